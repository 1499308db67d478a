package checkpoint

import "os"

// writebackStep is how much a background writer (a spare's fill) leaves
// dirty before it writes that out and waits: never more than this is in
// the disk's queue on its account.
//
// Left to the kernel, a spare's gigabytes of dirty pages are written out
// all at once, 30 s later or when the dirty limit is reached, and every
// fsync on the host waits behind them: a small file's fsync took 466-472
// ms here (2-core Debian 12 VM, ext4) while 1 GiB was being written out,
// against 1-2.5 ms otherwise; QEMU's flush of the disk layers in a
// checkpoint's pause is such an fsync. Spares of zeros write nothing at
// all where the filesystem can preallocate (Spares.fill); this pacing is
// for those that hold a checkpoint's RAM, and for filesystems that
// cannot. BenchmarkSpareFillFsync measures the three.
const writebackStep = 8 << 20

// pacer writes a file out as it is written, in steps of writebackStep.
// Its zero value does nothing (unpaced), for the benchmark's baseline.
type pacer struct {
	f     *os.File
	dirty int64
}

func pace(f *os.File) *pacer { return &pacer{f: f} }

// wrote counts n bytes written to the file and writes them out once a
// step is reached.
func (p *pacer) wrote(n int64) {
	if p == nil || p.f == nil {
		return
	}
	if p.dirty += n; p.dirty >= writebackStep {
		writeBack(p.f)
		p.dirty = 0
	}
}

// done writes out what is left.
func (p *pacer) done() {
	if p != nil && p.f != nil && p.dirty > 0 {
		writeBack(p.f)
		p.dirty = 0
	}
}
