package vmspec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A console log of any size is read at its end only, and each line is
// clipped.
func TestConsoleTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(64 << 20) // sparse: reading it whole would take 64 MiB
	f.WriteAt([]byte("\n"+strings.Repeat("y", 4<<20)+"\nnext to last\r\nlast line\n"), 64<<20)
	f.Close()
	got := ConsoleTail(p, 3)
	if len(got) != 3 || got[1] != "next to last" || got[2] != "last line" || len(got[0]) != MaxConsoleLine+3 {
		t.Errorf("ConsoleTail = %d lines, last %q", len(got), got[max(0, len(got)-2):])
	}
	if got := ConsoleTail(filepath.Join(t.TempDir(), "none"), 3); got != nil {
		t.Errorf("no log: %q", got)
	}
}

// Just after the driver moved a long log aside, the lines before come from
// the older half; the guest's escape sequences never come through.
func TestConsoleTailOlderHalfAndEscapes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(p+".1", []byte("one\ntwo\nthree\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("four \x1b]0;owned\x07\x1b[2Jend\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := ConsoleTail(p, 3)
	if len(got) != 3 || got[0] != "two" || got[1] != "three" || !strings.HasPrefix(got[2], "four") || !strings.HasSuffix(got[2], "end") {
		t.Fatalf("ConsoleTail = %q", got)
	}
	if strings.ContainsAny(got[2], "\x1b\x07") {
		t.Errorf("escape sequences came through: %q", got[2])
	}
}
