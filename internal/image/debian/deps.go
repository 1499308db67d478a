package debian

import (
	"fmt"
	"strings"
)

// Dep is one alternative of a dependency: "libc6 (>= 2.36)" is {libc6, "",
// ">=", "2.36"} and "python3:any" is {python3, "any", "", ""}. Op is one of
// "<<", "<=", "=", ">=", ">>" or "" (any version); the obsolete "<" and ">"
// are read as the "<=" and ">=" dpkg takes them for.
type Dep struct {
	Name, Arch, Op, Version string
}

func (d Dep) String() string {
	s := d.Name
	if d.Arch != "" {
		s += ":" + d.Arch
	}
	if d.Op != "" {
		s += " (" + d.Op + " " + d.Version + ")"
	}
	return s
}

// maxDepAlternatives bounds one relationship field, far above Debian's
// largest (a few hundred), so a hostile field cannot grow without end.
const maxDepAlternatives = 4096

// ParseDeps parses a binary package's relationship field (Depends,
// Pre-Depends, Provides) into AND-ed groups of OR-ed alternatives.
// Architecture restrictions ("[amd64]") and build profiles ("<!nocheck>")
// belong to source packages and are an error here rather than silently
// dropped. An empty field is no dependency.
func ParseDeps(s string) ([][]Dep, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var groups [][]Dep
	n := 0
	for _, g := range strings.Split(s, ",") {
		var group []Dep
		for _, alt := range strings.Split(g, "|") {
			if n++; n > maxDepAlternatives {
				return nil, fmt.Errorf("more than %d dependencies", maxDepAlternatives)
			}
			d, err := parseDep(alt)
			if err != nil {
				return nil, err
			}
			group = append(group, d)
		}
		groups = append(groups, group)
	}
	return groups, nil
}

func parseDep(s string) (Dep, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Dep{}, fmt.Errorf("empty dependency")
	}
	if strings.ContainsAny(s, "[]<>") && !strings.Contains(s, "(") {
		return Dep{}, fmt.Errorf("dependency %q: architecture restrictions and build profiles are not allowed here", clip(s))
	}
	var d Dep
	name, rest := s, ""
	if i := strings.IndexAny(s, " \t\n("); i >= 0 {
		name, rest = s[:i], strings.TrimSpace(s[i:])
	}
	if n, arch, ok := strings.Cut(name, ":"); ok {
		if !validArch(arch) {
			return Dep{}, fmt.Errorf("dependency %q: bad architecture qualifier", clip(s))
		}
		name, d.Arch = n, arch
	}
	if !validName(name) {
		return Dep{}, fmt.Errorf("dependency %q: bad package name", clip(s))
	}
	d.Name = name
	if rest == "" {
		return d, nil
	}
	if rest[0] != '(' || rest[len(rest)-1] != ')' {
		return Dep{}, fmt.Errorf("dependency %q: want NAME (OP VERSION)", clip(s))
	}
	rel := strings.TrimSpace(rest[1 : len(rest)-1])
	i := 0
	for i < len(rel) && strings.IndexByte("<=>", rel[i]) >= 0 {
		i++
	}
	op, ver := rel[:i], strings.TrimSpace(rel[i:])
	switch op {
	case "<<", "<=", "=", ">=", ">>":
	case "<":
		op = "<="
	case ">":
		op = ">="
	default:
		return Dep{}, fmt.Errorf("dependency %q: bad relation %q", clip(s), op)
	}
	if !validVersion(ver) {
		return Dep{}, fmt.Errorf("dependency %q: bad version %q", clip(s), clip(ver))
	}
	d.Op, d.Version = op, ver
	return d, nil
}

func validArch(a string) bool {
	if a == "" || len(a) > 32 {
		return false
	}
	for i := 0; i < len(a); i++ {
		if c := a[i]; !isDigit(c) && !('a' <= c && c <= 'z') && c != '-' {
			return false
		}
	}
	return true
}

// satisfies reports whether version v meets d's version constraint.
func (d Dep) satisfies(v string) bool {
	if d.Op == "" {
		return true
	}
	c := CompareVersions(v, d.Version)
	switch d.Op {
	case "<<":
		return c < 0
	case "<=":
		return c <= 0
	case "=":
		return c == 0
	case ">=":
		return c >= 0
	case ">>":
		return c > 0
	}
	return false
}
