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
	// docker: the container registries a sandbox made with --docker may
	// pull from (it gets these rules added), read-only: a pull passes, a
	// push (of whatever the agent can read) does not.
	"docker": readOnly(dockerHosts),
}

// dockerHosts are Docker Hub's registry, token service and blob CDNs
// (Docker's own allow-list for its clients), GitHub's registry and the
// storage its blobs redirect to, and Quay's registry and CDNs.
var dockerHosts = []string{
	"registry-1.docker.io", "auth.docker.io", "index.docker.io",
	"production.cloudflare.docker.com", "production.cloudfront.docker.com",
	"docker-images-prod.6aa30f8b08e16409b46e0173d6de2f56.r2.cloudflarestorage.com",
	"ghcr.io", "pkg-containers.githubusercontent.com",
	"quay.io", "cdn.quay.io", "cdn01.quay.io", "cdn02.quay.io", "cdn03.quay.io",
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
