// kosa8 runs an AI agent's commands in a sandbox on your own machine: a
// microVM with its own kernel, one folder, a closed network, keys kept
// outside and undo.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// version is the commit kosa8 was built from, set at build time
// (-ldflags "-X main.version=…"); release (version.go) is the semantic one.
var version = "dev"

// exitError carries a command's exit status without another message.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// errInterrupted is a start ended by ^C (or SIGTERM, SIGHUP): exit 130, as a
// shell reports a command ended by SIGINT.
var errInterrupted = errors.New("interrupted")

// Exit statuses of kosa8 itself, as docker run has them: scripts can tell
// kosa8's failures from the command's.
const (
	exitKosa8       = 125 // kosa8 failed: a bad flag or value, no such sandbox, a boot failure
	exitNotRunnable = 126 // the command exists but cannot be run
	exitNotFound    = 127 // no such command in the guest
	exitInterrupted = 130 // ^C before the command started
)

// exitCode is the status kosa8 exits with for err.
func exitCode(err error) int {
	var ee *exitError
	var ce *api.CommandError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ce) && (ce.Code == exitNotRunnable || ce.Code == exitNotFound):
		return ce.Code
	case errors.Is(err, errInterrupted):
		return exitInterrupted
	}
	return exitKosa8
}

func main() {
	// A closed pipe on stdout must end the command in the guest, not kill
	// kosa8 before it can clean up: with SIGPIPE notified, writes return
	// EPIPE instead (and exec'd children still get the default action).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	os.Exit(execute(newRoot(), os.Args[1:], termOut, termErr))
}

// execute runs the command line and returns the exit status, printing
// kosa8's own error. What it prints reaches out and errw through
// termsafe (see guardOutput).
func execute(root *cobra.Command, args []string, out, errw io.Writer) int {
	root.SetArgs(args)
	top := ""
	if c, _, err := root.Find(args); err == nil {
		for ; c.HasParent(); c = c.Parent() {
			top = c.Name()
		}
	}
	if top == "supervise" {
		// The detached supervisor writes its log, not to a terminal.
		return exitCode(root.Execute())
	}
	finish, gerr := guardOutput(rawStdout[top], out, errw)
	if gerr != nil {
		fmt.Fprintln(errw, "kosa8: "+gerr.Error())
		return exitKosa8
	}
	err := root.Execute()
	var ee *exitError
	if err != nil && !errors.As(err, &ee) {
		fmt.Fprintln(os.Stderr, "kosa8: "+err.Error())
	}
	finish()
	return exitCode(err)
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "kosa8",
		Short:         "Run AI agents in a sandbox on your own machine",
		Long:          "kosa8 runs an agent's commands in a microVM with its own kernel, one workspace folder,\na closed network, keys kept outside, and checkpoints to rewind to.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       currentVersion().String(),
	}
	root.SetVersionTemplate("kosa8 {{.Version}}\n")
	root.AddCommand(
		versionCmd(), setupCmd(), doctorCmd(), imageCmd(), agentsCmd(),
		runCmd(), createCmd(), startCmd(), execCmd(), shellCmd(),
		lsCmd(), inspectCmd(), logsCmd(), stopCmd(), rmCmd(),
		netCmd(), portCmd(), secretCmd(), mcpCmd(),
		syncCmd(), diffCmd(), heldCmd(),
		changeCmd("apply NAME [PATH...]", "Write the sandbox's changes waiting for review (all, or PATHs) to the host folder",
			"Write the changes a --review sandbox made (all, or the PATHs given) to the host folder.\nHeld files need 'kosa8 approve'. A sandbox not running is started (a paused one resumed) and paused again after, or stopped (removed, with --rm) once nothing is left to review.", "apply", false),
		changeCmd("discard NAME [PATH...]", "Undo the sandbox's unapplied changes (all, or PATHs) inside it",
			"Put the host's version back in the sandbox for its changes waiting for review and its held\nfiles (all, or the PATHs given). A sandbox not running is started (a paused one resumed) and paused again after, or stopped (removed, with --rm) once nothing is left to review.", "discard", false),
		changeCmd("approve NAME PATH...", "Show held files' diffs, then write them to the host folder",
			"Show the diff of each held PATH (files host tools run or obey), ask on a terminal, then\nwrite them to the host folder. A sandbox not running is started (a paused one resumed) and paused again after, or stopped (removed, with --rm) once nothing is left to review.", "approve", true),
		checkpointCmd(), checkpointsCmd(), rewindCmd(), pauseCmd(), resumeCmd(), forkCmd(),
		trustCmd(), debugCmd(), superviseCmd(), serveCmd(),
	)
	// A bad flag says which command's help lists the real ones.
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w ('%s --help' lists its flags)", err, c.CommandPath())
	})
	return root
}

// manager returns the sandbox manager for this user's directories.
func manager() (*sandbox.Manager, error) {
	p, err := sandbox.DefaultPaths()
	if err != nil {
		return nil, err
	}
	return &sandbox.Manager{Paths: p, Disks: qemu.Layers{}}, nil
}

// agentPath finds the kosa8-agent binary for a guest of arch.
func agentPath(arch vmspec.Arch) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	return launch.AgentPath(self, arch)
}

func lookTool(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}
