package main

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/checkpoint"
)

var (
	rcSizes = flag.String("ramclone-sizes", "512M,1G,2G", "bench ramclone: RAM file sizes (half of each is touched)")
	rcFS    = flag.String("ramclone-fs", "xfs,btrfs", "bench ramclone: copy-on-write file systems to clone on (made on a loop device; needs root)")
	rcBG    = flag.Duration("ramclone-background", 60*time.Second, "bench ramclone: how long the guest keeps writing for the write-back figure (longer than the kernel's dirty_expire, 30 s by default)")
	rcBGMiB = flag.Int("ramclone-background-rate", 8, "bench ramclone: MiB/s of scattered 4 KiB pages the guest writes meanwhile")
	rcBGAt  = flag.String("ramclone-background-at", "1G", "bench ramclone: the RAM file size the write-back figure is measured at")
)

// The guest's writes between checkpoints, as in 'bench cp -cp incremental'.
const (
	rcBigWrite   = 64 << 20
	rcSmallWrite = 4 << 20
)

var rcPage = int(checkpoint.PageSize)

type rcRow struct{ size, what, value, mechanism string }

// benchRAMClone measures, with no VM, what a checkpoint and a rewind cost
// when guest RAM lives in a file on a copy-on-write file system and is
// cloned (FICLONE), against today's copy of a tmpfs RAM file into a
// prepared spare. The "guest" is this process writing through a shared
// mapping of the RAM file, as QEMU's vCPUs write: half of each RAM file's
// pages (its first half, as 'bench cp' and BenchmarkIncrementalSave2GiB
// fill theirs), then scattered 4 KiB pages.
func benchRAMClone() {
	if os.Geteuid() != 0 {
		must(errors.New("bench ramclone makes file systems on loop devices: run it as root"))
	}
	// A failure, or a SIGBUS from a write through a mapping, panics: the
	// deferred unmounts and removals run before the benchmark exits.
	debug.SetPanicOnFault(true)
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(interface{ Addr() uintptr }); ok {
				must(fmt.Errorf("a write through a RAM file's mapping failed at %#x (SIGBUS: is its file system full?)", f.Addr()))
			}
			must(fmt.Errorf("%v", r))
		}
	}()
	start := hostContext()
	var rows []rcRow
	for _, s := range strings.Split(*rcSizes, ",") {
		size := parseSize(s)
		label := fmt.Sprintf("%s (%s touched)", sizeName(size), sizeName(size/2))
		fmt.Fprintf(os.Stderr, "ramclone %s: tmpfs copy...\n", label)
		rows = append(rows, rcTmpfs(label, size)...)
		for _, fs := range strings.Split(*rcFS, ",") {
			fmt.Fprintf(os.Stderr, "ramclone %s: %s clone...\n", label, fs)
			r, err := rcClone(label, fs, size, size == parseSize(*rcBGAt))
			if err != nil {
				rows = append(rows, rcRow{label, fs + ": not measured", "-", err.Error()})
				continue
			}
			rows = append(rows, r...)
		}
	}
	fmt.Printf("\nRAM file: clone on a copy-on-write file system vs copy on tmpfs, no VM (the guest is this process writing through a shared mapping) — %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("host: %s; at the end: load average %s\n", start, loadAvg())
	fmt.Printf("soft-dirty bits: %s; writeback: dirty_expire_centisecs=%s, dirty_writeback_centisecs=%s\n\n",
		softDirtyState(), sysctl("vm/dirty_expire_centisecs"), sysctl("vm/dirty_writeback_centisecs"))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RAM FILE\tMEASURE\tVALUE\tMECHANISM")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.size, r.what, r.value, r.mechanism)
	}
	tw.Flush()
}

