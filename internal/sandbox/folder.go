package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

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

// CheckWorkspace validates a host folder for use as a workspace and
// returns its canonical path. The home directory and / need force.
func CheckWorkspace(dir string, force bool) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("workspace %s: %w", dir, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("workspace %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("workspace %s is not a directory", dir)
	}
	if !force {
		home, _ := os.UserHomeDir()
		if rh, err := filepath.EvalSymlinks(home); err == nil && rh == real {
			return "", fmt.Errorf("refusing to use your home directory %s as the workspace: cd into a project folder, pass --workspace DIR or --no-workspace (or --force)", real)
		}
		if real == "/" {
			return "", errors.New("refusing to use / as the workspace: pass --workspace DIR or --no-workspace (or --force)")
		}
	}
	return real, nil
}

// createWorkspaceDisk makes an empty ext4 disk for the workspace, its root
// owned by the guest user.
func createWorkspaceDisk(ctx context.Context, path string, gib, uid, gid int) error {
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
	out, err := exec.CommandContext(ctx, mkfs, "-q", "-F", "-L", "kosa8-ws", "-m", "0",
		"-E", "root_owner="+strconv.Itoa(uid)+":"+strconv.Itoa(gid)+",lazy_itable_init=1,lazy_journal_init=1", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("format the workspace disk: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// LoadManifest reads the workspace sync's manifest as last saved (nil if
// there is none or it cannot be read).
func (s *Sandbox) LoadManifest() map[string]*wsync.Entry {
	var m map[string]*wsync.Entry
	if err := readJSON(s.Path(workspaceManifest), &m); err != nil {
		return nil
	}
	return m
}

// SaveManifest records the workspace sync's manifest.
func (s *Sandbox) SaveManifest(m map[string]*wsync.Entry) error {
	return WriteJSONAtomic(s.Path(workspaceManifest), m)
}
