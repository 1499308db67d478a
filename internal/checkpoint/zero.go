package checkpoint

import (
	"bytes"
	"errors"
	"io"
	"os"
)

// zeroRunMin is the shortest run of zero pages FreeZeroRuns gives back: a
// guest that leaves every other page zero must not cost the host a hole
// per page.
const zeroRunMin = 64 << 10

var zeroPage [4096]byte

// FreeZeroRuns gives back the memory (or disk) that runs of zeros take in
// f, punching holes where at least zeroRunMin of page-aligned zeros lie in
// its data, and returns the bytes freed. A RAM file a restore filled from
// a stream (a checkpoint whose RAM is in its device state) holds every
// page, zero or not, as QEMU writes or reads each one: without this the
// restored guest would hold all of its RAM on the host until its free
// pages are reported. The machine must not run meanwhile.
func FreeZeroRuns(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	const page = 4096
	buf := make([]byte, 1<<20)
	var freed int64
	runStart := int64(-1)
	flush := func(end int64) error {
		if runStart >= 0 && end-runStart >= zeroRunMin {
			if err := punchHole(int(f.Fd()), runStart, end-runStart); err != nil {
				return err
			}
			freed += end - runStart
		}
		runStart = -1
		return nil
	}
	err = forEachData(f, size, func(off, end int64) error {
		if err := flush(off); err != nil { // a hole ends a run
			return err
		}
		for pos := off; pos < end; {
			n := int(min(int64(len(buf)), end-pos))
			k, err := f.ReadAt(buf[:n], pos)
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			k -= k % page
			if k == 0 {
				break
			}
			for i := 0; i < k; i += page {
				if bytes.Equal(buf[i:i+page], zeroPage[:]) { // memcmp's speed, not a byte loop's
					if runStart < 0 {
						runStart = pos + int64(i)
					}
				} else if err := flush(pos + int64(i)); err != nil {
					return err
				}
			}
			pos += int64(k)
		}
		return nil
	})
	if err == nil {
		err = flush(size)
	}
	return freed, err
}
