package supervisor

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
)

// forkRig is a running source sandbox (a fake machine) in a sandboxes
// folder, and the manager of that folder.
type forkRig struct {
	src *fakeRig
	m   *sandbox.Manager
}

func newForkRig(t *testing.T) *forkRig {
	t.Helper()
	home := t.TempDir()
	m := &sandbox.Manager{Paths: sandbox.Paths{Home: home, Cache: t.TempDir(), Config: t.TempDir()}, Disks: vmmtest.Layers{}}
	// 256 MiB (sparse): the least a sandbox's settings allow.
	r := newFakeRigIn(t, false, filepath.Join(m.Paths.SandboxesDir(), "fake"), 256)
	s := r.s
	s.home = home
	s.sb.Config.Env = []string{"EXIT=3"} // the fake guest's programs exit with it
	if err := s.sb.SaveConfig(); err != nil {
		t.Fatal(err)
	}
	if err := s.sb.WriteStatus(api.Status{State: api.Running}); err != nil {
		t.Fatal(err)
	}
	return &forkRig{src: r, m: m}
}

// fork takes the fork checkpoint through the API.
func (r *forkRig) fork(t *testing.T, count int) *checkpoint.Meta {
	t.Helper()
	code, body := apiCall(t, r.src.s.routes(), "POST", "/v1/fork", `{"count":`+strconv.Itoa(count)+`}`)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/fork: %d %s", code, body)
	}
	var meta checkpoint.Meta
	decodeAnswer(t, body, &meta)
	return &meta
}

// startFork runs a fork's first start on a fake machine, as far as its
// machine: its network, then the restore.
func startFork(t *testing.T, r *forkRig, name string) (*startJob, *vmmtest.Driver, *fakeGuest, error) {
	t.Helper()
	j, drv := newStartJob(t)
	var g *fakeGuest
	drv.OnStart = func(m *vmmtest.Machine) { g = serveFakeGuest(t, m) }
	sb, err := r.m.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	j.s.sb = sb
	j.m = r.m
	j.s.home = r.m.Paths.Home
	j.s.setStatus(func(st *api.Status) { st.State, st.Started = api.Starting, time.Now() })
	err = j.run(context.Background(), []step{{"network", j.network}, {"machine", j.machine}})
	t.Cleanup(func() {
		if j.s.net != nil {
			j.s.net.close()
		}
	})
	return j, drv, g, err
}

