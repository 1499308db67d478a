// kosa8 runs an AI agent's commands in a sandbox on your own machine: a
// microVM with its own kernel, one folder, a closed network, keys kept
// outside and undo.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/sandbox"
)

// version is set at build time (-ldflags "-X main.version=…").
var version = "dev"

// exitError carries a command's exit status without another message.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	root := &cobra.Command{
		Use:           "kosa8",
		Short:         "Run AI agents in a sandbox on your own machine",
		Long:          "kosa8 runs an agent's commands in a microVM with its own kernel, one workspace folder,\na closed network, keys kept outside, and checkpoints to rewind to.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.AddCommand(
		setupCmd(), doctorCmd(), imageCmd(), agentsCmd(),
		runCmd(), createCmd(), startCmd(), execCmd(), shellCmd(),
		lsCmd(), inspectCmd(), logsCmd(), stopCmd(), rmCmd(),
		netCmd(), portCmd(), secretCmd(),
		syncCmd(), diffCmd(), heldCmd(),
		changeCmd("apply NAME [PATH...]", "Write the sandbox's pending changes (all, or PATHs) to the host folder", "apply", false),
		changeCmd("discard NAME [PATH...]", "Undo the sandbox's pending changes (all, or PATHs) inside it", "discard", false),
		changeCmd("approve NAME PATH...", "Write held files (host-executed ones) to the host folder", "approve", true),
		checkpointCmd(), checkpointsCmd(), rewindCmd(), pauseCmd(),
		trustCmd(), debugCmd(), superviseCmd(),
	)
	if err := root.Execute(); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "kosa8: "+err.Error())
		os.Exit(1)
	}
}

// manager returns the sandbox manager for this user's directories.
func manager() (*sandbox.Manager, error) {
	p, err := sandbox.DefaultPaths()
	if err != nil {
		return nil, err
	}
	return &sandbox.Manager{Paths: p}, nil
}

// agentPath finds the kosa8-agent binary that goes into the guest.
func agentPath() (string, error) {
	if p := os.Getenv("KOSA8_AGENT"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("KOSA8_AGENT=%s: %w", p, err)
		}
		return p, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	self, _ = filepath.EvalSymlinks(self)
	for _, p := range []string{
		filepath.Join(filepath.Dir(self), "kosa8-agent"),
		filepath.Join(filepath.Dir(self), "..", "lib", "kosa8", "kosa8-agent"),
	} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("kosa8-agent not found next to kosa8: run 'make build' (or set KOSA8_AGENT)")
}

func lookTool(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}
