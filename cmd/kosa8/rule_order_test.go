package main

import (
	"testing"

	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/project"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/secrets"
)

// A trusted kosa8.toml that denies a host the agent preset allows must
// keep it denied: the preset's rules come first and the user's
// (kosa8.toml's, then the flags') after them, since an allow rule after a
// deny for the same target removes the deny (netpolicy.Policy.Add).
func TestAgentPresetRulesBeforeProjectRules(t *testing.T) {
	t.Setenv("KOSA8_SECRET_BACKEND", "file")
	dir := t.TempDir()
	store, err := secrets.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Add(secrets.Secret{Name: "ANTHROPIC_API_KEY", Hosts: []string{"api.anthropic.com"}, Header: "x-api-key", Format: "{value}"}, []byte("v"), false); err != nil {
		t.Fatal(err)
	}
	m := &sandbox.Manager{Paths: sandbox.Paths{Home: dir, Cache: dir, Config: dir}}
	proj := &config.Project{}
	proj.Network.Allow = []string{"deny:pypi.org"} // aider's preset has read:pypi.org
	a := &agentFlags{name: "aider"}
	o := project.Options{Name: "order", Arch: "x86_64"}
	if err := a.options(m, proj, &o); err != nil {
		t.Fatal(err)
	}
	c, err := project.Resolve(o, proj, dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netpolicy.Parse(c.Network.Rules, netpolicy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Decide("pypi.org", 443); !d.Denied {
		t.Fatalf("kosa8.toml's deny:pypi.org was dropped: rules %v, decision %+v", c.Network.Rules, d)
	}
}
