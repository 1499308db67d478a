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
