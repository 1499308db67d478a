package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/kosa8/kosa8/internal/termsafe"
)

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// progress shows what a long operation is doing: the step, a count where
// there is one, and the time the step has taken. On a terminal it keeps one
// line up to date (a spinner, a bar when the step has a count); elsewhere
// (a log, a pipe) it prints each step once, then a line with the count and
// the elapsed time every heartbeat while the step lasts, so that a wait
// over a few seconds never reads as a hang.
type progress struct {
	out       io.Writer
	tty       bool
	start     time.Time
	heartbeat time.Duration // non-terminal: the interval of "still at it" lines

	mu        sync.Mutex
	step      string
	stepStart time.Time
	done, of  int       // the step's count, when it has one (of > 0)
	lastBeat  time.Time // the step's last line (non-terminal)
	unsaid    []string  // non-terminal: steps said while quiet, written once the progress lasts past it
	quiet     time.Duration
	log       io.Writer // also told each step, as "kosa8: progress: STEP"
	stop      chan struct{}
	finished  chan struct{}
}

// progressHeartbeat is how often a long step prints a line where there is
// no terminal to redraw.
var progressHeartbeat = 15 * time.Second

// quietFor is how long progress says nothing where there is no terminal: a
// script's short command (or one that fails at once) prints only its
// result, and no wait over 3 s is silent. KOSA8_PROGRESS=all says every
// step at once instead (a log that wants each step however short).
var quietFor = 2 * time.Second

// progressQuiet is quietFor, or 0 when KOSA8_PROGRESS=all.
func progressQuiet() time.Duration {
	if os.Getenv("KOSA8_PROGRESS") == "all" {
		return 0
	}
	return quietFor
}

// newProgress shows progress on kosa8's own stderr (out is os.Stderr or
// nil): the spinner's line rewriting needs the raw terminal, so each step's
// text is cleaned here instead.
func newProgress(out *os.File) *progress {
	if out == nil || out == os.Stderr {
		out = termErr
	}
	p := startProgress(out, isTerminal(out), progressHeartbeat)
	p.mu.Lock()
	p.quiet = progressQuiet()
	p.mu.Unlock()
	return p
}

func startProgress(out io.Writer, tty bool, heartbeat time.Duration) *progress {
	p := &progress{out: out, tty: tty, start: time.Now(), heartbeat: heartbeat,
		stop: make(chan struct{}), finished: make(chan struct{})}
	go p.run()
	return p
}

func (p *progress) run() {
	defer close(p.finished)
	frames := []rune("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
	tick := 100 * time.Millisecond
	if !p.tty {
		tick = time.Second
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-p.stop:
			if p.tty {
				fmt.Fprint(p.out, "\r\033[K")
			}
			return
		case <-t.C:
		}
		p.mu.Lock()
		switch {
		case p.step == "":
		case !p.tty && len(p.unsaid) > 0:
			if time.Since(p.start) >= p.quiet {
				// Each step said so far, not only the current one: a
				// script's log shows what the wait went through.
				p.sayUnsaid()
			}
		case p.tty:
			fmt.Fprintf(p.out, "\r\033[K%c %s%s  %s", frames[i%len(frames)], p.step, p.countText(true), elapsed(time.Since(p.stepStart)))
		case time.Since(p.lastBeat) >= p.heartbeat:
			p.lastBeat = time.Now()
			fmt.Fprintf(p.out, "  ... %s%s, %s\n", p.step, p.countText(false), elapsed(time.Since(p.stepStart)))
		}
		p.mu.Unlock()
	}
}

// countText is the step's count: " [#####     ] 120/584 20%" on a
// terminal, ": 120/584 (20%)" elsewhere; "" without one.
func (p *progress) countText(bar bool) string {
	if p.of <= 0 {
		return ""
	}
	pct := p.done * 100 / p.of
	if !bar {
		return fmt.Sprintf(": %d/%d (%d%%)", p.done, p.of, pct)
	}
	const width = 20
	n := p.done * width / p.of
	return fmt.Sprintf("  [%s%s] %d/%d %d%%", strings.Repeat("#", n), strings.Repeat(" ", width-n), p.done, p.of, pct)
}

// elapsed is a duration as a person reads it: 4.2s, 3m05s.
func elapsed(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}

