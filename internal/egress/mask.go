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
			if bytes.HasPrefix(data[i:], p) {
				// A longer pattern (they are sorted longest first) that
				// could still complete wins over this one: wait for it.
				if !eof && m.couldStart(data[i:], k) {
					wait = true
					break
				}
				hit, matched = true, true
				if m.reps != nil {
					out = append(out, m.reps[k]...)
				} else {
					out = append(out, p...)
				}
				i += len(p)
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

// couldStart reports whether tail is a proper prefix of one of the first n
// patterns.
func (m *matcher) couldStart(tail []byte, n int) bool {
	for _, p := range m.pats[:n] {
		if len(tail) < len(p) && bytes.HasPrefix(p, tail) {
			return true
		}
	}
	return false
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
