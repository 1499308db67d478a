package agent

import (
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The disk filesystems whose superblock is writable are synced before a
// checkpoint, through any of their mount points (a read-only bind of a
// writable one too), their paths unescaped as the kernel escapes them;
// a line too long to read is skipped, not the end of the list.
func TestDiskMounts(t *testing.T) {
	long := `40 22 0:50 / /over rw - overlay overlay rw,lowerdir=` + strings.Repeat("/l", 40<<10)
	info := strings.Join([]string{
		`22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw`,
		`23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw,size=4k`,
		`24 22 0:21 / /proc rw,nosuid,nodev,noexec - proc proc rw`,
		long,
		`30 22 254:16 / /home/me/my\040project rw,nosuid,nodev master:3 - ext4 /dev/vdb rw`,
		`31 22 254:16 /sub /mnt/bind ro - ext4 /dev/vdb rw`,
		`32 22 254:32 / /ro ro,relatime - ext4 /dev/vdc ro`,
		`33 22 0:40 / /tmp rw - tmpfs tmpfs rw`,
		`34 22 0:41 / /fuse rw - fuse.sshfs /dev/vdz rw`, // names its own source
		`garbage without the separator`,
		`36 22 7:0 / /img rw - ext4 /dev/loop0 rw`,
		`35 22 254:48 / /tab\011and\134back rw - xfs /dev/vdd rw`,
		`37 22 bad / /bad rw - ext4 /dev/vde rw`,
	}, "\n")
	got := diskMounts(strings.NewReader(info))
	want := []diskMount{
		{"/", unix.Mkdev(254, 0)},
		{"/home/me/my project", unix.Mkdev(254, 16)},
		{"/mnt/bind", unix.Mkdev(254, 16)},
		{"/img", unix.Mkdev(7, 0)},
		{"/tab\tand\\back", unix.Mkdev(254, 48)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("diskMounts = %v, want %v", got, want)
	}
	for in, want := range map[string]string{`a\040b`: "a b", `\04`: `\04`, `x\999`: `x\999`, `end\`: `end\`} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}
