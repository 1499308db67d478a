package linediff

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCount(t *testing.T) {
	for _, c := range []struct {
		name    string
		a, b    string
		add, rm int
	}{
		{"same", "a\nb\n", "a\nb\n", 0, 0},
		{"both empty", "", "", 0, 0},
		{"new file", "", "a\nb\nc\n", 3, 0},
		{"deleted", "a\nb\n", "", 0, 2},
		{"one line changed", "a\nb\nc\n", "a\nB\nc\n", 1, 1},
		{"appended", "a\n", "a\nb\nc\n", 2, 0},
		{"moved", "a\nb\nc\n", "b\nc\na\n", 1, 1},
		{"newline added at the end", "a", "a\n", 1, 1},
		{"repeated lines", "x\nx\nx\n", "x\nx\n", 0, 1},
		{"interleaved", "1\n2\n3\n4\n5\n", "1\nx\n3\ny\n5\nz\n", 3, 2},
	} {
		add, rm, exact := Count([]byte(c.a), []byte(c.b))
		if add != c.add || rm != c.rm || !exact {
			t.Errorf("%s: +%d -%d exact=%v, want +%d -%d", c.name, add, rm, exact, c.add, c.rm)
		}
	}
}

// The counts are diff's: checked against diff -u on generated changes,
// where the diff tool is installed.
func TestCountAgreesWithDiff(t *testing.T) {
	if _, err := exec.LookPath("diff"); err != nil {
		t.Skip("no diff on this machine to compare with")
	}
	dir := t.TempDir()
	for seed := 0; seed < 40; seed++ {
		a, b := variant(seed, 0), variant(seed, 1)
		pa, pb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
		os.WriteFile(pa, a, 0o600)
		os.WriteFile(pb, b, 0o600)
		out, _ := exec.Command("diff", "-u", pa, pb).Output()
		wantAdd, wantRm := 0, 0
		for _, l := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"):
			case strings.HasPrefix(l, "+"):
				wantAdd++
			case strings.HasPrefix(l, "-"):
				wantRm++
			}
		}
		add, rm, _ := Count(a, b)
		// diff -u's script is one of the shortest: the sum must agree,
		// and with it (lengths fixed) both counts.
		if add != wantAdd || rm != wantRm {
			t.Errorf("seed %d: +%d -%d, diff says +%d -%d", seed, add, rm, wantAdd, wantRm)
		}
	}
}

// variant is a pseudo-random text; side 1 is side 0 with lines changed,
// dropped and inserted.
func variant(seed, side int) []byte {
	var buf bytes.Buffer
	r := uint32(seed*7919 + 1)
	next := func() uint32 { r = r*1103515245 + 12345; return r >> 8 }
	for i := 0; i < 60; i++ {
		line := next() % 12
		if side == 1 {
			switch next() % 7 {
			case 0:
				continue
			case 1:
				line += 100
			case 2:
				buf.WriteString("inserted\n")
			}
		}
		buf.WriteString(strings.Repeat("w", int(line%5)) + string(rune('a'+line%26)) + "\n")
	}
	return buf.Bytes()
}

func TestCountTooLargeFallsBack(t *testing.T) {
	var a, b bytes.Buffer
	for i := 0; i < MaxEdits; i++ {
		a.WriteString("a" + strings.Repeat("x", i%50) + "\n")
		b.WriteString("b" + strings.Repeat("y", i%50) + "\n")
	}
	add, rm, exact := Count(a.Bytes(), b.Bytes())
	if exact || add != MaxEdits || rm != MaxEdits {
		t.Errorf("+%d -%d exact=%v, want the set difference %d each, not exact", add, rm, exact, MaxEdits)
	}
}

func FuzzCount(f *testing.F) {
	f.Add([]byte("a\nb\n"), []byte("a\nc\n"))
	f.Add([]byte(""), []byte("x"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		add, rm, _ := Count(a, b)
		la, lb := len(lines(a)), len(lines(b))
		if add < 0 || rm < 0 || add > lb || rm > la || lb-add != la-rm {
			t.Fatalf("+%d -%d for %d and %d lines", add, rm, la, lb)
		}
		if a2, r2, _ := Count(b, a); a2 != rm || r2 != add {
			t.Fatalf("not symmetric: +%d -%d against +%d -%d", add, rm, a2, r2)
		}
	})
}