// Step announces the current step (its count and timer start again).
func (p *progress) Step(s string) { p.setStep(s, true) }

// Status changes the step's text without writing it to the log: a wait's
// view of another process's progress, which is that process's to log.
func (p *progress) Status(s string) { p.setStep(s, false) }

func (p *progress) setStep(s string, logIt bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s = sanitize(s, false)
	if s == "" || s == p.step {
		return
	}
	if p.tty && p.step != "" {
		// Keep finished steps visible above the spinner line, with their time.
		fmt.Fprintf(p.out, "\r\033[K  %s%s  %s\n", p.step, p.countText(false), elapsed(time.Since(p.stepStart)))
	}
	p.step, p.stepStart, p.done, p.of = s, time.Now(), 0, 0
	p.lastBeat = p.stepStart
	if !p.tty {
		if time.Since(p.start) < p.quiet {
			p.unsaid = append(p.unsaid, s)
		} else {
			p.sayUnsaid()
			fmt.Fprintf(p.out, "%s\n", s)
		}
	}
	if logIt && p.log != nil {
		fmt.Fprintf(p.log, "kosa8: progress: %s\n", s)
	}
}

// slowWaitAfter is how long a wait goes unannounced: the rule is that no
// wait over 3 s is silent.
var slowWaitAfter = 2 * time.Second

// slowWait shows what is awaited, with its elapsed time, once the wait has
// lasted slowWaitAfter (short ones print nothing); done ends it.
func slowWait(what string) (done func()) {
	var mu sync.Mutex
	var p *progress
	stopped := false
	t := time.AfterFunc(slowWaitAfter, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			p = newProgress(os.Stderr)
			p.mu.Lock()
			p.quiet = 0 // it was quiet for slowWaitAfter already
			p.mu.Unlock()
			p.Step(what)
		}
	})
	return func() {
		t.Stop()
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		if p != nil {
			p.Done()
		}
	}
}

// Note prints a line above the progress line (cleaned, as steps are).
func (p *progress) Note(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.out, "\r\033[K")
	}
	// After the steps said before it, in order.
	p.sayUnsaid()
	fmt.Fprintf(p.out, "%s\n", sanitize(s, false))
}

// sayUnsaid writes the steps said while quiet, in order (p.mu held).
func (p *progress) sayUnsaid() {
	for _, u := range p.unsaid {
		fmt.Fprintf(p.out, "%s\n", u)
	}
	p.unsaid = nil
}

// Count sets how far the current step has come: done of total.
func (p *progress) Count(done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	before := p.tenth()
	p.done, p.of = min(max(done, 0), total), total
	if p.log != nil && p.of > 0 && p.tenth() != before {
		fmt.Fprintf(p.log, "kosa8: progress: %s%s\n", p.step, p.countText(false))
	}
}

// tenth is how many tenths of its count the step has done (-1: no count).
func (p *progress) tenth() int {
	if p.of <= 0 {
		return -1
	}
	return p.done * 10 / p.of
}

// watchBuildLog shows, while another process builds and this one waits
// for it, that build's last progress line from its log (what it writes
// through LogTo), with the log's path; stop ends the watch.
func watchBuildLog(p *progress, what, logPath string) (stop func()) {
	show := func() {
		line := lastProgressLine(logPath)
		if line == "" {
			line = "starting"
		}
		p.Status(fmt.Sprintf("%s (log: %s); it is at: %s", what, logPath, line))
	}
	show()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				show()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// lastProgressLine is the last "kosa8: progress: " line in the last 64 KiB
// of a build log, at most 160 characters of it; "" when there is none.
func lastProgressLine(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	const tail = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > tail {
		f.Seek(fi.Size()-tail, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, tail))
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if rest, ok := strings.CutPrefix(lines[i], "kosa8: progress: "); ok {
			rest = sanitize(rest, false)
			if r := []rune(rest); len(r) > 160 {
				rest = string(r[:157]) + "..."
			}
			return rest
		}
	}
	return ""
}

// LogTo also writes each later step to w, as "kosa8: progress: STEP" (a
// build's log: another kosa8 waiting for the build reads it there).
func (p *progress) LogTo(w io.Writer) {
	p.mu.Lock()
	p.log = w
	p.mu.Unlock()
}

// Done ends the display.
func (p *progress) Done() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.finished
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
