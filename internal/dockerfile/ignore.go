package dockerfile

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"regexp"
	"strings"
)

// Bounds on a .dockerignore file: every path of the context is matched
// against every pattern, on the host, and a repository's file (a dev
// container's build) is not trusted. Real ones hold tens of patterns.
const (
	maxIgnoreSize     = 256 << 10
	maxIgnorePatterns = 1_000
	maxPatternLen     = 1024
)

// Ignore is a .dockerignore file: patterns matched in order against a
// path relative to the context (slash-separated), the last match
// deciding; a pattern starting with ! takes paths back in. A pattern that
// matches a folder matches everything under it. The syntax is Docker's
// (moby's patternmatcher): * and ? within a name, ** across folders,
// [classes], \ escapes; each pattern is cleaned and a leading / dropped.
type Ignore struct {
	patterns []pattern
	// exceptions is set when some pattern takes paths back in: then no
	// excluded folder can be skipped whole.
	exceptions bool
}

type pattern struct {
	text      string
	re        *regexp.Regexp
	exclusion bool
}

// ParseIgnore reads a .dockerignore file.
func ParseIgnore(b []byte) (*Ignore, error) {
	if len(b) > maxIgnoreSize {
		return nil, fmt.Errorf(".dockerignore: larger than %d KiB", maxIgnoreSize>>10)
	}
	ig := &Ignore{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), maxIgnoreSize)
	line := 0
	for sc.Scan() {
		line++
		p := strings.TrimSpace(sc.Text())
		if p == "" || strings.HasPrefix(p, "#") {
			continue
		}
		if len(p) > maxPatternLen {
			return nil, fmt.Errorf(".dockerignore line %d: a pattern longer than %d bytes", line, maxPatternLen)
		}
		if len(ig.patterns) >= maxIgnorePatterns {
			return nil, fmt.Errorf(".dockerignore: more than %d patterns", maxIgnorePatterns)
		}
		excl := false
		if p[0] == '!' {
			excl = true
			p = strings.TrimSpace(p[1:])
		}
		if p == "" {
			continue
		}
		p = path.Clean(p)
		if len(p) > 1 && p[0] == '/' {
			p = p[1:]
		}
		re, err := compilePattern(p)
		if err != nil {
			return nil, fmt.Errorf(".dockerignore line %d: %q: %v", line, clip(p), err)
		}
		ig.patterns = append(ig.patterns, pattern{text: p, re: re, exclusion: excl})
		ig.exceptions = ig.exceptions || excl
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return ig, nil
}

// compilePattern turns a pattern into a regular expression as moby's
// patternmatcher does, quoting what is not pattern syntax.
func compilePattern(p string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch c {
		case '*':
			if i+1 < len(p) && p[i+1] == '*' {
				i++
				if i+1 < len(p) && p[i+1] == '/' {
					i++
				}
				if i+1 >= len(p) {
					b.WriteString(".*")
				} else {
					b.WriteString("(.*/)?")
				}
			} else {
				b.WriteString("[^/]*")
			}
		case '?':
			b.WriteString("[^/]")
		case '\\':
			if i+1 < len(p) {
				i++
				b.WriteString(regexp.QuoteMeta(p[i : i+1]))
			} else {
				b.WriteString(`\\`)
			}
		case '[':
			// A class, passed through to its closing bracket.
			end := strings.IndexByte(p[i+1:], ']')
			if end < 0 {
				return nil, fmt.Errorf("[ without ]")
			}
			class := p[i+1 : i+1+end]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			if class == "" || class == "^" || strings.Contains(class, "[") {
				return nil, fmt.Errorf("bad character class [%s]", class)
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += end + 1
		default:
			b.WriteString(regexp.QuoteMeta(p[i : i+1]))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// Excluded reports whether rel (slash-separated, relative to the context)
// is left out of the context.
func (ig *Ignore) Excluded(rel string) bool {
	if ig == nil {
		return false
	}
	var parents []string
	for d := path.Dir(rel); d != "." && d != "/"; d = path.Dir(d) {
		parents = append(parents, d)
	}
	matched := false
	for _, p := range ig.patterns {
		// An exclusion can only undo a match, an inclusion only make one.
		if p.exclusion != matched {
			continue
		}
		m := p.re.MatchString(rel)
		for k := 0; !m && k < len(parents); k++ {
			m = p.re.MatchString(parents[k])
		}
		if m {
			matched = !p.exclusion
		}
	}
	return matched
}

// SkipDir reports whether the excluded folder rel can be left unread
// whole: no pattern takes anything back in.
func (ig *Ignore) SkipDir(rel string) bool {
	return ig != nil && !ig.exceptions && ig.Excluded(rel)
}
