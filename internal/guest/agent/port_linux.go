package agent

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// FindPort returns the device of the virtio-serial port called name,
// waiting for the driver to create it.
func FindPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		dirs, _ := filepath.Glob("/sys/class/virtio-ports/*")
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, "name"))
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(d)
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio-serial port %q not found", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// portConn is a virtio-serial port that outlives the host end. While the
// host side is closed a read returns 0 at once (and poll says HUP), so a
// plain reader would see EOF or spin; the driver raises SIGIO when the host
// connects again, and portConn sleeps until then (or a slow fallback tick).
type portConn struct {
	fd    int
	sigio chan os.Signal
}

// OpenPort opens the port for the channel.
func OpenPort(dev string) (*portConn, error) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dev, err)
	}
	p := &portConn{fd: fd, sigio: make(chan os.Signal, 1)}
	signal.Notify(p.sigio, unix.SIGIO)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETOWN, os.Getpid()); err == nil {
		fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl|unix.O_ASYNC)
	}
	return p, nil
}

func (p *portConn) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(p.fd, b)
		if n > 0 {
			return n, nil
		}
		if err == unix.EINTR || err == unix.EAGAIN || (err == nil && n == 0) {
			// Host end closed: wait for it to come back.
			select {
			case <-p.sigio:
			case <-time.After(time.Second):
			}
			continue
		}
		if err != nil {
			return 0, err
		}
	}
}

func (p *portConn) Write(b []byte) (int, error) {
	written := 0
	for written < len(b) {
		n, err := unix.Write(p.fd, b[written:])
		if n > 0 {
			written += n
		}
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return written, err
		}
	}
	return written, nil
}
