package qemu

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A guest that prints without end leaves at most two logs of the bound on
// the host, the newest lines among them, and is read to the end.
func TestConsoleLogBounded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "console.log")
	if err := os.WriteFile(path, []byte("from the start before\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const bound = 64 << 10
	var out bytes.Buffer
	for i := 0; out.Len() < 20*bound; i++ {
		out.WriteString(strings.Repeat("x", i%200) + "\n")
	}
	out.WriteString("the last line\n")
	r := &countingReader{r: bytes.NewReader(out.Bytes())}
	copyConsole(r, path, bound)
	if r.n != int64(out.Len()) {
		t.Fatalf("read %d of %d bytes: the guest would stall", r.n, out.Len())
	}
	var total int64
	for _, name := range []string{"console.log", "console.log.1"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > bound {
			t.Errorf("%s: %d bytes, bound %d", name, fi.Size(), bound)
		}
		total += fi.Size()
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("%d files in the sandbox's directory, want 2", len(entries))
	}
	b, _ := os.ReadFile(path)
	if !strings.HasSuffix(string(b), "the last line\n") {
		t.Errorf("the log does not end with the guest's last line: %q", b[max(0, len(b)-40):])
	}
	t.Logf("%d bytes printed, %d kept", out.Len(), total)
}

// The log is appended to (a restored machine continues it) and never
// written through a symbolic link.
func TestConsoleLogAppendsNoSymlink(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "console.log")
	os.WriteFile(path, []byte("boot\n"), 0o600)
	copyConsole(strings.NewReader("restored\n"), path, 1<<20)
	if b, _ := os.ReadFile(path); string(b) != "boot\nrestored\n" {
		t.Errorf("log = %q", b)
	}
	target := filepath.Join(dir, "host-file")
	os.WriteFile(target, []byte("host\n"), 0o600)
	link := filepath.Join(dir, "linked.log")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	r := &countingReader{r: strings.NewReader("through the link\n")}
	copyConsole(r, link, 1<<20)
	if b, _ := os.ReadFile(target); string(b) != "host\n" {
		t.Errorf("written through a symlink: %q", b)
	}
	if r.n != int64(len("through the link\n")) {
		t.Errorf("not drained when the log cannot be opened")
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
