package image

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

func TestDerivedKey(t *testing.T) {
	a := DerivedRecipe{Base: "b1", Packages: []string{"jq", "golang"}, Setup: []string{"npm i -g pnpm"}, Hosts: []string{"registry.npmjs.org"}}
	b := a
	b.Packages = []string{"golang", "jq", "jq"} // a set: order and repeats do not matter
	if a.Key() != b.Key() {
		t.Fatal("package order changed the key")
	}
	for name, c := range map[string]DerivedRecipe{
		"base":        {Base: "b2", Packages: a.Packages, Setup: a.Setup, Hosts: a.Hosts},
		"setup":       {Base: "b1", Packages: a.Packages, Setup: []string{"npm i -g yarn"}, Hosts: a.Hosts},
		"setup split": {Base: "b1", Packages: a.Packages, Setup: []string{"npm i", "-g pnpm"}, Hosts: a.Hosts},
		"hosts":       {Base: "b1", Packages: a.Packages, Setup: a.Setup},
		"label only":  {Base: "b1", Packages: a.Packages, Setup: a.Setup, Hosts: a.Hosts, Label: "x"},
	} {
		if (c.Key() == a.Key()) != (name == "label only") {
			t.Errorf("%s: key %s vs %s", name, c.Key(), a.Key())
		}
	}
	if !strings.HasPrefix(a.Key(), "d-") {
		t.Errorf("key %s", a.Key())
	}
}

func TestDerivedValidate(t *testing.T) {
	for _, bad := range []DerivedRecipe{
		{Packages: []string{"jq; curl evil"}},
		{Packages: []string{"-o=APT::foo"}},
		{Setup: []string{"  "}},
		{Setup: []string{"a\x00b"}},
	} {
		if bad.Validate() == nil {
			t.Errorf("accepted %+v", bad)
		}
	}
	if err := (DerivedRecipe{Packages: []string{"golang", "python3-venv", "g++", "jq=1.7.1-3"}, Setup: []string{"echo hi"}}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestResolvePins(t *testing.T) {
	answers := map[string][]netip.Addr{
		"mirror.test": {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("203.0.113.80")},
		"liar.test":   {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("169.254.169.254")},
	}
	lookup := func(_ context.Context, _, h string) ([]netip.Addr, error) { return answers[h], nil }
	pins, err := ResolvePins(context.Background(), []string{"mirror.test"}, lookup)
	if err != nil || pins["mirror.test"] != netip.MustParseAddr("203.0.113.80") {
		t.Fatalf("pins %v %v: want the documentation-range address, never loopback", pins, err)
	}
	if _, err := ResolvePins(context.Background(), []string{"liar.test"}, lookup); err == nil {
		t.Fatal("a name resolving only to loopback and link-local was pinned")
	}
}
