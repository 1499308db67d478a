package checkpoint

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCommitListDelete(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "checkpoints")}
	id := NewID()
	tmp, err := s.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := s.List(); len(l) != 0 {
		t.Fatal("an uncommitted checkpoint is listed")
	}
	os.WriteFile(filepath.Join(tmp, RAMFile), []byte("ram"), 0o600)
	if err := s.Commit(tmp, &Meta{ID: id, Kind: "manual", Disks: map[string]Disk{"root": {Path: "disks/root-1.qcow2", Format: "qcow2"}}}); err != nil {
		t.Fatal(err)
	}
	l, err := s.List()
	if err != nil || len(l) != 1 || l[0].ID != id {
		t.Fatalf("list: %v %v", l, err)
	}
	// A crash mid-way leaves a .tmp-* directory: swept, never listed.
	s.Begin(NewID())
	s.Sweep()
	if m, _ := filepath.Glob(filepath.Join(s.Dir, ".tmp-*")); len(m) != 0 {
		t.Fatalf("not swept: %v", m)
	}
	if err := s.Delete(id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(id); err == nil {
		t.Fatal("deleted checkpoint loads")
	}
}

// Two checkpoints made in one second (a checkpoint, then a rewind's own)
// have IDs that sort at random: List orders them by when they were made.
func TestListOldestFirstWithinASecond(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "checkpoints")}
	now := time.Now().UTC()
	for i, id := range []string{"20261201-000000-ffff", "20261201-000000-0000"} {
		tmp, err := s.Begin(id)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(tmp, RAMFile), []byte("ram"), 0o600)
		m := &Meta{ID: id, Kind: "manual", Created: now.Add(time.Duration(i) * time.Millisecond), Disks: map[string]Disk{"root": {Path: "disks/root-1.qcow2", Format: "qcow2"}}}
		if err := s.Commit(tmp, m); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.List()
	if err != nil || len(l) != 2 || l[0].ID != "20261201-000000-ffff" {
		t.Fatalf("list: %v %v", l, err)
	}
}

func TestParseMetaRejects(t *testing.T) {
	cases := map[string]string{
		"version":  `{"version":2,"id":"20260101-000000-abcd"}`,
		"id":       `{"version":1,"id":"../../etc"}`,
		"abs disk": `{"version":1,"id":"20260101-000000-abcd","disks":{"root":{"path":"/etc/passwd","format":"raw"}}}`,
		"up disk":  `{"version":1,"id":"20260101-000000-abcd","disks":{"root":{"path":"../x","format":"raw"}}}`,
		"format":   `{"version":1,"id":"20260101-000000-abcd","disks":{"root":{"path":"d","format":"vmdk"}}}`,
		"not json": `{`,
	}
	for name, in := range cases {
		if _, err := ParseMeta([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := (Store{Dir: t.TempDir()}).Load("../x"); err == nil || !strings.Contains(err.Error(), "not a checkpoint id") {
		t.Errorf("bad id: %v", err)
	}
}

func FuzzParseMeta(f *testing.F) {
	f.Add([]byte(`{"version":1,"id":"20260101-000000-abcd","disks":{"root":{"path":"disks/r.qcow2","format":"qcow2"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMeta(b)
		if err != nil {
			return
		}
		for _, d := range m.Disks {
			if filepath.IsAbs(d.Path) || strings.Contains(d.Path, "..") {
				t.Fatalf("accepted disk path %q", d.Path)
			}
		}
	})
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src, _ := os.Create(filepath.Join(dir, "src"))
	src.Truncate(64 << 20)
	src.WriteAt(bytes.Repeat([]byte("a"), 5000), 1<<20)
	src.WriteAt([]byte("tail"), 64<<20-4)
	dst, _ := os.Create(filepath.Join(dir, "dst"))
	n, err := CopySparse(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if n > 2<<20 {
		t.Fatalf("copied %d bytes of a file with 5 KB of data", n)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs")
	}
}

func TestCopyDataOverSpare(t *testing.T) {
	dir := t.TempDir()
	src, _ := os.Create(filepath.Join(dir, "src"))
	src.Truncate(32 << 20)
	src.WriteAt(bytes.Repeat([]byte("x"), 8192), 4<<20)
	spare, _ := os.Create(filepath.Join(dir, "spare"))
	if err := WriteZeros(spare, 32<<20); err != nil {
		t.Fatal(err)
	}
	exts, n, err := CopyData(spare, src)
	if err != nil || n < 8192 || len(exts) == 0 {
		t.Fatalf("copy: %v %d %v", exts, n, err)
	}
	if err := PunchHoles(spare, exts, 32<<20); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(spare.Name())
	if !bytes.Equal(a, b) {
		t.Fatal("content differs")
	}
	var st syscall.Stat_t
	syscall.Stat(spare.Name(), &st)
	if st.Blocks*512 > 4<<20 {
		t.Fatalf("holes not punched: %d bytes allocated", st.Blocks*512)
	}
}

func TestLoadableAcrossQEMUBuilds(t *testing.T) {
	const q72 = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"
	const q10 = "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)"
	for _, tc := range []struct {
		name           string
		meta           Meta
		qemu, firmware string
		ok             bool
		why            string
	}{
		{"same build", Meta{QEMU: q72, Firmware: "qboot.rom"}, q72, "qboot.rom", true, ""},
		{"upgrade", Meta{QEMU: q72, Firmware: "qboot.rom"}, q10, "qboot.rom", false, "saved by"},
		{"downgrade", Meta{QEMU: q10}, q72, "qboot.rom", false, "7.2.22"},
		{"other firmware", Meta{QEMU: q10, Firmware: "bios-microvm.bin"}, q10, "qboot.rom", false, "firmware"},
		{"firmware not recorded (older kosa8)", Meta{QEMU: q72}, q72, "qboot.rom", true, ""},
		{"disks only", Meta{QEMU: q72, DisksOnly: true}, q72, "qboot.rom", false, "disks-only"},
	} {
		ok, why := tc.meta.Loadable(tc.qemu, tc.firmware)
		if ok != tc.ok || !strings.Contains(why, tc.why) {
			t.Errorf("%s: Loadable = %v, %q; want %v, %q", tc.name, ok, why, tc.ok, tc.why)
		}
	}
}

// A sandbox removed while a checkpoint or a spare fill of its supervisor
// still runs stays removed: neither makes its folder again (it came back
// as a folder without sandbox.json, which 'kosa8 ls' cannot open).
func TestNoFolderMadeForARemovedSandbox(t *testing.T) {
	sandboxDir := filepath.Join(t.TempDir(), "sandboxes", "gone")
	dir := filepath.Join(sandboxDir, "checkpoints")
	if _, err := (Store{Dir: dir}).Begin(NewID()); err == nil {
		t.Error("a checkpoint began in a removed sandbox")
	}
	sp := &Spares{Dir: dir, Size: 1 << 20, Slots: 1}
	sp.Refill()
	time.Sleep(300 * time.Millisecond)
	sp.Close()
	if _, err := os.Lstat(sandboxDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the removed sandbox's folder is back: %v", err)
	}
	// Where the sandbox is, its checkpoints folder is made as before.
	if err := os.MkdirAll(sandboxDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := (Store{Dir: dir}).Begin(NewID()); err != nil {
		t.Fatal(err)
	}
}
