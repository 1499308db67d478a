package debian

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// Bounds of deb822 parsing. Debian's largest real fields (a Description, a
// long Depends) are a few KiB; the bounds keep a hostile file from making one
// line or one stanza the size of the whole input.
const (
	maxLineLen      = 1 << 20
	maxStanzaLen    = 4 << 20
	maxStanzaFields = 256
)

// Stanza is one paragraph of deb822 control data. Keys are the field names
// as they appear in the file; use Get for the case-insensitive lookup that
// Debian's field names call for.
type Stanza map[string]string

// Get returns the value of field, matched without regard to case, or "".
func (s Stanza) Get(field string) string {
	if v, ok := s[field]; ok {
		return v
	}
	for k, v := range s {
		if strings.EqualFold(k, field) {
			return v
		}
	}
	return ""
}

// ParseStanzas parses deb822 control data (Packages, Release, a .deb's
// control file), calling fn for each stanza in order. Continuation lines
// are joined to their field with "\n" (leading whitespace removed, a lone
// "." kept as is); comment lines starting with "#" are skipped. A field
// given twice in one stanza is an error, as for dpkg: which of the two a
// consumer would see is not something to leave to chance. An error from fn
// stops parsing and is returned.
func ParseStanzas(r io.Reader, fn func(Stanza) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		st      Stanza
		last    string          // the field continuation lines add to
		cur     strings.Builder // last's value, built up (+= would be quadratic)
		size    int
		lineNo  int
		lineBuf []byte
	)
	endField := func() {
		if last != "" {
			st[last] = cur.String()
			cur.Reset()
		}
	}
	flush := func() error {
		endField()
		if st == nil {
			return nil
		}
		s := st
		st, last, size = nil, "", 0
		return fn(s)
	}
	for {
		line, err := readLine(br, &lineBuf)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("line %d: %w", lineNo+1, err)
		}
		lineNo++
		if strings.TrimSpace(line) == "" {
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		size += len(line) + 1
		if size > maxStanzaLen {
			return fmt.Errorf("line %d: stanza longer than %d bytes", lineNo, maxStanzaLen)
		}
		if line[0] == ' ' || line[0] == '\t' {
			if last == "" {
				return fmt.Errorf("line %d: continuation line outside a field", lineNo)
			}
			cur.WriteString("\n")
			cur.WriteString(strings.TrimSpace(line))
			continue
		}
		if line[0] == '#' {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return fmt.Errorf("line %d: %q is not a \"Field: value\" line", lineNo, clip(line))
		}
		if !validFieldName(name) {
			return fmt.Errorf("line %d: bad field name %q", lineNo, clip(name))
		}
		endField()
		if st == nil {
			st = Stanza{}
		}
		for k := range st {
			if strings.EqualFold(k, name) {
				return fmt.Errorf("line %d: field %q given twice", lineNo, name)
			}
		}
		if len(st) >= maxStanzaFields {
			return fmt.Errorf("line %d: stanza has more than %d fields", lineNo, maxStanzaFields)
		}
		st[name] = ""
		cur.WriteString(strings.TrimSpace(value))
		last = name
	}
	return flush()
}

// readLine reads one line without its "\n" (or "\r\n"), refusing lines
// longer than maxLineLen instead of buffering them.
func readLine(br *bufio.Reader, buf *[]byte) (string, error) {
	b := (*buf)[:0]
	for {
		frag, err := br.ReadSlice('\n')
		if len(b)+len(frag) > maxLineLen+1 {
			return "", fmt.Errorf("line longer than %d bytes", maxLineLen)
		}
		b = append(b, frag...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF {
			if len(b) == 0 {
				return "", io.EOF
			}
			break
		}
		if err != nil {
			return "", err
		}
		break
	}
	*buf = b
	s := strings.TrimSuffix(string(b), "\n")
	s = strings.TrimSuffix(s, "\r")
	if len(s) > maxLineLen {
		return "", fmt.Errorf("line longer than %d bytes", maxLineLen)
	}
	return s, nil
}

// validFieldName follows deb822: printable ASCII without spaces or colons,
// not starting with "#" or "-".
func validFieldName(name string) bool {
	if name == "" || len(name) > 256 || name[0] == '#' || name[0] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || c == ':' {
			return false
		}
	}
	return true
}

// clip shortens untrusted text quoted in an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
