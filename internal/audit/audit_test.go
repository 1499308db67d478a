package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAddReadRotate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(p, 2000)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		l.Add(Event{Kind: "dns", Name: "example.com", Decision: "allow"})
	}
	l.Close()
	for _, f := range []string{p, p + ".1"} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 2000 {
			t.Errorf("%s is %d bytes, over the 2000 limit", f, st.Size())
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v", f, st.Mode())
		}
	}
	evs, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 || len(evs) >= 50 {
		t.Fatalf("read %d events: rotation should keep some, not all", len(evs))
	}
	for _, e := range evs {
		if e.Time.IsZero() || e.Name != "example.com" {
			t.Fatalf("bad event %+v", e)
		}
	}
}

func TestSubscribe(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "a.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ch, cancel := l.Subscribe()
	l.Add(Event{Kind: "tcp", Decision: "deny"})
	if e := <-ch; e.Kind != "tcp" {
		t.Fatalf("got %+v", e)
	}
	cancel()
	l.Add(Event{Kind: "tcp"})
	select {
	case e := <-ch:
		t.Fatalf("event after cancel: %+v", e)
	default:
	}
}

func TestReadSkipsGarbage(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.log")
	if err := os.WriteFile(p, []byte("{\"kind\":\"dns\"}\nnot json\n{\"kind\":\"tcp\"}\n{\"kind\":"), 0o600); err != nil {
		t.Fatal(err)
	}
	evs, err := Read(p)
	if err != nil || len(evs) != 2 {
		t.Fatalf("%v %v", evs, err)
	}
}

// A guest flooding denied DNS queries and connections must not erase an
// earlier exfiltration record, and the flood is summed up, not lost.
func TestSecurityLogSurvivesFlood(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "audit.log")
	l, err := Open(p, 1<<20) // 90,000 records of 150 bytes would rotate this many times over
	if err != nil {
		t.Fatal(err)
	}
	l.Add(Event{Kind: KindExfiltration, Name: "x.evil.test", Decision: "deny", Reason: "a secret's placeholder in a DNS query"})
	l.Security(Event{Kind: KindHeld, Name: ".envrc", Reason: "held for approval"})
	start := time.Now()
	for i := 0; i < 90000; i++ {
		l.Add(Event{Time: start.Add(time.Duration(i) * 100 * time.Microsecond), Kind: "dns", Name: fmt.Sprintf("n%d.flood.test", i), Decision: "deny", Reason: "no rule allows it"})
		l.Add(Event{Time: start.Add(time.Duration(i) * 100 * time.Microsecond), Kind: "dns", Name: "ok.test", Decision: "allow"})
	}
	l.Close()
	sec, err := ReadSecurity(p)
	if err != nil {
		t.Fatal(err)
	}
	var exfil, held, dnsDeny, summarized int
	for _, e := range sec {
		switch {
		case e.Kind == KindExfiltration:
			exfil++
		case e.Kind == KindHeld:
			held++
		case e.Kind == "dns" && e.Decision == "deny":
			dnsDeny++
		case e.Kind == "dns" && e.Decision == DecisionSummary:
			summarized += e.Count
		case e.Kind == "dns":
			t.Errorf("an allowed DNS answer in the security log: %+v", e)
		}
	}
	if exfil != 1 || held != 1 {
		t.Fatalf("security log lost evidence: %d exfiltration, %d held records", exfil, held)
	}
	if dnsDeny+summarized != 90000 {
		t.Fatalf("denials: %d written + %d summarized, want 90000 in all", dnsDeny, summarized)
	}
	if dnsDeny > int(securityBudget.burst)+100 {
		t.Fatalf("%d denial records written: the budget did not hold", dnsDeny)
	}
	if _, err := os.Stat(SecurityPath(p) + ".1"); err == nil {
		t.Fatal("the security log rotated during a 9 s flood")
	}
	st, _ := os.Stat(SecurityPath(p))
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("security log mode %v", st.Mode())
	}
}

func TestSummaryAfterFloodStops(t *testing.T) {
	p := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	n := int(securityBudget.burst) + 10
	for i := 0; i < n; i++ {
		l.Add(Event{Time: t0, Kind: "tcp", Dest: "1.2.3.4:80", Decision: "deny"})
	}
	l.Close() // writes the pending summary
	sec, err := ReadSecurity(p)
	if err != nil {
		t.Fatal(err)
	}
	last := sec[len(sec)-1]
	if len(sec) != int(securityBudget.burst)+1 || last.Decision != DecisionSummary || last.Count != 10 || last.Dest != "1.2.3.4:80" {
		t.Fatalf("%d records, last %+v", len(sec), last)
	}
}

func TestSecurityRotationKeepsGenerations(t *testing.T) {
	p := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(p, 4000)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		l.Security(Event{Kind: KindCheckpoint, Name: fmt.Sprintf("cp%03d", i), Decision: "saved"})
	}
	l.Close()
	for i := 1; i < SecurityGenerations; i++ {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", SecurityPath(p), i)); err != nil {
			t.Fatalf("generation %d: %v", i, err)
		}
	}
	if _, err := os.Stat(fmt.Sprintf("%s.%d", SecurityPath(p), SecurityGenerations)); err == nil {
		t.Fatal("more generations kept than SecurityGenerations")
	}
	evs, _ := ReadSecurity(p)
	if len(evs) == 0 || evs[len(evs)-1].Name != "cp199" {
		t.Fatalf("read back %d, last %+v", len(evs), evs[len(evs)-1])
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Name <= evs[i-1].Name {
			t.Fatalf("out of order: %s after %s", evs[i].Name, evs[i-1].Name)
		}
	}
}

func TestNilLogIsSafe(t *testing.T) {
	var l *Log
	l.Add(Event{Kind: "tcp"})
	l.Security(Event{Kind: KindHeld})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// A guest-sized field (a megabyte Host header) is cut before it is
// written: records cannot rotate the security log away by their size.
func TestFieldsBounded(t *testing.T) {
	e := Event{Kind: "http", Name: strings.Repeat("a", 1<<20), Reason: "short"}.bounded()
	if len(e.Name) > maxField+32 || !strings.HasSuffix(e.Name, "(1048576 bytes)") {
		t.Fatalf("name not bounded: %d bytes, ends %q", len(e.Name), e.Name[len(e.Name)-20:])
	}
	if e.Reason != "short" {
		t.Fatalf("a short field changed: %q", e.Reason)
	}
}
