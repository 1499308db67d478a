package wsync

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"path"
	"strings"
)

// A git index names the paths git writes when the user restores the work
// tree from it (git checkout -- ., git restore ., checkout-index): git
// checks the names of trees it reads, not those of the index it wrote
// itself. An index from the guest naming "../../.bashrc" or
// ".git/hooks/post-checkout" would have the host's git write there. So a
// guest's index crosses only if every entry names a path git would
// accept from a tree; it is checked as it is written (indexCheck), so
// that the bytes checked are the bytes written.

// errBadIndex: an index from the guest names a path git must never write.
var errBadIndex = errors.New("git index names a path outside the work tree or in a git directory")

// isGitIndex reports whether p is a git directory's index.
func (e *Engine) isGitIndex(p string) bool {
	if foldName(path.Base(p)) != "index" {
		return false
	}
	if rest, ok := gitDirRest(p); ok && foldName(rest) == "index" {
		return true
	}
	return e.gitDirs[path.Dir(p)]
}

// indexCheck passes r through while parsing it as a git index of a
// repository whose object names are hashLen bytes: at r's end, or at a
// bad entry, it fails with errBadIndex, so the write never commits.
type indexCheck struct {
	r io.Reader
	x indexParser
}

func newIndexCheck(r io.Reader, hashLen int) *indexCheck {
	return &indexCheck{r: r, x: indexParser{hashLen: hashLen}}
}

func (c *indexCheck) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.x.feed(p[:n])
	if c.x.err != nil {
		return 0, c.x.err
	}
	if err == io.EOF && c.x.left != 0 {
		return 0, errBadIndex // cut short: not what git would read whole
	}
	return n, err
}

// indexHashLen is the length of object names in the repository whose git
// directory is dir, as its host config says (extensions.objectFormat; the
// guest cannot change it there).
func (e *Engine) indexHashLen(ctx context.Context, dir string) int {
	b, _ := readAllMax(ctx, e.host.Read, path.Join(dir, "config"), maxHostGitConfig)
	for _, en := range gitConfigEntries(b) {
		if en.key == "extensions.objectformat" && strings.EqualFold(en.value, "sha256") {
			return 32
		}
	}
	return 20
}

// indexParser reads a git index (versions 2 to 4) pushed to it in pieces,
// checking each entry's name as git reads it. Only the entries are read:
// the extensions after them name no path git writes.
type indexParser struct {
	hashLen int
	buf     []byte
	started bool
	version uint32
	left    uint32 // entries still to read
	prev    []byte // the last name (version 4 compresses names against it)
	err     error
}

// maxIndexName bounds a name's bytes (git's PATH_MAX-sized names and more).
const maxIndexName = 64 << 10

func (x *indexParser) feed(b []byte) {
	if x.err != nil || (x.started && x.left == 0) {
		return
	}
	x.buf = append(x.buf, b...)
	for x.err == nil {
		n := x.next()
		if n == 0 {
			break
		}
		x.buf = x.buf[n:]
	}
	if x.err == nil && len(x.buf) > maxIndexName+256 {
		x.err = errBadIndex
	}
	if x.started && x.left == 0 {
		x.buf = nil
	}
}

// next consumes one unit of buf (the header or an entry), returning its
// length, or 0 when more bytes are needed (or on an error, in x.err).
func (x *indexParser) next() int {
	b := x.buf
	if !x.started {
		if len(b) < 12 {
			return 0
		}
		x.started = true
		x.version = binary.BigEndian.Uint32(b[4:8])
		if string(b[:4]) != "DIRC" || x.version < 2 || x.version > 4 {
			return 0 // git refuses it whole ("bad signature", "bad index version"): nothing to check
		}
		x.left = binary.BigEndian.Uint32(b[8:12])
		return 12
	}
	if x.left == 0 {
		return 0
	}
	fixed := 40 + x.hashLen + 2
	if len(b) < fixed {
		return 0
	}
	flags := binary.BigEndian.Uint16(b[fixed-2 : fixed])
	if flags&0x4000 != 0 { // extended flags (git reads them whatever the version)
		fixed += 2
		if len(b) < fixed {
			return 0
		}
	}
	nameLen := int(flags & 0xfff)
	var name []byte
	var size int
	rest := b[fixed:]
	if x.version < 4 {
		if nameLen == 0xfff {
			i := bytes.IndexByte(rest, 0)
			if i < 0 {
				return 0
			}
			nameLen = i
		}
		size = (fixed + nameLen + 8) &^ 7
		if len(b) < size {
			return 0
		}
		name = rest[:nameLen]
	} else {
		strip, vl := gitVarint(rest)
		if vl == 0 {
			if len(rest) > 16 {
				x.err = errBadIndex
			}
			return 0
		}
		if strip > uint64(len(x.prev)) {
			x.err = errBadIndex
			return 0
		}
		keep := len(x.prev) - int(strip)
		suffix := rest[vl:]
		i := bytes.IndexByte(suffix, 0)
		if nameLen == 0xfff {
			if i < 0 {
				return 0
			}
			nameLen = keep + i
		}
		take := nameLen - keep // git copies these and one byte more
		if take < 0 {
			x.err = errBadIndex
			return 0
		}
		if len(suffix) < take+1 {
			return 0
		}
		name = append(append([]byte{}, x.prev[:keep]...), suffix[:take]...)
		size = fixed + vl + take + 1
	}
	if !indexNameOK(name) {
		x.err = errBadIndex
		return 0
	}
	x.prev = append(x.prev[:0], name...)
	x.left--
	return size
}

// gitVarint decodes git's offset varint (varint.c), returning the value
// and its length (0: incomplete).
func gitVarint(b []byte) (uint64, int) {
	if len(b) == 0 {
		return 0, 0
	}
	c := b[0]
	val := uint64(c & 127)
	i := 1
	for c&128 != 0 {
		if i >= len(b) || i > 9 {
			return 0, 0
		}
		c = b[i]
		i++
		val = ((val + 1) << 7) + uint64(c&127)
	}
	return val, i
}

// indexNameOK is git's verify_path, made stricter: a relative path of
// non-empty components, none "." or "..", none a git directory's name
// as any host may take it (case, ignored code points, NTFS's short name
// and trailing dots and spaces), no NUL.
func indexNameOK(name []byte) bool {
	if len(name) == 0 || len(name) > maxIndexName || bytes.IndexByte(name, 0) >= 0 {
		return false
	}
	for _, c := range strings.Split(string(name), "/") {
		if c == "" || c == "." || c == ".." {
			return false
		}
		f := strings.TrimRight(foldName(c), ". ")
		if f == ".git" || f == "git~1" || strings.HasPrefix(f, ".git:") {
			return false
		}
	}
	return true
}
