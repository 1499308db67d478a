package main

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/kosa8/kosa8/internal/agent"
)

// countWriter counts what is written, failing past max (so a test of an
// unbounded writer ends).
type countWriter struct{ n, max int64 }

func (c *countWriter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	if c.n > c.max {
		return 0, errors.New("too much")
	}
	return len(b), nil
}

// sparseTar is a tar stream of a few KiB holding a GNU sparse file (PAX
// 0.1) of size bytes, all hole: archive/tar's reader expands it to size
// bytes of zeros, typed as a regular file.
func sparseTar(name string, size int64) []byte {
	hdr := func(name string, typ byte, size int) []byte {
		b := make([]byte, 512)
		copy(b, name)
		copy(b[100:], "0000644\x00")
		copy(b[108:], "0000000\x00")
		copy(b[116:], "0000000\x00")
		copy(b[124:], fmt.Sprintf("%011o\x00", size))
		copy(b[136:], "00000000000\x00")
		b[156] = typ
		copy(b[257:], "ustar\x0000")
		copy(b[148:], "        ")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		return b
	}
	rec := func(k, v string) string {
		s := " " + k + "=" + v + "\n"
		n := len(s)
		for m := 0; m != n; {
			m, n = n, len(fmt.Sprint(n))+len(s)
		}
		return fmt.Sprint(n) + s
	}
	pax := rec("GNU.sparse.major", "0") + rec("GNU.sparse.minor", "1") + rec("GNU.sparse.size", fmt.Sprint(size)) +
		rec("GNU.sparse.numblocks", "1") + rec("GNU.sparse.map", "0,0")
	var b []byte
	b = append(b, hdr("PaxHeaders/x", 'x', len(pax))...)
	b = append(b, pax...)
	b = append(b, make([]byte, (512-len(pax)%512)%512)...)
	b = append(b, hdr(name, '0', 0)...)
	return append(b, make([]byte, 1024)...)
}

// A guest's tar stream is bounded (maxHomeArchive) as it arrives, but a
// sparse file in it expands when read: what filterHome writes must be
// bounded too, or a few KiB from the guest fill the host's memory.
func TestFilterHomeSparseBomb(t *testing.T) {
	p, err := agent.Get("claude")
	if err != nil {
		t.Fatal(err)
	}
	in := sparseTar(".claude/big", 1<<40)
	out := &countWriter{max: 2 * maxHomeArchive}
	_, err = filterHome(p, bytes.NewReader(in), out)
	if out.n > maxHomeArchive+1<<20 {
		t.Fatalf("a %d-byte stream from the guest made filterHome write %d bytes", len(in), out.n)
	}
	if err == nil {
		t.Fatal("a home expanding past the cap was kept")
	}
}