// rcTmpfs is today's path: the RAM file on tmpfs, each checkpoint a copy
// of its data into a spare prepared beforehand (zeros, in the page cache),
// the rewind a copy of the checkpoint into fresh tmpfs.
func rcTmpfs(label string, size int64) []rcRow {
	shm, err := os.MkdirTemp("/dev/shm", "kosa8-bench-")
	check(err)
	defer os.RemoveAll(shm)
	disk, err := os.MkdirTemp("", "kosa8-bench-")
	check(err)
	defer os.RemoveAll(disk)
	diskFS := fsType(disk)

	ram, mem := rcRAM(filepath.Join(shm, "ram"), size)
	defer ram.Close()
	defer unix.Munmap(mem)
	rng := rand.New(rand.NewPCG(1, 2))
	touch := rcTouch(mem, size/2, rng)

	spare := rcSpare(filepath.Join(shm, "spare"), size)
	defer spare.Close()
	t0 := time.Now()
	_, copied, err := checkpoint.CopyData(spare, ram)
	check(err)
	toShm := time.Since(t0)

	onDisk := rcSpare(filepath.Join(disk, "spare"), size)
	defer onDisk.Close()
	t0 = time.Now()
	exts, _, err := checkpoint.CopyData(onDisk, ram)
	check(err)
	toDisk := time.Since(t0)
	// After the pause the spare's zeros are freed (RAMSaver.FreeHoles): a
	// checkpoint holds the guest's data only.
	check(checkpoint.PunchHoles(onDisk, exts, size))

	written, tw := rcScatter(mem, size/2, rcBigWrite, rng)
	t0 = time.Now()
	_, incCopied, err := checkpoint.CopyIncremental(spare, ram, size, written)
	check(err)
	inc := time.Since(t0)
	var tens []time.Duration
	for range 10 {
		small, _ := rcScatter(mem, size/2, rcSmallWrite, rng)
		t0 = time.Now()
		_, _, err := checkpoint.CopyIncremental(spare, ram, size, small)
		check(err)
		tens = append(tens, time.Since(t0))
	}
	slices.Sort(tens)

	// Rewind: the checkpoint (on the host disk, where kosa8 keeps them,
	// its pages cached since it was just written) copied into fresh tmpfs
	// before the guest runs; its pages are then in memory.
	cached := resident(onDisk.Name())
	fresh, err := os.OpenFile(filepath.Join(shm, "rewound"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	check(err)
	defer fresh.Close()
	t0 = time.Now()
	_, err = checkpoint.CopySparse(fresh, onDisk)
	check(err)
	rmem, err := unix.Mmap(int(fresh.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	check(err)
	defer unix.Munmap(rmem)
	first := time.Since(t0)
	rcRead(rmem, size/2)
	all := time.Since(t0)

	m := "tmpfs RAM file, today's path"
	return []rcRow{
		{label, "guest touches half its pages (first writes)", dur(touch), m + ": shmem page allocation"},
		{label, "checkpoint pause: copy into a spare on tmpfs", dur(toShm), fmt.Sprintf("%s: CopyData of %s into a resident spare", m, sizeName(copied))},
		{label, "checkpoint pause: copy into a spare on " + diskFS, dur(toDisk), m + ": as kosa8 keeps spares today, in the sandbox's directory on the host disk (" + diskFS + "), pages resident"},
		{label, "guest writes 64 MiB of scattered 4 KiB pages", dur(tw), m + ": pages already present"},
		{label, "checkpoint pause after those 64 MiB: incremental copy", dur(inc), fmt.Sprintf("%s: CopyIncremental of %s into the spare (page set given; the pagemap walk is extra, see BenchmarkIncrementalSave2GiB)", m, sizeName(incCopied))},
		{label, "10 checkpoints, 4 MiB written before each: pause min/median/max",
			fmt.Sprintf("%s / %s / %s", dur(tens[0]), dur((tens[4]+tens[5])/2), dur(tens[9])),
			m + ": CopyIncremental of the pages written (back to back: nothing here depends on the time between)"},
		{label, "rewind: RAM ready (first page)", dur(first), fmt.Sprintf("%s: CopySparse from the checkpoint on %s (%s of it in the page cache) into fresh tmpfs", m, diskFS, cached)},
		{label, "rewind: all in-use pages touched", dur(all), m + ": then reading every in-use page (in memory)"},
	}
}

// rcClone is the candidate: the RAM file on fs (on a loop device whose
// backing file is on the host disk, direct I/O, so that write-back and
// reads reach a disk), each checkpoint a clone of it, the rewind a clone
// of the checkpoint that the guest then faults in.
func rcClone(label, fs string, size int64, background bool) ([]rcRow, error) {
	// Room for the worst case: on XFS a checkpoint after scattered
	// writes can cost a new block for nearly every in-use page (see the
	// bytes each clone wrote back), so 12 checkpoints and a rewind take
	// about 6.5 times the RAM file. A write through the mapping that finds
	// no free block is a SIGBUS, in QEMU as here.
	lfs, err := newLoopFS(fs, 8*size+(1<<30))
	if err != nil {
		return nil, err
	}
	defer lfs.close()
	m := fmt.Sprintf("%s RAM file (loop device, direct I/O, backing file on %s)", fs, lfs.backingFS)
	dir := lfs.mnt

	ram, mem := rcRAM(filepath.Join(dir, "ram"), size)
	closed := false
	closeRAM := func() {
		if !closed {
			unix.Munmap(mem)
			ram.Close()
			closed = true
		}
	}
	defer closeRAM()
	rng := rand.New(rand.NewPCG(1, 2))
	used0 := lfs.used()
	touch := rcTouch(mem, size/2, rng)

	clone := func(name string) (time.Duration, int64) {
		w0 := lfs.written()
		t0 := time.Now()
		check(checkpoint.CloneOpen(filepath.Join(dir, name), ram))
		return time.Since(t0), lfs.written() - w0
	}
	c1, w1 := clone("cp1")
	lfs.mustHave(size / 2)
	wb0 := lfs.written()
	_, tw := rcScatter(mem, size/2, rcBigWrite, rng)
	wb := lfs.written() - wb0
	c2, w2 := clone("cp2")
	var tens []time.Duration
	var tenW int64
	for i := range 10 {
		lfs.mustHave(size / 2)
		rcScatter(mem, size/2, rcSmallWrite, rng)
		time.Sleep(time.Second)
		d, w := clone(fmt.Sprintf("cp%d", i+3))
		tens = append(tens, d)
		tenW += w
	}
	slices.Sort(tens)
	extents := fileExtents(filepath.Join(dir, "ram"))
	used := lfs.used() - used0

	rows := []rcRow{
		{label, "guest touches half its pages (first writes)", dur(touch), m + ": page cache + delayed allocation at page_mkwrite"},
		{label, "checkpoint pause: first clone, all touched pages dirty", dur(c1), fmt.Sprintf("%s: FICLONE, which first wrote back %s", m, sizeName(w1))},
		{label, "guest writes 64 MiB of scattered 4 KiB pages after the clone", dur(tw), fmt.Sprintf("%s: every first write faults (write-protected after write-back) and reserves a copy-on-write block; %s written back meanwhile", m, sizeName(wb))},
		{label, "checkpoint pause after those 64 MiB: clone", dur(c2), fmt.Sprintf("%s: FICLONE, which first wrote back %s", m, sizeName(w2))},
		{label, "10 checkpoints 1 s apart, 4 MiB written before each: pause min/median/max",
			fmt.Sprintf("%s / %s / %s", dur(tens[0]), dur((tens[4]+tens[5])/2), dur(tens[9])),
			fmt.Sprintf("%s: FICLONE, %s written back in all; the RAM file then had %s extents", m, sizeName(tenW), extents)},
		{label, "space: RAM file and its 12 checkpoints", sizeName(used), m + ": blocks allocated on the file system (as copies: " + sizeName(13*size/2) + ")"},
	}

	// Rewind: a clone of the first checkpoint as the new RAM file, mapped
	// as QEMU maps it; its pages come from the disk as the guest touches
	// them (a new inode: nothing of it is in the page cache).
	t0 := time.Now()
	check(checkpoint.CloneFile(filepath.Join(dir, "rewound"), filepath.Join(dir, "cp1")))
	rf, err := os.OpenFile(filepath.Join(dir, "rewound"), os.O_RDWR, 0)
	check(err)
	defer rf.Close()
	rmem, err := unix.Mmap(int(rf.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	check(err)
	defer unix.Munmap(rmem)
	_ = rmem[0]
	first := time.Since(t0)
	r0 := lfs.read()
	rcRead(rmem, size/2)
	all := time.Since(t0)
	rd := lfs.read() - r0
	t1 := time.Now()
	for off := 0; off < int(size/2); off += rcPage {
		rmem[off+9] ^= 1
	}
	cow := time.Since(t1)
	lfs.mustHave(size / 2)
	rows = append(rows,
		rcRow{label, "rewind: RAM ready (first page)", dur(first), m + ": FICLONE of the checkpoint + mmap + one fault"},
		rcRow{label, "rewind: all in-use pages touched", dur(all), fmt.Sprintf("%s: reading every in-use page in order (readahead helps; %s read from the device)", m, sizeName(rd))},
		rcRow{label, "after the rewind: first write to every in-use page", dur(cow), m + ": page_mkwrite reserves a copy-on-write block for each"},
	)
	if background {
		closeRAM()
		rows = append(rows, rcBackground(label, m, lfs, rmem, size)...)
	}
	return rows, nil
}

// rcBackground: the guest (running on the rewound RAM file) keeps writing scattered pages at a steady rate;
// the kernel writes the RAM file's dirty pages back to the device once
// they are older than dirty_expire, with no checkpoint asking for it.
func rcBackground(label, m string, lfs *loopFS, mem []byte, size int64) []rcRow {
	fmt.Fprintf(os.Stderr, "ramclone %s: guest writing %d MiB/s for %s after a warm-up...\n", label, *rcBGMiB, *rcBG)
	var stop atomic.Bool
	type result struct {
		n     int64
		fault any // a panic of the writer (a SIGBUS: no space)
	}
	done := make(chan result, 1)
	go func() {
		rng := rand.New(rand.NewPCG(3, 4))
		perTick := int64(*rcBGMiB<<20) / 10
		var n int64
		defer func() { done <- result{n, recover()} }()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for !stop.Load() {
			<-t.C
			rcScatter(mem, size/2, perTick, rng)
			n += perTick
		}
	}()
	// Pages dirtied at the start are written back only once they are
	// dirty_expire old: measure after that, in the steady state.
	warm := 30 * time.Second
	if cs, err := strconv.Atoi(sysctl("vm/dirty_expire_centisecs")); err == nil {
		warm = time.Duration(cs) * 10 * time.Millisecond
	}
	time.Sleep(warm)
	w0 := lfs.written()
	time.Sleep(*rcBG)
	w := lfs.written() - w0
	stop.Store(true)
	res := <-done
	if res.fault != nil {
		panic(res.fault)
	}
	n := res.n
	secs := rcBG.Seconds()
	return []rcRow{{label, fmt.Sprintf("background write-back while the guest writes %d MiB/s of scattered pages", *rcBGMiB),
		fmt.Sprintf("%s/s", sizeName(int64(float64(w)/secs))),
		fmt.Sprintf("%s: written to the loop device over %s after %s of warm-up (the guest wrote %s of pages in all; tmpfs writes nothing back)", m, *rcBG, warm, sizeName(n))}}
}

// rcRAM makes a RAM file of size at path, mapped shared as QEMU maps it.
func rcRAM(path string, size int64) (*os.File, []byte) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	check(err)
	check(f.Truncate(size))
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	check(err)
	return f, mem
}

// rcSpare is a spare as checkpoint.Spares prepares one: zeros, resident.
func rcSpare(path string, size int64) *os.File {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	check(err)
	check(checkpoint.WriteZeros(f, size))
	return f
}

// rcTouch writes into every page of mem's first n bytes.
func rcTouch(mem []byte, n int64, rng *rand.Rand) time.Duration {
	t0 := time.Now()
	for off := 0; off < int(n); off += rcPage {
		mem[off] = byte(rng.Uint32()) | 1
	}
	return time.Since(t0)
}

// rcScatter writes into n bytes' worth of random pages of mem's first
// half (inUse bytes) and returns the pages written.
func rcScatter(mem []byte, inUse, n int64, rng *rand.Rand) (*checkpoint.Pages, time.Duration) {
	pages := checkpoint.NewPages(int64(len(mem)))
	t0 := time.Now()
	for range n / int64(rcPage) {
		p := rng.Int64N(inUse / int64(rcPage))
		mem[p*int64(rcPage)+8] = byte(rng.Uint32())
		pages.Set(p)
	}
	return pages, time.Since(t0)
}

var sink byte

func rcRead(mem []byte, n int64) {
	var x byte
	for off := 0; off < int(n); off += rcPage {
		x ^= mem[off]
	}
	sink = x
}

// loopFS is a file system made on a loop device over a sparse file in the
// temporary directory (the host's disk here).
type loopFS struct {
	dir, dev, mnt, backingFS string
}

func newLoopFS(fs string, size int64) (*loopFS, error) {
	mkfs, err := exec.LookPath("mkfs." + fs)
	if err != nil {
		return nil, fmt.Errorf("mkfs.%s not found (apt-get install xfsprogs btrfs-progs)", fs)
	}
	dir, err := os.MkdirTemp("", "kosa8-bench-"+fs+"-")
	if err != nil {
		return nil, err
	}
	l := &loopFS{dir: dir, mnt: filepath.Join(dir, "mnt"), backingFS: fsType(dir)}
	img := filepath.Join(dir, "img")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		f.Close()
	}
	if err != nil {
		l.close()
		return nil, err
	}
	run := func(name string, args ...string) (string, error) {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return strings.TrimSpace(string(out)), nil
	}
	// Direct I/O: the loop device writes to the disk, not into the host's
	// page cache of its backing file, as a real disk under the file
	// system would.
	if l.dev, err = run("losetup", "--find", "--show", "--direct-io=on", img); err != nil {
		l.close()
		return nil, err
	}
	args := []string{"-q", "-f"}
	if fs == "xfs" {
		args = append(args, "-m", "reflink=1")
	}
	if _, err = run(mkfs, append(args, l.dev)...); err == nil {
		if err = os.Mkdir(l.mnt, 0o700); err == nil {
			_, err = run("mount", "-t", fs, l.dev, l.mnt)
		}
	}
	if err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

func (l *loopFS) close() {
	if l.mnt != "" {
		exec.Command("umount", l.mnt).Run()
	}
	if l.dev != "" {
		exec.Command("losetup", "-d", l.dev).Run()
	}
	os.RemoveAll(l.dir)
}

// stat reads field i (0-based) of the loop device's /sys/block/DEV/stat,
// in 512-byte sectors.
func (l *loopFS) stat(i int) int64 {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(l.dev), "stat"))
	check(err)
	f := strings.Fields(string(b))
	n, err := strconv.ParseInt(f[i], 10, 64)
	check(err)
	return n * 512
}

func (l *loopFS) written() int64 { return l.stat(6) }
func (l *loopFS) read() int64    { return l.stat(2) }

// mustHave stops the benchmark, rather than a write through a mapping
// with a SIGBUS, when the file system has less than n bytes free.
func (l *loopFS) mustHave(n int64) {
	var sf unix.Statfs_t
	check(unix.Statfs(l.mnt, &sf))
	if free := int64(sf.Bavail) * sf.Bsize; free < n {
		check(fmt.Errorf("%s on %s has %s free, less than the %s the next writes may need", filepath.Base(l.dev), l.mnt, sizeName(free), sizeName(n)))
	}
}

func (l *loopFS) used() int64 {
	var sf unix.Statfs_t
	check(unix.Statfs(l.mnt, &sf))
	return int64(sf.Blocks-sf.Bfree) * sf.Bsize
}

func fsType(dir string) string {
	out, err := exec.Command("findmnt", "-n", "-o", "FSTYPE", "-T", dir).Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

// resident is how much of the file at path is in the page cache.
func resident(path string) string {
	out, err := exec.Command("fincore", "--bytes", "--noheadings", "-o", "RES", path).Output()
	if err != nil {
		return "?"
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return "?"
	}
	return sizeName(n)
}

func fileExtents(path string) string {
	out, err := exec.Command("filefrag", path).Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	for i, w := range f {
		if strings.HasPrefix(w, "extent") && i > 0 {
			return f[i-1]
		}
	}
	return "?"
}

func parseSize(s string) int64 {
	s = strings.TrimSpace(s)
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	check(err)
	return n * mult
}

func sizeName(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 10<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}

func dur(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return ms(d)
}

// check panics on err, so that the loop devices and files made so far
// are removed (must exits at once).
func check(err error) {
	if err != nil {
		panic(err)
	}
}

func hostContext() string {
	var u unix.Utsname
	unix.Uname(&u)
	return fmt.Sprintf("%d CPUs (GOMAXPROCS %d), kernel %s, %s, load average at the start %s; the machine is shared with other jobs",
		nproc(), runtime.GOMAXPROCS(0), unix.ByteSliceToString(u.Release[:]), osName(), loadAvg())
}

func osName() string {
	b, _ := os.ReadFile("/etc/os-release")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "Linux"
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func sysctl(name string) string {
	b, _ := os.ReadFile("/proc/sys/" + name)
	return strings.TrimSpace(string(b))
}

func softDirtyState() string {
	if err := checkpoint.ProbeSoftDirty(); err != nil {
		return "not available (" + err.Error() + ")"
	}
	return "available"
}
