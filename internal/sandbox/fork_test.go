package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
)

// forkSource is a sandbox with a workspace, secrets, rules, a port, the
// files a started sandbox has (CA, DNS names, the rules in force) and a
// checkpoint of a machine, as the source of a fork.
func forkSource(t *testing.T, m *Manager) (*Sandbox, *checkpoint.Meta) {
	t.Helper()
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs): a workspace disk needs it")
	}
	cfg := validConfig("base")
	cfg.Secrets = []string{"API_KEY"}
	cfg.Network.Rules = []string{"example.com"}
	cfg.Network.Ports = []api.PortForward{{HostPort: 3000, GuestPort: 3000}}
	cfg.Env = []string{"A=1"}
	cfg.Workspace = &WorkspaceConfig{Path: t.TempDir(), Exclude: []string{"node_modules"}}
	src, err := m.Create(context.Background(), cfg, fakeImage(t))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"ca.crt": "cert", "ca.key": "key", NamesFile: "198.18.0.2 example.com\n"} {
		mode := os.FileMode(0o600)
		if name == "ca.crt" {
			mode = 0o644
		}
		if err := os.WriteFile(src.Path(name), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	// The rules in force differ from the create flags: 'net allow' since.
	if err := WriteJSONAtomic(src.Path(policyFile), map[string]any{"rules": []map[string]string{{"text": "example.com"}, {"text": "other.example"}}}); err != nil {
		t.Fatal(err)
	}
	// A checkpoint of a machine: its frozen layers are the disks the
	// source wrote to until then (the source goes on on new ones).
	store := src.Checkpoints()
	id := checkpoint.NewID()
	tmp, err := store.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{checkpoint.RAMFile, checkpoint.DevicesFile} {
		os.WriteFile(filepath.Join(tmp, f), []byte(f), 0o600)
	}
	os.WriteFile(filepath.Join(tmp, checkpoint.ManifestFile), []byte(`{"a.txt":{"path":"a.txt","type":102}}`), 0o600)
	frozen := src.ActiveDisks()
	next, err := src.NewOverlays(frozen, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.SaveActiveDisks(next); err != nil {
		t.Fatal(err)
	}
	meta := &checkpoint.Meta{ID: id, Created: time.Now().UTC(), Kind: "fork", Arch: "amd64", MemoryMiB: 512, Disks: frozen, RAMBytes: 1 << 20}
	if err := store.Commit(tmp, meta); err != nil {
		t.Fatal(err)
	}
	return src, meta
}

// A fork is a complete sandbox of its own, made of the source's
// checkpoint: its disk layers over the checkpoint's frozen ones (in the
// source's directory), review mode whatever the source's, no host ports
// (the source's), and what the guest holds of the source already (its
// placeholders, CA, cached names, the rules in force) copied. While it
// exists, the source and that checkpoint cannot be removed; once it is
// gone, they can.
func TestCreateFork(t *testing.T) {
	m := newManager(t)
	src, cp := forkSource(t, m)
	ctx := context.Background()
	fork, err := m.CreateFork(ctx, src, cp, ForkOptions{Index: 1, Command: []string{"make", "test"}})
	if err != nil {
		t.Fatal(err)
	}
	if fork.Config.Name != "base.1" || fork.Dir != filepath.Join(m.Paths.SandboxesDir(), "base.1") {
		t.Fatalf("fork %s in %s", fork.Config.Name, fork.Dir)
	}
	opened, err := m.Open("base.1")
	if err != nil {
		t.Fatal(err)
	}
	c := opened.Config
	if c.Fork == nil || c.Fork.Source != "base" || c.Fork.Checkpoint != cp.ID || c.Fork.Index != 1 {
		t.Errorf("fork origin %+v", c.Fork)
	}
	if c.Workspace == nil || !c.Workspace.Review || c.Workspace.Path != src.Config.Workspace.Path || !slices.Equal(c.Workspace.Exclude, []string{"node_modules"}) {
		t.Errorf("fork workspace %+v: want the source's folder, in review mode", c.Workspace)
	}
	if src.Config.Workspace.Review {
		t.Error("the source's workspace was put in review mode")
	}
	if len(c.Network.Ports) != 0 || !slices.Equal(c.Secrets, []string{"API_KEY"}) || !slices.Equal(c.Env, []string{"A=1"}) {
		t.Errorf("fork ports %v secrets %v env %v: want no ports, the source's secrets and environment", c.Network.Ports, c.Secrets, c.Env)
	}
	if st := opened.Status(); st.State != api.Created {
		t.Errorf("a new fork is %s, want created", st.State)
	}
	for _, f := range []string{placeholdersFile, policyFile, NamesFile, "ca.crt", "ca.key"} {
		a, _ := os.ReadFile(src.Path(f))
		b, err := os.ReadFile(fork.Path(f))
		if err != nil || string(a) != string(b) {
			t.Errorf("%s: the fork's %q (%v), the source's %q", f, b, err, a)
		}
	}
	if fi, err := os.Stat(fork.Path("ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the fork's CA key: %v %v, want mode 0600", fi, err)
	}
	ph1, _ := src.Placeholders()
	ph2, _ := fork.Placeholders()
	if ph1["API_KEY"] == "" || ph1["API_KEY"] != ph2["API_KEY"] {
		t.Errorf("placeholders %v and %v: the guest holds the source's, so the fork's broker must know it", ph1, ph2)
	}
	if c.ID == "" || c.ID == src.Config.ID || fork.MachineID() == src.MachineID() {
		t.Errorf("the fork's identity %q, the source's %q: want one of its own", c.ID, src.Config.ID)
	}
	rec, err := fork.ForkRecord()
	if err != nil || !slices.Equal(rec.Command, []string{"make", "test"}) || !rec.Restored.IsZero() {
		t.Errorf("fork record %+v %v", rec, err)
	}
	// Its disks: new layers in its own directory, over the frozen ones.
	active := fork.ActiveDisks()
	if len(active) != 2 {
		t.Fatalf("fork disks %v", active)
	}
	for id, d := range active {
		if filepath.IsAbs(d.Path) || !strings.HasPrefix(d.Path, DisksDir+"/") {
			t.Errorf("disk %s: layer %s, want one in the fork's own disks folder", id, d.Path)
		}
		chain, err := m.Disks.Chain(ctx, fork.Path(d.Path), d.Format)
		if err != nil || len(chain) < 2 || chain[1] != src.Path(cp.Disks[id].Path) {
			t.Errorf("disk %s: chain %v (%v), want the checkpoint's frozen layer %s under it", id, chain, err, src.Path(cp.Disks[id].Path))
		}
	}
	if forks, err := m.ForksOf("base"); err != nil || len(forks) != 1 || forks[0].Config.Name != "base.1" {
		t.Errorf("ForksOf: %v %v", forks, err)
	}
	if n, _ := m.NextForkIndex("base"); n != 2 {
		t.Errorf("next fork number %d, want 2", n)
	}
	// The source, and the checkpoint, are what the fork builds on.
	if err := m.Remove("base"); !errors.Is(err, ErrHasForks) || !strings.Contains(err.Error(), "base.1") {
		t.Errorf("remove the source: %v, want ErrHasForks naming base.1", err)
	}
	if err := DeleteCheckpoint(src, cp.ID); !errors.Is(err, ErrHasForks) {
		t.Errorf("delete the forks' checkpoint: %v, want ErrHasForks", err)
	}
	if _, err := src.Checkpoints().Load(cp.ID); err != nil {
		t.Errorf("the checkpoint is gone: %v", err)
	}
	// A second fork, under the next number; then both go, and the
	// source's checkpoint and the source with them.
	if _, err := m.CreateFork(ctx, src, cp, ForkOptions{Index: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateFork(ctx, src, cp, ForkOptions{Index: 2}); !errors.Is(err, ErrExists) {
		t.Errorf("a fork over an existing name: %v, want ErrExists", err)
	}
	for _, f := range []string{"base.1", "base.2"} {
		if err := m.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(src.Path(cp.Disks["root"].Path)); err != nil {
		t.Errorf("removing the forks touched the source's layer: %v", err)
	}
	if err := DeleteCheckpoint(src, cp.ID); err != nil {
		t.Errorf("delete the checkpoint without forks: %v", err)
	}
	if err := m.Remove("base"); err != nil {
		t.Errorf("remove the source without forks: %v", err)
	}
}

// A fork that cannot be made leaves nothing behind: no sandbox listed,
// no staging folder (a checkpoint whose layer is gone).
func TestCreateForkAllOrNothing(t *testing.T) {
	m := newManager(t)
	src, cp := forkSource(t, m)
	if err := os.Remove(src.Path(cp.Disks["ws"].Path)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateFork(context.Background(), src, cp, ForkOptions{Index: 1}); err == nil {
		t.Fatal("a fork over a missing layer was made")
	}
	entries, _ := os.ReadDir(m.Paths.SandboxesDir())
	for _, e := range entries {
		if e.Name() != "base" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	disksOnly := *cp
	disksOnly.DisksOnly = true
	if _, err := m.CreateFork(context.Background(), src, &disksOnly, ForkOptions{Index: 1}); err == nil || !strings.Contains(err.Error(), "disks only") {
		t.Errorf("a fork of a disks-only checkpoint: %v", err)
	}
}

// How many forks fit is decided from the host's memory, its shared
// memory and the disk, each keeping its reserve, and the error says how
// many fit and what bounds them.
func TestCheckForkRoom(t *testing.T) {
	defer func(r func() (checkpoint.Room, error), d func(string) (int64, error)) { hostRoom, diskFree = r, d }(hostRoom, diskFree)
	free := int64(100 << 30)
	diskFree = func(string) (int64, error) { return free, nil }
	hostRoom = func() (checkpoint.Room, error) {
		// 6 GiB available, 2 GiB kept free: 4 GiB for forks.
		return checkpoint.Room{Known: true, MemTotal: 16 << 30, MemAvailable: 6 << 30}, nil
	}
	inUse := int64(1<<30 - forkOverhead) // each fork: 1 GiB of memory
	if err := CheckForkRoom("", 4, inUse, true); err != nil {
		t.Errorf("4 forks of 1 GiB in 4 GiB: %v", err)
	}
	err := CheckForkRoom("", 5, inUse, true)
	if !errors.Is(err, ErrForkRoom) || !strings.Contains(err.Error(), "4 fit") || !strings.Contains(err.Error(), "memory") {
		t.Errorf("5 forks of 1 GiB in 4 GiB: %v, want ErrForkRoom saying 4 fit, for memory", err)
	}
	// The disk: the checkpoint (RAM in use) and each fork's share, 1 GiB kept.
	free = 1<<30 + inUse + 2*forkDisk
	if err := CheckForkRoom("", 3, inUse, true); !errors.Is(err, ErrForkRoom) || !strings.Contains(err.Error(), "2 fit") || !strings.Contains(err.Error(), "disk") {
		t.Errorf("3 forks with disk for 2: %v", err)
	}
	if err := CheckForkRoom("", 3, inUse, false); err != nil {
		t.Errorf("3 forks of an existing checkpoint, disk for 3 without it: %v", err)
	}
	free = 0
	if err := CheckForkRoom("", 1, inUse, true); err == nil || !strings.Contains(err.Error(), "none fits") {
		t.Errorf("no disk: %v", err)
	}
}

// The record a fork keeps reads back as written.
func TestForkRecordRoundTrip(t *testing.T) {
	sb := &Sandbox{Dir: t.TempDir()}
	code := 3
	if err := sb.UpdateForkRecord(func(r *ForkRecord) { r.Command = []string{"x"}; r.ExitCode = &code }); err != nil {
		t.Fatal(err)
	}
	r, err := sb.ForkRecord()
	b, _ := json.Marshal(r)
	if err != nil || r.ExitCode == nil || *r.ExitCode != 3 || r.Command[0] != "x" {
		t.Errorf("record %s %v", b, err)
	}
}
