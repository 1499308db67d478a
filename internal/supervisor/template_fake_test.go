package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
)

// templateRig starts new sandboxes named as given, on fake machines,
// sharing one cache (where templates are kept); each starts as a
// sandbox's first start does.
type templateRig struct {
	t     *testing.T
	cache string
	img   *image.Image // one image for all: part of the shape
}

type templateStart struct {
	j     *startJob
	drv   *vmmtest.Driver
	guest *fakeGuest
}

func (r *templateRig) start(name string, prepare func(*vmmtest.Machine)) (*templateStart, error) {
	return r.startWith(name, prepare, nil)
}

// startWith is start with more steps after the machine's, through
// runStart (a second job if the first restored a template whose machine
// stopped under it).
func (r *templateRig) startWith(name string, prepare func(*vmmtest.Machine), more func(*startJob) []step) (*templateStart, error) {
	t := r.t
	j, drv := newStartJob(t)
	ts := &templateStart{j: j, drv: drv}
	drv.OnStart = func(m *vmmtest.Machine) {
		ts.guest = serveFakeGuest(t, m)
		if prepare != nil {
			prepare(m)
		}
	}
	s := j.s
	s.sb.Config.Name = name
	s.firstBoot = true
	j.m.Paths.Cache = r.cache
	if r.img == nil {
		r.img = &image.Image{Dir: t.TempDir()}
	}
	j.img = r.img
	// The disks sandbox.Create made: this sandbox's own bytes.
	if err := os.WriteFile(s.sb.Path(sandbox.RootDisk), []byte("root of "+name), 0o600); err != nil {
		t.Fatal(err)
	}
	s.setStatus(func(st *api.Status) { st.State, st.Started = api.Starting, time.Now() })
	j.s.cache = r.cache
	first := true
	j, err := s.runStart(context.Background(), func() *startJob {
		if first {
			first = false
			return j
		}
		return &startJob{s: s, m: j.m, o: j.o, img: j.img}
	}, func(j *startJob) []step {
		steps := []step{{"network", j.network}, {"machine", j.machine}}
		if more != nil {
			steps = append(steps, more(j)...)
		}
		return steps
	})
	ts.j = j
	t.Cleanup(func() {
		if s.net != nil {
			s.net.close()
		}
	})
	s.bg.Wait()
	return ts, err
}

