package dockerfile

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

var amd64 = Platform{OS: "linux", Arch: "amd64"}

func plan(t *testing.T, src string, args map[string]string, target string) *Plan {
	t.Helper()
	f, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	pl, err := f.Plan(args, target, amd64)
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	return pl
}

func TestPlanImages(t *testing.T) {
	for _, c := range []struct {
		name, src, target string
		args              map[string]string
		images            []string
		stages            int
	}{
		{name: "one image", src: "FROM python:3.12-slim\nRUN pip install x\n", images: []string{"python:3.12-slim"}, stages: 1},
		{name: "scratch", src: "FROM scratch\nCOPY a /a\n", images: nil, stages: 1},
		{name: "global arg default", src: "ARG BASE=debian:trixie\nFROM ${BASE} AS build\nRUN make\nFROM build\n", images: []string{"debian:trixie"}, stages: 2},
		{name: "build arg wins", src: "ARG BASE=debian:trixie\nFROM $BASE\n", args: map[string]string{"BASE": "alpine:3.20"}, images: []string{"alpine:3.20"}, stages: 1},
		{name: "default word", src: "ARG V\nFROM node:${V:-22}-bookworm\n", images: []string{"node:22-bookworm"}, stages: 1},
		{name: "alternative word", src: "ARG SLIM=1\nFROM python:3.12${SLIM:+-slim}\n", images: []string{"python:3.12-slim"}, stages: 1},
		{name: "platform args", src: "FROM --platform=$BUILDPLATFORM golang:1.24 AS b\nFROM example.com/base-${TARGETARCH}:1\nCOPY --from=b /x /x\n", images: []string{"golang:1.24", "example.com/base-amd64:1"}, stages: 2},
		{name: "copy from image", src: "FROM debian:trixie\nCOPY --from=ghcr.io/astral-sh/uv:0.5 /uv /bin/\n", images: []string{"debian:trixie", "ghcr.io/astral-sh/uv:0.5"}, stages: 1},
		{name: "copy from stage index and name", src: "FROM alpine:3 AS A\nFROM busybox:1\nCOPY --from=0 /a /a\nCOPY --from=a /b /b\n", images: []string{"alpine:3", "busybox:1"}, stages: 2},
		{name: "mount from image", src: "FROM debian:trixie\nRUN --mount=type=bind,from=alpine:3,source=/,target=/a ls /a\n", images: []string{"debian:trixie", "alpine:3"}, stages: 1},
		{name: "unused stage", src: "FROM golang:1.24 AS unused\nFROM debian:trixie AS final\n", images: []string{"debian:trixie"}, stages: 2},
		{name: "target", src: "FROM golang:1.24 AS dev\nFROM debian:trixie AS final\n", target: "dev", images: []string{"golang:1.24"}, stages: 2},
		{name: "target needs stage", src: "FROM golang:1.24 AS b\nFROM debian:trixie AS t\nCOPY --from=b /x /x\nFROM alpine:3\n", target: "T", images: []string{"golang:1.24", "debian:trixie"}, stages: 3},
		{name: "digest", src: "FROM python@sha256:" + strings.Repeat("ab", 32) + "\n", images: []string{"python@sha256:" + strings.Repeat("ab", 32)}, stages: 1},
		{name: "lower-case keywords and comments", src: "# a comment\nfrom alpine:3 as base\n  # indented comment\nrun echo hi\n", images: []string{"alpine:3"}, stages: 1},
		{name: "stage arg not global", src: "FROM alpine:3\nARG X=evil:1\nCOPY --from=alpine:3 /a /a\n", images: []string{"alpine:3"}, stages: 1},
		{name: "same image twice", src: "FROM alpine:3 AS a\nFROM alpine:3\nCOPY --from=a /a /a\n", images: []string{"alpine:3"}, stages: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl := plan(t, c.src, c.args, c.target)
			if !slices.Equal(pl.Images, c.images) {
				t.Errorf("images %q, want %q", pl.Images, c.images)
			}
			if len(pl.Stages) != c.stages {
				t.Errorf("%d stages, want %d", len(pl.Stages), c.stages)
			}
		})
	}
}

