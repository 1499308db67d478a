package qemu

import (
	"os"
	"path/filepath"
	"testing"
)

// The TSC rate is measured once per boot of the host and recorded.
func TestRecordedTSC(t *testing.T) {
	dir := t.TempDir()
	measured := 0
	measure := func() int { measured++; return 2294000 + measured }
	if got := recordedTSC(dir, "boot-a", measure); got != 2294001 || measured != 1 {
		t.Fatalf("first: %d kHz, %d measurements", got, measured)
	}
	if got := recordedTSC(dir, "boot-a", measure); got != 2294001 || measured != 1 {
		t.Fatalf("same boot: %d kHz, %d measurements (want the record)", got, measured)
	}
	if got := recordedTSC(dir, "boot-b", measure); got != 2294002 || measured != 2 {
		t.Fatalf("next boot: %d kHz, %d measurements (want a new one)", got, measured)
	}
	if err := os.WriteFile(filepath.Join(dir, tscRecordFile), []byte("boot-b -5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := recordedTSC(dir, "boot-b", measure); got != 2294003 || measured != 3 {
		t.Fatalf("a bad record: %d kHz, %d measurements", got, measured)
	}
	if got := recordedTSC("", "boot-b", measure); got != 2294004 || measured != 4 {
		t.Fatalf("no record dir: %d kHz, %d measurements", got, measured)
	}
}
