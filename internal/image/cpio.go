package image

import (
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
)

// cpioWriter writes the "newc" cpio format the Linux kernel unpacks as an
// initramfs. Only what an initramfs needs: directories, regular files and
// symlinks, all owned by root.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
	// made holds the directories and symlinks written, so a tree merged
	// from several sources names each once.
	made map[string]bool
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: w, ino: 1, made: map[string]bool{}}
}

const (
	cpioDir     = 0o040000
	cpioFile    = 0o100000
	cpioSymlink = 0o120000
	cpioChar    = 0o020000
)

func (c *cpioWriter) header(name string, mode uint32, size int) {
	c.headerDev(name, mode, size, 0, 0)
}

func (c *cpioWriter) headerDev(name string, mode uint32, size int, major, minor uint32) {
	if c.err != nil {
		return
	}
	if strings.HasPrefix(name, "/") || strings.Contains(name, "\x00") {
		c.err = fmt.Errorf("cpio: bad name %q", name)
		return
	}
	c.ino++
	nlink := 1
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, major, minor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad(len(hdr) + len(name) + 1)
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// Dir adds a directory, once.
func (c *cpioWriter) Dir(name string, perm fs.FileMode) {
	if c.made[name] {
		return
	}
	c.made[name] = true
	c.header(name, cpioDir|uint32(perm.Perm()), 0)
}

// MkdirAll adds the directories above name that are not there yet.
func (c *cpioWriter) MkdirAll(name string) {
	for _, d := range parents(name) {
		c.Dir(d, 0o755)
	}
}

// parents returns the directories above the relative path name, outermost
// first: "a/b/c" gives a, a/b.
func parents(name string) []string {
	var parts []string
	for d := path.Dir(name); d != "." && d != "/"; d = path.Dir(d) {
		parts = append(parts, d)
	}
	slices.Reverse(parts)
	return parts
}

// File adds a regular file with the given contents.
func (c *cpioWriter) File(name string, perm fs.FileMode, data []byte) {
	c.header(name, cpioFile|uint32(perm.Perm()), len(data))
	c.write(data)
	c.pad(len(data))
}

// Symlink adds a symbolic link, once.
func (c *cpioWriter) Symlink(name, target string) {
	if c.made[name] {
		return
	}
	c.made[name] = true
	c.header(name, cpioSymlink|0o777, len(target))
	c.write([]byte(target))
	c.pad(len(target))
}

// CharDevice adds a character device node (the kernel needs /dev/console
// in the initramfs to give /init its standard streams).
func (c *cpioWriter) CharDevice(name string, perm fs.FileMode, major, minor uint32) {
	c.headerDev(name, cpioChar|uint32(perm.Perm()), 0, major, minor)
}

// Close writes the trailer and reports the first error.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0)
	return c.err
}
