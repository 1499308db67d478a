// Package termsafe makes text that came from a sandbox safe to show on the
// user's terminal. The guest is hostile: file names, link targets,
// checkpoint messages, host names it looked up and the errors it returns
// may carry escape sequences that set the terminal's title, clear the
// screen, rewrite earlier lines or, on some terminals, type into the shell.
// Every byte kosa8 prints about a sandbox goes through Clean, directly or
// through a Writer; only a guest process's own output, which the user
// attached a terminal to on purpose (exec, run, shell), passes raw.
package termsafe

import (
	"io"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Replacement stands for each character that is removed.
const Replacement = '?'

// Clean replaces control characters (C0, DEL, C1), invalid UTF-8 and
// bidirectional overrides in s, so nothing in it can steer a terminal or
// reorder what the user reads. Newlines and tabs stay when keepLines is
// set (multi-line text: a diff, a log); otherwise one value stays on one
// line.
func Clean(s string, keepLines bool) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		switch {
		case r == utf8.RuneError && n <= 1:
			b.WriteRune(Replacement)
		case keepLines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case !allowed(r):
			b.WriteRune(Replacement)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// allowed reports whether r may reach a terminal.
func allowed(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return false
	case unicode.Is(unicode.Bidi_Control, r), r == '\u2028', r == '\u2029':
		return false
	case unicode.IsControl(r):
		return false
	}
	return true
}

// Writer cleans a stream of text (lines kept) on its way to w. A UTF-8
// sequence split across two writes is joined, not replaced.
type Writer struct {
	mu   sync.Mutex
	w    io.Writer
	tail []byte // the start of a rune the next write completes
}

// NewWriter returns a Writer to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

func (t *Writer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	buf := append(t.tail, p...)
	t.tail = nil
	// Hold back an incomplete rune at the end (at most 3 bytes).
	cut := len(buf)
	for k := 1; k <= 3 && k <= len(buf); k++ {
		c := buf[len(buf)-k]
		if c < 0x80 {
			break
		}
		if c >= 0xc0 { // a lead byte: complete if it has its continuation bytes
			if !utf8.FullRune(buf[len(buf)-k:]) {
				cut = len(buf) - k
			}
			break
		}
	}
	if cut < len(buf) {
		t.tail = append([]byte(nil), buf[cut:]...)
	}
	if _, err := io.WriteString(t.w, Clean(string(buf[:cut]), true)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a rune left incomplete (as a replacement).
func (t *Writer) Flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.tail) == 0 {
		return nil
	}
	t.tail = nil
	_, err := io.WriteString(t.w, string(Replacement))
	return err
}
