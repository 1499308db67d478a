package qemu

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// The driver's records in its RecordDir (the failed accelerators, the
// probe cache, the host's TSC rate) are read and written by these two.

// readRecord reads the file at path, at most max bytes of it, if it is a
// regular file: never through a link, nor waiting on a FIFO planted at its
// name.
func readRecord(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("%s is over %d bytes", path, max)
	}
	return b, err
}

// writeRecord replaces the file at path whole (a new file renamed over
// it: never through a link planted at its name).
func writeRecord(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
