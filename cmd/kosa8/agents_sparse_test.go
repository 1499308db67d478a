package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
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

// A guest's tar stream is bounded (maxHomeStream) as it arrives, but a
// sparse file in it expands when read: what filterHome writes must be
// bounded too, or a few KiB from the guest fill the host's memory. The
// file is skipped, named, and what follows it is still kept.
func TestFilterHomeSparseBomb(t *testing.T) {
	p, err := agent.Get("claude")
	if err != nil {
		t.Fatal(err)
	}
	in := sparseTar(".claude/big", 1<<40)
	in = in[:len(in)-1024] // the end-of-archive blocks: a file follows
	var small bytes.Buffer
	tw := tar.NewWriter(&small)
	tw.WriteHeader(&tar.Header{Name: ".claude/settings.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("{}"))
	tw.Close()
	in = append(in, small.Bytes()...)
	var out bytes.Buffer
	cw := &countWriter{max: 2 * maxHomeArchive}
	res, err := filterHome(p, bytes.NewReader(in), io.MultiWriter(&out, cw))
	if err != nil {
		t.Fatal(err)
	}
	if cw.n > 64<<10 {
		t.Fatalf("a %d-byte stream from the guest made filterHome write %d bytes", len(in), cw.n)
	}
	if len(res.skipped) != 1 || res.skipped[0].name != ".claude/big" || !strings.Contains(res.skipped[0].why, "1024.0 GiB") {
		t.Fatalf("skipped %+v, want .claude/big (1024.0 GiB)", res.skipped)
	}
	tr := tar.NewReader(&out)
	h, err := tr.Next()
	if err != nil || h.Name != ".claude/settings.json" {
		t.Fatalf("what follows the skipped file is not kept: %v %v", h, err)
	}
}

// Files that together pass the limit: each that fits is kept, each that
// does not is skipped; the archive stays within the limit.
func TestFilterHomeKeepsWhatFits(t *testing.T) {
	p, _ := agent.Get("claude")
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		chunk := make([]byte, 1<<20)
		for i, size := range []int64{100 << 20, 200 << 20, 200 << 20, 1 << 10} {
			tw.WriteHeader(&tar.Header{Name: fmt.Sprintf(".claude/f%d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size})
			for left := size; left > 0; left -= int64(len(chunk)) {
				tw.Write(chunk[:min(left, int64(len(chunk)))])
			}
		}
		tw.Close()
		pw.Close()
	}()
	cw := &countWriter{max: 2 * maxHomeArchive}
	res, err := filterHome(p, pr, cw)
	if err != nil {
		t.Fatal(err)
	}
	if cw.n > maxHomeArchive {
		t.Fatalf("wrote %d bytes, over the %d limit", cw.n, maxHomeArchive)
	}
	var names []string
	for _, s := range res.skipped {
		names = append(names, s.name)
	}
	if fmt.Sprint(names) != "[.claude/f1 .claude/f2]" {
		t.Fatalf("skipped %v, want f1 and f2 (f0 and f3 fit)", names)
	}
}

// The guest's own list of what it left out becomes one line that names
// each file (cleaned, capped) and says what to do.
func TestSkippedLine(t *testing.T) {
	p, _ := agent.Get("claude")
	skips := guestSkips("find: './.claude/x': Permission denied\n" +
		"kosa8-skip\tunreadable\t.claude/hard-shadow\n" +
		"kosa8-skip\t2147483648 bytes\t.claude/big\x1b[2J\n" +
		"kosa8-skip\tbroken")
	line := skippedLine(p, skips)
	for _, want := range []string{
		"kept claude's settings except 2 files: ~/.claude/hard-shadow (unreadable), ~/.claude/big?[2J (2.0 GiB, over the limit).",
		"make it readable by the sandbox's user and smaller than 256 MiB",
		"move it out of ~/.claude, ~/.claude.json",
	} {
		if !strings.Contains(line, want) {
			t.Fatalf("line %q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "\n") {
		t.Fatalf("not one line: %q", line)
	}
	many := make([]homeSkip, 20)
	for i := range many {
		many[i] = homeSkip{fmt.Sprintf(".claude/f%d", i), "unreadable"}
	}
	if l := skippedLine(p, many); !strings.Contains(l, "and 12 more") || strings.Contains(l, "f8 ") {
		t.Fatalf("20 files: %q", l)
	}
	if skippedLine(p, nil) != "" {
		t.Fatal("a line with nothing skipped")
	}
}
