package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
)

// Boot templates. A new sandbox's first start boots a guest that is the
// same, up to its agent answering, as every other sandbox of its shape:
// one image, one agent, one kernel command line (which names no sandbox:
// the hostname comes after), one size of CPUs, memory and disks, one
// accelerator and QEMU build. The first such boot is saved as a template
// (its RAM, device state and disks, paused for the copy) before anything
// of the sandbox's own reaches the guest (the workspace, the CA, a
// command); a later sandbox of that shape starts from copies of its disks
// and loads its machine instead of booting: a restore, not a boot.
//
// A template is a cache: any sandbox may be started without one, a start
// from one that fails boots instead, and KOSA8_TEMPLATES=0 turns them off.
// Each start that uses one copies its disks into the sandbox's own, so
// nothing refers to a template once it is started, and a template can be
// removed at any time (the least recently used beyond templateKeep or
// templateBytes are).

// templateVersion changes with what a template holds or how its key is
// made. 2: the root filesystem has metadata_csum_seed (set by the agent
// before it mounts the root), so a sandbox started from the template can
// take a UUID of its own.
const templateVersion = 2

// templateStartTimeout bounds a start from a template under TCG (under
// KVM or HVF, accelBootTimeout does).
const templateStartTimeout = time.Minute

// At most templateKeep templates are kept, and at most templateBytes of
// them (the most recently used first; the newest always).
const (
	templateKeep  = 8
	templateBytes = 2 << 30
)

// templateSpareBytes is the free space a template's copy must leave on
// its filesystem (shared, as a rule, with every sandbox's disks, whose
// writes fail when it is full): a cache is not made at their cost.
var templateSpareBytes int64 = 1 << 30

// Files in a template's directory.
const (
	templateMetaFile = "template.json"
	templateRoot     = "root.qcow2"
	templateWS       = "workspace.img"
)

// templatesOff: KOSA8_TEMPLATES=0 (or "off", "false") in the supervisor's
// environment.
func templatesOff() bool {
	switch strings.ToLower(os.Getenv("KOSA8_TEMPLATES")) {
	case "0", "off", "false", "no":
		return true
	}
	return false
}

// templateMeta is a template's record (template.json).
type templateMeta struct {
	Version   int       `json:"version"`
	Key       string    `json:"key"`
	Created   time.Time `json:"created"`
	QEMU      string    `json:"qemu"`
	Firmware  string    `json:"qemu_firmware,omitempty"`
	Accel     string    `json:"accel"`
	Arch      string    `json:"arch"`
	CPUs      int       `json:"cpus"`
	MemoryMiB int       `json:"memory_mib"`
	DiskGiB   int       `json:"disk_gib"`
	Workspace bool      `json:"workspace"`
	ImageDir  string    `json:"image_dir"`
	RAMBytes  int64     `json:"ram_bytes"`
	PauseMS   float64   `json:"pause_ms"` // the template sandbox's pause for the copy
}

// templateKey is the key of the machine s boots now: everything the guest
// sees up to its agent's first answer. The disks are the ones a new
// sandbox gets (sandbox.Create), so a sandbox is eligible only before its
// first start.
func (s *supervisor) templateKey() string {
	cfg, spec := &s.sb.Config, s.spec
	parts := []any{
		templateVersion, spec.Arch, spec.CPUs, spec.MemoryMiB, spec.Kernel, spec.Initrd, spec.Cmdline,
		spec.AgentPort, spec.Net,
		cfg.ImageDir, cfg.DiskGiB, cfg.Workspace != nil, string(s.accel), s.qemuVersion, s.qemuFirmware,
	}
	b, _ := json.Marshal(parts)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// templatesDir holds the templates, beside the images they are made from.
func (s *supervisor) templatesDir() string { return templatesIn(s.cache) }

// templatesIn is the templates folder of the cache folder cache.
func templatesIn(cache string) string { return filepath.Join(cache, "templates") }

// publishedTemplate is one of the templates folder's entries.
type publishedTemplate struct {
	path string
	meta templateMeta
	err  error // its record could not be read: damaged (a published folder always has one)
}

// publishedTemplates lists the templates in dir (not captures under way,
// the dot folders, nor links).
func publishedTemplates(dir string) []publishedTemplate {
	ents, _ := os.ReadDir(dir)
	var out []publishedTemplate
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		t := publishedTemplate{path: filepath.Join(dir, e.Name())}
		t.err = readRecord(filepath.Join(t.path, templateMetaFile), &t.meta)
		out = append(out, t)
	}
	return out
}

