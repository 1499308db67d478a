package audit

import (
	"os"
	"path/filepath"
	"testing"
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
