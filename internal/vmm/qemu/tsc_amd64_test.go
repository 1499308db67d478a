package qemu

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
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

// The record is read bounded, and only from a regular file: a FIFO or a
// link at its name is measured over, not waited on or followed.
func TestRecordedTSCReadsOnlyItsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, tscRecordFile)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	go func() { got <- recordedTSC(dir, "boot-a", func() int { return 2294000 }) }()
	select {
	case n := <-got:
		if n != 2294000 {
			t.Errorf("a FIFO at the record: %d kHz, want the measurement", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("reading the record waits on a FIFO at its name")
	}
	os.Remove(path)
	elsewhere := filepath.Join(t.TempDir(), "record")
	if err := os.WriteFile(elsewhere, []byte("boot-a 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, path); err != nil {
		t.Fatal(err)
	}
	if n := recordedTSC(dir, "boot-a", func() int { return 2294000 }); n != 2294000 {
		t.Errorf("a link at the record: %d kHz, want the measurement", n)
	}
}