// freshDisks: the sandbox's disks are still those sandbox.Create made (no
// layer over them recorded), the only ones a template's stand in for:
// the capture's own check. The start (start.go's machine) knows it
// already: it asks sandbox.DisksUnused (no QEMU had them) and records
// those disks itself.
func (s *supervisor) freshDisks() bool {
	m, err := s.sb.RecordedDisks()
	if err != nil || len(m) != 1+boolInt(s.sb.Config.Workspace != nil) {
		return false
	}
	if m["root"].Path != sandbox.RootDisk {
		return false
	}
	return s.sb.Config.Workspace == nil || m["ws"].Path == sandbox.WorkspaceDisk
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// template is a template found for a start: its directory held open, so
// that all its files are one template's even if its path changes.
type template struct {
	dir  string
	root *os.Root
	meta templateMeta
}

func (t *template) close() { t.root.Close() }

// findTemplate returns the template for key, or nil (none, or one that
// does not match: a record is read bounded, never through a link). Close
// what it returns.
func (s *supervisor) findTemplate(key string) *template {
	dir := filepath.Join(s.templatesDir(), key)
	all, err := os.OpenRoot(s.templatesDir())
	if err != nil {
		return nil
	}
	root, err := all.OpenRoot(key)
	all.Close()
	if err != nil {
		return nil
	}
	var meta templateMeta
	f, err := openRegularIn(root, templateMetaFile)
	if err == nil {
		err = readRecordFile(f, &meta)
		f.Close()
	}
	if err != nil || meta.Version != templateVersion || meta.Key != key || meta.QEMU != s.qemuVersion || meta.Firmware != s.qemuFirmware || meta.Accel != string(s.accel) {
		root.Close()
		return nil
	}
	return &template{dir: dir, root: root, meta: meta}
}

// readRecord reads a small JSON record: a regular file, not a link, at
// most 64 KiB.
func readRecord(path string, v any) error {
	f, err := openRegular(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return readRecordFile(f, v)
}

func readRecordFile(f *os.File, v any) error {
	b, err := io.ReadAll(io.LimitReader(f, 64<<10+1))
	if err != nil {
		return err
	}
	if len(b) > 64<<10 {
		return fmt.Errorf("%s: too large", f.Name())
	}
	return json.Unmarshal(b, v)
}

// restoreMeta is the template as a checkpoint to restore (its files in
// its own directory).
func (t *template) restoreMeta() *checkpoint.Meta {
	return &checkpoint.Meta{
		ID: "template-" + t.meta.Key, Kind: "template", QEMU: t.meta.QEMU, Firmware: t.meta.Firmware,
		Arch: t.meta.Arch, MemoryMiB: t.meta.MemoryMiB, Root: t.root,
	}
}

// templateDisks pairs each of a template's disk files with the sandbox
// file it stands for.
func (s *supervisor) templateDisks() [][2]string {
	d := [][2]string{{templateRoot, sandbox.RootDisk}}
	if s.sb.Config.Workspace != nil {
		d = append(d, [2]string{templateWS, sandbox.WorkspaceDisk})
	}
	return d
}

// takeTemplateDisks makes the sandbox's disks copies of the template's:
// each is copied (sparse) beside the sandbox's file under a name claimed
// with O_EXCL, never through a link, then renamed over it. Sources are
// opened first, so a template removed meanwhile is still read whole.
func (s *supervisor) takeTemplateDisks(t *template) error {
	for _, d := range s.templateDisks() {
		src, err := openRegularIn(t.root, d[0])
		if err != nil {
			return err
		}
		err = replaceWithCopy(s.sb.Path(d[1]), src)
		src.Close()
		if err != nil {
			return fmt.Errorf("copy the template's %s: %w", d[0], err)
		}
	}
	return nil
}

// openRegular opens a regular file for reading, not through a link.
func openRegular(path string) (*os.File, error) {
	return regularOnly(os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0))
}

// openRegularIn is openRegular for a file in root.
func openRegularIn(root *os.Root, name string) (*os.File, error) {
	return regularOnly(root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0))
}

// regularOnly passes on an opened file if it is a regular one (not a
// FIFO or a device, opened without blocking), else closes it.
func regularOnly(f *os.File, err error) (*os.File, error) {
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", f.Name())
	}
	return f, nil
}

