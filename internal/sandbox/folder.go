package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/wsync"
)

// WorkspaceConfig is the folder a sandbox works in.
type WorkspaceConfig struct {
	// Path is the host folder (absolute, symlinks resolved); the guest
	// sees it at the same path.
	Path    string   `json:"path"`
	Review  bool     `json:"review,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	Hold    []string `json:"hold,omitempty"`
	// QuotaBytes and QuotaFiles bound what the sync may keep of the
	// agent's making in the host folder (0: wsync's defaults, 10 GiB and
	// 200,000 entries).
	QuotaBytes int64 `json:"quota_bytes,omitempty"`
	QuotaFiles int   `json:"quota_files,omitempty"`
}

const (
	WorkspaceDisk     = "workspace.img"
	workspaceManifest = "workspace-manifest.json"
)

// CheckWorkspace resolves a host folder named for use as a workspace (by
// a CLI argument, an SDK field, an MCP argument: folder.Resolve, the one
// resolver) and returns its canonical path. The home directory and / need
// force.
func CheckWorkspace(dir string, force bool) (folder.Path, error) {
	real, err := folder.Resolve(dir)
	if err != nil {
		return folder.Path{}, fmt.Errorf("workspace: %w", err)
	}
	if !force {
		if home, err := HomeFolder(); err == nil && home == real {
			return folder.Path{}, fmt.Errorf("refusing to use your home directory %s as the workspace: cd into a project folder, pass --workspace DIR or --no-workspace (or --force)", real)
		}
		if real.String() == "/" {
			return folder.Path{}, errors.New("refusing to use / as the workspace: pass --workspace DIR or --no-workspace (or --force)")
		}
	}
	return real, nil
}

// HomeFolder is the user's home directory, resolved.
func HomeFolder() (folder.Path, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return folder.Path{}, err
	}
	return folder.Resolve(home)
}

// createWorkspaceDisk makes an empty ext4 disk for the workspace, its root
// owned by the guest user.
func createWorkspaceDisk(ctx context.Context, path string, gib, uid, gid int) error {
	if err := createExt4(ctx, path, "kosa8-ws", gib, uid, gid); err != nil {
		return fmt.Errorf("format the workspace disk: %w", err)
	}
	return nil
}

// createExt4 makes a sparse file of gib GiB at path holding an empty ext4
// filesystem labelled label, its root owned by uid:gid.
func createExt4(ctx context.Context, path, label string, gib, uid, gid int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(int64(gib) << 30); err != nil {
		f.Close()
		return err
	}
	f.Close()
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		mkfs = "/sbin/mkfs.ext4"
	}
	out, err := exec.CommandContext(ctx, mkfs, "-q", "-F", "-L", label, "-m", "0",
		"-E", "root_owner="+strconv.Itoa(uid)+":"+strconv.Itoa(gid)+",lazy_itable_init=1,lazy_journal_init=1", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// maxManifest bounds a saved manifest (or a checkpoint's): one entry is a
// few hundred bytes, and the sync's quota allows 200,000 of the agent's
// entries plus the user's. The bound of the other state files (1 MiB)
// made every workspace of more than about 4,000 files start with no
// manifest: every file both sides held counted as new on both.
const maxManifest = 512 << 20

// LoadManifest reads the workspace sync's manifest as last saved (nil if
// there is none or it cannot be read).
func (s *Sandbox) LoadManifest() map[string]*wsync.Entry {
	return ReadManifest(s.Path(workspaceManifest))
}

// ReadManifest reads a manifest file (the sandbox's, or a checkpoint's):
// nil if there is none or it cannot be read.
func ReadManifest(path string) map[string]*wsync.Entry {
	var m map[string]*wsync.Entry
	if err := readJSONMax(path, &m, maxManifest); err != nil {
		return nil
	}
	return m
}

// SaveManifest records the workspace sync's manifest, durably.
func (s *Sandbox) SaveManifest(m map[string]*wsync.Entry) error {
	return WriteManifest(s.Path(workspaceManifest), m)
}

// WriteManifest writes a manifest file atomically and durably, compact
// (a manifest is read by programs only, and can be large).
func WriteManifest(path string, m map[string]*wsync.Entry) error {
	return writeAtomic(path, m, false)
}

// Files of the workspace sync's crash safety (issue 27): what the next
// start needs to tell the guest's state from what the manifest says.
const (
	// WorkspaceGuestFile holds the guest versions awaiting review or
	// approval (wsync.Options.SaveGuest); a checkpoint keeps its own.
	WorkspaceGuestFile = "workspace-guest.json"
	workspaceJournal   = "workspace-deleting.json"
	workspaceClean     = "workspace-clean"
)

// LoadWorkspaceGuest reads the guest versions saved with the manifest.
func (s *Sandbox) LoadWorkspaceGuest() map[string]*wsync.Entry {
	return ReadManifest(s.Path(WorkspaceGuestFile))
}

// SaveWorkspaceGuest records them, durably.
func (s *Sandbox) SaveWorkspaceGuest(m map[string]*wsync.Entry) error {
	return WriteManifest(s.Path(WorkspaceGuestFile), m)
}

// LoadJournal reads the host deletions a pass had begun when its run
// ended (nil: none).
func (s *Sandbox) LoadJournal() map[string]*wsync.Entry {
	return ReadManifest(s.Path(workspaceJournal))
}

// SaveJournal records them durably before they are made; nil clears it.
func (s *Sandbox) SaveJournal(m map[string]*wsync.Entry) error {
	if m == nil {
		err := os.Remove(s.Path(workspaceJournal))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return syncDir(s.Dir)
	}
	return WriteManifest(s.Path(workspaceJournal), m)
}

// CleanStop is what the last run of a sandbox left its workspace as:
// stopped cleanly (the last pass done and durable, the guest powered off)
// or paused at a checkpoint whose manifest describes the guest exactly.
// Anything else (no mark: the supervisor or QEMU was killed, the host
// lost power, a start failed) makes the next start's first pass a merge
// that infers no deletion (wsync.Engine.Recover).
type CleanStop struct {
	Stopped bool
	Paused  string // the checkpoint the sandbox paused at
}

// TakeCleanStop reads the mark the last run left and removes it, durably,
// before the new run changes anything: a crash of the new run must not
// find it.
func (s *Sandbox) TakeCleanStop() (CleanStop, error) {
	b, err := os.ReadFile(s.Path(workspaceClean))
	if errors.Is(err, os.ErrNotExist) {
		return CleanStop{}, nil
	}
	if err != nil {
		return CleanStop{}, err
	}
	var c CleanStop
	switch f := strings.Fields(string(b)); {
	case len(f) == 1 && f[0] == "stopped":
		c.Stopped = true
	case len(f) == 2 && f[0] == "paused":
		c.Paused = f[1]
	}
	if err := os.Remove(s.Path(workspaceClean)); err != nil {
		return CleanStop{}, err
	}
	return c, syncDir(s.Dir)
}

// MarkCleanStop records how the run ended cleanly (see CleanStop).
func (s *Sandbox) MarkCleanStop(c CleanStop) error {
	text := "stopped\n"
	if c.Paused != "" {
		text = "paused " + c.Paused + "\n"
	}
	return writeFileAtomic(s.Path(workspaceClean), []byte(text))
}
