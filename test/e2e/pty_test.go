package e2e

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
)

// screen collects what a terminal shows.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until the screen shows want after position from.
func (s *screen) waitFor(t *testing.T, from int, want string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out := s.String()
		if i := strings.Index(out[from:], want); i >= 0 {
			return from + i + len(want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("terminal never showed %q; it shows:\n%s", want, s.String()[from:])
	return 0
}

func TestInteractiveShell(t *testing.T) {
	name := sandbox(t, "tty")
	cmd := kosa8Cmd(t.Context(), "shell", name)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	var scr screen
	go io.Copy(&scr, ptmx)
	send := func(s string) {
		if _, err := ptmx.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// Markers are printed by arithmetic so the echoed command line does not
	// match them.
	send("stty size; echo mark-$((1+1))\r")
	pos := scr.waitFor(t, 0, "mark-2")
	if !strings.Contains(scr.String(), "40 120") {
		t.Fatalf("initial size not passed: %s", scr.String())
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 50, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // SIGWINCH → resize frame → guest
	send("stty size; echo mark-$((2+1))\r")
	end := scr.waitFor(t, pos, "mark-3")
	if !strings.Contains(scr.String()[pos:end], "50 100") {
		t.Fatalf("resize did not reach the guest: %s", scr.String()[pos:end])
	}
	send("sleep 600\r")
	time.Sleep(500 * time.Millisecond)
	send("\x03") // ^C: the guest's terminal turns it into SIGINT for sleep
	send("echo status-$?-$((3+1))\r")
	scr.waitFor(t, end, "status-130-4")
	send("exit 5\r")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if cmd.ProcessState.ExitCode() != 5 {
			t.Fatalf("shell exit status %d (%v), want 5", cmd.ProcessState.ExitCode(), err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("kosa8 shell did not end after exit")
	}
}
