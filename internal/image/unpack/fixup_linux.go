package unpack

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CABundle is where kosa8 and Debian keep the system's roots.
const CABundle = "etc/ssl/certs/ca-certificates.crt"

// Fixup adds to the unpacked root at root the few things a kosa8 sandbox
// needs and the image may lack (the accounts files, the CA bundle from
// caBundle, /tmp and the like), and reports on the rest. user is the
// image config's User.
func Fixup(root, caBundle, user string) (*Report, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	rep := &Report{}
	for _, d := range []struct {
		name string
		mode uint32
	}{{"etc", 0o755}, {"tmp", 0o1777}, {"root", 0o700}, {"home", 0o755}, {"run", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"var", 0o755}, {"var/tmp", 0o1777}} {
		if exists(fd, d.name) {
			continue
		}
		if err := mkdirIn(fd, d.name, d.mode); err != nil {
			return nil, fmt.Errorf("make /%s: %w", d.name, err)
		}
		rep.Added = append(rep.Added, "/"+d.name)
	}
	for _, f := range []struct{ name, body string }{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"},
		{"etc/group", "root:x:0:\n"},
	} {
		if exists(fd, f.name) {
			continue
		}
		if err := writeIn(fd, f.name, strings.NewReader(f.body), 0o644); err != nil {
			return nil, fmt.Errorf("write /%s: %w", f.name, err)
		}
		rep.Added = append(rep.Added, "/"+f.name)
	}
	if !exists(fd, CABundle) && caBundle != "" {
		src, err := os.Open(caBundle)
		if err != nil {
			return nil, err
		}
		for _, d := range []string{"etc/ssl", "etc/ssl/certs"} {
			if !exists(fd, d) {
				if err := mkdirIn(fd, d, 0o755); err != nil {
					src.Close()
					return nil, err
				}
			}
		}
		err = writeIn(fd, CABundle, io.LimitReader(src, 16<<20), 0o644)
		src.Close()
		if err != nil {
			return nil, fmt.Errorf("write the CA bundle: %w", err)
		}
		rep.Added = append(rep.Added, "/"+CABundle)
	}
	for _, sh := range []string{"bin/bash", "usr/bin/bash", "bin/sh", "usr/bin/sh"} {
		if executable(fd, sh) {
			rep.Shell = "/bin/" + sh[strings.LastIndex(sh, "/")+1:]
			if !strings.HasPrefix(sh, "bin/") {
				rep.Shell = "/" + sh
			}
			break
		}
	}
	rep.Sudo = executable(fd, "usr/bin/sudo") || executable(fd, "bin/sudo")
	switch {
	case executable(fd, "usr/bin/apt-get"):
		rep.Packages = "apt"
	case executable(fd, "sbin/apk") || executable(fd, "usr/sbin/apk") || executable(fd, "bin/apk"):
		rep.Packages = "apk"
	}
	for _, p := range []string{"etc/os-release", "usr/lib/os-release"} {
		if b, err := readIn(fd, p, 64<<10); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "ID="); ok {
					rep.OS = strings.Trim(strings.TrimSpace(v), `"'`)
				}
			}
			break
		}
	}
	if user != "" {
		u, err := lookupUser(fd, user)
		if err != nil {
			return nil, err
		}
		if u.UID != 0 {
			rep.User = u
		}
	}
	return rep, nil
}

