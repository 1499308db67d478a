package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
)

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "dev", "my-proj_2.x", strings.Repeat("a", 63)} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q rejected: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".hidden", "-x", "a/b", "..", "a b", "ä", strings.Repeat("a", 64), "x\x00"} {
		if ValidateName(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestHostname(t *testing.T) {
	cases := map[string]string{"Dev_Box.1": "dev-box-1", "---": "kosa8", "ok": "ok"}
	for in, want := range cases {
		if got := Hostname(in); got != want {
			t.Errorf("Hostname(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]int{"512M": 512, "2G": 2048, "1.5G": 1536, "2048": 2048, "1T": 1 << 20, "4GiB": 4096, "256mb": 256}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "2x", "-1G", "0", "G", "NaN", "Inf", "1e30G", "2 G"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

func validConfig(name string) Config {
	return Config{Name: name, Arch: "amd64", CPUs: 1, MemoryMiB: 512, DiskGiB: 4, User: "u", UID: 1000, GID: 1000}
}

func TestConfigValidate(t *testing.T) {
	c := validConfig("x")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"cpus":   func(c *Config) { c.CPUs = 0 },
		"memory": func(c *Config) { c.MemoryMiB = 100 },
		"disk":   func(c *Config) { c.DiskGiB = 1 },
		"env":    func(c *Config) { c.Env = []string{"NOEQ"} },
		"name":   func(c *Config) { c.Name = "a/b" },
	} {
		c := validConfig("x")
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s: invalid config accepted", name)
		}
	}
}

// fakeImage is an image directory with a small raw root filesystem.
func fakeImage(t *testing.T) *image.Image {
	t.Helper()
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs.ext4")
	if err := os.WriteFile(rootfs, make([]byte, 1<<20), 0o444); err != nil {
		t.Fatal(err)
	}
	return &image.Image{Dir: dir}
}

func newManager(t *testing.T) *Manager {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (qemu-utils): creating a sandbox needs it")
	}
	return &Manager{Paths: Paths{Home: t.TempDir(), Cache: t.TempDir(), Config: t.TempDir()}, Disks: qemu.Layers{}}
}

func TestCreateOpenListRemove(t *testing.T) {
	m := newManager(t)
	img := fakeImage(t)
	sb, err := m.Create(context.Background(), validConfig("one"), img)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sb.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state dir: %v %v", fi, err)
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", sb.Path(RootDisk)).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		VirtualSize int64  `json:"virtual-size"`
		Backing     string `json:"backing-filename"`
		Format      string `json:"format"`
	}
	_ = json.Unmarshal(out, &info)
	if info.Format != "qcow2" || info.Backing != img.RootFS() || info.VirtualSize != 4<<30 {
		t.Fatalf("root disk: %+v", info)
	}
	if st := sb.Status(); st.State != api.Created {
		t.Fatalf("new sandbox state %q", st.State)
	}
	if _, err := m.Create(context.Background(), validConfig("one"), img); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := m.Create(context.Background(), validConfig("two"), img); err != nil {
		t.Fatal(err)
	}
	list, err := m.List()
	if err != nil || len(list) != 2 || list[0].Config.Name != "one" || list[1].Config.Name != "two" {
		t.Fatalf("list: %v %v", list, err)
	}
	if err := m.Remove("one"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open("one"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open after remove: %v", err)
	}
	entries, _ := os.ReadDir(m.Paths.SandboxesDir())
	if len(entries) != 1 {
		t.Fatalf("sandboxes dir after remove: %v", entries)
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	m := newManager(t)
	img := &image.Image{Dir: t.TempDir()} // no rootfs: qemu-img fails
	if _, err := m.Create(context.Background(), validConfig("broken"), img); err == nil {
		t.Fatal("create on a missing root filesystem succeeded")
	}
	entries, _ := os.ReadDir(m.Paths.SandboxesDir())
	if len(entries) != 0 {
		t.Fatalf("a failed create left %v", entries)
	}
}

func TestStatusFollowsSupervisorLock(t *testing.T) {
	m := newManager(t)
	sb, err := m.Create(context.Background(), validConfig("live"), fakeImage(t))
	if err != nil {
		t.Fatal(err)
	}
	// A supervisor asks whether its sandbox was ever started with the
	// lock held, when Status says running: NeverStarted reads the record.
	first, err := LockSupervisor(sb.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if !sb.NeverStarted() || sb.Status().State != api.Running {
		t.Errorf("a new sandbox under its first supervisor: never started %v, status %s", sb.NeverStarted(), sb.Status().State)
	}
	first.Close()
	if err := sb.WriteStatus(api.Status{State: api.Running, SupervisorPID: 424242}); err != nil {
		t.Fatal(err)
	}
	if st := sb.Status(); st.State != api.Crashed || !strings.Contains(st.Error, "424242") {
		t.Fatalf("running without a supervisor: %+v", st)
	}
	if sb.NeverStarted() {
		t.Error("a sandbox started once counts as never started")
	}
	lock, err := LockSupervisor(sb.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := sb.Status(); st.State != api.Running || !sb.Alive() {
		t.Fatalf("with the lock held: %+v alive=%v", st, sb.Alive())
	}
	if _, err := LockSupervisor(sb.Dir); !errors.Is(err, ErrRunning) {
		t.Fatalf("second supervisor: %v", err)
	}
	if err := m.Remove("live"); !errors.Is(err, ErrRunning) {
		t.Fatalf("remove while running: %v", err)
	}
	lock.Close()
	if sb.Alive() {
		t.Fatal("alive after the lock was released")
	}
}

func TestBlockedHosts(t *testing.T) {
	pol, err := netpolicy.Parse([]string{"github.com", "db.internal.test:5432"}, netpolicy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	events := []audit.Event{
		{Time: at(1), Kind: "dns", Name: "registry.npmjs.org", Decision: "deny"},
		{Time: at(2), Kind: "dns", Name: "Registry.NPMjs.org", Decision: "deny"},
		{Time: at(3), Kind: "tcp", Name: "github.com", Dest: "198.18.0.5:22", Decision: "deny"},
		{Time: at(4), Kind: "dns", Name: "github.com", Decision: "deny"},                         // allowed since
		{Time: at(5), Kind: "tcp", Name: "github.com", Dest: "198.18.0.5:443", Decision: "deny"}, // allowed now: another reason
		{Time: at(6), Kind: "dns", Name: "pypi.org", Decision: "allow"},
		{Time: at(7), Kind: "exfiltration", Name: "kosa8-ph-x.evil.test", Decision: "deny"},
		{Time: at(8), Kind: "tcp", Dest: "1.2.3.4:443", Decision: "deny"}, // raw address: no name
		{Time: at(9), Kind: "tcp", Name: "db.internal.test", Dest: "198.18.0.9:5433", Decision: "deny"},
	}
	got := BlockedHosts(events, pol)
	var rules []string
	for _, b := range got {
		rules = append(rules, fmt.Sprintf("%s×%d", b.Rule, b.Count))
	}
	want := []string{"db.internal.test:5433×1", "github.com:22×1", "registry.npmjs.org×2"}
	if strings.Join(rules, " ") != strings.Join(want, " ") {
		t.Fatalf("blocked = %v, want %v", rules, want)
	}
	if !got[2].Last.Equal(at(2)) || got[2].Port != 0 {
		t.Fatalf("registry entry: %+v", got[2])
	}
}

func TestRefusedHost(t *testing.T) {
	pol, err := netpolicy.Parse([]string{"allowed.test", "*.example.com", "deny:other.example.com"}, netpolicy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		e    audit.Event
		rule string // "" when not a candidate
	}{
		{audit.Event{Kind: "dns", Name: "wanted.test", Decision: "deny"}, "wanted.test"},
		{audit.Event{Kind: "tcp", Name: "allowed.test", Dest: "198.18.0.5:8080", Decision: "deny"}, "allowed.test:8080"},
		{audit.Event{Kind: "dns", Name: "allowed.test", Decision: "deny"}, ""}, // allowed since
		{audit.Event{Kind: "dns", Name: "wanted.test", Decision: "allow"}, ""},
		{audit.Event{Kind: "dns", Name: "other.example.com", Decision: "deny"}, "other.example.com"},
		{audit.Event{Kind: "exfiltration", Name: "x.test", Decision: "deny"}, ""},
		{audit.Event{Kind: "tcp", Dest: "203.0.113.1:80", Decision: "deny"}, ""},
	}
	for _, tc := range cases {
		b, ok := RefusedHost(tc.e, pol)
		if ok != (tc.rule != "") || ok && b.Rule != tc.rule {
			t.Errorf("RefusedHost(%+v) = %+v %v, want %q", tc.e, b, ok, tc.rule)
		}
	}
}

// A stopped sandbox's rules, ports and checkpoints change under the
// supervisor's lock: while a supervisor holds it (a start under way), the
// change is refused, not written where the supervisor would not see it.
func TestStoppedEditsTakeTheSupervisorLock(t *testing.T) {
	sb := &Sandbox{Dir: t.TempDir(), Config: validConfig("stopped")}
	if _, err := AllowStopped(context.Background(), sb, []string{"example.com"}, false); err != nil {
		t.Fatal(err)
	}
	if err := AddPortStopped(sb, api.PortForward{HostPort: 3000, GuestPort: 3000}); err != nil {
		t.Fatal(err)
	}
	if err := AddPortStopped(sb, api.PortForward{HostPort: 3000, GuestPort: 80}); err == nil {
		t.Fatal("a host port forwarded twice")
	}
	events, err := audit.Read(sb.Path(AuditLog))
	if err != nil || len(events) != 1 || events[0].Kind != audit.KindPolicy || events[0].Rule != "example.com" {
		t.Fatalf("the stopped sandbox's rule change is not in its audit log: %+v %v", events, err)
	}
	lock, err := LockSupervisor(sb.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	for what, err := range map[string]error{
		"allow": func() error {
			_, err := AllowStopped(context.Background(), sb, []string{"other.example"}, false)
			return err
		}(),
		"deny":              func() error { _, err := DenyStopped(sb, []string{"other.example"}); return err }(),
		"remove":            func() error { _, err := RemoveStopped(sb, []string{"example.com"}); return err }(),
		"add a port":        AddPortStopped(sb, api.PortForward{HostPort: 4000, GuestPort: 4000}),
		"remove a port":     RemovePortStopped(sb, 3000),
		"delete checkpoint": DeleteCheckpoint(sb, "20261201-000000-0000"),
	} {
		if !errors.Is(err, ErrRunning) {
			t.Errorf("%s while the supervisor's lock is held: %v", what, err)
		}
	}
	if p, _ := sb.LoadPolicy(); len(p.Rules) != 1 {
		t.Fatalf("rules changed under the lock: %v", p.Rules)
	}
}

// A start that comes while a stopped sandbox's edit holds the lock waits
// for it, rather than failing as "already running".
func TestStartWaitsForAStoppedEdit(t *testing.T) {
	dir := t.TempDir()
	release, err := lockStopped(dir)
	if err != nil {
		t.Fatal(err)
	}
	if supervisorAlive(dir) {
		t.Fatal("a stopped sandbox's edit makes it look alive")
	}
	go func() {
		time.Sleep(400 * time.Millisecond) // past the 200 ms a real supervisor gets
		release()
	}()
	lock, err := LockSupervisor(dir)
	if err != nil {
		t.Fatalf("the start did not wait for the edit: %v", err)
	}
	defer lock.Close()
	if _, err := lockStopped(dir); !errors.Is(err, ErrRunning) {
		t.Fatalf("an edit while the supervisor runs: %v", err)
	}
}

// net blocked lists every refusal the user can lift, each with the rule
// that lifts it: an allowed name refused for a private or documentation
// address it resolved to (a pin, until one is added), a raw address (its
// /32), a deny rule (named); never a refusal at the connection cap.
func TestBlockedListsAddressesAndPins(t *testing.T) {
	pol, err := netpolicy.Parse([]string{"registry.npmjs.org", "*.example.com", "deny:*.ads.example.com"}, netpolicy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	events := []audit.Event{
		{Time: at(1), Kind: "tcp", Name: "registry.npmjs.org", Dest: "198.18.0.2:443", Decision: "deny", Refused: "203.0.113.80", Reason: "registry.npmjs.org resolved to …"},
		{Time: at(2), Kind: "tcp", Dest: "203.0.113.9:8080", Decision: "deny", Reason: "no rule allows the address 203.0.113.9:8080"},
		{Time: at(3), Kind: "tcp", Dest: "203.0.113.9:443", Decision: "deny", Reason: "the sandbox has 128 connections open, its limit: refused"},
		{Time: at(4), Kind: "dns", Name: "x.ads.example.com", Decision: "deny", Reason: "denied by rule deny:*.ads.example.com"},
		{Time: at(5), Kind: "dns", Name: "pypi.org", Decision: "deny", Reason: "no rule allows pypi.org"},
		{Time: at(6), Kind: "tcp", Name: "pypi.org", Dest: "198.19.255.254:443", Decision: "deny", Reason: "no rule allows pypi.org"},
	}
	got := BlockedHosts(events, pol)
	by := map[string]api.Blocked{}
	for _, b := range got {
		by[b.Rule] = b
	}
	if len(got) != 4 {
		t.Fatalf("blocked = %+v", got)
	}
	if b := by["pin:registry.npmjs.org"]; b.Address != "203.0.113.80" || !strings.Contains(b.Why, "203.0.113.80 (a documentation address)") {
		t.Errorf("the allowed name refused for its address: %+v", b)
	}
	if b := by["203.0.113.9/32:8080"]; b.Host != "203.0.113.9" || b.Address != "203.0.113.9" {
		t.Errorf("the raw address: %+v", b)
	}
	if b := by["x.ads.example.com"]; b.DenyRule != "deny:*.ads.example.com" {
		t.Errorf("the denied name: %+v", b)
	}
	if b := by["pypi.org"]; b.Count != 2 || b.Port != 443 {
		t.Errorf("the lookup and the connection of one name are one entry: %+v", b)
	}
	// Pinned since: no longer listed.
	r, _ := netpolicy.ParseRule("pin:registry.npmjs.org=203.0.113.80", netpolicy.ParseOptions{})
	pol.Add(r)
	for _, b := range BlockedHosts(events, pol) {
		if b.Host == "registry.npmjs.org" {
			t.Errorf("listed after it was pinned: %+v", b)
		}
	}
}

// A folder in the sandboxes folder that does not open (a removal cut
// short, or one made again by a late writer) is listed as broken, never
// hidden, and 'rm -f' removes it; a sandbox that opens is not broken.
func TestBrokenFoldersListedAndRemoved(t *testing.T) {
	m := newManager(t)
	if _, err := m.Create(context.Background(), validConfig("good"), fakeImage(t)); err != nil {
		t.Fatal(err)
	}
	half := filepath.Join(m.Paths.SandboxesDir(), "half")
	if err := os.MkdirAll(filepath.Join(half, "checkpoints"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, b, err := m.ListAll()
	if err != nil || len(b) != 1 || b[0].Name != "half" || b[0].Err == nil {
		t.Fatalf("broken: %+v, want half alone", b)
	}
	if err := m.RemoveBroken("good"); err == nil {
		t.Fatal("RemoveBroken removed a sandbox that opens")
	}
	if err := m.RemoveBroken("half"); err != nil {
		t.Fatal(err)
	}
	if _, b, _ := m.ListAll(); len(b) != 0 {
		t.Fatalf("still broken: %+v", b)
	}
	if _, err := os.Lstat(half); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("half is still there: %v", err)
	}
	if _, err := m.Open("good"); err != nil {
		t.Fatalf("the good sandbox: %v", err)
	}
}
