package debian

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ulikunitz/xz"
)

// Bounds on the index. Debian's largest Packages.xz (main, amd64) is about
// 10 MiB and 60 MiB decompressed.
const (
	maxPackagesCompressed = 128 << 20
	maxDebSize            = 2 << 30
	// maxNotes bounds how many skipped stanzas are logged one by one.
	maxNotes = 20
)

// maxPackagesPlain bounds a decompressed Packages file; a variable so that
// the test of the bound need not decompress 512 MiB.
var maxPackagesPlain int64 = 512 << 20

// Options configures Open and the Index it returns.
type Options struct {
	// Client fetches everything. nil: a client that honours the proxy
	// environment, with connect and response-header timeouts and no overall
	// one (ctx bounds downloads).
	Client *http.Client
	// Keyring holds the keys an InRelease must be signed by. nil: the
	// embedded Debian archive keys.
	Keyring openpgp.EntityList
	// Now is the clock for Valid-Until and Date checks. nil: time.Now.
	Now func() time.Time
	// CacheDir is where Download keeps .deb files and reuses them after
	// checking their SHA256. Required for Download.
	CacheDir string
	// Log receives every fetch (URL, bytes, ms) and every decision worth
	// knowing. nil: nothing is logged.
	Log func(msg string)
}

// Package is one binary package of the index.
type Package struct {
	Name, Version, Architecture, Filename, SHA256, Priority, Source string
	Size                                                            int64
	Essential                                                       bool
	// Depends and PreDepends are AND-ed groups of OR-ed alternatives.
	Depends, PreDepends [][]Dep
	// Provides lists the virtual names the package provides, without
	// versions.
	Provides []string
	// Base is the mirror URL (Source.URL) the package comes from;
	// Filename is relative to it.
	Base string

	// problem says why the package cannot be installed (a field missing or
	// malformed); it is kept in the index so that resolving it fails with
	// the reason rather than with "not found".
	problem string
	// provided holds the versions of versioned Provides ("foo (= 1.2)").
	provided map[string]string
}

// Index is the merged package list of one or more sources for one
// architecture.
type Index struct {
	conf
	arch     string
	pkgs     map[string]*Package
	provides map[string][]*Package // virtual name -> providers, sorted by name
}

// conf is what Index and Open share of the Options, with defaults applied.
type conf struct {
	client   *http.Client
	keyring  openpgp.EntityList
	now      func() time.Time
	cacheDir string
	log      func(string)
}

func (c *conf) logf(format string, args ...any) {
	if c.log != nil {
		c.log(fmt.Sprintf(format, args...))
	}
}