// A fork: the source pays one checkpoint (kind fork); the fork's first
// start restores that checkpoint's machine (its RAM, its devices) from
// the source's directory, on layers of its own over the checkpoint's
// frozen disks, as a new machine (its own hostname, a new identity);
// then the command it was made for runs and its exit status is recorded.
// While the fork exists, the source keeps the checkpoint, whatever its
// retention, and refuses to delete it.
func TestForkRestoresTheSourcesCheckpointAsANewMachine(t *testing.T) {
	r := newForkRig(t)
	src := r.src.s
	srcMachine := r.src.drv.Machines()[0]
	if _, err := srcMachine.RAM().WriteAt(guestPattern, guestPatternAt); err != nil {
		t.Fatal(err)
	}
	meta := r.fork(t, 2)
	if meta.Kind != "fork" || meta.DisksOnly {
		t.Fatalf("fork checkpoint %+v", meta)
	}
	if srcMachine.Paused() {
		t.Error("the source stays paused after the fork's checkpoint")
	}
	if _, err := r.m.CreateFork(context.Background(), src.sb, meta, sandbox.ForkOptions{Index: 1, Command: []string{"make", "it"}}); err != nil {
		t.Fatal(err)
	}
	j, drv, g, err := startFork(t, r, "fake.1")
	if err != nil {
		t.Fatal(err)
	}
	s := j.s
	ms := drv.Machines()
	if len(ms) != 1 {
		t.Fatalf("%d machines for the fork, want 1", len(ms))
	}
	if calls := ms[0].CallNames(); !slices.Equal(calls, []string{"Start", "LoadDevices", "Resume"}) {
		t.Errorf("the fork's machine: %v, want a restore (devices loaded), not a boot", calls)
	}
	if !ms[0].Private || ms[0].RAM() != nil || ms[0].Copied {
		t.Errorf("the fork's RAM: private %v, copied %v: want the checkpoint's mapped copy-on-write", ms[0].Private, ms[0].Copied)
	}
	got := make([]byte, len(guestPattern))
	if _, err := ms[0].Memory().ReadAt(got, guestPatternAt); err != nil || string(got) != string(guestPattern) {
		t.Errorf("the fork's RAM holds %q (%v), want the source's at the checkpoint", got, err)
	}
	if !slices.Equal(g.names, []string{"fake-1"}) || !slices.Equal(g.renewed, []bool{true}) {
		t.Errorf("restored as %q, new identity %v: want its own hostname and a new identity", g.names, g.renewed)
	}
	rec, err := s.sb.ForkRecord()
	if err != nil || rec.Restored.IsZero() || !s.forkUp {
		t.Errorf("the fork's record after its start: %+v %v", rec, err)
	}
	// Its layers are its own, over the checkpoint's frozen ones.
	for id, d := range s.sb.ActiveDisks() {
		chain, err := vmmtest.Layers{}.Chain(context.Background(), s.sb.Path(d.Path), d.Format)
		if err != nil || len(chain) < 2 || !strings.HasPrefix(chain[0], s.sb.Dir) || chain[1] != src.sb.Path(meta.Disks[id].Path) {
			t.Errorf("disk %s: chain %v (%v)", id, chain, err)
		}
	}
	// The command it was made for, run and recorded.
	s.runForkCommand(context.Background())
	execs := g.Execs()
	if len(execs) != 1 || !slices.Equal(execs[0].Argv, []string{"make", "it"}) {
		t.Fatalf("the guest ran %+v", execs)
	}
	rec, _ = s.sb.ForkRecord()
	if rec.ExitCode == nil || *rec.ExitCode != 3 || rec.Started.IsZero() || rec.Ended.IsZero() || rec.Error != "" {
		t.Errorf("the command's record %+v, want exit code 3", rec)
	}
	if out, _ := os.ReadFile(s.sb.Path(sandbox.ForkOutputFile)); !strings.Contains(string(out), "it\n") {
		t.Errorf("the command's output %q", out)
	}
	// Run once: a later start of the fork does not run it again.
	s.runForkCommand(context.Background())
	if len(g.Execs()) != 1 {
		t.Error("the forked command ran twice")
	}

	// The source keeps the checkpoint: the API refuses to delete it and
	// the retention skips it.
	code, body := apiCall(t, src.routes(), "DELETE", "/v1/checkpoints/"+meta.ID, "")
	wantAPIError(t, "DELETE the forks' checkpoint", code, body, http.StatusBadRequest, "fake.1")
	src.sb.Config.MaxCheckpoints = 1
	for i := 0; i < 2; i++ {
		if _, err := src.checkpoint(context.Background(), "later", "manual"); err != nil {
			t.Fatal(err)
		}
	}
	src.enforceRetention()
	if _, err := src.sb.Checkpoints().Load(meta.ID); err != nil {
		t.Errorf("the retention removed the checkpoint a fork builds on: %v", err)
	}
	if list, _ := src.sb.Checkpoints().List(); len(list) != 2 {
		t.Errorf("%d checkpoints after the retention, want the fork's and the newest", len(list))
	}
	// The fork's own checkpoint: its RAM is private to its VMM, so it
	// goes in the device state (no RAM file, no spares), and a rewind to
	// it loads it whole into a machine whose RAM is the host's again.
	own := []byte("written by the fork")
	if _, err := ms[0].Memory().WriteAt(own, guestPatternAt); err != nil {
		t.Fatal(err)
	}
	cp, err := s.checkpoint(context.Background(), "in the fork", "manual")
	if err != nil {
		t.Fatalf("a checkpoint of the fork: %v", err)
	}
	if !cp.RAMInStream || !slices.Contains(ms[0].CallNames(), "SaveAll") {
		t.Errorf("the fork's checkpoint: RAM in stream %v, calls %v", cp.RAMInStream, ms[0].CallNames())
	}
	if _, err := os.Stat(filepath.Join(s.sb.Checkpoints().Path(cp.ID), checkpoint.RAMFile)); !os.IsNotExist(err) {
		t.Errorf("the fork's checkpoint has a RAM file (%v)", err)
	}
	if spares, _ := filepath.Glob(filepath.Join(s.sb.Checkpoints().Dir, checkpoint.SpareName+"*")); len(spares) > 0 {
		t.Errorf("spare RAM files for a machine whose RAM is not copied: %v", spares)
	}
	if _, err := ms[0].Memory().WriteAt([]byte("written after the checkpoint"), guestPatternAt); err != nil {
		t.Fatal(err)
	}
	if _, err := s.rewind(context.Background(), cp.ID); err != nil {
		t.Fatalf("rewind the fork to its own checkpoint: %v", err)
	}
	ms = drv.Machines()
	last := ms[len(ms)-1]
	if calls := last.CallNames(); !slices.Equal(calls, []string{"Start", "LoadAll", "Resume"}) || last.Private || last.RAM() == nil {
		t.Errorf("the rewound fork's machine: calls %v, private %v", calls, last.Private)
	}
	got = make([]byte, len(own))
	if _, err := last.RAM().ReadAt(got, guestPatternAt); err != nil || string(got) != string(own) {
		t.Errorf("the rewound fork's RAM holds %q (%v), want %q", got, err, own)
	}
	if s.hasPrivateRAM() {
		t.Error("the rewound fork still counts its RAM as private")
	}
}

