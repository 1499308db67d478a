package main

import (
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/vmspec"
)

func TestCheckTag(t *testing.T) {
	for _, ok := range []string{"myproj", "myproj:1", "registry.example.com/me/myproj:1.2", "devcontainer-app-1a2b3c4d", "127.0.0.1:5000/x/y:dev"} {
		if err := checkTag(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "MyProj", "./x", "/abs", "x.tar", "a/../b", "x@sha256:" + strings.Repeat("a", 64), "-x", "a b", "x\n", strings.Repeat("a", 300)} {
		if err := checkTag(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The build key changes with every input and with nothing else.
func TestBuildKey(t *testing.T) {
	bases := []*oci.Record{{Manifest: "sha256:" + strings.Repeat("1", 64)}}
	k := buildKey([]byte("FROM x\n"), map[string]string{"A": "1", "B": "2"}, "", vmspec.AMD64, "sha256:c", bases)
	if again := buildKey([]byte("FROM x\n"), map[string]string{"B": "2", "A": "1"}, "", vmspec.AMD64, "sha256:c", bases); again != k {
		t.Error("the same inputs gave another key")
	}
	for name, other := range map[string]string{
		"dockerfile": buildKey([]byte("FROM y\n"), map[string]string{"A": "1", "B": "2"}, "", vmspec.AMD64, "sha256:c", bases),
		"arg":        buildKey([]byte("FROM x\n"), map[string]string{"A": "1", "B": "3"}, "", vmspec.AMD64, "sha256:c", bases),
		"arg split":  buildKey([]byte("FROM x\n"), map[string]string{"A": "1B=2"}, "", vmspec.AMD64, "sha256:c", bases),
		"target":     buildKey([]byte("FROM x\n"), map[string]string{"A": "1", "B": "2"}, "t", vmspec.AMD64, "sha256:c", bases),
		"arch":       buildKey([]byte("FROM x\n"), map[string]string{"A": "1", "B": "2"}, "", vmspec.ARM64, "sha256:c", bases),
		"context":    buildKey([]byte("FROM x\n"), map[string]string{"A": "1", "B": "2"}, "", vmspec.AMD64, "sha256:d", bases),
		"base":       buildKey([]byte("FROM x\n"), map[string]string{"A": "1", "B": "2"}, "", vmspec.AMD64, "sha256:c", []*oci.Record{{Manifest: "sha256:" + strings.Repeat("2", 64)}}),
	} {
		if other == k {
			t.Errorf("a changed %s kept the key", name)
		}
	}
}

// stepWriter shows buildah's STEP lines, cleaned and cut, and passes
// everything on.
func TestStepWriter(t *testing.T) {
	var got []string
	var out strings.Builder
	w := &stepWriter{w: &out, step: func(s string) { got = append(got, s) }}
	w.Write([]byte("STEP 1/2: FROM x\nsome output\nSTEP 2/2: RUN echo \x1b[2J" + strings.Repeat("y", 100)))
	w.Flush()
	if len(got) != 2 || got[0] != "STEP 1/2: FROM x" || strings.Contains(got[1], "\x1b") || len(got[1]) > 72 {
		t.Errorf("steps %q", got)
	}
	if !strings.Contains(out.String(), "some output") {
		t.Error("output not passed on")
	}
}

func TestReadBuildArgs(t *testing.T) {
	t.Setenv("KOSA8_TEST_ARG", "from-host")
	m, err := readBuildArgs([]string{"A=1", "B=", "KOSA8_TEST_ARG", "KOSA8_TEST_UNSET_ARG", "C=x=y"})
	if err != nil || m["A"] != "1" || m["B"] != "" || m["KOSA8_TEST_ARG"] != "from-host" || m["C"] != "x=y" {
		t.Errorf("%v %v", m, err)
	}
	if _, ok := m["KOSA8_TEST_UNSET_ARG"]; ok {
		t.Error("an unset host variable was passed")
	}
	if _, err := readBuildArgs([]string{"=x"}); err == nil {
		t.Error("an empty name passed")
	}
}