// replaceWithCopy makes dst a copy of src (holes kept): written to a new
// file beside it, then renamed over it.
func replaceWithCopy(dst string, src *os.File) error {
	// Copies a killed supervisor left (one supervisor runs a sandbox at a
	// time: none is another's under way).
	old, _ := filepath.Glob(dst + ".new-*")
	for _, p := range old {
		os.Remove(p)
	}
	// A new name (O_EXCL: never an existing file or link), mode 0600.
	f, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+".new-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = checkpoint.CopySparse(f, src)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// startFromTemplate starts the machine from the template for this
// sandbox's shape, if there is one: its disks copied in, its machine
// restored. It reports whether it did; a start that fails is undone (QEMU
// killed) and the caller boots instead, on the copied disks, which are a
// booted guest's and boot as well as new ones.
func (s *supervisor) startFromTemplate(ctx context.Context, key string) bool {
	t := s.findTemplate(key)
	if t == nil {
		return false
	}
	defer t.close()
	tStart := time.Now()
	if err := s.takeTemplateDisks(t); err != nil {
		s.log.Warn("start from a template: booting instead", "template", key, "err", err)
		return false
	}
	tDisks := time.Now()
	// Its own deadline, so that a restore that hangs leaves the boot
	// time: a restore reaches the agent in about 1.5 s under TCG here.
	wait := templateStartTimeout
	if s.accel != vmm.TCG {
		wait = accelBootTimeout
	}
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := s.launch(lctx, t.restoreMeta()); err != nil {
		if m := s.currentMachine(); m != nil {
			_ = m.Kill()
		}
		if ctx.Err() != nil {
			return false // the caller gave up (^C): nothing wrong with the template
		}
		// Removed: a template this machine cannot start from would cost
		// every later start the same try (a good one is made again by the
		// boot that follows).
		os.RemoveAll(t.dir)
		// The console log is kept: the boot's lines follow the failed
		// restore's (a guest that panicked says why only there).
		s.log.Warn("start from a template failed: removed it, booting instead", "template", key, "err", err)
		return false
	}
	now := time.Now()
	_ = os.Chtimes(t.dir, now, now) // used: kept before those that were not
	s.setStatus(func(st *api.Status) { st.Template = key })
	s.log.Info("started from a template", "template", key, "disks_ms", msBetween(tStart, tDisks), "ms", msSince(tStart))
	return true
}

// errNotResumed: the machine stayed paused after a template's copy; the
// start fails with it (a paused guest answers nothing).
var errNotResumed = errors.New("the VM did not resume")

// captureTemplate saves the machine just booted as the template for key:
// the guest's workloads frozen (the freeze waits for the root
// filesystem's grow), the VM paused while its device state, RAM and disks
// are copied, then resumed and thawed. The files are synced and
// published (renamed into place) in the background; wait for it with
// s.bg. A failure costs the template, never the start, but for a machine
// left paused (errNotResumed).
func (s *supervisor) captureTemplate(ctx context.Context, key string) error {
	if !s.freshDisks() {
		return errors.New("the sandbox's disks are not new")
	}
	dir := s.templatesDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	sweepTemplateTemps(dir)
	tmp, err := os.MkdirTemp(dir, ".tmp-"+key+"-")
	if err != nil {
		return err
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(tmp)
		}
	}()
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	create := func(name string) (*os.File, error) {
		f, err := os.OpenFile(filepath.Join(tmp, name), os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err == nil {
			files = append(files, f)
		}
		return f, err
	}
	dev, err := create(checkpoint.DevicesFile)
	if err != nil {
		return err
	}
	ram, err := create(checkpoint.RAMFile)
	if err != nil {
		return err
	}
	type diskCopy struct{ dst, src *os.File }
	var disks []diskCopy
	for _, d := range s.templateDisks() {
		dst, err := create(d[0])
		if err != nil {
			return err
		}
		src, err := openRegular(s.sb.Path(d[1]))
		if err != nil {
			return err
		}
		files = append(files, src)
		disks = append(disks, diskCopy{dst, src})
	}
	m := s.currentMachine()
	snap, err := snapshotter(m)
	if err != nil {
		return err
	}
	ramSrc, err := dupFile(snap.RAM())
	if err != nil {
		return err
	}
	files = append(files, ramSrc)

	need := checkpoint.Allocated(ramSrc)
	for _, d := range disks {
		need += checkpoint.Allocated(d.src)
	}
	free, err := checkpoint.FreeBytes(tmp)
	if err != nil {
		return err
	}
	if free < need+templateSpareBytes {
		return fmt.Errorf("%d MiB free in %s, the copy needs %d MiB and leaves at least %d MiB", free>>20, dir, need>>20, templateSpareBytes>>20)
	}

	client := s.currentClient()
	fctx, cancel := withTimeout(ctx, guestCallTimeout)
	err = within(fctx, client.Freeze)
	cancel()
	defer func() {
		tctx, cancel := withTimeout(context.Background(), guestCallTimeout)
		if terr := within(tctx, client.Thaw); terr != nil {
			s.log.Warn("thaw after the template's copy", "err", terr)
		}
		cancel()
	}()
	if err != nil {
		return fmt.Errorf("freeze: %w", err)
	}
	pctx, cancel := withTimeout(ctx, vmCallTimeout)
	err = snap.Pause(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	tPaused := time.Now()
	var ramBytes int64
	err = snap.SaveDevices(ctx, dev)
	if err == nil {
		ramBytes, err = checkpoint.CopySparse(ram, ramSrc)
	}
	for _, d := range disks {
		if err == nil {
			_, err = checkpoint.CopySparse(d.dst, d.src)
		}
	}
	rctx, cancel := withTimeout(context.Background(), vmCallTimeout)
	rerr := snap.Resume(rctx)
	cancel()
	pause := msSince(tPaused)
	if rerr != nil {
		return errors.Join(err, fmt.Errorf("%w after the template's copy: %w", errNotResumed, rerr))
	}
	if err != nil {
		return err
	}
	meta := templateMeta{
		Version: templateVersion, Key: key, Created: time.Now().UTC(), QEMU: s.qemuVersion, Firmware: s.qemuFirmware,
		Accel: string(s.accel), Arch: string(s.spec.Arch), CPUs: s.spec.CPUs, MemoryMiB: s.spec.MemoryMiB,
		DiskGiB: s.sb.Config.DiskGiB, Workspace: s.sb.Config.Workspace != nil, ImageDir: s.sb.Config.ImageDir,
		RAMBytes: ramBytes, PauseMS: pause,
	}
	// Synced and published off the start's path; Supervise waits for it
	// before it returns.
	published = true
	keep := files
	files = nil
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		err := publishTemplate(dir, tmp, key, &meta, keep)
		for _, f := range keep {
			f.Close()
		}
		if err != nil {
			os.RemoveAll(tmp)
			s.log.Warn("template not saved", "template", key, "err", err)
			return
		}
		s.log.Info("template saved", "template", key, "pause_ms", pause, "ram_mib", ramBytes>>20)
		pruneTemplates(dir, templateKeep, templateBytes, s.log)
	}()
	return nil
}

// publishTemplate syncs a template's files and record and renames its
// directory into place (not over one already there: another sandbox's
// capture of the same shape won).
func publishTemplate(dir, tmp, key string, meta *templateMeta, files []*os.File) error {
	for _, f := range files {
		if f.Name() == "" || !strings.HasPrefix(f.Name(), tmp+string(filepath.Separator)) {
			continue // a source
		}
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := sandbox.WriteJSONAtomic(filepath.Join(tmp, templateMetaFile), meta); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, key)); err != nil {
		if errors.Is(err, os.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
			os.RemoveAll(tmp)
			return nil
		}
		return err
	}
	return nil
}