// Where the VMM cannot map a RAM file copy-on-write (QEMU before 8.2),
// a fork copies its checkpoint's RAM into memory of its own.
func TestForkCopiesRAMWhereTheVMMCannotMapIt(t *testing.T) {
	r := newForkRig(t)
	if _, err := r.src.drv.Machines()[0].RAM().WriteAt(guestPattern, guestPatternAt); err != nil {
		t.Fatal(err)
	}
	meta := r.fork(t, 1)
	if _, err := r.m.CreateFork(context.Background(), r.src.s.sb, meta, sandbox.ForkOptions{Index: 1}); err != nil {
		t.Fatal(err)
	}
	j, drv := newStartJob(t)
	drv.NoRAMTemplate = true
	drv.OnStart = func(m *vmmtest.Machine) { serveFakeGuest(t, m) }
	sb, _ := r.m.Open("fake.1")
	j.s.sb, j.m, j.s.home = sb, r.m, r.m.Paths.Home
	if err := j.run(context.Background(), []step{{"network", j.network}, {"machine", j.machine}}); err != nil {
		t.Fatal(err)
	}
	defer j.s.net.close()
	m := drv.Machines()[0]
	got := make([]byte, len(guestPattern))
	if _, err := m.RAM().ReadAt(got, guestPatternAt); !m.Copied || m.Private || err != nil || string(got) != string(guestPattern) {
		t.Errorf("copied %v, private %v, RAM %q (%v)", m.Copied, m.Private, got, err)
	}
}