func (r *templateRig) templates() []string {
	ents, _ := os.ReadDir(filepath.Join(r.cache, "templates"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// A new sandbox's first boot is saved as a template (paused for the copy,
// frozen, then running and thawed again); the next new sandbox of the
// same shape starts from it: the template's disks, device state and RAM,
// restored, its own hostname given after. Nothing of the first sandbox's
// own name is in the machine the second gets (the command line names
// none).
func TestTemplateMadeByTheFirstBootAndStartedFrom(t *testing.T) {
	r := &templateRig{t: t, cache: t.TempDir()}
	a, err := r.start("first", func(m *vmmtest.Machine) {
		if _, err := m.RAM().WriteAt([]byte("booted guest"), 4096); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	ma := a.drv.Machines()[0]
	if names := ma.CallNames(); !slices.Equal(names, []string{"Start", "Pause", "SaveDevices", "Resume"}) {
		t.Errorf("the first boot's machine: calls %v, want a start, then a pause for the copy and a resume", names)
	}
	if ma.Paused() {
		t.Error("the first sandbox's machine stays paused after the template's copy")
	}
	ops := a.guest.ops
	if i := slices.Index(ops, guest.OpFreeze); i < 0 || !slices.Contains(ops[i:], guest.OpThaw) {
		t.Errorf("guest ops %v: want a freeze before the copy and a thaw after it", ops)
	}
	tpls := r.templates()
	if len(tpls) != 1 {
		t.Fatalf("templates after the first boot: %v, want one", tpls)
	}
	key := tpls[0]
	if key != a.j.s.templateKey() || a.j.s.getStatus().Template != "" {
		t.Errorf("template %s, the first sandbox's key %s, its status says %q (booted, not started from one)", key, a.j.s.templateKey(), a.j.s.getStatus().Template)
	}
	// Unnamed while copied (no template holds a sandbox's name), named
	// after.
	if !slices.Equal(a.guest.names, []string{"", "first"}) || ops[len(ops)-1] != guest.OpSetTime || !slices.Contains(ops[:len(ops)-1], guest.OpThaw) {
		t.Errorf("the first guest: hostnames %q, ops %v; want unnamed until the copy is done, then named", a.guest.names, ops)
	}
	tdir := filepath.Join(r.cache, "templates", key)
	if b, _ := os.ReadFile(filepath.Join(tdir, templateRoot)); string(b) != "root of first" {
		t.Errorf("the template's root disk holds %q", b)
	}

	b, err := r.start("second", nil)
	if err != nil {
		t.Fatal(err)
	}
	mb := b.drv.Machines()
	if len(mb) != 1 {
		t.Fatalf("%d machines started for the second sandbox, want 1 (restored)", len(mb))
	}
	if names := mb[0].CallNames(); !slices.Equal(names, []string{"Start", "LoadDevices", "Resume"}) {
		t.Errorf("the second sandbox's machine: calls %v, want its device state loaded, not a boot", names)
	}
	if !mb[0].Copied {
		t.Error("the second machine's RAM was not prepared from the template's")
	}
	ram := make([]byte, 12)
	if _, err := mb[0].RAM().ReadAt(ram, 4096); err != nil || string(ram) != "booted guest" {
		t.Errorf("the second machine's RAM holds %q (%v), want the template's", ram, err)
	}
	if got, _ := os.ReadFile(b.j.s.sb.Path(sandbox.RootDisk)); string(got) != "root of first" {
		t.Errorf("the second sandbox's root disk holds %q, want the template's copy", got)
	}
	if st := b.j.s.getStatus(); st.Template != key {
		t.Errorf("status.template %q, want %q", st.Template, key)
	}
	if !slices.Contains(b.guest.ops, guest.OpRestored) || !slices.Equal(b.guest.names, []string{"second"}) {
		t.Errorf("the restored guest: ops %v, hostnames %q; want restored, named second", b.guest.ops, b.guest.names)
	}
	if n := len(r.templates()); n != 1 {
		t.Errorf("%d templates after a start from one, want still 1", n)
	}
	// The copy is the sandbox's own: the template stays as it was.
	if err := os.WriteFile(b.j.s.sb.Path(sandbox.RootDisk), []byte("written by second"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(tdir, templateRoot)); string(got) != "root of first" {
		t.Errorf("the template's disk changed with a sandbox's: %q", got)
	}
}

// A start from a template that fails (a device state QEMU refuses) boots
// instead, on the copied disks, and removes the template; the boot makes
// a new one. KOSA8_TEMPLATES=0 neither uses nor makes one.
func TestTemplateFailedStartBootsAndOffMeansOff(t *testing.T) {
	r := &templateRig{t: t, cache: t.TempDir()}
	if _, err := r.start("first", nil); err != nil {
		t.Fatal(err)
	}
	key := r.templates()[0]
	devs := filepath.Join(r.cache, "templates", key, checkpoint.DevicesFile)
	if err := os.WriteFile(devs, []byte("not a device state\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := r.start("second", nil)
	if err != nil {
		t.Fatalf("a start whose template fails: %v, want a boot", err)
	}
	ms := b.drv.Machines()
	if len(ms) != 2 || !slices.Contains(ms[0].CallNames(), "LoadDevices") || slices.Contains(ms[1].CallNames(), "LoadDevices") {
		t.Fatalf("machines: %d, want the failed restore then a boot", len(ms))
	}
	select {
	case <-ms[0].Done():
	case <-time.After(5 * time.Second):
		t.Error("the failed restore's machine still runs")
	}
	if st := b.j.s.getStatus(); st.Template != "" {
		t.Errorf("status.template %q after a boot", st.Template)
	}
	if got, _ := os.ReadFile(devs); bytes.Contains(got, []byte("not a device state")) {
		t.Error("the failed template is still there")
	}
	if len(r.templates()) != 1 {
		t.Errorf("templates after the boot: %v, want the boot's new one", r.templates())
	}

	t.Setenv("KOSA8_TEMPLATES", "0")
	if err := os.RemoveAll(filepath.Join(r.cache, "templates")); err != nil {
		t.Fatal(err)
	}
	c, err := r.start("third", nil)
	if err != nil {
		t.Fatal(err)
	}
	if names := c.drv.Machines()[0].CallNames(); !slices.Equal(names, []string{"Start"}) || len(r.templates()) != 0 {
		t.Errorf("KOSA8_TEMPLATES=0: calls %v, templates %v; want a boot and none made", names, r.templates())
	}
}

// A machine restored from a template that dies later in the start (the
// guest connection breaks under the workspace's mount: QEMU exited) costs
// the template, not the start: the start runs again, booting on the
// copied disks, and the template is removed once the boot got past where
// the restore died. The start's error would otherwise have been
// "workspace: agent: EOF".
func TestTemplateMachineThatDiesInTheStartBootsInstead(t *testing.T) {
	r := &templateRig{t: t, cache: t.TempDir()}
	if _, err := r.start("first", nil); err != nil {
		t.Fatal(err)
	}
	calls := 0
	b, err := r.startWith("second", nil, func(j *startJob) []step {
		return []step{{"workspace", func(context.Context) error {
			if calls++; calls == 1 {
				j.s.currentMachine().Kill()
				return fmt.Errorf("workspace: agent: %w", io.EOF)
			}
			return nil
		}}}
	})
	if err != nil {
		t.Fatalf("a start whose restored machine died: %v, want a boot", err)
	}
	ms := b.drv.Machines()
	if len(ms) != 2 || calls != 2 || !slices.Contains(ms[0].CallNames(), "LoadDevices") || slices.Contains(ms[1].CallNames(), "LoadDevices") {
		t.Fatalf("machines: %d, workspace steps %d; want the restore that died, then a boot, each with its workspace step", len(ms), calls)
	}
	if st := b.j.s.getStatus(); st.Template != "" || st.State != api.Starting || st.Error != "" {
		t.Errorf("status after the boot: %+v", st)
	}
	if len(r.templates()) != 0 {
		t.Errorf("templates after the boot: %v, want the one whose machine died gone (the boot's disks are not new: no other made)", r.templates())
	}
}

// The retry is no cover for what it is not: a step failing on its own
// (QEMU still running) fails the start; a sandbox whose booted machine
// dies the same way fails with its own machine's stop, and the template,
// shared with other sandboxes, stays; a retry that fails before its own
// QEMU runs says so, not that the first's stopped again.
func TestTemplateRetryOnlyForTheTemplatesMachine(t *testing.T) {
	defer func(g time.Duration) { vmExitGrace = g }(vmExitGrace)
	vmExitGrace = 100 * time.Millisecond
	r := &templateRig{t: t, cache: t.TempDir()}
	if _, err := r.start("first", nil); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected")
	calls := 0
	if _, err := r.startWith("own-failure", nil, func(*startJob) []step {
		return []step{{"workspace", func(context.Context) error { calls++; return injected }}}
	}); !errors.Is(err, injected) || calls != 1 || errors.As(err, new(errVMStopped)) {
		t.Errorf("a step failing with the machine up: %v after %d tries, want its error after one", err, calls)
	}

	calls = 0
	b, err := r.startWith("dies-twice", nil, func(j *startJob) []step {
		return []step{{"workspace", func(context.Context) error {
			calls++
			j.s.currentMachine().Kill()
			return fmt.Errorf("workspace: agent: %w", io.EOF)
		}}}
	})
	if !errors.As(err, new(errVMStopped)) || !errors.Is(err, io.EOF) || calls != 2 || len(b.drv.Machines()) != 2 {
		t.Errorf("a sandbox whose booted machine dies too: %v after %d tries, %d machines; want the boot's stop after two", err, calls, len(b.drv.Machines()))
	}
	if st := b.j.s.getStatus(); st.State != api.Crashed || !strings.Contains(st.Error, "the VM stopped while starting") {
		t.Errorf("status: %+v, want crashed with the stop", st)
	}
	if len(r.templates()) != 1 {
		t.Errorf("templates: %v, want the template kept", r.templates())
	}

	calls = 0
	qemuGone := errors.New("qemu: could not start (injected)")
	c, err := r.startWith("retry-fails-early", nil, func(j *startJob) []step {
		return []step{{"workspace", func(context.Context) error {
			calls++
			j.s.currentMachine().Kill()
			j.s.drv.(*vmmtest.Driver).FailStart(qemuGone)
			return fmt.Errorf("workspace: agent: %w", io.EOF)
		}}}
	})
	if !errors.Is(err, qemuGone) || calls != 1 || strings.HasPrefix(err.Error(), "the VM stopped") || !strings.Contains(err.Error(), "agent: EOF") {
		t.Errorf("a retry whose QEMU does not start: %v after %d workspace steps; want QEMU's failure first, the first's after", err, calls)
	}
	_ = c
}

// Only a sandbox's first start, on the disks Create made, is a template's
// business: a sandbox started before, or one whose disks a checkpoint
// moved on, boots as it always did, and makes none.
func TestTemplateOnlyForNewSandboxes(t *testing.T) {
	r := &templateRig{t: t, cache: t.TempDir()}
	j, _ := newStartJob(t)
	j.s.cache = r.cache
	if j.s.firstBoot {
		t.Fatal("a supervisor of the rig's kind starts with firstBoot")
	}
	j.s.firstBoot = true
	if err := j.s.sb.SaveActiveDisks(map[string]checkpoint.Disk{"root": {Path: "disks/x-root.qcow2", Format: "qcow2"}}); err != nil {
		t.Fatal(err)
	}
	if j.s.freshDisks() {
		t.Error("disks moved on by a checkpoint count as fresh")
	}
	if err := os.WriteFile(j.s.sb.Path("disks.json"), []byte("{damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	if j.s.freshDisks() {
		t.Error("a damaged disks record counts as fresh")
	}
	if err := j.s.captureTemplate(context.Background(), "k"); err == nil {
		t.Errorf("capture over moved disks: %v, want refused", err)
	}
	if len(r.templates()) != 0 {
		t.Errorf("templates: %v", r.templates())
	}
}

// A new sandbox's start that stops short after its QEMU had the disks (^C
// while booting: launch.Launch puts a sandbox never started back to
// "created") leaves disks a guest wrote, and the host's copy of the
// workspace into it. Its next start is still a first boot by its state,
// but its disks are no longer every new sandbox's: no template is made
// of them.
func TestTemplateNotMadeOfDisksAStartHadBefore(t *testing.T) {
	t.Setenv("KOSA8_TEMPLATES", "0") // the first start makes none
	cache := t.TempDir()
	j, _ := newStartJob(t)
	j.s.firstBoot = true
	j.s.cache = cache
	if err := os.WriteFile(j.s.sb.Path(sandbox.RootDisk), []byte("new root"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := j.run(context.Background(), []step{{"network", j.network}, {"machine", j.machine}}); err != nil {
		t.Fatal(err)
	}
	j.s.net.close()
	for _, m := range j.s.drv.(*vmmtest.Driver).Machines() {
		m.Kill()
	}
	// What the guest and the workspace's copy wrote before the ^C.
	if err := os.WriteFile(j.s.sb.Path(sandbox.RootDisk), []byte("this sandbox's own files"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Setenv("KOSA8_TEMPLATES", "1")
	k, _ := newStartJob(t)
	k.s.sb = j.s.sb
	k.s.firstBoot = true // the state launch.Launch put back
	k.s.cache = cache
	if err := k.run(context.Background(), []step{{"network", k.network}, {"machine", k.machine}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.s.net.close)
	k.s.bg.Wait()
	if ents, _ := os.ReadDir(filepath.Join(cache, "templates")); len(ents) != 0 {
		t.Errorf("a template was made of disks a start had before: %v", ents)
	}
}

// A machine that does not resume after the template's copy fails the
// start (the sandbox crashed, its QEMU killed) rather than going on with
// a paused guest whose every call then waits out the boot's deadline.
func TestTemplateCaptureNotResumedFailsTheStart(t *testing.T) {
	r := &templateRig{t: t, cache: t.TempDir()}
	a, err := r.start("first", func(m *vmmtest.Machine) { m.Fail("Resume", errors.New("injected: no resume")) })
	if err == nil || !strings.Contains(err.Error(), "injected: no resume") {
		t.Fatalf("start over a machine left paused: %v, want its failure", err)
	}
	select {
	case <-a.drv.Machines()[0].Done():
	case <-time.After(5 * time.Second):
		t.Error("the paused machine still runs after the failed start")
	}
	if len(r.templates()) != 0 {
		t.Errorf("templates: %v", r.templates())
	}
}

// A start reads one template whole: its disks, RAM and device state come
// from the directory it found, even if another supervisor replaces the
// template at that path meanwhile (a failed start removed it, a boot made
// a new one): the new one's device state with the old one's disks would
// be a guest whose cached file systems are not its disks'.
func TestTemplateStartReadsOneTemplate(t *testing.T) {
	r := &templateRig{t: t, cache: t.TempDir()}
	if _, err := r.start("first", nil); err != nil {
		t.Fatal(err)
	}
	tdir := filepath.Join(r.cache, "templates", r.templates()[0])
	swapped := false
	b, err := r.start("second", func(*vmmtest.Machine) {
		if swapped {
			return
		}
		swapped = true
		if err := os.Rename(tdir, tdir+".gone"); err != nil {
			t.Error(err)
		}
		if err := os.Mkdir(tdir, 0o700); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(filepath.Join(tdir, checkpoint.DevicesFile), []byte("another template's\n"), 0o600); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if ms := b.drv.Machines(); len(ms) != 1 || !slices.Contains(ms[0].CallNames(), "LoadDevices") {
		t.Errorf("%d machines: want the one restored from the template found", len(ms))
	}
}

// A template's device state or RAM that is not a regular file (a FIFO
// would block the open for ever, past every deadline) fails the restore
// at once: the start boots.
func TestTemplateFileNotRegularBoots(t *testing.T) {
	for _, name := range []string{checkpoint.DevicesFile, checkpoint.RAMFile} {
		t.Run(name, func(t *testing.T) {
			r := &templateRig{t: t, cache: t.TempDir()}
			if _, err := r.start("first", nil); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(r.cache, "templates", r.templates()[0], name)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := r.start("second", nil)
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("start over a template with a FIFO: %v, want a boot", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the start hangs on the template's FIFO")
			}
		})
	}
}

// A template is a cache: one is not made where its copy would leave the
// host's disk short (other sandboxes' disks get I/O errors when it fills),
// and the machine is not paused for it.
func TestTemplateNotMadeWithoutRoom(t *testing.T) {
	defer func(n int64) { templateSpareBytes = n }(templateSpareBytes)
	templateSpareBytes = 1 << 60
	r := &templateRig{t: t, cache: t.TempDir()}
	a, err := r.start("first", nil)
	if err != nil {
		t.Fatal(err)
	}
	if names := a.drv.Machines()[0].CallNames(); !slices.Equal(names, []string{"Start"}) || len(r.templates()) != 0 {
		t.Errorf("calls %v, templates %v: want no pause and none made", names, r.templates())
	}
}

// A copy of a template's disk a killed supervisor left beside the
// sandbox's (its tmp name) is removed by the next start's copy, not kept
// for the sandbox's life.
func TestTemplateDiskCopyLeftoversRemoved(t *testing.T) {
	r := &templateRig{t: t, cache: t.TempDir()}
	if _, err := r.start("first", nil); err != nil {
		t.Fatal(err)
	}
	b, err := r.start("second", nil)
	if err != nil {
		t.Fatal(err)
	}
	left := b.j.s.sb.Path(sandbox.RootDisk) + ".new-0123456789ab"
	if err := os.WriteFile(left, []byte("a killed copy"), 0o600); err != nil {
		t.Fatal(err)
	}
	tpl := b.j.s.findTemplate(r.templates()[0])
	if tpl == nil {
		t.Fatal("no template")
	}
	defer tpl.close()
	if err := b.j.s.takeTemplateDisks(tpl); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(left); err == nil {
		t.Error("the killed copy is still there")
	}
}

// 'kosa8 image prune' takes the boot templates of the images it removed
// with them (and damaged ones); those of images still there, and captures
// under way (dot folders), stay.
func TestPruneTemplatesOfImagesGone(t *testing.T) {
	cache, img := t.TempDir(), t.TempDir()
	dir := filepath.Join(cache, "templates")
	write := func(name, imageDir string, record bool) {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if record {
			if err := sandbox.WriteJSONAtomic(filepath.Join(dir, name, templateMetaFile), templateMeta{Version: templateVersion, Key: name, ImageDir: imageDir}); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("kept", img, true)
	write("gone", filepath.Join(img, "removed"), true)
	write("damaged", "", false)
	write(".tmp-x", "", false)
	removed := PruneTemplates(cache)
	slices.Sort(removed)
	want := []string{filepath.Join(dir, "damaged"), filepath.Join(dir, "gone")}
	if !slices.Equal(removed, want) {
		t.Errorf("removed %q, want %q", removed, want)
	}
	for _, name := range []string{"kept", ".tmp-x"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Templates are kept by last use, at most so many and so many bytes: a
// template a start used lately outlives a newer one nobody used; the
// most recent stays even alone over the byte limit.
func TestPruneTemplatesKeepsTheRecentlyUsed(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Now().Add(-time.Hour)
	mk := func(name string, created, used time.Time, size int) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := sandbox.WriteJSONAtomic(filepath.Join(p, templateMetaFile), templateMeta{Version: templateVersion, Key: name, Created: created}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, checkpoint.RAMFile), bytes.Repeat([]byte{1}, size), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, used, used); err != nil {
			t.Fatal(err)
		}
	}
	names := func() []string {
		ents, _ := os.ReadDir(dir)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	mk("old-but-used", t0, t0.Add(50*time.Minute), 4096)
	mk("new-unused", t0.Add(10*time.Minute), t0.Add(10*time.Minute), 4096)
	mk("oldest", t0, t0, 4096)
	pruneTemplates(dir, 2, 1<<30, slog.New(slog.DiscardHandler))
	if got := names(); !slices.Equal(got, []string{"new-unused", "old-but-used"}) {
		t.Errorf("kept %v, want the two most recently used", got)
	}
	pruneTemplates(dir, 8, 1, slog.New(slog.DiscardHandler))
	if got := names(); !slices.Equal(got, []string{"old-but-used"}) {
		t.Errorf("kept %v over the byte limit, want only the most recently used", got)
	}
}
