// Package launch starts a sandbox's supervisor (`kosa8 supervise NAME`)
// as a detached process and waits for its ready message: the one start
// path of the CLI and the SDK. It is light on purpose (no network stack,
// no VMM driver), so that the SDK links only what a client needs.
package launch

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// ReadyMessage is what the supervisor writes to its ready pipe.
type ReadyMessage struct {
	OK     bool        `json:"ok"`
	Error  string      `json:"error,omitempty"`
	Status *api.Status `json:"status,omitempty"`
	// Progress lines come before the last one (OK or Error set), while
	// the host folder is copied in.
	Progress *CopyProgress `json:"progress,omitempty"`
	// Phase lines come before it too: each step of the start as it begins.
	Phase *BootPhase `json:"phase,omitempty"`
}

// BootPhase is the step a start has reached: Step of Of, and what it does
// in a few words ("booting the VM").
type BootPhase struct {
	Step int    `json:"step"`
	Of   int    `json:"of"`
	What string `json:"what"`
}

// CopyProgress is how far copying the host folder into the guest has come:
// sent on the ready pipe while a sandbox boots, so the user sees a large
// folder move (files and bytes) instead of a silent wait.
type CopyProgress struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// LaunchOptions say how to start a sandbox's supervisor.
type LaunchOptions struct {
	// Binary is the kosa8 executable that runs `kosa8 supervise`.
	Binary string
	// Agent is the kosa8-agent binary for the guest (AgentPath finds it).
	Agent string
	// Restore starts the machine saved in this checkpoint instead of a
	// cold boot; with Rewind the host folder is merged back to it.
	Restore string
	Rewind  bool
	// Env, when not nil, is the supervisor's whole environment (the
	// caller's otherwise): KOSA8_HOME and the test overrides are read from
	// it.
	Env []string
	// Started, when set, is called once the supervisor runs and the wait
	// for the guest begins (the CLI shows its progress from there).
	Started func()
	// Progress, when set, is told how the first copy of the host folder
	// into the sandbox goes.
	Progress func(CopyProgress)
	// Phase, when set, is told each step of the start as it begins.
	Phase func(BootPhase)
}

// Launch starts sb's supervisor, detached in a session of its own, and
// waits until it reports the guest ready on a pipe: the one way both the
// CLI and the SDK start a sandbox. The supervisor outlives the caller; if
// ctx ends first (^C while booting) the supervisor is killed and the
// sandbox is put back in the state it had, not left crashed.
func Launch(ctx context.Context, sb *sandbox.Sandbox, o LaunchOptions) (*api.Status, error) {
	if sb.Alive() {
		return nil, fmt.Errorf("%w: %s", sandbox.ErrRunning, sb.Config.Name)
	}
	if o.Binary == "" || o.Agent == "" {
		return nil, errors.New("launch: the kosa8 and kosa8-agent binaries must be named")
	}
	before := sb.Status()
	logf, err := os.OpenFile(sb.Path(sandbox.SupervisorLog), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	args := []string{"supervise", "--ready-fd", "3", "--agent", o.Agent}
	if o.Restore != "" {
		args = append(args, "--restore", o.Restore)
		if o.Rewind {
			args = append(args, "--rewind")
		}
	}
	cmd := exec.Command(o.Binary, append(args, sb.Config.Name)...)
	cmd.Env = o.Env
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.Dir = "/"
	// A session of its own: the supervisor outlives this process and its
	// terminal (no SIGHUP, no ^C from the terminal's process group).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("start supervisor: %w", err)
	}
	pw.Close()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // reaped if it dies while we wait; detached otherwise
	if o.Started != nil {
		o.Started()
	}
	type result struct {
		msg ReadyMessage
		err error
	}
	res := make(chan result, 1)
	go func() {
		r := bufio.NewReader(pr)
		for {
			line, err := r.ReadBytes('\n')
			var msg ReadyMessage
			if err == nil {
				err = json.Unmarshal(line, &msg)
			}
			if err == nil && msg.Progress != nil {
				if o.Progress != nil {
					o.Progress(*msg.Progress)
				}
				continue
			}
			if err == nil && msg.Phase != nil {
				if o.Phase != nil {
					o.Phase(*msg.Phase)
				}
				continue
			}
			res <- result{msg, err}
			return
		}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return nil, fmt.Errorf("the supervisor exited before the sandbox was ready%s", logTail(sb.Path(sandbox.SupervisorLog)))
		}
		if !r.msg.OK {
			return nil, errors.New(r.msg.Error)
		}
		return r.msg.Status, nil
	case <-ctx.Done():
		// Interrupted while booting: end the supervisor (QEMU dies with
		// it) and put the sandbox back as it was, not crashed.
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = sb.WaitStopped(wctx)
		if !sb.Alive() {
			before.SupervisorPID, before.QEMUPID = 0, 0
			if before.State != api.Paused {
				before.State = api.Stopped
				if before.Started.IsZero() {
					before.State = api.Created
				}
			}
			_ = sb.WriteStatus(before)
		}
		return nil, ctx.Err()
	}
}