// A fork whose checkpoint this QEMU cannot load boots from the
// checkpoint's disks, and says so.
func TestForkOfAnUnloadableCheckpointBoots(t *testing.T) {
	r := newForkRig(t)
	meta := r.fork(t, 1)
	if _, err := r.m.CreateFork(context.Background(), r.src.s.sb, meta, sandbox.ForkOptions{Index: 1}); err != nil {
		t.Fatal(err)
	}
	// Saved by another QEMU build than the fork's.
	mp := filepath.Join(r.src.s.sb.Checkpoints().Path(meta.ID), checkpoint.MetaFile)
	saved := strings.Replace(mustRead(t, mp), `"qemu": ""`, `"qemu": "another build"`, 1)
	if err := os.WriteFile(mp, []byte(saved), 0o600); err != nil {
		t.Fatal(err)
	}
	j, drv := newStartJob(t)
	drv.OnStart = func(m *vmmtest.Machine) { serveFakeGuest(t, m) }
	sb, _ := r.m.Open("fake.1")
	j.s.sb, j.m, j.s.home = sb, r.m, r.m.Paths.Home
	j.s.qemuVersion = "this build"
	if cp, _, err := sb.ForkCheckpoint(); err != nil || cp.QEMU != "another build" {
		t.Fatalf("the checkpoint %+v %v", cp, err)
	}
	if err := j.run(context.Background(), []step{{"network", j.network}, {"machine", j.machine}}); err != nil {
		t.Fatal(err)
	}
	defer j.s.net.close()
	if calls := drv.Machines()[0].CallNames(); !slices.Equal(calls, []string{"Start"}) {
		t.Errorf("machine calls %v, want a boot", calls)
	}
	if st := j.s.getStatus(); st.ColdBoot == "" {
		t.Error("the status does not say the fork booted from its disks")
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A fork request is bounded, and refused with what to do when the host
// has no room for it (the room is the sandbox package's, tested there).
func TestForkRequestBounds(t *testing.T) {
	r := newForkRig(t)
	h := r.src.s.routes()
	for _, body := range []string{`{"count":0}`, `{"count":65}`, `{"count":"x"}`, `{"count":2,"extra":1}`} {
		code, answer := apiCall(t, h, "POST", "/v1/fork", body)
		wantAPIError(t, "POST /v1/fork "+body, code, answer, http.StatusBadRequest, "")
	}
	if list, _ := r.src.s.sb.Checkpoints().List(); len(list) != 0 {
		t.Errorf("refused requests took %d checkpoints", len(list))
	}
}

// The summary of a sandbox's changes (what 'kosa8 fork ls' shows of each
// fork): per pending or held path, the lines added and removed against
// the host's version; binary files and links count no lines and say why.
func TestChangeSummary(t *testing.T) {
	s, _, _ := fakeSupervisor(t)
	hostDir, guestDir := withWorkspace(t, s, true, map[string]string{"a.txt": "1\n2\n3\n", "gone.txt": "x\ny\n", "bin": "\x00\x01"})
	writeFile(t, guestDir, "a.txt", "1\ntwo\n3\n4\n")
	writeFile(t, guestDir, "new.txt", "n\n")
	writeFile(t, guestDir, "bin", "\x00\x02")
	writeFile(t, guestDir, ".envrc", "export X=1\n")
	if err := os.Remove(filepath.Join(guestDir, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(guestDir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := s.ws.engine.Sync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	code, body := apiCall(t, s.routes(), "GET", "/v1/sync/summary", "")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/sync/summary: %d %s", code, body)
	}
	var sum api.ChangeSummary
	decodeAnswer(t, body, &sum)
	want := map[string]api.FileChange{
		"a.txt":    {Path: "a.txt", Kind: "modified", Added: 2, Removed: 1},
		"new.txt":  {Path: "new.txt", Kind: "added", Added: 1},
		"gone.txt": {Path: "gone.txt", Kind: "deleted", Removed: 2},
		"bin":      {Path: "bin", Kind: "modified", Note: "binary"},
		"link":     {Path: "link", Kind: "added", Note: "a link"},
		".envrc":   {Path: ".envrc", Kind: "added", Added: 1},
	}
	for _, f := range sum.Files {
		w, ok := want[f.Path]
		if f.Path == ".envrc" {
			if f.Held == "" {
				t.Errorf(".envrc is not said to be held: %+v", f)
			}
			f.Held = ""
		}
		if !ok || f != w {
			t.Errorf("%+v, want %+v", f, w)
		}
		delete(want, f.Path)
	}
	if len(want) != 0 {
		t.Errorf("missing from the summary: %v", want)
	}
	if sum.Added != 4 || sum.Removed != 3 {
		t.Errorf("totals +%d -%d, want +4 -3", sum.Added, sum.Removed)
	}
	if readFile(hostDir, "a.txt") != "1\n2\n3\n" {
		t.Error("the summary changed the host folder")
	}
}

// A guest with more changed files than a summary counts lines in: the
// summary lists them all, counts the first maxCountedChanges, and says so
// of the rest instead of reading every file on both sides.
func TestChangeSummaryCountsABoundedNumber(t *testing.T) {
	s, _, _ := fakeSupervisor(t)
	_, guestDir := withWorkspace(t, s, true, nil)
	n := maxCountedChanges + 25
	for i := 0; i < n; i++ {
		writeFile(t, guestDir, fmt.Sprintf("f%05d.txt", i), "a\nb\n")
	}
	if err := s.ws.engine.Sync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	sum, err := s.changeSummary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	counted, uncounted := 0, 0
	for _, f := range sum.Files {
		switch {
		case f.Added == 2 && f.Note == "":
			counted++
		case f.Added == 0 && strings.HasPrefix(f.Note, "not counted"):
			uncounted++
		default:
			t.Fatalf("%+v", f)
		}
	}
	if len(sum.Files) != n || counted != maxCountedChanges || uncounted != n-maxCountedChanges || sum.Added != 2*maxCountedChanges {
		t.Fatalf("%d files listed, %d counted, %d not, %d lines: want %d, %d, %d, %d",
			len(sum.Files), counted, uncounted, sum.Added, n, maxCountedChanges, n-maxCountedChanges, 2*maxCountedChanges)
	}
}

// Applies to one folder take turns: while one holds the folder's apply
// lock, another waits (here: fails after its wait, shortened).
func TestApplyLockIsExclusive(t *testing.T) {
	home, folder := t.TempDir(), t.TempDir()
	a, err := lockApply(home, folder)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		b, err := lockApply(home, folder)
		if err == nil {
			b.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a second apply lock while the first is held: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	a.Close()
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("the second apply after the first ended: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the second apply still waits after the first ended")
	}
	if _, err := lockApply("", folder); err == nil {
		t.Error("an apply lock without KOSA8_HOME")
	}
}

// One sandbox syncs a folder both ways; forks of it read it beside that
// one (their sync writes nothing there), each taking no folder lock.
func TestForksTakeNoFolderLock(t *testing.T) {
	home, folder := t.TempDir(), t.TempDir()
	open := func(name string, fork bool) (*workspace, error) {
		sb := &sandbox.Sandbox{Dir: t.TempDir(), Config: validConfig(name)}
		sb.Config.Workspace = &sandbox.WorkspaceConfig{Path: folder, Review: fork}
		if fork {
			sb.Config.Fork = &sandbox.ForkOrigin{Source: "base", Checkpoint: "x", Index: 1}
		}
		return openWorkspace(sb, home, nil)
	}
	base, err := open("base", false)
	if err != nil {
		t.Fatal(err)
	}
	defer base.closeFiles()
	for _, f := range []string{"base.1", "base.2"} {
		w, err := open(f, true)
		if err != nil {
			t.Fatalf("fork %s beside the sandbox that syncs the folder: %v", f, err)
		}
		defer w.closeFiles()
	}
	if w, err := open("other", false); err == nil {
		w.closeFiles()
		t.Error("a second sandbox synced the folder both ways beside the first")
	}
}

// A fork of a --docker sandbox hands its VMM the source's engine disk (the
// lowest layer of its own, as its root and workspace disks), not a path in
// its own folder where no such file is: Landlock would leave QEMU unable to
// read the layer its engine disk builds on.
func TestForkOfADockerSandboxReadsTheSourcesEngineDisk(t *testing.T) {
	r := newForkRig(t)
	src := r.src.s
	if err := os.WriteFile(src.sb.Path(sandbox.DockerDisk), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	src.sb.Config.Docker = &sandbox.DockerConfig{DiskGiB: 2}
	if err := src.sb.SaveConfig(); err != nil {
		t.Fatal(err)
	}
	meta := r.fork(t, 1)
	if _, err := r.m.CreateFork(context.Background(), src.sb, meta, sandbox.ForkOptions{Index: 1}); err != nil {
		t.Fatal(err)
	}
	j, drv, _, err := startFork(t, r, "fake.1")
	if err != nil {
		t.Fatal(err)
	}
	j.o.NewDriver = func(vmm.DriverOptions) (vmm.Driver, error) { return drv, nil }
	if err := j.driver(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(j.s.driverOpts.ReadOnly, src.sb.Path(sandbox.DockerDisk)) {
		t.Errorf("the fork's VMM may read %v: not the source's engine disk", j.s.driverOpts.ReadOnly)
	}
	for _, p := range j.s.driverOpts.ReadOnly {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the fork's VMM is given %s to read: %v", p, err)
		}
	}
}
