package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/sandbox"
)

// refusals writes a stopped sandbox's security log with what its guest
// was refused.
func refusals(t *testing.T, sb *sandbox.Sandbox, evs ...audit.Event) {
	t.Helper()
	al, err := audit.Open(sb.Path(sandbox.AuditLog), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		al.Add(e)
	}
	al.Close()
}

// net approve without a terminal refuses at once, naming the forms that
// need none; --yes allows what the sandbox was refused, with the rule net
// blocked names, and refuses what it was not.
func TestNetApproveWithoutTerminal(t *testing.T) {
	home := fakeHome(t)
	sb := fakeSandbox(t, home, "dev", "", api.Status{State: api.Stopped})
	now := time.Now()
	refusals(t, sb,
		audit.Event{Time: now, Kind: "dns", Name: "pypi.org", Decision: "deny", Reason: "no rule allows pypi.org"},
		audit.Event{Time: now, Kind: "tcp", Dest: "203.0.113.9:8080", Decision: "deny", Reason: "no rule allows the address 203.0.113.9:8080"},
	)
	// go test's standard input is not a terminal.
	done := make(chan struct{})
	var code int
	var stderr string
	go func() {
		code, _, stderr = kosa8(t, "net", "approve", "dev")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("net approve without a terminal is still waiting")
	}
	if code != 125 || !strings.Contains(stderr, "needs a terminal") || !strings.Contains(stderr, "kosa8 net approve dev --yes HOST") || !strings.Contains(stderr, "--json") {
		t.Fatalf("without a terminal: exit %d, %q", code, stderr)
	}
	code, stdout, stderr := kosa8(t, "net", "approve", "dev", "--yes", "nowhere.test")
	if code != 125 || !strings.Contains(stderr, "dev was not refused nowhere.test") || !strings.Contains(stderr, "kosa8 net allow dev nowhere.test") {
		t.Fatalf("--yes of a host never refused: exit %d, %q %q", code, stdout, stderr)
	}
	code, stdout, stderr = kosa8(t, "net", "approve", "dev", "--yes", "pypi.org,203.0.113.9")
	if code != 0 || stdout != "allowed: pypi.org\nallowed: 203.0.113.9/32:8080\n" {
		t.Fatalf("--yes: exit %d, %q %q", code, stdout, stderr)
	}
	_, stdout, _ = kosa8(t, "net", "ls", "dev")
	if stdout != "pypi.org\n203.0.113.9/32:8080\n" {
		t.Fatalf("rules after --yes: %q", stdout)
	}
	if _, stdout, _ = kosa8(t, "net", "blocked", "dev"); !strings.Contains(stdout, "nothing blocked") {
		t.Fatalf("still blocked after --yes: %q", stdout)
	}
}

// net blocked names the refused address, why, and the exact command that
// lets each refusal through: a pin for an allowed name that resolved to a
// documentation address, the /32 of a raw address, and the deny rule to
// lift for a name the user's own rule refuses.
func TestNetBlockedNamesAddressAndFix(t *testing.T) {
	home := fakeHome(t)
	sb := fakeSandbox(t, home, "dev", "", api.Status{State: api.Stopped})
	sb.Config.Network.Rules = []string{"registry.npmjs.org", "*.example.com", "deny:*.ads.example.com"}
	writeJSON(t, filepath.Join(sb.Dir, "sandbox.json"), sb.Config)
	now := time.Now()
	refusals(t, sb,
		audit.Event{Time: now, Kind: "tcp", Name: "registry.npmjs.org", Dest: "198.18.0.2:443", Decision: "deny", Refused: "203.0.113.80", Reason: "registry.npmjs.org resolved to …"},
		audit.Event{Time: now.Add(time.Second), Kind: "tcp", Dest: "203.0.113.9:5432", Decision: "deny", Reason: "no rule allows the address 203.0.113.9:5432"},
		audit.Event{Time: now.Add(2 * time.Second), Kind: "dns", Name: "x.ads.example.com", Decision: "deny", Reason: "denied by rule deny:*.ads.example.com"},
	)
	code, stdout, stderr := kosa8(t, "net", "blocked", "dev")
	if code != 0 || !strings.Contains(stdout, "pin:registry.npmjs.org") || !strings.Contains(stdout, "resolved to 203.0.113.80 (a documentation address)") ||
		!strings.Contains(stdout, "203.0.113.9/32:5432") || !strings.Contains(stderr, "allow with: kosa8 net allow dev 203.0.113.9/32:5432 pin:registry.npmjs.org\n") ||
		!strings.Contains(stderr, "lift with: kosa8 net rm dev deny:*.ads.example.com") {
		t.Fatalf("net blocked: exit %d\n%s%s", code, stdout, stderr)
	}
	_, stdout, _ = kosa8(t, "net", "blocked", "dev", "--json")
	var list []api.Blocked
	if err := json.Unmarshal([]byte(stdout), &list); err != nil || len(list) != 3 {
		t.Fatalf("--json: %v %q", err, stdout)
	}
	for _, b := range list {
		if b.Host == "registry.npmjs.org" && (b.Address != "203.0.113.80" || b.Rule != "pin:registry.npmjs.org") {
			t.Errorf("--json entry %+v", b)
		}
	}
}

// net rm of a bare host takes its allow rules and never its deny rule;
// the deny rule goes when named, as the README says.
func TestNetRmKeepsDenyRules(t *testing.T) {
	home := fakeHome(t)
	fakeSandbox(t, home, "dev", "", api.Status{State: api.Stopped})
	for _, args := range [][]string{
		{"net", "allow", "dev", "*.example.com", "other.example.com"},
		{"net", "deny", "dev", "other.example.com"},
	} {
		if code, _, stderr := kosa8(t, args...); code != 0 {
			t.Fatalf("%v: %s", args, stderr)
		}
	}
	// allow then deny of the same target keeps both rules
	if _, stdout, _ := kosa8(t, "net", "ls", "dev"); stdout != "*.example.com\nother.example.com\ndeny:other.example.com\n" {
		t.Fatalf("rules: %q", stdout)
	}
	if code, stdout, stderr := kosa8(t, "net", "rm", "dev", "other.example.com"); code != 0 || stdout != "*.example.com\ndeny:other.example.com\n" {
		t.Fatalf("rm of the allow rule: exit %d %q %q", code, stdout, stderr)
	}
	code, _, stderr := kosa8(t, "net", "rm", "dev", "other.example.com")
	if code != 125 || !strings.Contains(stderr, "its deny rule is removed by naming it: deny:other.example.com") {
		t.Fatalf("rm of a target with only a deny rule: exit %d %q", code, stderr)
	}
	if code, stdout, _ := kosa8(t, "net", "rm", "dev", "deny:other.example.com"); code != 0 || stdout != "*.example.com\n" {
		t.Fatalf("rm deny: exit %d %q", code, stdout)
	}
}
