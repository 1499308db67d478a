package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A guest restored as another machine than the one saved (a fork of a
// sandbox, a new sandbox started from a boot template) would share that
// machine's boot_id with every other copy once the kernel has made it (at
// its first read): one boot told from another in logs and caches keyed by
// boot. The kernel makes it once per boot and refuses writes, so a file
// holding a new one is bind-mounted, read-only, over it, as LXC gives each
// container its own. (The machine-id is the sandbox's, named by the host:
// identity_linux.go.)

const (
	bootIDPath = "/proc/sys/kernel/random/boot_id"
	bootIDFile = "/run/kosa8/boot_id" // bind-mounted over bootIDPath
)

// newUUID is a random (version 4) UUID in the kernel's boot_id format.
func newUUID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// renewBootID puts a new boot id over the kernel's, after taking off any
// earlier one (a fork of a fork).
func renewBootID() error {
	id, err := newUUID()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(bootIDFile), 0o755); err != nil {
		return err
	}
	tmp := bootIDFile + ".new"
	_ = os.Remove(tmp)
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o444); err != nil {
		return err
	}
	if err := os.Rename(tmp, bootIDFile); err != nil {
		os.Remove(tmp)
		return err
	}
	for {
		// Every mount stacked there before: each fork's, in a fork of a fork.
		if err := unix.Unmount(bootIDPath, unix.MNT_DETACH); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // nothing mounted there
			}
			return fmt.Errorf("unmount the old boot id: %w", err)
		}
	}
	if err := unix.Mount(bootIDFile, bootIDPath, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount the new boot id: %w", err)
	}
	if err := unix.Mount("", bootIDPath, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("make the new boot id read-only: %w", err)
	}
	return nil
}
