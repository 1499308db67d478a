package debian

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Source is one apt sources line: "deb URL SUITE COMPONENT...".
type Source struct {
	URL        string
	Suite      string
	Components []string
}

// suiteRE and componentRE keep suites and components to the characters
// Debian uses, because both become parts of URLs and of paths looked up in
// the Release; ".." is rejected separately.
var (
	suiteRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
	componentRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
)

// ParseSource parses one apt sources line. Options in brackets ("deb
// [signed-by=...] ...") and flat repositories ("SUITE/") are refused rather
// than ignored, since honouring them silently differently from apt would be
// worse than saying so.
func ParseSource(line string) (Source, error) {
	orig := line
	if i := strings.IndexByte(line, '#'); i >= 0 {
		line = line[:i]
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return Source{}, fmt.Errorf("sources line %q is empty", orig)
	}
	if f[0] != "deb" {
		return Source{}, fmt.Errorf("sources line %q: only \"deb\" lines are supported (not %q)", orig, f[0])
	}
	if len(f) >= 2 && strings.HasPrefix(f[1], "[") {
		return Source{}, fmt.Errorf("sources line %q: options in brackets are not supported", orig)
	}
	if len(f) < 4 {
		return Source{}, fmt.Errorf("sources line %q: want \"deb URL SUITE COMPONENT...\"", orig)
	}
	u, err := url.Parse(f[1])
	if err != nil {
		return Source{}, fmt.Errorf("sources line %q: bad URL: %v", orig, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return Source{}, fmt.Errorf("sources line %q: URL scheme must be http or https, not %q", orig, u.Scheme)
	}
	if u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return Source{}, fmt.Errorf("sources line %q: URL must be a plain http(s)://HOST/PATH", orig)
	}
	s := Source{URL: f[1], Suite: f[2]}
	if !validPathPart(s.Suite, suiteRE) || strings.HasSuffix(s.Suite, "/") {
		return Source{}, fmt.Errorf("sources line %q: bad suite %q (flat repositories are not supported)", orig, s.Suite)
	}
	for _, c := range f[3:] {
		if !validPathPart(c, componentRE) {
			return Source{}, fmt.Errorf("sources line %q: bad component %q", orig, c)
		}
		s.Components = append(s.Components, c)
	}
	return s, nil
}

func validPathPart(s string, re *regexp.Regexp) bool {
	if len(s) > 128 || !re.MatchString(s) {
		return false
	}
	for _, p := range strings.Split(s, "/") {
		if p == "" || p == "." || p == ".." {
			return false
		}
	}
	return true
}
