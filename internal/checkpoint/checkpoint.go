// Package checkpoint keeps a sandbox's checkpoints on disk.
//
// # Layout
//
//	SANDBOX/checkpoints/ID/           one checkpoint, visible only once complete
//	    meta.json                     Meta (below); written last
//	    ram                           guest RAM, sparse (holes where the guest never wrote)
//	    devices                       QEMU's device state (a migration stream without RAM)
//	    workspace-manifest.json       the workspace sync's manifest at the checkpoint
//	SANDBOX/checkpoints/.tmp-ID/      a checkpoint being written (removed if a crash left it)
//	SANDBOX/disks/                    disk layers: a checkpoint names the frozen layer of each
//	                                  disk; later layers are qcow2 overlays on it
//
// IDs are time-ordered (YYYYMMDD-HHMMSS-xxxx). Meta is JSON with a version;
// a reader refuses versions it does not know.
package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Version of meta.json.
const Version = 1

// Meta describes a checkpoint.
type Meta struct {
	Version int       `json:"version"`
	ID      string    `json:"id"`
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	Message string    `json:"message,omitempty"`
	Kind    string    `json:"kind"` // manual, pre-rewind, pause, auto, disks
	// DisksOnly: a stopped machine's disks, without RAM or device state;
	// restoring it boots from its disks.
	DisksOnly bool `json:"disks_only,omitempty"`
	// QEMU is the build that saved it (version line); a different build may
	// not load the device state.
	QEMU string `json:"qemu"`
	// Firmware is the file name of the microvm firmware it ran with
	// (qboot.rom), empty where QEMU's default was used or not recorded.
	// It is part of the machine: its ROM is in the device state.
	Firmware  string `json:"qemu_firmware,omitempty"`
	Arch      string `json:"arch"`
	MemoryMiB int    `json:"memory_mib"`
	// Disks maps a disk's id to its frozen layer (relative to the sandbox
	// directory) and format.
	Disks map[string]Disk `json:"disks"`
	// Root holds the RAM and device state of a machine restored from
	// outside the sandbox's checkpoints (a boot template's directory, a
	// fork's source's checkpoint, held open); not recorded.
	Root *os.Root `json:"-"`
	// MapRAM: a restore maps the RAM file copy-on-write where the VMM
	// can (vmm.StartOptions.RAMTemplate) rather than copying it: the
	// forks of one checkpoint share its pages. Not recorded.
	MapRAM bool `json:"-"`
	// RAMInStream: the RAM is in the device state (a checkpoint of a
	// machine whose RAM was private to its VMM: a fork that maps its
	// source's checkpoint), not in a RAM file of its own.
	RAMInStream bool `json:"ram_in_stream,omitempty"`
	// Sizes and times.
	RAMBytes    int64   `json:"ram_bytes"` // data actually stored
	DeviceBytes int64   `json:"device_bytes"`
	PauseMillis float64 `json:"pause_ms"`
	TotalMillis float64 `json:"total_ms"`
	// PauseSteps is where the pause went, in ms: stop, disks (their
	// snapshots), devices (their state), ram (its copy), resume.
	PauseSteps map[string]float64 `json:"pause_steps_ms,omitempty"`
	// How the RAM was saved: Incremental copies only the pages the guest
	// wrote since the parent (RAMCopiedBytes of them) over a copy of the
	// parent's RAM; FullCopyReason says why a copy was full. Verify is the
	// verifier's finding ("ok", or the first page that differed) when
	// KOSA8_CHECKPOINT_VERIFY=1.
	Incremental    bool   `json:"incremental,omitempty"`
	RAMCopiedBytes int64  `json:"ram_copied_bytes,omitempty"`
	FullCopyReason string `json:"full_copy_reason,omitempty"`
	Verify         string `json:"verify,omitempty"`
}

// Loadable reports whether a machine run by QEMU build qemu (its version
// line) with firmware can load this checkpoint's device state, and when it
// cannot, why: the restore then boots from the checkpoint's disks, which
// every QEMU reads. microvm has no versioned machine types, so QEMU
// promises no migration between releases in either direction, and a load
// that fails halfway leaves no machine to fall back to: any other build
// cold-boots, after an upgrade and after a downgrade alike.
func (m *Meta) Loadable(qemu, firmware string) (bool, string) {
	switch {
	case m.DisksOnly:
		return false, "a disks-only checkpoint"
	case m.QEMU != "" && qemu != "" && m.QEMU != qemu:
		return false, fmt.Sprintf("saved by %q, running %q", m.QEMU, qemu)
	case m.Firmware != "" && firmware != "" && m.Firmware != firmware:
		return false, fmt.Sprintf("saved with firmware %s, running %s", m.Firmware, firmware)
	}
	return true, ""
}

