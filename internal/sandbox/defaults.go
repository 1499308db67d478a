package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
)

var userNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// GuestUser is the guest's default user, as the CLI and the SDK make it:
// the host user's name and ids, unless the host user is root (the guest's
// default user must not be), then kosa8 with 1000:1000.
func GuestUser() (name string, uid, gid int) {
	uid, gid = os.Getuid(), os.Getgid()
	name = "kosa8"
	if u, err := user.Current(); err == nil && userNameRE.MatchString(u.Username) && u.Username != "root" {
		name = u.Username
	}
	if uid == 0 {
		return "kosa8", 1000, 1000
	}
	return name, uid, gid
}

var nameUnsafeRE = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

// DefaultName names a new sandbox after its folder ("" for none), with a
// random suffix.
func DefaultName(folder string) string {
	base := "sandbox"
	if folder != "" {
		base = strings.Trim(nameUnsafeRE.ReplaceAllString(filepath.Base(folder), "-"), "-.")
	}
	if base == "" || len(base) > 40 {
		base = "sandbox"
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return base + "-" + hex.EncodeToString(b)
}
