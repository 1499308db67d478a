package qemu

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// consoleMax bounds a console log: past it the log is renamed to its
// name with ".1" (replacing an older one) and a new one begun. A guest
// that prints without end (root writing to its serial port) holds at
// most twice this on the host's disk, and the newest lines, those a
// failed boot is explained by, are always kept.
var consoleMax int64 = 1 << 20

// copyConsole copies what the guest prints, read from r until it ends,
// into the log at path (appended: a restored machine continues the log
// its supervisor began). It never stops reading while r has data: QEMU's
// serial port waits for its output to be taken, so a reader that stopped
// would stall the guest. What cannot be written (a full disk) is dropped.
// The log is never opened through a symbolic link.
func copyConsole(r io.Reader, path string, max int64) {
	var f *os.File
	var size int64
	open := func(flags int) {
		var err error
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC|flags, 0o600)
		if err != nil {
			f = nil
			return
		}
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			size = fi.Size()
		} else {
			f.Close()
			f = nil
		}
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	open(0)
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if f != nil && size+int64(n) > max {
				// A log that cannot be renamed is not reopened: what
				// follows is dropped rather than let it grow.
				f.Close()
				f = nil
				if os.Rename(path, path+".1") == nil {
					open(os.O_EXCL)
				}
			}
			if f != nil {
				w, _ := f.Write(buf[:n])
				size += int64(w)
			}
		}
		if err != nil {
			return // QEMU is gone (EOF, or a reset socket)
		}
	}
}
