package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"golang.org/x/term"
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

func newProgress(out *os.File) *progress {
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

// sanitize removes terminal control sequences from text that came from the
// guest before it is printed anywhere but an attached terminal: a guest
// must not be able to rewrite the user's screen through 'kosa8 ls' or logs.
// Newlines and tabs stay when keepLines is set.
func sanitize(s string, keepLines bool) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case keepLines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == unicode.ReplacementChar, unicode.IsControl(r), r >= 0x80 && r <= 0x9f:
			b.WriteRune('?')
		case unicode.Is(unicode.Bidi_Control, r):
			b.WriteRune('?')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// sanitizeWriter applies sanitize to a stream of text, line-preserving.
type sanitizeWriter struct{ w io.Writer }

func (s sanitizeWriter) Write(p []byte) (int, error) {
	_, err := io.WriteString(s.w, sanitize(strings.ToValidUTF8(string(p), "?"), true))
	return len(p), err
}
