package checkpoint

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// PageSize is the unit of dirty tracking: the host's page.
var PageSize = int64(os.Getpagesize())

// Pages is a set of page numbers of a file (page n covers
// [n*PageSize, (n+1)*PageSize)), one bit each.
type Pages struct {
	bits []uint64
	n    int64
}

// NewPages is an empty set over a file of size bytes.
func NewPages(size int64) *Pages {
	n := (size + PageSize - 1) / PageSize
	return &Pages{bits: make([]uint64, (n+63)/64), n: n}
}

// Len is the number of pages the set ranges over.
func (p *Pages) Len() int64 { return p.n }

// Set adds page i (outside the range: ignored).
func (p *Pages) Set(i int64) {
	if i >= 0 && i < p.n {
		p.bits[i/64] |= 1 << (i % 64)
	}
}

// Clear removes page i.
func (p *Pages) Clear(i int64) {
	if i >= 0 && i < p.n {
		p.bits[i/64] &^= 1 << (i % 64)
	}
}

// Has tells whether page i is in the set.
func (p *Pages) Has(i int64) bool {
	return i >= 0 && i < p.n && p.bits[i/64]&(1<<(i%64)) != 0
}

// SetAll adds every page.
func (p *Pages) SetAll() {
	for i := range p.bits {
		p.bits[i] = ^uint64(0)
	}
}

// Count is the number of pages in the set.
func (p *Pages) Count() int64 {
	var c int64
	for i := int64(0); i < p.n; i++ {
		if p.Has(i) {
			c++
		}
	}
	return c
}

// DataExtents lists the ranges of f (of size) that hold data, in order.
func DataExtents(f *os.File, size int64) ([]Extent, error) {
	var exts []Extent
	err := forEachData(f, size, func(off, end int64) error {
		exts = append(exts, Extent{off, end - off})
		return nil
	})
	if errors.Is(err, errNoSeekData) {
		return []Extent{{0, size}}, nil // all of it may be data
	}
	return exts, err
}

// CopyIncremental makes dst, which holds the previous checkpoint's RAM
// exactly (zeros where it had none), equal in content to src (of size),
// the guest RAM now: within src's data extents it copies only the pages in
// must (the pages the guest may have written since). Where src has holes
// dst must read zeros already: the holes are freed later, out of the
// pause (PunchHoles with the returned extents). It returns src's data
// extents and the bytes copied.
func CopyIncremental(dst, src *os.File, size int64, must *Pages) ([]Extent, int64, error) {
	exts, err := DataExtents(src, size)
	if err != nil {
		return nil, 0, err
	}
	buf := make([]byte, 4<<20)
	var copied int64
	for _, e := range exts {
		end := e.Off + e.Len
		for pos := e.Off; pos < end; {
			page := pos / PageSize
			if !must.Has(page) {
				pos = min((page+1)*PageSize, end)
				continue
			}
			// A run of pages to copy.
			runEnd := pos
			for runEnd < end && must.Has(runEnd/PageSize) {
				runEnd = min((runEnd/PageSize+1)*PageSize, end)
			}
			n, err := copyRange(dst, src, pos, runEnd, buf)
			copied += n
			if err != nil {
				return nil, copied, err
			}
			pos = runEnd
		}
	}
	return exts, copied, nil
}

// FillFrom makes dst a resident copy of base (of size): base's data where
// it has data and written zeros elsewhere, so that every page of dst is in
// the page cache (a spare that is also a copy of the last checkpoint).
// stop is polled between chunks; a stopped fill returns errStopped. dst is
// written out to its disk as the fill goes, a step (writebackStep) at a
// time, so that its writeback never holds up another file's fsync for long.
func FillFrom(dst, base *os.File, size int64, stop func() bool) ([]Extent, error) {
	return fillFrom(dst, base, size, stop, pace(dst))
}

