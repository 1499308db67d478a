package agent

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A checkpoint's disks are also what a machine boots from when its memory
// cannot be loaded: by another QEMU build (a distribution's QEMU update
// makes every older checkpoint one), or after a failed rewind. What the
// guest had written but kept in its caches is not on them: a file written
// a second before the checkpoint was missing after such a boot. So once
// the workloads are frozen (nothing dirties the caches any more), the
// guest's disk filesystems are synced before the host pauses the machine.
// Always, not only when the kernel counts dirty pages: a rename or an
// unlink waits in the journal without any.

// freezeSyncWait bounds a checkpoint's wait for that sync; freezeBudget is
// what the whole freeze may take, well within the host's 15 s.
const (
	freezeSyncWait = 5 * time.Second
	freezeBudget   = 13 * time.Second
)

// syncing is closed when the sync in flight ends (nil: none runs). One
// that outlived its wait (a disk the host is slow to write) is waited for
// by the next checkpoint, within its own wait, and then run again: it
// does not cover what was written since it began.
var (
	syncMu  sync.Mutex
	syncing chan struct{}
)

// syncDisks syncs the writable disk filesystems, waiting at most wait. It
// reports whether the sync finished in time; one that did not goes on in
// the background, and that checkpoint's disks alone are as after a crash
// (the journal recovers them), as they were before.
func (a *Agent) syncDisks(wait time.Duration) bool {
	deadline := time.NewTimer(max(wait, 0))
	defer deadline.Stop()
	syncMu.Lock()
	prev := syncing
	syncMu.Unlock()
	if prev != nil {
		select {
		case <-prev:
		case <-deadline.C:
			a.log.Warn("a disk sync of an earlier checkpoint still runs: this checkpoint's disks alone are as after a crash")
			return false
		}
	}
	done := make(chan struct{})
	syncMu.Lock()
	syncing = done
	syncMu.Unlock()
	go func() {
		a.syncMounts()
		syncMu.Lock()
		syncing = nil
		syncMu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-deadline.C:
		a.log.Warn("the disks' sync goes on past the checkpoint: its disks alone are as after a crash", "waited", wait)
		return false
	}
}

// syncMounts syncs each disk filesystem once, through the first of its
// mount points that opens onto it, the last mounted first (a filesystem
// in a file, loop-mounted, is written into the one holding the file).
func (a *Agent) syncMounts() {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		a.log.Warn("sync the disks before a checkpoint", "err", err)
		return
	}
	mounts := diskMounts(f)
	f.Close()
	done := map[uint64]bool{}
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if done[m.dev] {
			continue
		}
		fd, err := unix.Open(m.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue // gone, or not a directory now: another mount of it may do
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Dev == m.dev {
			if err := unix.Syncfs(fd); err != nil {
				a.log.Warn("sync a disk filesystem before a checkpoint", "mount", strconv.Quote(m.path), "err", err)
			} else {
				done[m.dev] = true
			}
		}
		unix.Close(fd) // else something else is mounted over it now
	}
}

// diskMount is a mount point of a disk filesystem and its device.
type diskMount struct {
	path string
	dev  uint64
}

// diskFS are the filesystems kept on a disk. A FUSE server among the
// frozen workloads would hold a sync of its filesystem until the thaw.
var diskFS = map[string]bool{"ext4": true, "ext3": true, "ext2": true, "xfs": true, "btrfs": true, "vfat": true, "f2fs": true}

// maxMountinfoLine: longer lines (overlay options can be long) are skipped,
// not the end of the list.
const maxMountinfoLine = 64 << 10

// diskMounts lists, from a mountinfo file, the mount points of disk
// filesystems whose superblock is writable, in the file's order.
func diskMounts(r io.Reader) []diskMount {
	var out []diskMount
	br := bufio.NewReaderSize(io.LimitReader(r, 16<<20), 4096)
	for {
		line, err := readBoundedLine(br, maxMountinfoLine)
		if line != nil {
			if m, ok := parseDiskMount(line); ok {
				out = append(out, m)
			}
		}
		if err != nil {
			return out
		}
	}
}

// readBoundedLine returns the next line, or nil for one longer than max
// (consumed all the same); err is set at the end of r.
func readBoundedLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	tooLong := false
	for {
		chunk, isPrefix, err := br.ReadLine()
		if !tooLong {
			line = append(line, chunk...)
			if len(line) > max {
				tooLong, line = true, nil
			}
		}
		if err != nil || !isPrefix {
			if tooLong {
				return nil, err
			}
			if line == nil && err == nil {
				line = []byte{}
			}
			return line, err
		}
	}
}

// parseDiskMount reads one mountinfo line: id parent major:minor root
// mountpoint options [optional...] - fstype source superoptions.
func parseDiskMount(line []byte) (diskMount, bool) {
	sep := bytes.Index(line, []byte(" - "))
	if sep < 0 {
		return diskMount{}, false
	}
	pre, post := strings.Fields(string(line[:sep])), strings.Fields(string(line[sep+3:]))
	if len(pre) < 6 || len(post) < 3 || !diskFS[post[0]] || !hasOption(post[2], "rw") {
		return diskMount{}, false
	}
	majMin := strings.SplitN(pre[2], ":", 2)
	if len(majMin) != 2 {
		return diskMount{}, false
	}
	maj, err1 := strconv.ParseUint(majMin[0], 10, 32)
	min, err2 := strconv.ParseUint(majMin[1], 10, 32)
	if err1 != nil || err2 != nil {
		return diskMount{}, false
	}
	return diskMount{path: unescapeMount(pre[4]), dev: unix.Mkdev(uint32(maj), uint32(min))}, true
}

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
