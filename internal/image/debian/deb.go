package debian

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// Bounds of the .deb reader: a .deb has three members (a signature or two
// more at most), and a control file is a few KiB.
const (
	maxArMembers  = 16
	maxControlLen = 4 << 20
	// maxDictSize bounds the dictionary (window) a compressed member may
	// ask for: xz and zstd allocate what their header says, so a hostile
	// header could otherwise claim gigabytes. dpkg-deb uses 8 MiB (xz -6);
	// 64 MiB covers xz -9 and zstd --long.
	maxDictSize = 64 << 20
)

// maxUnpacked bounds what a data.tar or control.tar may decompress to.
// Debian's largest packages unpack to a few GiB; without a bound a few KiB
// of hostile zstd or xz (ratios above 10000:1) could keep a build busy for
// hours. A variable so that the fuzzer can lower it.
var maxUnpacked int64 = 16 << 30

// arMember is one member of a .deb's ar archive.
type arMember struct {
	name      string
	off, size int64
}

// readAr lists the members of the ar archive f (of size total), checking
// what dpkg-deb relies on: the magic, debian-binary first with a 2.x
// format, sane names and sizes that fit in the file.
func readAr(f io.ReaderAt, total int64) ([]arMember, error) {
	var magic [8]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != "!<arch>\n" {
		return nil, errors.New("not a .deb (no ar magic)")
	}
	var members []arMember
	off := int64(8)
	for off < total {
		if len(members) >= maxArMembers {
			return nil, fmt.Errorf("more than %d ar members", maxArMembers)
		}
		var h [60]byte
		if _, err := f.ReadAt(h[:], off); err != nil {
			return nil, fmt.Errorf("ar header at %d: %v", off, err)
		}
		if h[58] != '`' || h[59] != '\n' {
			return nil, fmt.Errorf("ar header at %d: bad magic", off)
		}
		name := strings.TrimRight(string(h[0:16]), " ")
		name = strings.TrimSuffix(name, "/") // GNU ar
		if !validMemberName(name) {
			return nil, fmt.Errorf("ar member name %q is not valid", clip(name))
		}
		sizeField := strings.TrimRight(string(h[48:58]), " ")
		size, err := strconv.ParseInt(sizeField, 10, 64)
		if err != nil || size < 0 || sizeField == "" || sizeField[0] == '+' {
			return nil, fmt.Errorf("ar member %s: bad size %q", name, sizeField)
		}
		off += 60
		if size > total-off {
			return nil, fmt.Errorf("ar member %s: %d bytes, past the end of the file", name, size)
		}
		members = append(members, arMember{name: name, off: off, size: size})
		off += size + size%2
	}
	if len(members) == 0 || members[0].name != "debian-binary" {
		return nil, errors.New("not a .deb (debian-binary is not the first member)")
	}
	var ver [4]byte
	if members[0].size < 4 {
		return nil, errors.New("debian-binary too short")
	}
	if _, err := f.ReadAt(ver[:], members[0].off); err != nil || string(ver[:2]) != "2." {
		return nil, fmt.Errorf("unsupported .deb format %q", ver[:])
	}
	return members, nil
}

func validMemberName(n string) bool {
	if n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !isDigit(c) && !isAlpha(c) && !strings.ContainsRune("._+-", rune(c)) {
			return false
		}
	}
	return true
}

// openTar opens the ar member prefix+".tar[.gz|.xz|.zst]" of the .deb at
// path as a streaming tar reader; close releases the file and decoder.
func openTar(path, prefix string) (tr *tar.Reader, closeFn func(), err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	tr, closeDec, err := openTarAt(f, fi.Size(), prefix)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %v", path, err)
	}
	return tr, func() { closeDec(); f.Close() }, nil
}

// openTarAt is openTar on the .deb held by f (of size total); closeDec
// releases the decoder, not f.
func openTarAt(f io.ReaderAt, total int64, prefix string) (tr *tar.Reader, closeDec func(), err error) {
	members, err := readAr(f, total)
	if err != nil {
		return nil, nil, err
	}
	for _, m := range members[1:] {
		ext, ok := strings.CutPrefix(m.name, prefix+".tar")
		if !ok {
			continue
		}
		sr := io.NewSectionReader(f, m.off, m.size)
		// The decoders read a few bytes at a time: unbuffered, one pread
		// each, xz ran 20 times slower (0.75 MB/s here).
		var r io.Reader
		closeDec := func() {}
		switch ext {
		case "":
			r = bufio.NewReaderSize(sr, 256<<10)
		case ".gz":
			zr, err := gzip.NewReader(bufio.NewReaderSize(sr, 256<<10))
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %v", m.name, err)
			}
			r = zr
		case ".xz":
			if err := checkXZ(sr); err != nil {
				return nil, nil, fmt.Errorf("%s: %v", m.name, err)
			}
			xr, err := xz.NewReader(bufio.NewReaderSize(io.NewSectionReader(f, m.off, m.size), 256<<10))
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %v", m.name, err)
			}
			r = xr
		case ".zst":
			zr, err := zstd.NewReader(bufio.NewReaderSize(sr, 256<<10), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxDictSize), zstd.WithDecoderMaxMemory(maxDictSize*4))
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %v", m.name, err)
			}
			r, closeDec = zr, zr.Close
		default:
			continue
		}
		return tar.NewReader(capReader(r, maxUnpacked)), closeDec, nil
	}
	return nil, nil, fmt.Errorf("no %s.tar member", prefix)
}

// DebData calls fn for each member of the .deb's data.tar in archive order,
// with hdr.Name as in the archive ("./usr/bin/x") and r reading that
// member's content; members are streamed, never held in memory whole.
// Names are passed through as they are: the caller decides what a safe
// path is. An error from fn stops the walk and is returned.
func DebData(path string, fn func(hdr *tar.Header, r io.Reader) error) error {
	tr, closeFn, err := openTar(path, "data")
	if err != nil {
		return err
	}
	defer closeFn()
	return walkData(tr, path, fn)
}

// walkData is DebData's walk of the data.tar tr of the .deb named path.
func walkData(tr *tar.Reader, path string, fn func(hdr *tar.Header, r io.Reader) error) error {
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: data.tar: %v", path, err)
		}
		if err := fn(hdr, tr); err != nil {
			return err
		}
	}
}

// DebControl returns the fields of the .deb's control file.
func DebControl(path string) (Stanza, error) {
	tr, closeFn, err := openTar(path, "control")
	if err != nil {
		return nil, err
	}
	defer closeFn()
	return readControl(tr, path)
}

// readControl is DebControl's read of the control.tar tr of the .deb
// named path.
func readControl(tr *tar.Reader, path string) (Stanza, error) {
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s: no control file in control.tar", path)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: control.tar: %v", path, err)
		}
		if hdr.Typeflag != tar.TypeReg || strings.TrimPrefix(hdr.Name, "./") != "control" {
			continue
		}
		data, err := io.ReadAll(io.LimitReader(tr, maxControlLen+1))
		if err != nil {
			return nil, fmt.Errorf("%s: control: %v", path, err)
		}
		if len(data) > maxControlLen {
			return nil, fmt.Errorf("%s: control file longer than %d bytes", path, maxControlLen)
		}
		var st Stanza
		err = ParseStanzas(bytes.NewReader(data), func(s Stanza) error {
			if st != nil {
				return errors.New("more than one stanza")
			}
			st = s
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: control: %v", path, err)
		}
		if st == nil {
			return nil, fmt.Errorf("%s: control file is empty", path)
		}
		return st, nil
	}
}
