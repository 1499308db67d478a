package agent

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A sandbox's identity in its guest: /etc/machine-id and the UUIDs of its
// root and workspace filesystems. The image and a boot template are the
// same for many sandboxes, so all of these would be too; the host names
// the machine-id after the guest is booted or restored (SetTime,
// Restored), the agent writes it and derives the filesystems' UUIDs from
// it, and a sandbox keeps them across its stops and rewinds.

// validMachineID: 32 lowercase hex digits, as machine-id(5) has it.
func validMachineID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// takeMachineID writes the machine-id the host named (empty: unchanged)
// and, in the guest, sets the root filesystem's UUID from it.
func (a *Agent) takeMachineID(id string) error {
	etc := a.users.etc
	if id == "" {
		return nil
	}
	if !validMachineID(id) {
		return fmt.Errorf("machine-id %q refused: 32 lowercase hex digits", id)
	}
	a.mu.Lock()
	a.machineID = id
	a.mu.Unlock()
	p := filepath.Join(etc, "machine-id")
	if b, err := os.ReadFile(p); err != nil || string(b) != id+"\n" {
		tmp := p + ".kosa8"
		if err := os.WriteFile(tmp, []byte(id+"\n"), 0o444); err != nil {
			return fmt.Errorf("machine-id: %w", err)
		}
		if err := os.Rename(tmp, p); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("machine-id: %w", err)
		}
	}
	// Only the guest's init renames its root: an agent run anywhere else
	// (a test on the host) must never touch the filesystem it runs on.
	if etc == "/etc" && os.Getpid() == 1 {
		if err := setFSUUID("/", fsUUID(id, "root")); err != nil {
			a.log.Warn("root filesystem UUID", "err", err)
		}
	}
	return nil
}

// fsUUID is the UUID of a sandbox's filesystem (which: "root", "ws"): a
// random-looking (version 4) UUID made from its machine-id.
func fsUUID(machineID, which string) [16]byte {
	sum := sha256.Sum256([]byte("kosa8 filesystem uuid\x00" + machineID + "\x00" + which))
	var u [16]byte
	copy(u[:], sum[:16])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// ext4 superblock fields (at byte 1024 of the device).
const (
	sbOffset          = 1024
	sbSize            = 1024
	sbMagic           = 0x38
	sbFeatureCompat   = 0x5c
	sbFeatureIncompat = 0x60
	sbFeatureROCompat = 0x64
	sbUUID            = 0x68
	sbChecksumSeed    = 0x270
	sbChecksum        = 0x3fc

	ext4Magic             = 0xef53
	incompatCsumSeed      = 0x2000
	roCompatGDTCsum       = 0x10
	roCompatMetadataCsum  = 0x400
	ext4IocGetFSUUID      = 0x8008662c // _IOR('f', 44, struct fsuuid)
	ext4IocSetFSUUID      = 0x4008662c // _IOW('f', 44, struct fsuuid)
	ext4SuperMagicStatfs  = 0xef53
	fsuuidHeader          = 8 // struct fsuuid { __u32 fsu_len; __u32 fsu_flags; __u8 fsu_uuid[]; }
	errNoCsumSeedFeatures = "it has group descriptor checksums without metadata_csum"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crc32cRaw is the kernel's crc32c(seed, p): no inversion before or after.
func crc32cRaw(seed uint32, p []byte) uint32 { return ^crc32.Update(^seed, castagnoli, p) }

// ensureCsumSeed lets an unmounted ext4 filesystem on dev change its UUID
// while mounted later (EXT4_IOC_SETFSUUID needs it when metadata is
// checksummed): it records the checksum seed the UUID gives now
// (metadata_csum_seed), so that the metadata's checksums no longer depend
// on the UUID. The superblock's own checksum is written anew; nothing
// else changes. A filesystem that has the seed already, or no metadata
// checksums at all, is left as it is; a mounted one is refused (EBUSY:
// the exclusive open of a block device fails while it is mounted).
func ensureCsumSeed(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_EXCL, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	sb := make([]byte, sbSize)
	if _, err := f.ReadAt(sb, sbOffset); err != nil {
		return fmt.Errorf("read the superblock of %s: %w", dev, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[sbMagic:]) != ext4Magic {
		return fmt.Errorf("%s holds no ext4 filesystem", dev)
	}
	incompat, ro := le.Uint32(sb[sbFeatureIncompat:]), le.Uint32(sb[sbFeatureROCompat:])
	if incompat&incompatCsumSeed != 0 || ro&(roCompatMetadataCsum|roCompatGDTCsum) == 0 {
		return nil
	}
	if ro&roCompatMetadataCsum == 0 {
		return errors.New(errNoCsumSeedFeatures)
	}
	// The seed the kernel derives from the UUID (ext4_fill_super).
	le.PutUint32(sb[sbChecksumSeed:], crc32cRaw(0xffffffff, sb[sbUUID:sbUUID+16]))
	le.PutUint32(sb[sbFeatureIncompat:], incompat|incompatCsumSeed)
	le.PutUint32(sb[sbChecksum:], crc32cRaw(0xffffffff, sb[:sbChecksum]))
	if _, err := f.WriteAt(sb, sbOffset); err != nil {
		return fmt.Errorf("write the superblock of %s: %w", dev, err)
	}
	return f.Sync()
}

// setFSUUID gives the mounted ext4 filesystem at mnt the UUID u, if it has
// another (Linux 6.0 or later, and metadata_csum_seed: ensureCsumSeed).
// mnt must be the guest's own: whatever filesystem holds it is renamed.
func setFSUUID(mnt string, u [16]byte) error {
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		return err
	}
	if st.Type != ext4SuperMagicStatfs {
		return nil // the initramfs, a builder's tmpfs: nothing to name
	}
	d, err := os.Open(mnt)
	if err != nil {
		return err
	}
	defer d.Close()
	buf := make([]byte, fsuuidHeader+16)
	binary.NativeEndian.PutUint32(buf[0:], 16)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.Fd(), ext4IocGetFSUUID, uintptr(unsafe.Pointer(&buf[0]))); e == 0 && [16]byte(buf[fsuuidHeader:]) == u {
		return nil
	}
	binary.NativeEndian.PutUint32(buf[0:], 16)
	binary.NativeEndian.PutUint32(buf[4:], 0)
	copy(buf[fsuuidHeader:], u[:])
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.Fd(), ext4IocSetFSUUID, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("set the UUID of %s to %s: %w", mnt, hex.EncodeToString(u[:]), e)
	}
	return nil
}
