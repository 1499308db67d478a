package checkpoint

import (
	"os"
	"testing"
)

// Runs of zero pages become holes, data stays, and short runs between
// data (a guest that leaves every other page zero) stay allocated.
func TestFreeZeroRuns(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "ram")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const mib = 1 << 20
	// 4 MiB written whole: data at 0 and 3 MiB, zeros between, and every
	// other page of the last 512 KiB.
	buf := make([]byte, 4*mib)
	buf[10] = 1
	buf[3*mib+5] = 2
	for off := 4*mib - 512<<10; off < 4*mib; off += 2 * 4096 {
		buf[off] = 3
	}
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	before := Allocated(f)
	freed, err := FreeZeroRuns(f)
	if err != nil {
		t.Skipf("this file system punches no holes: %v", err)
	}
	// Zeros from the second page to 3 MiB, and from the page after 3 MiB
	// to the last 512 KiB.
	want := int64(3*mib-4096) + int64(4*mib-512<<10-(3*mib+4096))
	if freed != want {
		t.Errorf("freed %d bytes, want %d", freed, want)
	}
	if after := Allocated(f); after >= before || before-after < want-64<<10 {
		t.Errorf("allocated %d bytes before, %d after", before, after)
	}
	got := make([]byte, 4*mib)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(buf) {
		t.Error("the file's content changed")
	}
}
