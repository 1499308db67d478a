package qemu

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/vmm"
)

// fakeQEMU greets, accepts qmp_capabilities and then answers nothing, as
// a QEMU stopped or wedged on a host disk does.
func fakeQMPPeer(t *testing.T) *net.UnixConn {
	t.Helper()
	host, qemu, err := vmm.SocketPair("qmp")
	if err != nil {
		t.Fatal(err)
	}
	hc, _ := net.FileConn(host)
	qc, _ := net.FileConn(qemu)
	host.Close()
	qemu.Close()
	t.Cleanup(func() { hc.Close(); qc.Close() })
	go func() {
		qc.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		r := bufio.NewReader(qc)
		r.ReadString('\n') // qmp_capabilities
		qc.Write([]byte(`{"return": {}, "id": 1}` + "\n"))
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
		}
	}()
	return hc.(*net.UnixConn)
}

// A command given no deadline still ends: QEMU that does not answer must
// not hang the supervisor.
func TestQMPCommandWithoutDeadlineEnds(t *testing.T) {
	q, err := NewQMP(context.Background(), fakeQMPPeer(t))
	if err != nil {
		t.Fatal(err)
	}
	old := CommandTimeout
	CommandTimeout = 200 * time.Millisecond
	defer func() { CommandTimeout = old }()
	start := time.Now()
	err = q.Execute(context.Background(), "cont", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a command QEMU never answers returned %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("it took %v", d)
	}
	// A caller's own, longer deadline is kept.
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	start = time.Now()
	_ = q.Execute(ctx, "stop", nil, nil)
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Fatalf("the caller's deadline was cut short: %v", d)
	}
}

// Kill returns once QEMU is reaped, and when it is not reaped in time it
// says so instead of waiting for ever.
func TestKillIsBounded(t *testing.T) {
	start := func() (*Machine, *exec.Cmd) {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Skipf("cannot run sleep: %v", err)
		}
		return &Machine{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}, cmd
	}
	m, cmd := start()
	go func() { cmd.Wait(); close(m.done) }()
	if err := m.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := m.Kill(); err != nil {
		t.Fatalf("a second kill: %v", err)
	}

	old := killWait
	killWait = 100 * time.Millisecond
	defer func() { killWait = old }()
	m, cmd = start() // never reaped: done stays open
	defer cmd.Wait()
	t0 := time.Now()
	if err := m.Kill(); err == nil || time.Since(t0) > 5*time.Second {
		t.Fatalf("kill of a process that is never reaped: %v after %v", err, time.Since(t0))
	}
}
