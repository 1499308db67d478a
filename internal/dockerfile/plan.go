package dockerfile

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Plan is what a build needs from outside: its stages and the images they
// name, for the target stage and the stages it depends on.
type Plan struct {
	Stages []Stage
	// Target is the index of the stage built.
	Target int
	// Images are the distinct images the needed stages name (FROM,
	// COPY --from, RUN --mount from=), in order of first use.
	Images []string
	uses   []use
	strip  []Word // --platform flags of FROM, removed in the copy
	f      *File
}

// Stage is one FROM and what follows it.
type Stage struct {
	Name string // AS name, lower case ("" when unnamed)
	Line int
	// Base is what FROM names, its build arguments expanded: an image
	// reference, "scratch", or an earlier stage (BaseStage >= 0).
	Base      string
	BaseStage int
	// Needs are the earlier stages this one reads (its base, COPY
	// --from, RUN --mount from=).
	Needs []int
	// Images are the images this stage names.
	Images []string
}

// use is one place an image is named: the bytes to replace in the file.
type use struct {
	ref        string
	start, end int
	line       int
}

// Platform is the platform of the build: the builder sandbox's. It gives
// the build arguments BuildKit predefines (TARGETARCH and the like).
type Platform struct {
	OS, Arch, Variant string
}

func (p Platform) String() string {
	s := p.OS + "/" + p.Arch
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// platformArgs are the build arguments BuildKit defines in the global
// scope: the build runs on the target platform (the builder sandbox's).
func platformArgs(p Platform) map[string]string {
	return map[string]string{
		"TARGETPLATFORM": p.String(), "TARGETOS": p.OS, "TARGETARCH": p.Arch, "TARGETVARIANT": p.Variant,
		"BUILDPLATFORM": p.String(), "BUILDOS": p.OS, "BUILDARCH": p.Arch, "BUILDVARIANT": p.Variant,
	}
}

var (
	stageNameRE = regexp.MustCompile(`^[a-z][a-z0-9_.-]*$`)
	// refRE is the shape of an image reference: the registry checks the
	// rest when it is pulled.
	refRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._/:@+-]*$`)
)

// Plan reads the stages of f: the global build arguments (ARG before the
// first FROM, then args given on the command line), each stage's base,
// and the images the target's stages name. target "" builds the last
// stage.
func (f *File) Plan(args map[string]string, target string, p Platform) (*Plan, error) {
	pl := &Plan{f: f}
	global := platformArgs(p)
	lookup := func(name string) (string, bool) {
		v, ok := global[name]
		return v, ok
	}
	for _, in := range f.Instructions {
		switch in.Keyword {
		case "ARG":
			if len(pl.Stages) > 0 {
				continue // a stage's own ARG: not visible to FROM
			}
			for _, w := range in.Words {
				name, def, hasDef := strings.Cut(w.Text, "=")
				if !argNameRE.MatchString(name) {
					return nil, syntaxErr(in.Line, "ARG %q: not a name", clip(name))
				}
				if v, ok := args[name]; ok {
					global[name] = v
					continue
				}
				if hasDef {
					v, err := expand(unquote(def), lookup, f.Escape)
					if err != nil {
						return nil, syntaxErr(in.Line, "ARG %s: %v", name, err)
					}
					global[name] = v
				} else if _, ok := global[name]; !ok {
					global[name] = ""
				}
			}
		case "FROM":
			if len(pl.Stages) >= MaxStages {
				return nil, syntaxErr(in.Line, "more than %d stages", MaxStages)
			}
			st, err := pl.from(in, lookup)
			if err != nil {
				return nil, err
			}
			pl.Stages = append(pl.Stages, st)
		case "COPY", "ADD", "RUN":
			if len(pl.Stages) == 0 {
				return nil, syntaxErr(in.Line, "%s before the first FROM", in.Keyword)
			}
			if err := pl.fromFlags(in, lookup); err != nil {
				return nil, err
			}
		default:
			if len(pl.Stages) == 0 {
				return nil, syntaxErr(in.Line, "%s before the first FROM (only ARG may come before it)", clip(in.Keyword))
			}
		}
	}
	if len(pl.Stages) == 0 {
		return nil, fmt.Errorf("%w: no FROM instruction", ErrSyntax)
	}
	pl.Target = len(pl.Stages) - 1
	if target != "" {
		k := pl.stage(strings.ToLower(target), len(pl.Stages))
		if k < 0 {
			return nil, fmt.Errorf("%w: no stage named %q (the stages: %s)", ErrSyntax, clip(target), pl.stageNames())
		}
		pl.Target = k
	}
	// The images of the stages the target needs, in the file's order.
	need := map[int]bool{}
	var visit func(int)
	visit = func(k int) {
		if need[k] {
			return
		}
		need[k] = true
		for _, d := range pl.Stages[k].Needs {
			visit(d)
		}
	}
	visit(pl.Target)
	for k, st := range pl.Stages {
		if !need[k] {
			continue
		}
		for _, r := range st.Images {
			if !slices.Contains(pl.Images, r) {
				pl.Images = append(pl.Images, r)
			}
		}
	}
	if len(pl.Images) > MaxImages {
		return nil, fmt.Errorf("%w: names more than %d images", ErrSyntax, MaxImages)
	}
	return pl, nil
}

// stage finds an earlier stage by name or index (below before).
func (pl *Plan) stage(name string, before int) int {
	if n, err := strconv.Atoi(name); err == nil {
		if n >= 0 && n < before {
			return n
		}
		return -1
	}
	for k := 0; k < before && k < len(pl.Stages); k++ {
		if pl.Stages[k].Name != "" && pl.Stages[k].Name == name {
			return k
		}
	}
	return -1
}

func (pl *Plan) stageNames() string {
	var n []string
	for k, st := range pl.Stages {
		if st.Name != "" {
			n = append(n, st.Name)
		} else {
			n = append(n, strconv.Itoa(k))
		}
	}
	return strings.Join(n, ", ")
}

func (pl *Plan) from(in *Instruction, lookup func(string) (string, bool)) (Stage, error) {
	flags, rest := in.flags()
	for _, fl := range flags {
		name, _, _ := flagValue(fl)
		if name != "platform" {
			return Stage{}, syntaxErr(in.Line, "FROM flag %q: kosa8 knows only --platform", clip(fl.Text))
		}
		// The build is for the sandbox's platform; the images are pulled
		// for it. The flag goes from the copy handed to buildah.
		pl.strip = append(pl.strip, fl)
	}
	st := Stage{Line: in.Line, BaseStage: -1}
	switch {
	case len(rest) == 1:
	case len(rest) == 3 && strings.EqualFold(rest[1].Text, "AS"):
		st.Name = strings.ToLower(rest[2].Text)
		if !stageNameRE.MatchString(st.Name) {
			return st, syntaxErr(in.Line, "stage name %q: use letters, digits, '-', '_' and '.', starting with a letter", clip(rest[2].Text))
		}
		if pl.stage(st.Name, len(pl.Stages)) >= 0 {
			return st, syntaxErr(in.Line, "a second stage named %q", st.Name)
		}
	default:
		return st, syntaxErr(in.Line, "FROM takes an image and an optional 'AS name'")
	}
	base, err := expand(rest[0].Text, lookup, pl.f.Escape)
	if err != nil {
		return st, syntaxErr(in.Line, "FROM %s: %v", clip(rest[0].Text), err)
	}
	if base == "" {
		return st, syntaxErr(in.Line, "FROM %s: the image name is empty (a build argument without a value?)", clip(rest[0].Text))
	}
	st.Base = base
	if k := pl.stage(strings.ToLower(base), len(pl.Stages)); k >= 0 && !isNumber(base) {
		st.BaseStage = k
		st.Needs = append(st.Needs, k)
		return st, nil
	}
	if strings.EqualFold(base, "scratch") {
		st.Base = "scratch"
		return st, nil
	}
	if err := pl.image(&st, base, rest[0], 0, len(rest[0].Text), in.Line); err != nil {
		return st, err
	}
	return st, nil
}

// fromFlags reads COPY --from and RUN --mount=...,from= of the current
// stage.
func (pl *Plan) fromFlags(in *Instruction, lookup func(string) (string, bool)) error {
	st := &pl.Stages[len(pl.Stages)-1]
	flags, _ := in.flags()
	for _, fl := range flags {
		name, value, at := flagValue(fl)
		switch {
		case in.Keyword == "COPY" && name == "from":
			if err := pl.source(st, in, fl, value, at, lookup); err != nil {
				return err
			}
		case in.Keyword == "RUN" && name == "mount":
			// type=bind,from=x,source=/y,target=/z (comma-separated; no
			// quotes in the from= part kosa8 reads)
			off := at
			for _, kv := range strings.Split(value, ",") {
				k, v, _ := strings.Cut(kv, "=")
				if strings.EqualFold(strings.TrimSpace(k), "from") {
					if err := pl.source(st, in, fl, v, off+len(k)+1, lookup); err != nil {
						return err
					}
				}
				off += len(kv) + 1
			}
		}
	}
	return nil
}

// source records what a --from names: an earlier stage, or an image.
func (pl *Plan) source(st *Stage, in *Instruction, fl Word, value string, at int, lookup func(string) (string, bool)) error {
	v, err := expand(value, lookup, pl.f.Escape)
	if err != nil {
		return syntaxErr(in.Line, "%s: %v", clip(fl.Text), err)
	}
	if v == "" {
		return syntaxErr(in.Line, "%s: names nothing", clip(fl.Text))
	}
	cur := len(pl.Stages) - 1
	if k := pl.stage(strings.ToLower(v), cur); k >= 0 {
		st.Needs = append(st.Needs, k)
		return nil
	}
	if isNumber(v) {
		return syntaxErr(in.Line, "%s: no earlier stage %s", clip(fl.Text), v)
	}
	return pl.image(st, v, fl, at, at+len(value), in.Line)
}

// image records ref, named at w.Text[i:j].
func (pl *Plan) image(st *Stage, ref string, w Word, i, j, line int) error {
	if len(ref) > maxRefLen || !refRE.MatchString(ref) {
		return syntaxErr(line, "%q is not an image reference", clip(ref))
	}
	if !slices.Contains(st.Images, ref) {
		st.Images = append(st.Images, ref)
	}
	s, e, ok := w.sub(i, j)
	if !ok {
		s, e = -1, -1
	}
	pl.uses = append(pl.uses, use{ref: ref, start: s, end: e, line: line})
	return nil
}

func isNumber(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}

// Rewrite returns the Dockerfile with every image of the plan named by
// local[ref] instead (the name the builder knows it under), and FROM's
// --platform flags removed. Every image of Images must be in local.
func (pl *Plan) Rewrite(local map[string]string) ([]byte, error) {
	type edit struct {
		start, end int
		with       string
	}
	var edits []edit
	for _, u := range pl.uses {
		name, ok := local[u.ref]
		if !ok {
			if slices.Contains(pl.Images, u.ref) {
				return nil, fmt.Errorf("no local name for %s", u.ref)
			}
			continue // a stage the target does not need: buildah skips it
		}
		if u.start < 0 {
			return nil, syntaxErr(u.line, "the image %s is split across lines: write it on one line", clip(u.ref))
		}
		edits = append(edits, edit{u.start, u.end, name})
	}
	for _, w := range pl.strip {
		if w.Start < 0 {
			return nil, fmt.Errorf("%w: a FROM --platform flag split across lines", ErrSyntax)
		}
		edits = append(edits, edit{w.Start, w.End, ""})
	}
	sort.Slice(edits, func(a, b int) bool { return edits[a].start > edits[b].start })
	out := append([]byte(nil), pl.f.src...)
	last := len(out) + 1
	for _, e := range edits {
		if e.end > last {
			return nil, fmt.Errorf("%w: overlapping image names", ErrSyntax)
		}
		out = append(out[:e.start], append([]byte(e.with), out[e.end:]...)...)
		last = e.start
	}
	return out, nil
}

var argNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// unquote removes one pair of surrounding quotes.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// expand replaces $NAME, ${NAME}, ${NAME:-word} and ${NAME:+word} (and the
// forms without the colon) with build arguments; esc escapes a $. The
// result is bounded as s is: an ARG made of an earlier one many times over,
// and the next of it, would otherwise grow without end.
func expand(s string, lookup func(string) (string, bool), esc byte) (string, error) {
	if len(s) > maxRefLen*4 {
		return "", fmt.Errorf("longer than %d bytes", maxRefLen*4)
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if b.Len() > maxRefLen*4 {
			return "", fmt.Errorf("longer than %d bytes once expanded", maxRefLen*4)
		}
		c := s[i]
		switch {
		case c == esc && i+1 < len(s) && s[i+1] == '$':
			b.WriteByte('$')
			i++
		case c != '$':
			b.WriteByte(c)
		case i+1 < len(s) && s[i+1] == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("${ without }")
			}
			inner := s[i+2 : i+end]
			i += end
			name := inner
			op, word := "", ""
			for k := 0; k < len(inner); k++ {
				if !isNameByte(inner[k], k) {
					name, op = inner[:k], inner[k:]
					break
				}
			}
			if name == "" {
				return "", fmt.Errorf("${%s}: not a build argument", clip(inner))
			}
			v, set := lookup(name)
			switch {
			case op == "":
				b.WriteString(v)
			case strings.HasPrefix(op, ":-"), strings.HasPrefix(op, "-"):
				word = strings.TrimPrefix(strings.TrimPrefix(op, ":"), "-")
				if v == "" && (op[0] == ':' || !set) {
					v = word
				}
				b.WriteString(v)
			case strings.HasPrefix(op, ":+"), strings.HasPrefix(op, "+"):
				word = strings.TrimPrefix(strings.TrimPrefix(op, ":"), "+")
				if (op[0] == ':' && v != "") || (op[0] == '+' && set) {
					b.WriteString(word)
				}
			default:
				return "", fmt.Errorf("${%s}: kosa8 expands only $X, ${X}, ${X:-default} and ${X:+alternative} where images are named: write the image name out", clip(inner))
			}
		default:
			k := i + 1
			for k < len(s) && isNameByte(s[k], k-i-1) {
				k++
			}
			if k == i+1 {
				b.WriteByte('$')
				continue
			}
			v, _ := lookup(s[i+1 : k])
			b.WriteString(v)
			i = k - 1
		}
	}
	if b.Len() > maxRefLen*4 {
		return "", fmt.Errorf("longer than %d bytes once expanded", maxRefLen*4)
	}
	return b.String(), nil
}

func isNameByte(c byte, k int) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (k > 0 && c >= '0' && c <= '9')
}

// clip shortens s for an error message and replaces control characters
// (the file is the repository's).
func clip(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
