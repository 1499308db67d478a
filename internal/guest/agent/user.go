package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

type user struct {
	name   string
	uid    int
	gid    int
	groups []uint32
	home   string
	shell  string
}

// userDB reads accounts from an /etc-like directory (root in tests).
type userDB struct{ etc string }

// maxAccountFile bounds what is read of /etc/passwd and /etc/group: the
// guest can write them, and the agent must not be made to swallow gigabytes.
const maxAccountFile = 4 << 20

func (db userDB) read(name string) ([][]string, error) {
	f, err := os.Open(filepath.Join(db.etc, name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows [][]string
	s := bufio.NewScanner(&limitedReader{f, maxAccountFile})
	for s.Scan() {
		line := s.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rows = append(rows, strings.Split(line, ":"))
	}
	return rows, s.Err()
}

type limitedReader struct {
	f *os.File
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("file larger than %d bytes", maxAccountFile)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.f.Read(p)
	l.n -= int64(n)
	return n, err
}

// lookup finds an account by name, or by number; name "" means def.
func (db userDB) lookup(name, def string) (*user, error) {
	if name == "" {
		name = def
	}
	if name == "" {
		name = "root"
	}
	rows, err := db.read("passwd")
	if err != nil {
		return nil, fmt.Errorf("read accounts: %w", err)
	}
	for _, r := range rows {
		if len(r) < 7 || (r[0] != name && r[2] != name) {
			continue
		}
		uid, err1 := strconv.Atoi(r[2])
		gid, err2 := strconv.Atoi(r[3])
		if err1 != nil || err2 != nil {
			continue
		}
		u := &user{name: r[0], uid: uid, gid: gid, home: r[5], shell: r[6]}
		if u.home == "" {
			u.home = "/"
		}
		if u.shell == "" {
			u.shell = "/bin/sh"
		}
		u.groups = db.groupsOf(u.name, gid)
		return u, nil
	}
	return nil, fmt.Errorf("no user %q in the guest", name)
}

func (db userDB) groupsOf(name string, primary int) []uint32 {
	groups := []uint32{uint32(primary)}
	rows, _ := db.read("group")
	for _, r := range rows {
		if len(r) < 4 {
			continue
		}
		gid, err := strconv.Atoi(r[2])
		if err != nil || gid == primary {
			continue
		}
		for _, m := range strings.Split(r[3], ",") {
			if m == name {
				groups = append(groups, uint32(gid))
				break
			}
		}
	}
	return groups
}

var validUserName = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// ensureUser makes sure an account with uid exists, named name where that
// name is free, with gid as its group, a home directory, and passwordless
// sudo. It returns the account's name. Idempotent: it runs at every boot
// on a root disk that keeps what earlier boots wrote.
func (db userDB) ensureUser(name string, uid, gid int) (string, error) {
	if !validUserName.MatchString(name) {
		return "", fmt.Errorf("invalid user name %q", name)
	}
	if uid <= 0 || gid <= 0 {
		return "", fmt.Errorf("the default user must not be root (uid %d, gid %d)", uid, gid)
	}
	passwd, err := db.read("passwd")
	if err != nil {
		return "", err
	}
	groups, err := db.read("group")
	if err != nil {
		return "", err
	}
	group := ""
	for _, g := range groups {
		if len(g) >= 3 && g[2] == strconv.Itoa(gid) {
			group = g[0]
		}
	}
	if group == "" {
		group = name
		for _, g := range groups {
			if g[0] == group {
				group = fmt.Sprintf("%s%d", name, gid)
			}
		}
		if err := db.appendLine("group", fmt.Sprintf("%s:x:%d:", group, gid)); err != nil {
			return "", err
		}
	}
	var existing []string
	for _, r := range passwd {
		if len(r) >= 7 && r[2] == strconv.Itoa(uid) {
			existing = r
		}
	}
	home := ""
	if existing != nil {
		name, home = existing[0], existing[5]
	} else {
		for _, r := range passwd {
			if r[0] == name {
				name = fmt.Sprintf("user%d", uid)
			}
		}
		home = "/home/" + name
		// bash where the image has it (kosa8's own do); an OCI image may
		// have only sh.
		shell := "/bin/bash"
		if _, err := os.Stat(filepath.Join(filepath.Dir(db.etc), "bin", "bash")); err != nil {
			shell = "/bin/sh"
		}
		line := fmt.Sprintf("%s:x:%d:%d:kosa8 user:%s:%s", name, uid, gid, home, shell)
		if err := db.appendLine("passwd", line); err != nil {
			return "", err
		}
		if _, err := os.Stat(filepath.Join(db.etc, "shadow")); err == nil {
			_ = db.appendLine("shadow", name+":*:19000:0:99999:7:::")
		}
	}
	root := filepath.Dir(db.etc)
	hp := filepath.Join(root, home)
	if _, err := os.Lstat(hp); os.IsNotExist(err) {
		if err := os.MkdirAll(hp, 0o755); err != nil {
			return "", err
		}
		copySkel(filepath.Join(db.etc, "skel"), hp, uid, gid)
		if err := os.Chown(hp, uid, gid); err != nil {
			return "", err
		}
	}
	sudoers := filepath.Join(db.etc, "sudoers.d")
	if _, err := os.Stat(sudoers); err == nil {
		rule := []byte(name + " ALL=(ALL:ALL) NOPASSWD: ALL\n")
		p := filepath.Join(sudoers, "kosa8")
		if old, err := os.ReadFile(p); err != nil || !bytes.Equal(old, rule) {
			if err := os.WriteFile(p, rule, 0o440); err != nil {
				return "", err
			}
		}
	}
	return name, nil
}

func (db userDB) appendLine(file, line string) error {
	f, err := os.OpenFile(filepath.Join(db.etc, file), os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	// A line of its own even after a file that does not end in one: after
	// a crash, or a start from a checkpoint's disks alone, a file appended
	// to just before can end in zeros where the data never reached the
	// disk, and the new line would be read as part of them.
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err == nil && last[0] != '\n' {
			line = "\n" + line
		}
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	// On the disk before the host is told the guest is ready: a checkpoint
	// taken right after holds the account.
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func copySkel(skel, home string, uid, gid int) {
	entries, _ := os.ReadDir(skel)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(skel, e.Name()))
		if err != nil {
			continue
		}
		p := filepath.Join(home, e.Name())
		if os.WriteFile(p, data, 0o644) == nil {
			_ = os.Chown(p, uid, gid)
		}
	}
}
