package qemu

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// A QEMU must not outlive its supervisor, however the supervisor ends
// (kill -9 included). Linux has the parent-death signal (procAttr). macOS
// has none, so there a watchdog does it: a shell in a process group of its
// own waits on a pipe whose write end only the supervisor holds. When the
// supervisor ends by any means the kernel closes that end, the shell's
// read returns, and it kills QEMU's process group. When QEMU ends first,
// the supervisor writes "done" before closing: the shell then exits
// without signalling a group whose id the system may hand out again.
//
// The shell is the POSIX one every Mac has; it costs one small process
// per sandbox and nothing while it waits.

// watchdog is the supervisor's end of one QEMU's watchdog.
type watchdog struct {
	w   *os.File
	cmd *exec.Cmd
}

// watchdogScript kills process group $1 unless the first line read is
// "done".
const watchdogScript = `IFS= read -r line; [ "$line" = done ] || kill -s KILL -- "-$1"`

// startWatchdog starts the watchdog of process group pgid.
func startWatchdog(pgid int) (*watchdog, error) {
	if pgid <= 1 {
		return nil, fmt.Errorf("watchdog: bad process group %d", pgid)
	}
	r, w, err := os.Pipe() // close-on-exec: no other child inherits the write end
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "kosa8-watchdog", strconv.Itoa(pgid))
	cmd.Stdin = r
	// Its own group: a terminal's ^C to the supervisor's does not end it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start QEMU's watchdog: %w", err)
	}
	r.Close()
	go func() { _ = cmd.Wait() }()
	return &watchdog{w: w, cmd: cmd}, nil
}

// release ends the watchdog without a kill: QEMU has exited.
func (d *watchdog) release() {
	if d == nil {
		return
	}
	_, _ = d.w.WriteString("done\n")
	d.w.Close()
}
