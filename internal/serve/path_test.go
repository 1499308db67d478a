package serve

import (
	"errors"
	"path"
	"strings"
	"testing"
)

func TestContractPath(t *testing.T) {
	for _, tc := range []struct {
		base, in, want string
		outside        bool
	}{
		{"", "a.txt", "./a.txt", false},
		{"", "/a.txt", "./a.txt", false},
		{"", "//etc/passwd", "./etc/passwd", false},
		{"", ".", ".", false},
		{"", "/", ".", false},
		{"", "a/../b", "./b", false},
		{"", "-rf", "./-rf", false},
		{"/workspace", "x/y", "/workspace/x/y", false},
		{"/workspace", "/", "/workspace", false},
		{"", "..", "", true},
		{"", "a/../../b", "", true},
		{"/workspace", "/../etc/passwd", "", true},
	} {
		got, err := contractPath(tc.base, tc.in)
		if tc.outside {
			if !errors.Is(err, ErrOutside) {
				t.Errorf("contractPath(%q, %q) = %q, %v: want ErrOutside", tc.base, tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("contractPath(%q, %q) = %q, %v: want %q", tc.base, tc.in, got, err, tc.want)
		}
	}
	if _, err := contractPath("", "a\x00b"); err == nil {
		t.Error("NUL taken")
	}
}

func FuzzContractPath(f *testing.F) {
	for _, s := range []string{"a", "/a/../b", "..", "a/../../b", "./.././x", "x//y/", "-n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := contractPath("/base", p)
		if err != nil {
			return
		}
		// Whatever is taken stays at or under the base, and is clean.
		if got != "/base" && !strings.HasPrefix(got, "/base/") {
			t.Fatalf("%q became %q", p, got)
		}
		if path.Clean(got) != got || strings.Contains(got, "\x00") {
			t.Fatalf("%q became %q", p, got)
		}
		rel, err := contractPath("", p)
		if err != nil || !(rel == "." || strings.HasPrefix(rel, "./")) || rel == "./.." || strings.HasPrefix(rel, "./../") {
			t.Fatalf("%q became %q (%v) without a base", p, rel, err)
		}
	})
}

func FuzzParseList(f *testing.F) {
	f.Add([]byte("f\x0012\x001700000000.5\x00a b\x00d\x004096\x001.0\x00dir\x00"))
	f.Add([]byte("f\x00x\x001\x00n\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := parseList(b)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.Size < 0 || (e.Type != "file" && e.Type != "directory") {
				t.Fatalf("entry %+v", e)
			}
		}
	})
}