// fillFrom is FillFrom, writing dst out as p says (a nil p leaves that to
// the kernel).
func fillFrom(dst, base *os.File, size int64, stop func() bool, p *pacer) ([]Extent, error) {
	var exts []Extent
	var err error
	if base != nil {
		if exts, err = DataExtents(base, size); err != nil {
			return nil, err
		}
	}
	if err := dst.Truncate(size); err != nil {
		return nil, err
	}
	buf := make([]byte, 8<<20)
	zeros := make([]byte, 8<<20)
	write := func(off, end int64, from *os.File) error {
		for pos := off; pos < end; {
			if stop != nil && stop() {
				return errStopped
			}
			n := min(int64(len(buf)), end-pos)
			b := zeros[:n]
			if from != nil {
				k, err := from.ReadAt(buf[:n], pos)
				if err != nil && !(errors.Is(err, io.EOF) && int64(k) == n) {
					return err
				}
				b = buf[:n]
			}
			if _, err := dst.WriteAt(b, pos); err != nil {
				return err
			}
			p.wrote(n)
			pos += n
		}
		return nil
	}
	prev := int64(0)
	for _, e := range exts {
		if err := write(prev, e.Off, nil); err != nil {
			return nil, err
		}
		if err := write(e.Off, e.Off+e.Len, base); err != nil {
			return nil, err
		}
		prev = e.Off + e.Len
	}
	if err := write(prev, size, nil); err != nil {
		return nil, err
	}
	p.done()
	return exts, nil
}

var errStopped = errors.New("stopped")

// Compare reads a and b over size bytes (holes read as zeros) and returns
// nil if they are equal, else an error naming the first page that
// differs: the checkpoint verifier.
func Compare(a, b *os.File, size int64) error {
	// Where both are holes both read zeros: only the data of either is
	// read.
	ea, err := DataExtents(a, size)
	if err != nil {
		return err
	}
	eb, err := DataExtents(b, size)
	if err != nil {
		return err
	}
	const chunk = 4 << 20
	ba, bb := make([]byte, chunk), make([]byte, chunk)
	for _, e := range union(ea, eb) {
		if err := compareRange(a, b, e.Off, min(e.Off+e.Len, size), ba, bb); err != nil {
			return err
		}
	}
	return nil
}

// union merges two sorted lists of extents.
func union(a, b []Extent) []Extent {
	all := append(append([]Extent(nil), a...), b...)
	slices.SortFunc(all, func(x, y Extent) int { return cmp.Compare(x.Off, y.Off) })
	var out []Extent
	for _, e := range all {
		if n := len(out); n > 0 && e.Off <= out[n-1].Off+out[n-1].Len {
			out[n-1].Len = max(out[n-1].Len, e.Off+e.Len-out[n-1].Off)
			continue
		}
		out = append(out, e)
	}
	return out
}

func compareRange(a, b *os.File, off, end int64, ba, bb []byte) error {
	chunk := int64(len(ba))
	for pos := off; pos < end; pos += chunk {
		n := min(int64(chunk), end-pos)
		if err := readFull(a, ba[:n], pos); err != nil {
			return err
		}
		if err := readFull(b, bb[:n], pos); err != nil {
			return err
		}
		if !bytes.Equal(ba[:n], bb[:n]) {
			for i := int64(0); i < n; i += PageSize {
				e := min(i+PageSize, n)
				if !bytes.Equal(ba[i:e], bb[i:e]) {
					return fmt.Errorf("%w: page %d (offset %#x) differs", ErrMismatch, (pos+i)/PageSize, pos+i)
				}
			}
		}
	}
	return nil
}

// ErrMismatch: the verifier found a checkpoint that is not the guest's RAM.
var ErrMismatch = errors.New("checkpoint RAM differs from the guest's")

// readFull reads len(b) bytes at off; past the end of the file reads zeros.
func readFull(f *os.File, b []byte, off int64) error {
	k, err := f.ReadAt(b, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	clear(b[k:])
	return nil
}