func TestParseContinuationsHeredocsEscape(t *testing.T) {
	src := "# syntax=docker/dockerfile:1\n" +
		"FROM \\\n" +
		"  # a comment inside the continuation\n" +
		"  debian:trixie AS base\n" +
		"RUN <<EOF\n" +
		"FROM evil:1\n" +
		"COPY --from=evil:2 / /\n" +
		"EOF\n" +
		"RUN cat <<-'END' > /x\n" +
		"\tFROM evil:3\n" +
		"\tEND\n" +
		"FROM base\n" +
		"COPY --from=base /a /b\n"
	pl := plan(t, src, nil, "")
	if !slices.Equal(pl.Images, []string{"debian:trixie"}) || len(pl.Stages) != 2 {
		t.Fatalf("images %q, %d stages: a heredoc's lines were read as instructions", pl.Images, len(pl.Stages))
	}
	f, _ := Parse([]byte(src))
	var kw []string
	for _, in := range f.Instructions {
		kw = append(kw, fmt.Sprintf("%s@%d", in.Keyword, in.Line))
	}
	if got := strings.Join(kw, " "); got != "FROM@2 RUN@5 RUN@9 FROM@12 COPY@13" {
		t.Errorf("instructions %s", got)
	}

	bt := "# escape=`\nFROM mcr.microsoft.com/base:1 `\n  AS win\nRUN dir c:\\\n"
	f, err := Parse([]byte(bt))
	if err != nil || f.Escape != '`' {
		t.Fatalf("escape directive: %v %q", err, f.Escape)
	}
	pl, err = f.Plan(nil, "", amd64)
	if err != nil || pl.Stages[0].Name != "win" || pl.Images[0] != "mcr.microsoft.com/base:1" {
		t.Fatalf("backtick continuation: %v %+v", err, pl)
	}
	// A directive after the first instruction is a comment.
	f, _ = Parse([]byte("FROM a:1\n# escape=`\nRUN x `\nRUN y\n"))
	if f.Escape != '\\' || len(f.Instructions) != 3 {
		t.Errorf("a late escape directive was obeyed: %q, %d instructions", f.Escape, len(f.Instructions))
	}
}