// Open fetches, verifies and merges the package indices of sources for arch
// (Debian's name: "amd64", "arm64"). See the package documentation for the
// checks; any failed check is an error naming the URL. Where several
// sources have a package of the same name, the highest version wins (ties:
// the earlier source).
func Open(ctx context.Context, sources []Source, arch string, opts Options) (*Index, error) {
	if !validArch(arch) {
		return nil, fmt.Errorf("bad architecture %q", arch)
	}
	if len(sources) == 0 {
		return nil, errors.New("no sources")
	}
	c := conf{client: opts.Client, keyring: opts.Keyring, now: opts.Now, cacheDir: opts.CacheDir, log: opts.Log}
	if c.client == nil {
		c.client = defaultClient()
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.keyring == nil {
		k, err := debianKeys()
		if err != nil {
			return nil, err
		}
		c.keyring = k
	}
	ix := &Index{conf: c, arch: arch, pkgs: map[string]*Package{}, provides: map[string][]*Package{}}
	for _, src := range sources {
		if err := ix.addSource(ctx, src); err != nil {
			return nil, err
		}
	}
	for _, p := range ix.pkgs {
		for _, v := range p.Provides {
			ix.provides[v] = append(ix.provides[v], p)
		}
	}
	for _, ps := range ix.provides {
		slices.SortFunc(ps, func(a, b *Package) int { return strings.Compare(a.Name, b.Name) })
	}
	ix.logf("index for %s: %d packages, %d virtual names", arch, len(ix.pkgs), len(ix.provides))
	return ix, nil
}

func (ix *Index) addSource(ctx context.Context, src Source) error {
	if _, err := url.Parse(src.URL); err != nil || len(src.Components) == 0 {
		return fmt.Errorf("bad source %+v", src)
	}
	if !validPathPart(src.Suite, suiteRE) {
		return fmt.Errorf("bad suite %q", src.Suite)
	}
	for _, comp := range src.Components {
		if !validPathPart(comp, componentRE) {
			return fmt.Errorf("bad component %q", comp)
		}
	}
	dist, err := url.JoinPath(src.URL, "dists", src.Suite)
	if err != nil {
		return err
	}
	inURL := dist + "/InRelease"
	data, err := ix.fetch(ctx, inURL, maxInRelease)
	if err != nil {
		return err
	}
	text, err := verifyInRelease(data, ix.keyring, ix.now)
	if err != nil {
		return fmt.Errorf("%s: the mirror's InRelease for %s is not signed by a trusted Debian archive key (%v): is the mirror URL a Debian mirror, and is the host's clock right?", inURL, src.Suite, err)
	}
	rel, err := parseRelease(text)
	if err != nil {
		return fmt.Errorf("%s: bad Release: %v", inURL, err)
	}
	if src.Suite != rel.codename && src.Suite != rel.suite {
		return fmt.Errorf("%s: signed for suite %q (codename %q), not %q: the mirror serves another suite's Release", inURL, rel.suite, rel.codename, src.Suite)
	}
	if err := checkValidity(rel, ix.now()); err != nil {
		return fmt.Errorf("%s: %v", inURL, err)
	}
	if !rel.archs[ix.arch] {
		return fmt.Errorf("%s: suite %s has no architecture %s", inURL, src.Suite, ix.arch)
	}
	ix.logf("verified %s (suite %s, codename %s, dated %s)", inURL, rel.suite, rel.codename, rel.date.UTC().Format(time.RFC3339))
	for _, comp := range src.Components {
		// The security archive lists "updates/main" and keeps main/'s
		// indexes under main/, as apt knows.
		if !rel.components[comp] && !rel.components["updates/"+comp] {
			return fmt.Errorf("%s: suite %s has no component %s", inURL, src.Suite, comp)
		}
		if err := ix.addComponent(ctx, src, dist, rel, comp); err != nil {
			return err
		}
	}
	return nil
}

// addComponent fetches one Packages file in the first compression the
// Release lists and the mirror has, checks it against the Release and
// merges it. Only a missing file falls back to the next compression; a
// file that does not match its hash is an error, never skipped.
func (ix *Index) addComponent(ctx context.Context, src Source, dist string, rel *release, comp string) error {
	base := comp + "/binary-" + ix.arch + "/Packages"
	var tried []string
	for _, ext := range []string{".xz", ".gz", ""} {
		name := base + ext
		sum, ok := rel.files[name]
		if !ok {
			continue
		}
		u := dist + "/" + name
		tried = append(tried, u)
		if sum.size > maxPackagesCompressed {
			return fmt.Errorf("%s: %d bytes by the Release, more than the %d allowed", u, sum.size, maxPackagesCompressed)
		}
		data, err := ix.fetch(ctx, u, sum.size)
		var se *statusError
		if errors.As(err, &se) {
			ix.logf("%v; trying the next compression", err)
			continue
		}
		if err != nil {
			return err
		}
		if int64(len(data)) != sum.size {
			return fmt.Errorf("%s: %d bytes, the signed Release says %d: the mirror may be mid-sync; try again later or another mirror", u, len(data), sum.size)
		}
		h := sha256.Sum256(data)
		if hex.EncodeToString(h[:]) != sum.sha256 {
			return fmt.Errorf("%s: SHA256 does not match the signed Release: the mirror may be mid-sync; try again later or another mirror", u)
		}
		r, err := decompressor(ext, bytes.NewReader(data))
		if err != nil {
			return fmt.Errorf("%s: %v", u, err)
		}
		before := len(ix.pkgs)
		if err := ix.parsePackages(capReader(r, maxPackagesPlain), src.URL); err != nil {
			return fmt.Errorf("%s: %v", u, err)
		}
		ix.logf("parsed %s: %d packages new to the index", u, len(ix.pkgs)-before)
		return nil
	}
	if tried == nil {
		return fmt.Errorf("%s/InRelease lists no %s(.xz|.gz)", dist, base)
	}
	return fmt.Errorf("none of %s could be fetched", strings.Join(tried, ", "))
}

func decompressor(ext string, r io.Reader) (io.Reader, error) {
	switch ext {
	case ".xz":
		return xz.NewReader(r)
	case ".gz":
		return gzip.NewReader(r)
	case "":
		return r, nil
	}
	return nil, fmt.Errorf("unknown compression %q", ext)
}

// errTooLong is returned by a capReader past its limit.
var errTooLong = errors.New("data longer than allowed")

// capReader returns r, failing with errTooLong once more than limit bytes
// have been read, rather than truncating silently like io.LimitReader.
func capReader(r io.Reader, limit int64) io.Reader { return &capped{r: r, left: limit} }

type capped struct {
	r    io.Reader
	left int64
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, errTooLong
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	if int64(n) > c.left {
		n, c.left = int(c.left), -1
		return n, errTooLong
	}
	c.left -= int64(n)
	return n, err
}

// parsePackages merges one Packages file. Stanzas of other architectures
// are dropped; stanzas whose name or version is invalid are skipped with a
// note (one bad stanza should not make a whole suite unusable); a package
// with other fields missing or malformed is kept with the problem noted, so
// that only resolving it fails.
func (ix *Index) parsePackages(r io.Reader, base string) error {
	skipped, replaced := 0, 0
	defer func() {
		if replaced > 0 {
			ix.logf("%d packages of %s are newer than those read before, and replace them", replaced, base)
		}
	}()
	return ParseStanzas(r, func(st Stanza) error {
		a := st.Get("Architecture")
		if a != ix.arch && a != "all" {
			return nil
		}
		p, err := packageFrom(st, base)
		if err != nil {
			if skipped++; skipped <= maxNotes {
				ix.logf("skipping a stanza of %s: %v", base, err)
			}
			return nil
		}
		if old := ix.pkgs[p.Name]; old != nil {
			if CompareVersions(p.Version, old.Version) <= 0 {
				return nil
			}
			if old.Base != p.Base {
				replaced++
			}
		}
		ix.pkgs[p.Name] = p
		return nil
	})
}

func packageFrom(st Stanza, base string) (*Package, error) {
	p := &Package{
		Name:         st.Get("Package"),
		Version:      st.Get("Version"),
		Architecture: st.Get("Architecture"),
		Filename:     st.Get("Filename"),
		SHA256:       st.Get("SHA256"),
		Priority:     st.Get("Priority"),
		Source:       st.Get("Source"),
		Essential:    st.Get("Essential") == "yes",
		Base:         base,
	}
	if !validName(p.Name) {
		return nil, fmt.Errorf("bad package name %q", clip(p.Name))
	}
	if !validVersion(p.Version) {
		return nil, fmt.Errorf("package %s: bad version %q", p.Name, clip(p.Version))
	}
	var problems []string
	if err := checkFilename(p.Filename); err != nil {
		problems = append(problems, err.Error())
	}
	if !validSHA256(p.SHA256) {
		problems = append(problems, "no valid SHA256")
	}
	size, err := strconv.ParseInt(st.Get("Size"), 10, 64)
	if err != nil || size <= 0 || size > maxDebSize {
		problems = append(problems, fmt.Sprintf("bad Size %q (at most %d)", clip(st.Get("Size")), int64(maxDebSize)))
	}
	p.Size = size
	if p.Depends, err = ParseDeps(st.Get("Depends")); err != nil {
		problems = append(problems, "Depends: "+err.Error())
	}
	if p.PreDepends, err = ParseDeps(st.Get("Pre-Depends")); err != nil {
		problems = append(problems, "Pre-Depends: "+err.Error())
	}
	prov, err := ParseDeps(st.Get("Provides"))
	if err != nil {
		problems = append(problems, "Provides: "+err.Error())
	}
	for _, g := range prov {
		for _, d := range g {
			if !slices.Contains(p.Provides, d.Name) {
				p.Provides = append(p.Provides, d.Name)
			}
			if d.Op == "=" {
				if p.provided == nil {
					p.provided = map[string]string{}
				}
				p.provided[d.Name] = d.Version
			}
		}
	}
	p.problem = strings.Join(problems, "; ")
	return p, nil
}

// checkFilename accepts only a clean relative path (pool/main/...), since
// it is joined to the mirror URL and its base name becomes a file name.
func checkFilename(f string) error {
	switch {
	case f == "":
		return errors.New("no Filename")
	case len(f) > 1024:
		return errors.New("Filename too long")
	case strings.ContainsAny(f, "\\\x00") || strings.HasPrefix(f, "/") || path.Clean(f) != f:
		return fmt.Errorf("Filename %q is not a clean relative path", clip(f))
	}
	for _, part := range strings.Split(f, "/") {
		if part == ".." || part == "." {
			return fmt.Errorf("Filename %q is not a clean relative path", clip(f))
		}
	}
	for i := 0; i < len(f); i++ {
		if c := f[i]; c < ' ' || c == 0x7f {
			return fmt.Errorf("Filename %q has control characters", clip(f))
		}
	}
	return nil
}

// Lookup returns the package called name, or nil.
func (ix *Index) Lookup(name string) *Package { return ix.pkgs[name] }

// Required returns the names of the packages a minimal Debian system has
// (Essential: yes or Priority: required), sorted: the base that
// debootstrap's "minbase" variant installs.
func (ix *Index) Required() []string {
	var names []string
	for name, p := range ix.pkgs {
		if p.Essential || p.Priority == "required" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
