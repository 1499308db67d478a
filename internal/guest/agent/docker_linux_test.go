package agent

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/guest"
)

func TestJoinGroup(t *testing.T) {
	etc := t.TempDir()
	p := filepath.Join(etc, "group")
	os.WriteFile(p, []byte("root:x:0:\ndocker:x:102:\nsudo:x:27:kosa8\n"), 0o644)
	for range 2 { // idempotent
		if err := joinGroup(etc, "docker", "kosa8"); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(p)
	if string(b) != "root:x:0:\ndocker:x:102:kosa8\nsudo:x:27:kosa8\n" {
		t.Fatalf("%q", b)
	}
	if err := joinGroup(etc, "docker", "other"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); !strings.Contains(string(b), "docker:x:102:kosa8,other\n") {
		t.Fatalf("%q", b)
	}
	if err := joinGroup(etc, "nosuch", "kosa8"); err == nil {
		t.Fatal("a missing group was not reported")
	}
	// The user's groups as exec gives them now include docker's.
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("kosa8:x:1000:1000::/home/kosa8:/bin/bash\n"), 0o644)
	u, err := userDB{etc: etc}.lookup("kosa8", "")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range u.groups {
		found = found || g == 102
	}
	if !found {
		t.Fatalf("groups %v lack docker's", u.groups)
	}
}

// TestWriteDockerAuths: the guest's Docker settings get each registry's
// user and placeholder (never a value: the host has it), beside what the
// file held.
func TestWriteDockerAuths(t *testing.T) {
	home := t.TempDir()
	u := &user{name: "me", uid: os.Getuid(), gid: os.Getgid(), home: home}
	os.MkdirAll(filepath.Join(home, ".docker"), 0o700)
	os.WriteFile(filepath.Join(home, ".docker", "config.json"), []byte(`{"auths":{"old.example":{"auth":"eDp5"}},"detachKeys":"ctrl-x"}`), 0o600)
	err := writeDockerAuths(u, []guest.DockerAuth{{Registry: "registry.test:5000", User: "tester", Placeholder: "kosa8-ph-abc"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(home, ".docker", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Auths      map[string]struct{ Auth string }
		DetachKeys string
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	got, _ := base64.StdEncoding.DecodeString(cfg.Auths["registry.test:5000"].Auth)
	if string(got) != "tester:kosa8-ph-abc" || cfg.Auths["old.example"].Auth != "eDp5" || cfg.DetachKeys != "ctrl-x" {
		t.Fatalf("%s", b)
	}
	if fi, _ := os.Stat(filepath.Join(home, ".docker", "config.json")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
}
