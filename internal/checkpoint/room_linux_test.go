package checkpoint

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestRoomFor(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		need, total, avail int64
		ok                 bool
	}{
		{1 * gib, 24 * gib, 20 * gib, true},
		{1 * gib, 24 * gib, 4 * gib, true},
		{1 * gib, 24 * gib, 3*gib + gib/2, false}, // 3 GiB must stay free
		{1 * gib, 4 * gib, 2 * gib, true},         // at least 1 GiB kept
		{1 * gib, 4 * gib, gib + gib/2, false},
	} {
		if err := roomFor(c.need, c.total, c.avail); (err == nil) != c.ok {
			t.Errorf("roomFor(%d, %d, %d) = %v, want ok %v", c.need>>20, c.total>>20, c.avail>>20, err, c.ok)
		}
	}
}

func TestShmRoomFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		need, size, free, keep int64
		ok                     bool
	}{
		{100 * mib, 8192 * mib, 6000 * mib, 2048 * mib, true},
		{3000 * mib, 8192 * mib, 6000 * mib, 2048 * mib, false}, // the guest's 2 GiB and an eighth stay free
		{100 * mib, 8192 * mib, 3000 * mib, 2048 * mib, false},
		{100 * mib, 0, 0, 2048 * mib, true}, // a tmpfs without a size
	} {
		if err := shmRoomFor(c.need, c.size, c.free, c.keep); (err == nil) != c.ok {
			t.Errorf("shmRoomFor(%d, %d, %d, %d) = %v, want ok %v", c.need>>20, c.size>>20, c.free>>20, c.keep>>20, err, c.ok)
		}
	}
}

// A RAM file prepared for a rewind never takes the room in the tmpfs that
// guest RAM needs: a guest touches its memory into a tmpfs file as it
// goes, and one that finds the tmpfs full dies (SIGBUS in QEMU).
func TestRewindRAMKeepsTmpfsRoomForGuests(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	shm := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", shm).CombinedOutput(); err != nil {
		t.Skipf("mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", shm).Run() })
	// The running guest: all its 16 MiB touched.
	guest, err := os.Create(filepath.Join(shm, "guest.ram"))
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	if _, err := guest.Write(bytes.Repeat([]byte{1}, rewindSize)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pages int64
		ok    bool
	}{
		{1024, true},  // 4 MiB: 28 MiB left, the guest's 16 and an eighth of 48 kept
		{3072, false}, // 12 MiB: 20 left
	} {
		g := newRewindRigIn(t, t.TempDir(), shm)
		var offs []int64
		for p := range c.pages {
			offs = append(offs, p*PageSize)
		}
		a := g.checkpointRAM("a", 'a', offs...)
		g.r.Prepare("A", a)
		g.wait()
		f := g.takeExact("A", a)
		if (f != nil) != c.ok {
			t.Errorf("%d MiB of checkpoint RAM in a 48 MiB tmpfs holding a 16 MiB guest: prepared %v, want %v", c.pages*PageSize>>20, f != nil, c.ok)
		}
		if f != nil {
			g.equal(f, a)
			f.Close()
		}
	}
}
