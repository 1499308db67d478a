package termsafe

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	cases := []struct {
		name, in, want string
		keepLines      bool
	}{
		{"plain", "src/main.go", "src/main.go", false},
		{"title", "\x1b]0;pwned\x07x", "?]0;pwned?x", false},
		{"clear screen", "a\x1b[2Jb", "a?[2Jb", false},
		{"C1 CSI", "a\u009b2Jb", "a?2Jb", false},
		{"newline in a name", "a\nb", "a?b", false},
		{"newline in a diff", "a\nb\tc\r", "a\nb\tc?", true},
		{"bidi override", "evil\u202egnp.exe", "evil?gnp.exe", false},
		{"invalid utf-8", "a\xffb", "a?b", false},
		{"unicode kept", "café ✓", "café ✓", false},
		{"DEL", "a\x7fb", "a?b", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Clean(tc.in, tc.keepLines); got != tc.want {
				t.Fatalf("Clean(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestWriterJoinsSplitRunes(t *testing.T) {
	var out bytes.Buffer
	w := NewWriter(&out)
	in := []byte("é✓\x1b[2J")
	for i := range in {
		if _, err := w.Write(in[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	if got := out.String(); got != "é✓?[2J" {
		t.Fatalf("got %q", got)
	}
}

func FuzzClean(f *testing.F) {
	for _, s := range []string{"", "a\x1b]0;x\x07", "\u202e", "\xff\xfe", "a\nb"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, keep bool) {
		out := Clean(s, keep)
		if !utf8.ValidString(out) {
			t.Fatalf("invalid UTF-8 out of %q", s)
		}
		for _, r := range out {
			if r == '\n' || r == '\t' {
				if !keep {
					t.Fatalf("line break kept in %q", out)
				}
				continue
			}
			if !allowed(r) {
				t.Fatalf("%U passed in %q", r, out)
			}
		}
		if strings.ContainsRune(out, 0x1b) {
			t.Fatal("ESC passed")
		}
	})
}