// sweepTemplateTemps removes captures a killed supervisor left (older
// than any capture takes).
func sweepTemplateTemps(dir string) {
	tmps, _ := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	for _, d := range tmps {
		if fi, err := os.Lstat(d); err == nil && time.Since(fi.ModTime()) > 10*time.Minute {
			os.RemoveAll(d)
		}
	}
}

// pruneTemplates keeps the most recently used templates, at most keep of
// them and keepBytes of disk (the most recent always), and removes the
// rest.
func pruneTemplates(dir string, keep int, keepBytes int64, log interface{ Info(string, ...any) }) {
	type tpl struct {
		path string
		used time.Time
		size int64
	}
	var all []tpl
	for _, p := range publishedTemplates(dir) {
		if p.err != nil {
			os.RemoveAll(p.path)
			continue
		}
		t := tpl{path: p.path, used: p.meta.Created, size: sandbox.AllocatedTree(p.path)}
		if fi, err := os.Lstat(p.path); err == nil && fi.ModTime().After(t.used) {
			t.used = fi.ModTime() // touched by each start from it
		}
		all = append(all, t)
	}
	slices.SortFunc(all, func(a, b tpl) int { return b.used.Compare(a.used) })
	var total int64
	for i, t := range all {
		total += t.size
		if i == 0 || i < keep && total <= keepBytes {
			continue
		}
		if err := os.RemoveAll(t.path); err == nil {
			log.Info("template removed (the least recently used beyond what is kept)", "template", filepath.Base(t.path), "mib", t.size>>20)
		}
	}
}

// PruneTemplates removes the boot templates in cache made of an image
// that is gone ('kosa8 image prune'), and damaged ones, and returns the
// directories it removed.
func PruneTemplates(cache string) []string {
	var removed []string
	for _, p := range publishedTemplates(templatesIn(cache)) {
		if p.err == nil && p.meta.ImageDir != "" {
			if _, err := os.Stat(p.meta.ImageDir); err == nil {
				continue
			}
		}
		if os.RemoveAll(p.path) == nil {
			removed = append(removed, p.path)
		}
	}
	return removed
}