func TestRewrite(t *testing.T) {
	src := "ARG BASE=debian:trixie\n" +
		"FROM --platform=$BUILDPLATFORM golang:1.24 AS build\n" +
		"RUN --mount=type=cache,target=/root/.cache --mount=type=bind,from=alpine:3,target=/a go build\n" +
		"FROM ${BASE}\n" +
		"COPY --from=build /app /app\n" +
		"COPY --from=ghcr.io/x/uv:1 /uv /bin/\n" +
		"FROM \\\n  alpine:3 AS unused\n"
	pl := plan(t, src, nil, "1")
	out, err := pl.Rewrite(map[string]string{
		"golang:1.24": "localhost/kosa8/from-1", "alpine:3": "localhost/kosa8/from-2",
		"debian:trixie": "localhost/kosa8/from-3", "ghcr.io/x/uv:1": "localhost/kosa8/from-4",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "ARG BASE=debian:trixie\n" +
		"FROM  localhost/kosa8/from-1 AS build\n" +
		"RUN --mount=type=cache,target=/root/.cache --mount=type=bind,from=localhost/kosa8/from-2,target=/a go build\n" +
		"FROM localhost/kosa8/from-3\n" +
		"COPY --from=build /app /app\n" +
		"COPY --from=localhost/kosa8/from-4 /uv /bin/\n" +
		"FROM \\\n  localhost/kosa8/from-2 AS unused\n"
	if string(out) != want {
		t.Errorf("rewritten:\n%s\nwant:\n%s", out, want)
	}
	// A name missing from the map is refused.
	if _, err := pl.Rewrite(map[string]string{"golang:1.24": "x"}); err == nil {
		t.Error("a rewrite without every image's local name passed")
	}
	// An image split across a continuation cannot be replaced.
	pl = plan(t, "FROM alp\\\nine:3\n", nil, "")
	if pl.Images[0] != "alpine:3" {
		t.Fatalf("split name read as %q", pl.Images[0])
	}
	if _, err := pl.Rewrite(map[string]string{"alpine:3": "x"}); err == nil || !strings.Contains(err.Error(), "split across lines") {
		t.Errorf("split name: %v", err)
	}
}

func TestPlanRefusals(t *testing.T) {
	for _, c := range []struct{ name, src, want string }{
		{"no from", "RUN true\n", "before the first FROM"},
		{"empty", "# nothing\n", "no FROM"},
		{"only arg", "ARG X=1\n", "no FROM"},
		{"bad stage name", "FROM a:1 AS Bad/Name\n", "stage name"},
		{"duplicate stage", "FROM a:1 AS x\nFROM b:1 AS x\n", "a second stage"},
		{"from needs image", "FROM\n", "FROM takes"},
		{"from too many words", "FROM a b c d\n", "FROM takes"},
		{"empty arg", "ARG BASE\nFROM $BASE\n", "empty"},
		{"unknown expansion", "ARG B=x:1\nFROM ${B%:1}\n", "expands only"},
		{"not a reference", "FROM a;rm\n", "not an image reference"},
		{"unknown from flag", "FROM --foo=1 a:1\n", "only --platform"},
		{"no such stage index", "FROM a:1\nCOPY --from=3 / /\n", "no earlier stage"},
		{"unclosed heredoc", "FROM a:1\nRUN <<EOF\necho\n", "not closed"},
		{"bad escape", "# escape=x\nFROM a:1\n", "escape directive"},
		{"nul", "FROM a:1\x00\n", "NUL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := Parse([]byte(c.src))
			if err == nil {
				_, err = f.Plan(nil, "", amd64)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrSyntax) {
				t.Errorf("err %v, want one saying %q", err, c.want)
			}
		})
	}
	if _, err := Parse([]byte(strings.Repeat("#", MaxSize+1))); err == nil {
		t.Error("a file over MaxSize was read")
	}
	if _, err := Parse([]byte(strings.Repeat("RUN x\n", MaxInstructions+1))); err == nil {
		t.Error("more than MaxInstructions were read")
	}
	f, _ := Parse([]byte(strings.Repeat("FROM a:1\n", MaxStages+1)))
	if _, err := f.Plan(nil, "", amd64); err == nil {
		t.Error("more than MaxStages were read")
	}
	var b strings.Builder
	b.WriteString("FROM a:1\n")
	for i := 0; i <= MaxImages; i++ {
		fmt.Fprintf(&b, "COPY --from=img%d:1 / /\n", i)
	}
	f, _ = Parse([]byte(b.String()))
	if _, err := f.Plan(nil, "", amd64); err == nil {
		t.Error("more than MaxImages were accepted")
	}
	f, _ = Parse([]byte("FROM a:1 AS x\n"))
	if _, err := f.Plan(nil, "nope", amd64); err == nil || !strings.Contains(err.Error(), "no stage named") {
		t.Errorf("unknown target: %v", err)
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": ""}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for in, want := range map[string]string{
		"$A":             "a",
		"${A}b":          "ab",
		"$Ab":            "",
		`\$A`:            "$A",
		"${EMPTY:-d}":    "d",
		"${EMPTY-d}":     "",
		"${UNSET-d}":     "d",
		"${A:+alt}":      "alt",
		"${EMPTY:+alt}":  "",
		"${EMPTY+alt}":   "alt",
		"x$":             "x$",
		"$1":             "$1",
		"plain:tag@sha1": "plain:tag@sha1",
	} {
		got, err := expand(in, lookup, '\\')
		if err != nil || got != want {
			t.Errorf("expand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"${A", "${}", "${A/x/y}", "${A#x}"} {
		if _, err := expand(bad, lookup, '\\'); err == nil {
			t.Errorf("expand(%q) passed", bad)
		}
	}
}

// FuzzDockerfile: any input parses or fails without panicking, and a plan
// rewritten with local names plans again to exactly those names.
func FuzzDockerfile(f *testing.F) {
	for _, s := range []string{
		"FROM python:3.12\nRUN x\n",
		"ARG B=a:1\nFROM --platform=$BUILDPLATFORM ${B} AS s\nCOPY --from=s / /\nFROM s\nRUN --mount=type=bind,from=b:2,target=/b x\n",
		"# escape=`\nFROM a:1 `\n AS x\n",
		"FROM a:1\nRUN <<EOF\nFROM b:1\nEOF\nCOPY <<-X /y\n\tz\n\tX\n",
		"FROM \\\n# c\n\n a:1\n",
		"FROM a\\\n:1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		df, err := Parse(b)
		if err != nil {
			return
		}
		pl, err := df.Plan(map[string]string{"X": "x:1"}, "", amd64)
		if err != nil {
			return
		}
		local := map[string]string{}
		for i, r := range pl.Images {
			local[r] = fmt.Sprintf("localhost/kosa8/from-%d", i)
		}
		out, err := pl.Rewrite(local)
		if err != nil {
			return
		}
		df2, err := Parse(out)
		if err != nil {
			t.Fatalf("the rewritten file does not parse: %v\n%q\nfrom %q", err, out, b)
		}
		pl2, err := df2.Plan(map[string]string{"X": "x:1"}, "", amd64)
		if err != nil {
			t.Fatalf("the rewritten file does not plan: %v\n%q\nfrom %q", err, out, b)
		}
		for _, r := range pl2.Images {
			if !strings.HasPrefix(r, "localhost/kosa8/from-") {
				t.Fatalf("the rewritten file still names %q:\n%q\nfrom %q", r, out, b)
			}
		}
		if len(pl2.Stages) != len(pl.Stages) {
			t.Fatalf("%d stages became %d", len(pl.Stages), len(pl2.Stages))
		}
	})
}

// A repository's Dockerfile (a dev container's build) is planned on the
// host. Its ARG defaults expand earlier ARGs, each bounded as written but
// not as expanded: ARG B=$A$A$A... (700 times in 2 KiB) makes B 700 times
// A, C of B 700 times again, and four such lines ask for terabytes. An
// expansion is bounded as its source is.
func TestPlanBoundsExpandedArgs(t *testing.T) {
	src := "ARG A=" + strings.Repeat("x", 500) + "\n" +
		"ARG B=" + strings.Repeat("$A", 1000) + "\n" +
		"ARG C=" + strings.Repeat("$B", 1000) + "\n" +
		"ARG D=" + strings.Repeat("$C", 1000) + "\n" +
		"FROM debian:13\n"
	f, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if _, err := f.Plan(nil, "", amd64); err == nil || !errors.Is(err, ErrSyntax) {
		t.Fatalf("Plan of ARGs that expand to terabytes: %v, want a refusal", err)
	}
}
