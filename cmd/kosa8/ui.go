package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/kosa8/kosa8/internal/termsafe"
)

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// progress shows what a long operation is doing. On a terminal it keeps one
// line up to date with a spinner and the elapsed time; elsewhere it prints
// each step once.
type progress struct {
	out   io.Writer
	tty   bool
	start time.Time

	mu   sync.Mutex
	step string
	stop chan struct{}
	done chan struct{}
}

// newProgress shows progress on kosa8's own stderr (out is os.Stderr or
// nil): the spinner's line rewriting needs the raw terminal, so each step's
// text is cleaned here instead.
func newProgress(out *os.File) *progress {
	if out == nil || out == os.Stderr {
		out = termErr
	}
	p := &progress{out: out, tty: isTerminal(out), start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	if p.tty {
		go p.spin()
	} else {
		close(p.done)
	}
	return p
}

func (p *progress) spin() {
	defer close(p.done)
	frames := []rune("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-p.stop:
			fmt.Fprint(p.out, "\r\033[K")
			return
		case <-t.C:
		}
		p.mu.Lock()
		if p.step != "" {
			fmt.Fprintf(p.out, "\r\033[K%c %s  %.1fs", frames[i%len(frames)], p.step, time.Since(p.start).Seconds())
		}
		p.mu.Unlock()
	}
}

// Step announces the current step.
func (p *progress) Step(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s = sanitize(s, false)
	if s == "" || s == p.step {
		return
	}
	if p.tty && p.step != "" {
		// Keep finished steps visible above the spinner line.
		fmt.Fprintf(p.out, "\r\033[K  %s\n", p.step)
	}
	p.step = s
	if !p.tty {
		fmt.Fprintf(p.out, "%s\n", s)
	}
}

// Done ends the display.
func (p *progress) Done() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// sanitize is termsafe.Clean: for values printed outside the guarded
// streams (a progress step on the raw terminal).
func sanitize(s string, keepLines bool) string { return termsafe.Clean(s, keepLines) }

// termOut and termErr are the process's own stdout and stderr. Only a guest
// process's output that the user attached on purpose (exec, run, shell),
// the progress spinner and terminal checks use them; everything else kosa8
// prints goes through os.Stdout and os.Stderr, which guardOutput routes
// through termsafe: the one choke point for text a sandbox controls.
var termOut, termErr = os.Stdout, os.Stderr

// rawStdout are the commands whose stdout is a guest process's (exec, run,
// shell) or binary (debug memory): their stdout is not cleaned. Their
// stderr is, except for the guest process's own stderr, which execIn
// writes to termErr.
var rawStdout = map[string]bool{"exec": true, "run": true, "shell": true, "debug": true, "supervise": true}

// guardOutput replaces os.Stdout (unless rawOut) and os.Stderr with pipes
// drained through termsafe into out and errw. finish closes them and waits
// until everything written has been passed on.
func guardOutput(rawOut bool, out, errw io.Writer) (finish func(), err error) {
	var wg sync.WaitGroup
	var closers []func()
	route := func(dst io.Writer, set func(*os.File)) error {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		set(w)
		tw := termsafe.NewWriter(dst)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(tw, r)
			_ = tw.Flush()
			r.Close()
		}()
		closers = append(closers, func() { w.Close() })
		return nil
	}
	origOut, origErr := os.Stdout, os.Stderr
	if !rawOut {
		if err := route(out, func(f *os.File) { os.Stdout = f }); err != nil {
			return nil, err
		}
	}
	if err := route(errw, func(f *os.File) { os.Stderr = f }); err != nil {
		for _, c := range closers {
			c()
		}
		os.Stdout = origOut
		return nil, err
	}
	return func() {
		for _, c := range closers {
			c()
		}
		wg.Wait()
		os.Stdout, os.Stderr = origOut, origErr
	}, nil
}

// sanitizeWriter cleans a stream on its way to w (lines kept); output to
// os.Stdout is already cleaned by guardOutput.
type sanitizeWriter struct{ w io.Writer }

func (s sanitizeWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(s.w, termsafe.Clean(string(p), true)); err != nil {
		return 0, err
	}
	return len(p), nil
}