// AgentPath finds the kosa8-agent binary for a guest of arch:
// $KOSA8_AGENT, else next to the kosa8 binary (or in ../lib/kosa8) as
// kosa8-agent-linux-ARCH, or kosa8-agent. Whichever it finds must be a
// Linux program for arch: a wrong one would stop the guest at its first
// instruction, with nothing but "exec format error" on its console.
func AgentPath(kosa8Binary string, arch vmspec.Arch) (string, error) {
	if p := os.Getenv("KOSA8_AGENT"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("KOSA8_AGENT=%s: %w", p, err)
		}
		if err := checkAgentArch(p, arch); err != nil {
			return "", fmt.Errorf("KOSA8_AGENT=%s: %w", p, err)
		}
		return p, nil
	}
	self, err := filepath.EvalSymlinks(kosa8Binary)
	if err != nil {
		self = kosa8Binary
	}
	var wrong error
	for _, dir := range []string{filepath.Dir(self), filepath.Join(filepath.Dir(self), "..", "lib", "kosa8")} {
		for _, name := range []string{"kosa8-agent-linux-" + string(arch), "kosa8-agent"} {
			p := filepath.Join(dir, name)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if err := checkAgentArch(p, arch); err != nil {
				if wrong == nil {
					wrong = fmt.Errorf("%s: %w", p, err)
				}
				continue
			}
			return p, nil
		}
	}
	if wrong != nil {
		return "", fmt.Errorf("no kosa8-agent for %s guests next to %s (%v): run 'make build', which builds kosa8-agent-linux-%s", arch, kosa8Binary, wrong, arch)
	}
	return "", fmt.Errorf("kosa8-agent not found next to %s: run 'make build' (or set KOSA8_AGENT)", kosa8Binary)
}

// checkAgentArch checks that p is a Linux ELF program for arch.
func checkAgentArch(p string, arch vmspec.Arch) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("not a Linux program: %w", err)
	}
	defer f.Close()
	want := map[vmspec.Arch]elf.Machine{vmspec.AMD64: elf.EM_X86_64, vmspec.ARM64: elf.EM_AARCH64}[arch]
	if want == 0 {
		return fmt.Errorf("no guest architecture %q", arch)
	}
	if f.Machine != want {
		return fmt.Errorf("built for %s, the guest is %s", f.Machine, arch)
	}
	return nil
}

// logTail is the last lines of a log, control characters replaced (the
// supervisor's log quotes the guest), for an error message.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	clean := strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\t':
			return r
		case r == unicode.ReplacementChar, unicode.IsControl(r), unicode.Is(unicode.Bidi_Control, r):
			return '?'
		}
		return r
	}, strings.ToValidUTF8(string(b), "?"))
	lines := strings.Split(strings.TrimSpace(clean), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	if len(lines) == 0 || lines[0] == "" {
		return ""
	}
	return ":\n  " + strings.Join(lines, "\n  ")
}
