package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// The account made at boot is found even when /etc/passwd ends in zeros
// without a newline, as a file appended to just before a crash (or before
// a checkpoint whose disks alone a start boots from) can on ext4.
func TestEnsureUserAfterAFileEndingInZeros(t *testing.T) {
	etc := t.TempDir()
	passwd := "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" + string(make([]byte, 57))
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	db := userDB{etc: etc}
	name, err := db.ensureUser("kosa8", 1000, 1000)
	if err != nil || name != "kosa8" {
		t.Fatalf("ensureUser: %q, %v", name, err)
	}
	u, err := db.lookup("kosa8", "")
	if err != nil || u.uid != 1000 || u.gid != 1000 {
		t.Fatalf("lookup after ensureUser: %+v, %v", u, err)
	}
	// Made once: a second boot finds it.
	if name, err := db.ensureUser("kosa8", 1000, 1000); err != nil || name != "kosa8" {
		t.Fatalf("ensureUser again: %q, %v", name, err)
	}
}
