package agent

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A checkpoint's disks are also what a machine boots from when its memory
// cannot be loaded: by another QEMU build (a distribution's QEMU update
// makes every older checkpoint one), or after a failed rewind. Data the
// guest had written but kept in its page cache is not on them: a file
// written a second before the checkpoint was missing after such a boot.
// So once the workloads are frozen (nothing dirties the caches any more),
// the filesystems on the guest's disks are synced before the host pauses
// the machine.

// freezeSyncWait bounds a checkpoint's wait for that sync; freezeBudget is
// what the whole freeze may take, well within the host's 15 s.
const (
	freezeSyncWait = 5 * time.Second
	freezeBudget   = 13 * time.Second
)

// diskSyncing is set while a sync runs: one that outlived its wait (a disk
// the host is slow to write) is not joined by another.
var diskSyncing atomic.Bool

// syncDisks syncs the writable filesystems on the guest's disks, waiting
// at most wait. It reports whether the sync finished in time; one that did
// not goes on in the background, and the checkpoint's disks alone are then
// as after a crash (the journal recovers them), as they were before.
func (a *Agent) syncDisks(wait time.Duration) bool {
	if wait <= 0 || !diskSyncing.CompareAndSwap(false, true) {
		return false
	}
	// The kernel's counters lag by what each CPU has not folded in yet
	// (a few dirty pages read as none): fold them first.
	_ = os.WriteFile("/proc/sys/vm/stat_refresh", []byte("1"), 0)
	if b, err := os.ReadFile("/proc/meminfo"); err == nil && !unwritten(b) {
		diskSyncing.Store(false)
		return true // nothing waits to be written: a sync would only cost the host a flush
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		diskSyncing.Store(false)
		return false
	}
	mounts := diskMounts(f)
	f.Close()
	done := make(chan struct{})
	go func() {
		defer diskSyncing.Store(false)
		defer close(done)
		for _, m := range mounts {
			fd, err := unix.Open(m, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
			if err != nil {
				continue
			}
			if err := unix.Syncfs(fd); err != nil {
				a.log.Warn("sync a disk's filesystem before a checkpoint", "mount", strconv.Quote(m), "err", err)
			}
			unix.Close(fd)
		}
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		a.log.Warn("the disks' sync goes on past the checkpoint: its disks alone are as after a crash", "waited", wait)
		return false
	}
}

// unwritten tells from /proc/meminfo whether file data waits to be
// written (Dirty or Writeback above zero); unreadable counts as yes.
func unwritten(meminfo []byte) bool {
	found := 0
	for _, line := range strings.Split(string(meminfo), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || (f[0] != "Dirty:" && f[0] != "Writeback:") {
			continue
		}
		found++
		if n, err := strconv.ParseUint(f[1], 10, 64); err != nil || n > 0 {
			return true
		}
	}
	return found < 2
}

// diskMounts lists, from a mountinfo file, the mount points of writable
// disk filesystems on virtio disks (/dev/vd*), each device once.
func diskMounts(r io.Reader) []string {
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(io.LimitReader(r, 4<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 64<<10)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		line := sc.Bytes()
		sep := bytes.Index(line, []byte(" - "))
		if sep < 0 {
			continue
		}
		pre, post := strings.Fields(string(line[:sep])), strings.Fields(string(line[sep+3:]))
		if len(pre) < 6 || len(post) < 2 {
			continue
		}
		dev, fstype, source := pre[2], post[0], post[1]
		if !diskFS[fstype] || !strings.HasPrefix(source, "/dev/vd") || seen[dev] || !hasOption(pre[5], "rw") {
			continue
		}
		seen[dev] = true
		out = append(out, unescapeMount(pre[4]))
	}
	return out
}

// diskFS are the filesystems kept on a disk. A source name alone says
// nothing (a FUSE mount names its own), and a FUSE server among the frozen
// workloads would hold a sync until the thaw.
var diskFS = map[string]bool{"ext4": true, "ext3": true, "ext2": true, "xfs": true, "btrfs": true, "vfat": true, "f2fs": true}

func hasOption(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// unescapeMount undoes the kernel's octal escapes in a mountinfo path
// (\040 for a space, \011, \012, \134).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
