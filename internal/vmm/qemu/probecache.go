package qemu

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// probeCacheFile, in the driver's RecordDir, keeps what Probe found for
// each QEMU: a probe is two QEMU runs (--version, -L help), about 100 ms
// of every start.
const probeCacheFile = "qemu-probe.json"

// maxProbeCache bounds the cache file read and the entries kept.
const (
	maxProbeCacheBytes   = 256 << 10
	maxProbeCacheEntries = 16
)

// probeEntry is one QEMU's probe, valid while every stamp still matches:
// the binary's and those of the folders its data was looked for in (a
// firmware file added or removed changes its folder's).
type probeEntry struct {
	Binary     string       `json:"binary"`
	Arch       string       `json:"arch"`
	DataDirEnv string       `json:"datadir_env"`
	Stamps     []probeStamp `json:"stamps"`
	Install    Install      `json:"install"`
}

// probeStamp identifies a file's or folder's version: absent, or its
// size, modification time and inode.
type probeStamp struct {
	Path    string `json:"path"`
	Exists  bool   `json:"exists"`
	Size    int64  `json:"size,omitempty"`
	ModNano int64  `json:"mod_ns,omitempty"`
	Inode   uint64 `json:"inode,omitempty"`
}

func stamp(path string) probeStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return probeStamp{Path: path}
	}
	s := probeStamp{Path: path, Exists: true, Size: fi.Size(), ModNano: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.Inode = uint64(st.Ino)
	}
	return s
}

// ProbeCached is Probe, answered from dir's cache while the binary and
// the folders its data came from are unchanged. An empty dir: no cache.
func ProbeCached(ctx context.Context, bin string, arch vmspec.Arch, dir string) (Install, error) {
	if dir == "" {
		return Probe(ctx, bin, arch)
	}
	path := filepath.Join(dir, probeCacheFile)
	entries := readProbeCache(path)
	env := os.Getenv(DataDirEnv)
	for _, e := range entries {
		if e.Binary == bin && e.Arch == string(arch) && e.DataDirEnv == env && e.fresh() {
			return e.Install, nil
		}
	}
	inst, err := Probe(ctx, bin, arch)
	if err != nil {
		return inst, err
	}
	e := probeEntry{Binary: bin, Arch: string(arch), DataDirEnv: env, Install: inst}
	for _, p := range probeWatched(bin, inst) {
		e.Stamps = append(e.Stamps, stamp(p))
	}
	entries = slices.DeleteFunc(entries, func(o probeEntry) bool {
		return o.Binary == bin && o.Arch == string(arch) && o.DataDirEnv == env
	})
	entries = append(entries, e)
	if len(entries) > maxProbeCacheEntries {
		entries = entries[len(entries)-maxProbeCacheEntries:]
	}
	if b, err := json.Marshal(entries); err == nil && len(b) <= maxProbeCacheBytes {
		_ = writeRecord(path, b) // a cache: one not written is probed again
	}
	return inst, nil
}

// fresh reports whether nothing the probe depended on changed.
func (e probeEntry) fresh() bool {
	if len(e.Stamps) == 0 {
		return false
	}
	for _, s := range e.Stamps {
		if stamp(s.Path) != s {
			return false
		}
	}
	return true
}

// probeWatched are the paths a probe's answer depends on: the binary
// (through any links), the folders QEMU and kosa8 looked for data in, and
// those under its prefix that would make it a prefix with data.
func probeWatched(bin string, inst Install) []string {
	paths := []string{bin}
	real := bin
	if r, err := filepath.EvalSymlinks(bin); err == nil {
		real = r
		paths = append(paths, r)
	}
	paths = append(paths, inst.DataDirs...)
	paths = append(paths, inst.Builtin...)
	prefix := filepath.Dir(filepath.Dir(real))
	for _, sub := range []string{"share", "lib", "share/qemu", "share/seabios", "lib/ipxe", "lib/ipxe/qemu"} {
		paths = append(paths, filepath.Join(prefix, sub))
	}
	slices.Sort(paths)
	return slices.Compact(paths)
}

func readProbeCache(path string) []probeEntry {
	b, err := readRecord(path, maxProbeCacheBytes)
	if err != nil {
		return nil
	}
	var entries []probeEntry
	if json.Unmarshal(b, &entries) != nil {
		return nil
	}
	return entries
}
