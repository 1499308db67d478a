package netpolicy

import (
	"fmt"
	"sort"
	"strings"
)

// presets are named allow-lists. dev covers the common package registries
// and code hosts, read-only: their TLS is terminated by the broker and only
// reads pass (no npm publish, no git push). Multi-tenant wildcards
// (*.github.io, *.vercel.app) are deliberately not in it: anyone can
// publish there.
var presets = map[string][]string{
	"none": nil,
	"dev":  readOnly(devHosts),
}

func readOnly(hosts []string) []string {
	out := make([]string, len(hosts))
	for i, h := range hosts {
		out[i] = "read:" + h
	}
	return out
}

var devHosts = []string{
	// JavaScript
	"registry.npmjs.org", "registry.yarnpkg.com",
	// Python
	"pypi.org", "files.pythonhosted.org",
	// Go
	"proxy.golang.org", "sum.golang.org", "storage.googleapis.com",
	// Rust
	"crates.io", "index.crates.io", "static.crates.io",
	// Ruby
	"rubygems.org", "index.rubygems.org",
	// Debian packages
	"deb.debian.org", "security.debian.org",
	// Code hosts
	"github.com", "api.github.com", "codeload.github.com",
	"objects.githubusercontent.com", "raw.githubusercontent.com",
	"gitlab.com", "bitbucket.org",
}

// PresetNames lists the presets.
func PresetNames() []string {
	var n []string
	for k := range presets {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Preset returns a named policy.
func Preset(name string) (*Policy, error) {
	rules, ok := presets[name]
	if !ok {
		return nil, fmt.Errorf("unknown network preset %q: use one of %s", name, strings.Join(PresetNames(), ", "))
	}
	return Parse(rules, ParseOptions{})
}
