package agent

import (
	"reflect"
	"strings"
	"testing"
)

// Only writable filesystems on virtio disks are synced before a
// checkpoint, each disk once, their mount points unescaped as the kernel
// escapes them.
func TestDiskMounts(t *testing.T) {
	info := strings.Join([]string{
		`22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw`,
		`23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw,size=4k`,
		`24 22 0:21 / /proc rw,nosuid,nodev,noexec - proc proc rw`,
		`30 22 254:16 / /home/me/my\040project rw,nosuid,nodev master:3 - ext4 /dev/vdb rw`,
		`31 22 254:16 /sub /mnt/again rw - ext4 /dev/vdb rw`,
		`32 22 254:32 / /ro ro,relatime - ext4 /dev/vdc ro`,
		`33 22 0:40 / /tmp rw - tmpfs tmpfs rw`,
		`34 22 0:41 / /fuse rw - fuse.sshfs /dev/vdz rw`, // names its own source
		`garbage without the separator`,
		`35 22 254:48 / /tab\011and\134back rw - xfs /dev/vdd rw`,
	}, "\n")
	got := diskMounts(strings.NewReader(info))
	want := []string{"/", "/home/me/my project", "/tab\tand\\back"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("diskMounts = %q, want %q", got, want)
	}
	for in, want := range map[string]string{`a\040b`: "a b", `\04`: `\04`, `x\999`: `x\999`, `end\`: `end\`} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// The sync is skipped only when the kernel says nothing waits to be
// written; a meminfo it cannot read means a sync.
func TestUnwritten(t *testing.T) {
	for in, want := range map[string]bool{
		"MemTotal: 1 kB\nDirty:               0 kB\nWriteback:           0 kB\n": false,
		"Dirty:              12 kB\nWriteback:           0 kB\n":                 true,
		"Dirty:               0 kB\nWriteback:           4 kB\n":                 true,
		"Dirty:               0 kB\n":                                            true,
		"Dirty: x kB\nWriteback: 0 kB\n":                                         true,
		"":                                                                       true,
	} {
		if got := unwritten([]byte(in)); got != want {
			t.Errorf("unwritten(%q) = %v, want %v", in, got, want)
		}
	}
}
