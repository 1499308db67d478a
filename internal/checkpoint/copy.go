package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CopySparse copies the data of src into dst (both sized alike), skipping
// the holes: a guest's RAM file has data only where the guest wrote, and
// free-page reporting punches holes where it freed. It returns the bytes
// of data copied.
func CopySparse(dst, src *os.File) (int64, error) {
	st, err := src.Stat()
	if err != nil {
		return 0, err
	}
	size := st.Size()
	if err := dst.Truncate(size); err != nil {
		return 0, err
	}
	buf := make([]byte, 4<<20)
	var total int64
	err = forEachData(src, size, func(off, end int64) error {
		n, err := copyRange(dst, src, off, end, buf)
		total += n
		return err
	})
	if errors.Is(err, errNoSeekData) {
		return copyAll(dst, src, size, buf)
	}
	return total, err
}

// errNoSeekData: the file system cannot say where a file's data is.
var errNoSeekData = errors.New("SEEK_DATA not supported")

// forEachData calls f for each range [off, end) of src (of size) that
// holds data, in order.
func forEachData(src *os.File, size int64, f func(off, end int64) error) error {
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data after off
		}
		if err != nil {
			return fmt.Errorf("%w: %v", errNoSeekData, err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		if err := f(data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies [off, end) of src to the same offsets of dst (in the
// kernel where it can, else through buf) and returns the bytes copied.
func copyRange(dst, src *os.File, off, end int64, buf []byte) (int64, error) {
	if n, ok, err := sendRange(dst, src, off, end); ok {
		return n, err
	}
	var total int64
	for pos := off; pos < end; {
		n := int(min(int64(len(buf)), end-pos))
		k, err := src.ReadAt(buf[:n], pos)
		if k > 0 {
			if _, werr := dst.WriteAt(buf[:k], pos); werr != nil {
				return total, werr
			}
			pos += int64(k)
			total += int64(k)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return total, err
		}
		if k == 0 {
			break
		}
	}
	return total, nil
}

func copyAll(dst, src *os.File, size int64, buf []byte) (int64, error) {
	var total int64
	for pos := int64(0); pos < size; {
		n := int(min(int64(len(buf)), size-pos))
		k, err := src.ReadAt(buf[:n], pos)
		if k > 0 {
			// Zeros stay holes in the copy.
			if !allZero(buf[:k]) {
				if _, werr := dst.WriteAt(buf[:k], pos); werr != nil {
					return total, werr
				}
				total += int64(k)
			}
			pos += int64(k)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return total, err
		}
	}
	return total, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Extent is a range of a file that holds data: [Off, Off+Len).
type Extent struct{ Off, Len int64 }

// CopyData writes src's data extents into dst at the same offsets and
// returns them. dst is not truncated: a prepared spare file (all zeros,
// its pages already in the page cache) is overwritten where src has data,
// which is many times faster than filling new pages; PunchHoles then
// frees the rest.
func CopyData(dst, src *os.File) ([]Extent, int64, error) {
	st, err := src.Stat()
	if err != nil {
		return nil, 0, err
	}
	buf := make([]byte, 4<<20)
	var exts []Extent
	var total int64
	err = forEachData(src, st.Size(), func(off, end int64) error {
		n, err := copyRange(dst, src, off, end, buf)
		total += n
		exts = append(exts, Extent{off, end - off})
		return err
	})
	if err != nil {
		return nil, total, err
	}
	return exts, total, nil
}

// CopyOver makes dst, a RAM file holding anything, equal to src: src's
// data copied over it, the rest of dst freed (reading zeros). It returns
// the bytes of data copied. Writing into dst's resident pages is faster
// than filling new ones.
func CopyOver(dst, src *os.File) (int64, error) {
	st, err := src.Stat()
	if err != nil {
		return 0, err
	}
	if err := dst.Truncate(st.Size()); err != nil {
		return 0, err
	}
	// Where the file system cannot say, all of it is data: zeros included,
	// they must replace what dst held.
	exts, err := DataExtents(src, st.Size())
	if err != nil {
		return 0, err
	}
	return copyOver(dst, src, exts, st.Size(), nil)
}

// copyChunk is how much copyOver copies between its calls of each.
const copyChunk = 32 << 20

// copyOver copies src's data extents exts over dst (both of size) and
// frees the rest of dst. each, if set, is called with the bytes copied so
// far before every chunk of at most copyChunk; an error from it ends the
// copy. A src that ends early (reads short) is an error: dst would hold
// what it held before after that point, RAM part another checkpoint's.
func copyOver(dst, src *os.File, exts []Extent, size int64, each func(copied int64) error) (int64, error) {
	buf := make([]byte, 1<<20)
	var copied int64
	for _, e := range exts {
		for pos, end := e.Off, e.Off+e.Len; pos < end; {
			if each != nil {
				if err := each(copied); err != nil {
					return copied, err
				}
			}
			n := min(copyChunk, end-pos)
			k, err := copyRange(dst, src, pos, pos+n, buf)
			copied += k
			if err != nil {
				return copied, err
			}
			if k != n {
				return copied, fmt.Errorf("copy %s over the RAM file: it ended early, %d bytes read of %d at %d", src.Name(), k, n, pos)
			}
			pos += n
		}
	}
	return copied, PunchHoles(dst, exts, size)
}

// PunchHoles frees the ranges of f (of size) outside exts, which hold
// zeros: a checkpoint written over a spare file becomes sparse again.
func PunchHoles(f *os.File, exts []Extent, size int64) error {
	return punchHolesOver(f, exts, size, 1)
}

// minFreedHole is the smallest gap between a checkpoint's data extents
// that is given back where the file holds zeros there already (a spare's):
// smaller ones stay allocated zeros. Each hole punched is a filesystem
// call, and a device discard where it is mounted with discard; a guest
// that touches every other page would make that hundreds of thousands of
// calls per checkpoint (52 s of host I/O for 512 MiB measured on the
// development VM). With this floor there are at most size/1 MiB of them;
// what it costs is disk space, at most the guest's RAM size, as a spare
// took already.
const minFreedHole = 1 << 20

// FreeSpareHoles makes a checkpoint written over a spare sparse again.
// Over a spare of zeros (zeros set), which holds zeros outside exts
// already, only the gaps of minFreedHole or more are freed, which is disk
// space only; over a spare of older RAM every gap is cleared (PunchHoles).
func FreeSpareHoles(f *os.File, exts []Extent, size int64, zeros bool) error {
	if zeros {
		return punchHolesOver(f, exts, size, minFreedHole)
	}
	return PunchHoles(f, exts, size)
}

// punchHolesOver is PunchHoles for the gaps of at least min bytes (and
// the tail after the last extent, whatever its size).
func punchHolesOver(f *os.File, exts []Extent, size, min int64) error {
	fd := int(f.Fd())
	prev := int64(0)
	punch := func(off, end int64) error {
		if end <= off || (end-off < min && end != size) {
			return nil
		}
		return punchHole(fd, off, end-off)
	}
	for _, e := range exts {
		if err := punch(prev, e.Off); err != nil {
			return err
		}
		prev = e.Off + e.Len
	}
	return punch(prev, size)
}

// WriteZeros fills f with size bytes of zeros: a spare for CopyData, its
// pages in the page cache.
func WriteZeros(f *os.File, size int64) error {
	buf := make([]byte, 8<<20)
	for off := int64(0); off < size; {
		n := min(int64(len(buf)), size-off)
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}