func exists(root int, p string) bool {
	fd, err := unix.Openat2(root, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

func executable(root int, p string) bool {
	fd, err := unix.Openat2(root, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0
}

// splitParent opens p's directory in the root.
func splitParent(root int, p string) (int, string, error) {
	i := strings.LastIndex(p, "/")
	if i < 0 {
		fd, err := unix.Openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return fd, p, err
	}
	fd, err := unix.Openat2(root, p[:i], &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	return fd, p[i+1:], err
}

func mkdirIn(root int, p string, mode uint32) error {
	pfd, base, err := splitParent(root, p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, mode); err != nil {
		return err
	}
	dfd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return unix.Fchmod(dfd, mode) // past the umask
}

// writeIn writes a new file p in the root (a dangling link there is
// replaced, never followed).
func writeIn(root int, p string, r io.Reader, mode uint32) error {
	pfd, base, err := splitParent(root, p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	_ = unix.Unlinkat(pfd, base, 0)
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), base)
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(os.FileMode(mode)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readIn(root int, p string, max int64) ([]byte, error) {
	fd, err := unix.Openat2(root, p, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("/%s is not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if int64(len(b)) > max {
		return nil, fmt.Errorf("/%s is larger than %d bytes", p, max)
	}
	return b, err
}

// lookupUser resolves an image config's User (name, uid, name:group,
// uid:gid) in the root's /etc/passwd and /etc/group.
func lookupUser(root int, spec string) (*User, error) {
	name, group, _ := strings.Cut(spec, ":")
	passwd, _ := readIn(root, "etc/passwd", 4<<20)
	u := &User{UID: -1, GID: -1}
	if n, err := strconv.Atoi(name); err == nil {
		u.UID = n
	}
	sc := bufio.NewScanner(strings.NewReader(string(passwd)))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 4 {
			continue
		}
		if f[0] == name || (u.UID >= 0 && f[2] == name) {
			u.Name = f[0]
			u.UID, _ = strconv.Atoi(f[2])
			u.GID, _ = strconv.Atoi(f[3])
			break
		}
	}
	if u.UID < 0 {
		return nil, fmt.Errorf("the image's User %q is not in its /etc/passwd", clip(spec))
	}
	if group != "" {
		if n, err := strconv.Atoi(group); err == nil {
			u.GID = n
		} else {
			groups, _ := readIn(root, "etc/group", 4<<20)
			found := false
			sc := bufio.NewScanner(strings.NewReader(string(groups)))
			for sc.Scan() {
				f := strings.Split(sc.Text(), ":")
				if len(f) >= 3 && f[0] == group {
					u.GID, _ = strconv.Atoi(f[2])
					found = true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("the image's User %q names a group not in its /etc/group", clip(spec))
			}
		}
	}
	if u.GID < 0 {
		u.GID = u.UID
	}
	return u, nil
}

// Main is `kosa8-agent unpack`: the converter VM's commands.
//
//	unpack count -disk D -layers OFF:SIZE,... [-max-files N]     prints the member count
//	unpack apply -disk D -root DIR -layers ... [-max-files N]    prints Stats as JSON
//	unpack fixup -root DIR [-ca FILE] [-user USER]               prints Report as JSON
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "unpack: count, apply or fixup")
		return 2
	}
	fs := flag.NewFlagSet("unpack "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	disk := fs.String("disk", "", "the raw disk holding the uncompressed layers")
	root := fs.String("root", "", "the directory to unpack into")
	spec := fs.String("layers", "", "OFF:SIZE of each layer on the disk, comma-separated")
	maxFiles := fs.Int("max-files", 1_000_000, "bound on the members of all layers")
	ca := fs.String("ca", "", "CA bundle to add where the image has none")
	user := fs.String("user", "", "the image config's User")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "kosa8-unpack: %v\n", err)
		return 1
	}
	var layers []Layer
	if *spec != "" {
		for _, s := range strings.Split(*spec, ",") {
			o, n, ok := strings.Cut(s, ":")
			off, err1 := strconv.ParseInt(o, 10, 64)
			size, err2 := strconv.ParseInt(n, 10, 64)
			if !ok || err1 != nil || err2 != nil || off < 0 || size < 0 {
				return fail(fmt.Errorf("layer %q is not OFF:SIZE", s))
			}
			layers = append(layers, Layer{Off: off, Size: size})
		}
	}
	var out any
	switch args[0] {
	case "count", "apply":
		f, err := os.Open(*disk)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		if args[0] == "count" {
			n, err := Count(f, layers, *maxFiles)
			if err != nil {
				return fail(err)
			}
			fmt.Fprintln(stdout, n)
			return 0
		}
		st, err := Apply(*root, f, layers, Options{MaxFiles: *maxFiles})
		if err != nil {
			return fail(err)
		}
		out = st
	case "fixup":
		rep, err := Fixup(*root, *ca, *user)
		if err != nil {
			return fail(err)
		}
		out = rep
	default:
		return fail(errors.New("unknown command " + args[0]))
	}
	b, _ := json.Marshal(out)
	fmt.Fprintf(stdout, "%s\n", b)
	return 0
}