// Disk is one frozen disk layer.
type Disk struct {
	Path   string `json:"path"`
	Format string `json:"format"`
}

// Files in a checkpoint directory.
const (
	MetaFile     = "meta.json"
	RAMFile      = "ram"
	DevicesFile  = "devices"
	ManifestFile = "workspace-manifest.json"
)

var idRE = regexp.MustCompile(`^[0-9]{8}-[0-9]{6}-[0-9a-f]{4}$`)

// NewID returns a fresh, time-ordered id.
func NewID() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return time.Now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b)
}

// Store is a sandbox's checkpoint directory.
type Store struct{ Dir string }

// ErrNotFound: no checkpoint with that id.
var ErrNotFound = errors.New("no such checkpoint")

// mkdirIn makes dir if it is missing, never its parent: the parent is a
// sandbox's folder, and one removed (renamed aside, then deleted) while a
// late spare fill or checkpoint still ran must stay gone, not come back
// as a folder 'kosa8 ls' cannot open.
func mkdirIn(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// Path names a checkpoint's directory.
func (s Store) Path(id string) string { return filepath.Join(s.Dir, id) }

// Begin makes a temporary directory for a new checkpoint.
func (s Store) Begin(id string) (string, error) {
	if err := mkdirIn(s.Dir); err != nil {
		return "", err
	}
	tmp := filepath.Join(s.Dir, ".tmp-"+id)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", err
	}
	return tmp, nil
}

// Commit writes meta into tmp, syncs everything and renames tmp into place:
// a checkpoint is visible only once complete.
func (s Store) Commit(tmp string, m *Meta) error {
	m.Version = Version
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, MetaFile), b, 0o600); err != nil {
		return err
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := syncFile(filepath.Join(tmp, e.Name())); err != nil {
			return err
		}
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.Path(m.ID)); err != nil {
		return err
	}
	return syncFile(s.Dir)
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Abort removes a checkpoint that will not be completed.
func (s Store) Abort(tmp string) { os.RemoveAll(tmp) }

// Sweep removes what a crash left half-written.
func (s Store) Sweep() {
	dirs, _ := filepath.Glob(filepath.Join(s.Dir, ".tmp-*"))
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}

// maxMeta bounds meta.json.
const maxMeta = 1 << 20

// Load reads a checkpoint's metadata.
func (s Store) Load(id string) (*Meta, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("%w: %q is not a checkpoint id", ErrNotFound, id)
	}
	f, err := os.Open(filepath.Join(s.Path(id), MetaFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s ('kosa8 checkpoints NAME' lists them)", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMeta))
	if err != nil {
		return nil, err
	}
	return ParseMeta(b)
}

// ParseMeta decodes and checks meta.json.
func ParseMeta(b []byte) (*Meta, error) {
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("checkpoint metadata: %w", err)
	}
	if m.Version != Version {
		return nil, fmt.Errorf("checkpoint metadata version %d is not supported (this kosa8 reads %d)", m.Version, Version)
	}
	if !idRE.MatchString(m.ID) {
		return nil, fmt.Errorf("checkpoint metadata: bad id %q", m.ID)
	}
	for id, d := range m.Disks {
		if d.Path == "" || filepath.IsAbs(d.Path) || strings.Contains(d.Path, "..") || (d.Format != "qcow2" && d.Format != "raw") {
			return nil, fmt.Errorf("checkpoint metadata: bad disk %s %+v", id, d)
		}
	}
	return &m, nil
}

// List returns the checkpoints, oldest first.
func (s Store) List() ([]*Meta, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Meta
	for _, e := range entries {
		if !e.IsDir() || !idRE.MatchString(e.Name()) {
			continue
		}
		if m, err := s.Load(e.Name()); err == nil {
			out = append(out, m)
		}
	}
	// IDs name the second only: two checkpoints in one second (a
	// checkpoint and the rewind's own) are told apart by when they were made.
	slices.SortFunc(out, func(a, b *Meta) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Delete removes a checkpoint (not the disk layers, which later layers
// may be built on; see the sandbox's disk GC).
func (s Store) Delete(id string) error {
	if _, err := s.Load(id); err != nil {
		return err
	}
	// Out of sight first, then gone.
	trash := filepath.Join(s.Dir, ".tmp-del-"+id)
	if err := os.Rename(s.Path(id), trash); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}
