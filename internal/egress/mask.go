package egress

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net/url"
)

// secretForms are the ways a value travels in HTTP: as is, base64 (padded
// or not, standard or URL alphabet) and URL-escaped.
func secretForms(v []byte) [][]byte {
	forms := [][]byte{
		v,
		[]byte(base64.StdEncoding.EncodeToString(v)),
		[]byte(base64.RawStdEncoding.EncodeToString(v)),
		[]byte(base64.URLEncoding.EncodeToString(v)),
		[]byte(base64.RawURLEncoding.EncodeToString(v)),
		[]byte(url.QueryEscape(string(v))),
		[]byte(url.PathEscape(string(v))),
	}
	var out [][]byte
	for _, f := range forms {
		dup := false
		for _, o := range out {
			if bytes.Equal(o, f) {
				dup = true
			}
		}
		if !dup && len(f) > 0 {
			out = append(out, f)
		}
	}
	// Longest first: a padded form must win over its unpadded prefix (the
	// matcher relies on this order).
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if len(out[j]) > len(out[i]) {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// matcher finds any of a set of patterns in a stream, holding back only a
// tail that could still become one, so a stream (server-sent events) is
// delayed by nothing but a possible partial match.
type matcher struct {
	pats  [][]byte
	reps  [][]byte // nil: report instead of replace
	first [256]bool
	// gap, when set, recognizes bytes that may lie between two bytes of a
	// pattern and still count as a match (sseGap: the framing between two
	// data lines of an event stream, which a client joins). It returns how
	// many bytes at the start of d are such a gap (0: none), or partial
	// when d ends before that can be told.
	gap func(d []byte) (n int, partial bool)
}

func newMatcher(pats, reps [][]byte) *matcher {
	m := &matcher{pats: pats, reps: reps}
	for _, p := range pats {
		m.first[p[0]] = true
	}
	return m
}

// scan processes data (pending bytes plus new ones). It returns the output
// that is final, the number of input bytes it covers, and whether a
// pattern was seen. With eof, nothing is held back.
func (m *matcher) scan(data []byte, eof bool) (out []byte, used int, hit bool) {
	i := 0
	for i < len(data) {
		// Copy the run that cannot start a pattern in one go.
		j := i
		for j < len(data) && !m.first[data[j]] {
			j++
		}
		out = append(out, data[i:j]...)
		i = j
		if i == len(data) {
			break
		}
		matched, wait := false, false
		for k, p := range m.pats {
			if n, gaps, full, _ := m.matchAt(data[i:], p); full {
				// A longer pattern (they are sorted longest first) that
				// could still complete wins over this one: wait for it.
				if !eof && m.couldStart(data[i:], k) {
					wait = true
					break
				}
				hit, matched = true, true
				if m.reps != nil {
					// The framing between the pieces stays (the events
					// keep their shape); the pieces become one placeholder.
					out = append(out, m.reps[k]...)
					out = append(out, gaps...)
				} else {
					out = append(out, data[i:i+n]...)
				}
				i += n
				break
			}
		}
		if matched {
			continue
		}
		if wait || !eof && m.couldStart(data[i:], len(m.pats)) {
			break
		}
		out = append(out, data[i])
		i++
	}
	return out, i, hit
}

// couldStart reports whether tail is the start of a match of one of the
// first n patterns that more bytes could complete.
func (m *matcher) couldStart(tail []byte, n int) bool {
	for _, p := range m.pats[:n] {
		if _, _, _, partial := m.matchAt(tail, p); partial {
			return true
		}
	}
	return false
}

// matchAt matches p at the start of d, with the matcher's gaps allowed
// between two of p's bytes: full, covering d[:n], with the gaps' bytes;
// or partial, when d ends before p could complete.
func (m *matcher) matchAt(d, p []byte) (n int, gaps []byte, full, partial bool) {
	q := 0
	for j := 0; j < len(p); {
		if q == len(d) {
			return 0, nil, false, true
		}
		if d[q] == p[j] {
			q, j = q+1, j+1
			continue
		}
		if m.gap == nil || j < minBeforeGap {
			return 0, nil, false, false
		}
		k, part := m.gap(d[q:])
		if part {
			return 0, nil, false, true
		}
		if k == 0 {
			return 0, nil, false, false
		}
		gaps = append(gaps, d[q:q+k]...)
		q += k
	}
	return q, gaps, true, false
}

// minBeforeGap is how much of a pattern must come before a gap: a data
// line that ends in a shorter prefix of a secret ("s", "sk-") is common
// text, and holding its event back until the next one arrives would stall
// the stream.
const minBeforeGap = 8

// maxSSEGap bounds the framing sseGap skips between two pieces of data, so
// that what a partial match holds back stays small.
const maxSSEGap = 512

// sseGap recognizes the framing between two pieces of data in a stream of
// server-sent events: the end of a data line, any blank lines (the end of
// an event), event, id, retry and comment lines, then the next "data:"
// and its optional space. A client that joins the data of the stream (a
// model's streamed text) reads the pieces around it as one string.
func sseGap(d []byte) (int, bool) {
	i := 0
	for {
		if i > maxSSEGap {
			return 0, false
		}
		// One or more line ends.
		start := i
		for i < len(d) && (d[i] == '\n' || d[i] == '\r') {
			i++
		}
		if i == start {
			return 0, false
		}
		if i == len(d) {
			return 0, true
		}
		// At the start of a line: the next data line ends the gap.
		rest := d[i:]
		const field = "data:"
		if len(rest) < len(field) && bytes.HasPrefix([]byte(field), rest) {
			return 0, true
		}
		if bytes.HasPrefix(rest, []byte(field)) {
			i += len(field)
			if i == len(d) {
				return 0, true
			}
			if d[i] == ' ' {
				i++
			}
			if i == len(d) {
				return 0, true
			}
			if d[i] != '\n' && d[i] != '\r' {
				return i, false
			}
			continue // an empty data line: still framing
		}
		// Another field or a comment: skipped to its end.
		end := bytes.IndexAny(rest, "\r\n")
		if end < 0 {
			if len(d) > maxSSEGap {
				return 0, false
			}
			return 0, true
		}
		i += end
	}
}

// errExfiltration is returned when a placeholder shows up where it may not.
var errExfiltration = errors.New("placeholder in a place it may not go")

// scanReader runs a stream through a matcher. With replacements it
// replaces the patterns as they pass; without (a guard), it fails on the
// first pattern before passing on any byte of it.
type scanReader struct {
	src     io.Reader
	m       *matcher
	pending []byte
	out     []byte
	buf     []byte
	eof     bool
	err     error
	tripped func() // a guard's: told when it fails
}

func newReplacingReader(src io.Reader, pats, reps [][]byte) io.ReadCloser {
	return &scanReader{src: src, m: newMatcher(pats, reps), buf: make([]byte, 32<<10)}
}

// newEventStreamReplacingReader is newReplacingReader for a stream of
// server-sent events: a pattern split across data lines (the framing
// between them skipped, as a client joining the data reads it) is
// replaced too, its framing kept.
func newEventStreamReplacingReader(src io.Reader, pats, reps [][]byte) io.ReadCloser {
	m := newMatcher(pats, reps)
	m.gap = sseGap
	return &scanReader{src: src, m: m, buf: make([]byte, 32<<10)}
}

func newGuardReader(src io.Reader, pats [][]byte, tripped func()) io.ReadCloser {
	return &scanReader{src: src, m: newMatcher(pats, nil), buf: make([]byte, 32<<10), tripped: tripped}
}

func (r *scanReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.eof {
			if r.err != nil {
				return 0, r.err
			}
			return 0, io.EOF
		}
		n, err := r.src.Read(r.buf)
		if err != nil {
			r.eof = true
			if !errors.Is(err, io.EOF) {
				r.err = err
			}
		}
		data := append(r.pending, r.buf[:n]...)
		out, used, hit := r.m.scan(data, r.eof)
		if hit && r.m.reps == nil {
			r.eof, r.err, r.out = true, errExfiltration, nil
			if r.tripped != nil {
				r.tripped()
			}
			return 0, errExfiltration
		}
		r.out = out
		r.pending = append([]byte(nil), data[used:]...)
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

func (r *scanReader) Close() error {
	if c, ok := r.src.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
