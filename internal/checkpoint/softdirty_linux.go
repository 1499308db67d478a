package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// SoftDirty tracks the pages a process writes through its mappings of a
// file, with the kernel's soft-dirty bits: a Reset writes "4" to
// /proc/PID/clear_refs, which clears them and write-protects every page;
// the next write through a mapping sets the page's bit, which
// /proc/PID/pagemap shows (bit 55).
//
// For guest RAM that is every write that matters: the guest's own (TCG or
// KVM, both through QEMU's mapping), and devices' DMA (QEMU writes through
// the same mapping). What the bits cannot see:
//   - writes through the file descriptor, and holes punched in the file
//     (free page reporting, discards): after a punch the page's entry is
//     gone and a later read maps a fresh zero page with a clean bit. Both
//     go through the VFS, which sends an inotify IN_MODIFY for the file;
//     any such event since the last Reset makes Reset report changed.
//   - pages no mapping of the file covers: reported dirty (copied).
//   - a huge page collapse of shmem by khugepaged, which remaps pages
//     clean: tracking is refused unless shmem transparent huge pages are
//     off (never or deny).
//
// A new QEMU process means a new SoftDirty, never armed until its first
// Reset: the first checkpoint of every machine copies everything.
type SoftDirty struct {
	pid    int
	size   int64
	major  uint32
	minor  uint32
	ino    uint64
	notify int // inotify descriptor watching the file
	armed  bool
}

var (
	probeOnce sync.Once
	probeErr  error
)

// ProbeSoftDirty tells whether this kernel tracks soft-dirty pages (tried
// once on a page of this process).
func ProbeSoftDirty() error {
	probeOnce.Do(func() { probeErr = probeSoftDirty() })
	return probeErr
}

func probeSoftDirty() error {
	mem, err := unix.Mmap(-1, 0, int(PageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	mem[0] = 1
	if err := clearRefs(os.Getpid()); err != nil {
		return err
	}
	before, err := pagemapEntry(os.Getpid(), addrOf(mem))
	if err != nil {
		return err
	}
	mem[0] = 2
	after, err := pagemapEntry(os.Getpid(), addrOf(mem))
	if err != nil {
		return err
	}
	if before&pmSoftDirty != 0 || after&pmSoftDirty == 0 {
		return ErrNoSoftDirty
	}
	return nil
}

// NewSoftDirty tracks process pid's writes to ram (size bytes) through its
// mappings. It is not armed: Dirty fails until the first Reset.
func NewSoftDirty(pid int, ram *os.File, size int64) (*SoftDirty, error) {
	if err := ProbeSoftDirty(); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled"); err == nil {
		if s := string(b); !strings.Contains(s, "[never]") && !strings.Contains(s, "[deny]") {
			return nil, fmt.Errorf("shmem transparent huge pages are on (%s): their collapse would hide writes from soft-dirty tracking", strings.TrimSpace(s))
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(ram.Fd()), &st); err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, "/proc/self/fd/"+strconv.Itoa(int(ram.Fd())), unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch the RAM file: %w", err)
	}
	return &SoftDirty{pid: pid, size: size, major: unix.Major(st.Dev), minor: unix.Minor(st.Dev), ino: st.Ino, notify: fd}, nil
}

// Reset clears the soft-dirty bits of the whole process and starts a new
// window.
func (t *SoftDirty) Reset() (bool, error) {
	t.armed = false
	changed, err := t.drain()
	if err != nil {
		return true, err
	}
	if err := clearRefs(t.pid); err != nil {
		return true, err
	}
	t.armed = true
	return changed, nil
}

// drain reads the pending inotify events and tells whether there were any.
func (t *SoftDirty) drain() (bool, error) {
	buf := make([]byte, 4096)
	any := false
	for {
		n, err := unix.Read(t.notify, buf)
		if n > 0 {
			any = true
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return any, nil
		}
		if err == nil {
			return any, nil
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return any, fmt.Errorf("read inotify: %w", err)
	}
}

// Dirty returns the pages of the file that may have changed since the last
// Reset: those whose soft-dirty bit is set in any of the process's
// mappings of the file, and those no mapping covers.
func (t *SoftDirty) Dirty() (*Pages, error) {
	if !t.armed {
		return nil, errNotArmed
	}
	t.armed = false // one look per window
	mb, err := readBounded(fmt.Sprintf("/proc/%d/maps", t.pid), maxMaps)
	if err != nil {
		return nil, err
	}
	maps, err := parseMaps(mb)
	if err != nil {
		return nil, err
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", t.pid))
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	covered := NewPages(t.size)
	dirty := NewPages(t.size)
	found := false
	for _, m := range maps {
		if m.ino != t.ino || m.major != t.major || m.minor != t.minor {
			continue
		}
		found = true
		if err := scanMapping(pm, m, covered, dirty); err != nil {
			return nil, err
		}
	}
	if !found {
		return nil, fmt.Errorf("process %d does not map the RAM file", t.pid)
	}
	for i := int64(0); i < covered.Len(); i++ {
		if !covered.Has(i) {
			dirty.Set(i)
		}
	}
	return dirty, nil
}

// scanMapping reads the pagemap entries of mapping m: each page it covers
// goes into covered, and into dirty if its soft-dirty bit is set.
func scanMapping(pm *os.File, m mapping, covered, dirty *Pages) error {
	ps := uint64(PageSize)
	const batch = 64 << 10 // entries per read: 512 KiB
	buf := make([]byte, batch*8)
	for va := m.start; va < m.end; {
		n := min((m.end-va)/ps, batch)
		if n == 0 {
			break
		}
		b := buf[:n*8]
		if _, err := pm.ReadAt(b, int64(va/ps*8)); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read pagemap: %w", err)
		}
		for i := uint64(0); i < n; i++ {
			e := binary.LittleEndian.Uint64(b[i*8:])
			page := int64((m.off + va - m.start + i*ps) / ps)
			covered.Set(page)
			if e&pmSoftDirty != 0 {
				dirty.Set(page)
			}
		}
		va += n * ps
	}
	return nil
}

// Close stops watching the file.
func (t *SoftDirty) Close() error {
	if t.notify < 0 {
		return nil
	}
	err := unix.Close(t.notify)
	t.notify = -1
	return err
}

func clearRefs(pid int) error {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/clear_refs", pid), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("clear soft-dirty bits: %w", err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("4")); err != nil {
		return fmt.Errorf("clear soft-dirty bits: %w", err)
	}
	return nil
}

func pagemapEntry(pid int, addr uintptr) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], int64(addr/uintptr(PageSize))*8); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than %d bytes", path, limit)
	}
	return b, nil
}
