package debian

import (
	"fmt"
	"slices"
	"strings"
)

// Resolve returns the closure of roots over Pre-Depends and Depends (not
// Recommends or Suggests), sorted by name, the way apt installs without
// recommends:
//
//   - an OR group is satisfied if any alternative is already selected (a
//     real package meeting its version constraint, or for an unversioned
//     alternative, a selected package providing it);
//   - else the first alternative that is a real package of the index and
//     meets its constraint is selected;
//   - else a package providing an unversioned alternative is (one already
//     selected, else the lowest name, so the result is deterministic).
//
// A Provides meets any unversioned dependency on its name, and a versioned
// one only when it names a version ("Provides: foo (= 1.2)") that meets it,
// as in dpkg (Debian's npm needs node-cssesc (>= 3.0~), provided so). Architecture
// qualifiers ":any", ":native" and ":ARCH" for the index's own
// architecture are accepted; another architecture's never matches. Roots
// may name virtual packages. All roots are selected before any dependency,
// so an OR group prefers what was asked for. Roots that do not exist are
// one error listing them all; a dependency that cannot be met is an error
// naming both packages.
func (ix *Index) Resolve(roots []string) ([]*Package, error) {
	sel := map[string]*Package{}
	var queue []*Package
	add := func(p *Package) error {
		if sel[p.Name] != nil {
			return nil
		}
		if p.problem != "" {
			return fmt.Errorf("package %s %s from %s cannot be installed: %s (the mirror's Packages entry is malformed)", p.Name, p.Version, p.Base, p.problem)
		}
		sel[p.Name] = p
		queue = append(queue, p)
		return nil
	}
	var missing, virtual []string
	for _, r := range roots {
		name, arch, _ := strings.Cut(r, ":")
		if arch != "" && !ix.archOK(arch) {
			missing = append(missing, r)
			continue
		}
		if p := ix.pkgs[name]; p != nil {
			if err := add(p); err != nil {
				return nil, err
			}
		} else if len(ix.provides[name]) > 0 {
			virtual = append(virtual, name)
		} else {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("no package in the index for %s", strings.Join(missing, ", "))
	}
	for _, v := range virtual {
		if ix.providedBySelected(sel, Dep{Name: v}) {
			continue
		}
		if err := add(ix.provides[v][0]); err != nil {
			return nil, err
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, groups := range [][][]Dep{p.PreDepends, p.Depends} {
			for _, g := range groups {
				q, err := ix.choose(sel, p, g)
				if err != nil {
					return nil, err
				}
				if q != nil {
					if err := add(q); err != nil {
						return nil, fmt.Errorf("%s depends on it: %w", p.Name, err)
					}
				}
			}
		}
	}
	out := make([]*Package, 0, len(sel))
	for _, p := range sel {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Package) int { return strings.Compare(a.Name, b.Name) })
	ix.logf("resolved %d roots to %d packages", len(roots), len(out))
	return out, nil
}

// choose returns the package to select for OR group g of p, or nil if the
// group is already satisfied.
func (ix *Index) choose(sel map[string]*Package, p *Package, g []Dep) (*Package, error) {
	for _, d := range g {
		if !ix.archOK(d.Arch) {
			continue
		}
		if q := sel[d.Name]; q != nil && d.satisfies(q.Version) {
			return nil, nil
		}
		if ix.providedBySelected(sel, d) {
			return nil, nil
		}
	}
	var unmet []string
	for _, d := range g {
		if !ix.archOK(d.Arch) {
			unmet = append(unmet, d.String()+" (another architecture)")
			continue
		}
		q := ix.pkgs[d.Name]
		if q == nil {
			continue
		}
		if d.satisfies(q.Version) {
			return q, nil
		}
		unmet = append(unmet, fmt.Sprintf("%s but the index has %s %s", d, q.Name, q.Version))
	}
	for _, d := range g {
		if !ix.archOK(d.Arch) || len(ix.provides[d.Name]) == 0 {
			continue
		}
		for _, q := range ix.provides[d.Name] {
			if q.provides(d) {
				return q, nil
			}
		}
		unmet = append(unmet, fmt.Sprintf("%s but no package provides that version", d))
	}
	if len(unmet) == 0 {
		unmet = append(unmet, "none of them is in the index")
	}
	return nil, fmt.Errorf("%s %s depends on %s: %s", p.Name, p.Version, groupString(g), strings.Join(unmet, "; "))
}

// providedBySelected reports whether a selected package provides d.
func (ix *Index) providedBySelected(sel map[string]*Package, d Dep) bool {
	for _, q := range ix.provides[d.Name] {
		if sel[q.Name] == q && q.provides(d) {
			return true
		}
	}
	return false
}

// archOK reports whether an architecture qualifier can be met by this
// index's packages (all of one architecture, or "all").
func (ix *Index) archOK(arch string) bool {
	return arch == "" || arch == "any" || arch == "native" || arch == ix.arch
}

func groupString(g []Dep) string {
	s := make([]string, len(g))
	for i, d := range g {
		s[i] = d.String()
	}
	return strings.Join(s, " | ")
}

// provides reports whether p's Provides meets d.
func (p *Package) provides(d Dep) bool {
	if d.Op == "" {
		return slices.Contains(p.Provides, d.Name)
	}
	v, ok := p.provided[d.Name]
	return ok && d.satisfies(v)
}
