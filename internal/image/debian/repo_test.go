package debian

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/clearsign"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/ulikunitz/xz"
)

var testNow = time.Date(2026, 1, 15, 12, 0, 0, 0, time.UTC)

var keyCache sync.Map

// testKey returns a signing key made once per name per test binary (key
// generation is the slowest part of these tests).
func testKey(t testing.TB, name string) *openpgp.Entity {
	if e, ok := keyCache.Load(name); ok {
		return e.(*openpgp.Entity)
	}
	cfg := &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA, Time: func() time.Time { return testNow.Add(-24 * time.Hour) }}
	e, err := openpgp.NewEntity(name, "", name+"@example.org", cfg)
	if err != nil {
		t.Fatal(err)
	}
	keyCache.Store(name, e)
	return e
}

// pkgSpec is one package of a fake repository.
type pkgSpec struct {
	name, version, arch, extra string
	deb                        []byte // made by makeDeb if nil
}

// repo is a fake Debian mirror: files by path, served by an httptest
// server, with hooks to tamper with them.
type repo struct {
	t        testing.TB
	mu       sync.Mutex
	files    map[string][]byte
	override map[string]func(w http.ResponseWriter)
	hits     map[string]int
	srv      *httptest.Server
}

func newRepo(t testing.TB) *repo {
	r := &repo{t: t, files: map[string][]byte{}, override: map[string]func(http.ResponseWriter){}, hits: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p := strings.TrimPrefix(req.URL.Path, "/debian/")
		r.mu.Lock()
		r.hits[p]++
		data, ok := r.files[p]
		ov := r.override[p]
		r.mu.Unlock()
		if ov != nil {
			ov(w)
			return
		}
		if !ok {
			http.NotFound(w, req)
			return
		}
		w.Write(data)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// chunked serves body without a Content-Length, so that only the client's
// read bound can catch an over-long one.
func chunked(body []byte) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Write(body[:1])
		w.(http.Flusher).Flush()
		w.Write(body[1:])
	}
}

func (r *repo) url() string { return r.srv.URL + "/debian" }

func (r *repo) set(path string, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.files[path] = data
}

func (r *repo) get(path string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.files[path]
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// publish writes a suite: the packages' .debs, Packages(.xz|.gz) for arch,
// and an InRelease signed by signers with the given extra Release fields.
func (r *repo) publish(suite, arch string, pkgs []pkgSpec, releaseExtra string, signers ...*openpgp.Entity) {
	r.t.Helper()
	var idx strings.Builder
	for _, p := range pkgs {
		a := p.arch
		if a == "" {
			a = arch
		}
		deb := p.deb
		if deb == nil {
			deb = makeDeb(r.t, p.name, p.version, a, "gz", map[string]string{"./usr/share/doc/" + p.name + "/x": p.name})
		}
		fn := fmt.Sprintf("pool/main/%s/%s_%s_%s.deb", p.name[:1], p.name, p.version, a)
		r.set(fn, deb)
		fmt.Fprintf(&idx, "Package: %s\nVersion: %s\nArchitecture: %s\n", p.name, p.version, a)
		if !strings.Contains(p.extra, "Filename:") {
			fmt.Fprintf(&idx, "Filename: %s\n", fn)
		}
		if !strings.Contains(p.extra, "SHA256:") {
			fmt.Fprintf(&idx, "SHA256: %s\n", sum(deb))
		}
		if !strings.Contains(p.extra, "Size:") {
			fmt.Fprintf(&idx, "Size: %d\n", len(deb))
		}
		idx.WriteString(p.extra)
		idx.WriteString("\n")
	}
	r.publishPackages(suite, arch, []byte(idx.String()), releaseExtra, signers...)
}

func (r *repo) publishPackages(suite, arch string, plain []byte, releaseExtra string, signers ...*openpgp.Entity) {
	r.t.Helper()
	dir := "main/binary-" + arch + "/"
	var xzb, gzb bytes.Buffer
	xw, err := xz.NewWriter(&xzb)
	if err != nil {
		r.t.Fatal(err)
	}
	xw.Write(plain)
	xw.Close()
	gw := gzip.NewWriter(&gzb)
	gw.Write(plain)
	gw.Close()
	files := map[string][]byte{dir + "Packages": plain, dir + "Packages.xz": xzb.Bytes(), dir + "Packages.gz": gzb.Bytes()}
	var names []string
	for n, b := range files {
		names = append(names, n)
		r.set("dists/"+suite+"/"+n, b)
	}
	sort.Strings(names)
	var rel strings.Builder
	comps := "Components: main\n"
	if strings.Contains(releaseExtra, "Components:") {
		comps = ""
	}
	fmt.Fprintf(&rel, "Origin: Debian\nSuite: %s\nCodename: %s\nDate: %s\nArchitectures: all %s\n%s%sSHA256:\n",
		suite, suite, testNow.Add(-time.Hour).Format(time.RFC1123), arch, comps, releaseExtra)
	for _, n := range names {
		fmt.Fprintf(&rel, " %s %d %s\n", sum(files[n]), len(files[n]), n)
	}
	r.set("dists/"+suite+"/InRelease", clearsignText(r.t, rel.String(), signers...))
}

func clearsignText(t testing.TB, text string, signers ...*openpgp.Entity) []byte {
	var out bytes.Buffer
	var keys []*packet.PrivateKey
	for _, s := range signers {
		keys = append(keys, s.PrivateKey)
	}
	w, err := clearsign.EncodeMulti(&out, keys, &packet.Config{Time: func() time.Time { return testNow.Add(-time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, text)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// makeDeb builds a .deb: debian-binary, control.tar.gz and data.tar with
// the given compression ("gz", "xz" or "" for none).
func makeDeb(t testing.TB, name, version, arch, comp string, files map[string]string) []byte {
	control := fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: Test <t@example.org>\nDescription: test package\n long line\n .\n more\n", name, version, arch)
	ctl := tarball(t, map[string]string{"./control": control}, "gz")
	data := tarball(t, files, comp)
	dataName := "data.tar"
	if comp != "" {
		dataName += "." + comp
	}
	return arArchive([][2]string{{"debian-binary", "2.0\n"}, {"control.tar.gz", string(ctl)}, {dataName, string(data)}})
}

func tarball(t testing.TB, files map[string]string, comp string) []byte {
	var buf bytes.Buffer
	var w io.Writer = &buf
	var closer io.Closer
	switch comp {
	case "gz":
		gw := gzip.NewWriter(&buf)
		w, closer = gw, gw
	case "xz":
		xw, err := xz.NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		w, closer = xw, xw
	}
	tw := tar.NewWriter(w)
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg})
		io.WriteString(tw, files[n])
	}
	tw.Close()
	if closer != nil {
		closer.Close()
	}
	return buf.Bytes()
}

func arArchive(members [][2]string) []byte {
	var b bytes.Buffer
	b.WriteString("!<arch>\n")
	for _, m := range members {
		fmt.Fprintf(&b, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", m[0], 0, 0, 0, "100644", len(m[1]))
		b.WriteString(m[1])
		if len(m[1])%2 == 1 {
			b.WriteString("\n")
		}
	}
	return b.Bytes()
}

func (r *repo) opts(t testing.TB, keys ...*openpgp.Entity) Options {
	return Options{
		Keyring:  openpgp.EntityList(keys),
		Now:      func() time.Time { return testNow },
		CacheDir: t.TempDir(),
		Log:      func(msg string) { t.Log(msg) },
	}
}

func (r *repo) source(suite string) Source {
	return Source{URL: r.url(), Suite: suite, Components: []string{"main"}}
}

// basePkgs is a small dependency graph: OR groups, Provides, versions,
// Pre-Depends, an arch qualifier, and a package of another architecture.
var basePkgs = []pkgSpec{
	{name: "libc6", version: "2.41-12", extra: "Priority: required\nProvides: libc-any\n"},
	{name: "base-files", version: "13.8", extra: "Essential: yes\nPriority: required\n"},
	{name: "dash", version: "0.5.12-12", extra: "Essential: yes\nPre-Depends: libc6 (>= 2.34)\n"},
	{name: "mawk", version: "1.3.4.20250131-1", extra: "Provides: awk\nDepends: libc6 (>= 2.38)\n"},
	{name: "gawk", version: "1:5.2.1-2", extra: "Provides: awk\nDepends: libc6\n"},
	{name: "tool", version: "1.0-1", extra: "Depends: awk, default-mta | mail-transport-agent, python3:any (>= 3.11~)\n"},
	{name: "exim4-daemon-light", version: "4.98-1", extra: "Provides: mail-transport-agent\n"},
	{name: "postfix", version: "3.9-1", extra: "Provides: mail-transport-agent\n"},
	{name: "python3", version: "3.13.5-1", extra: "Depends: libc6\n"},
	{name: "old-thing", version: "1.0", extra: "Depends: libc6 (>= 3.0)\n"},
	{name: "needs-virtual-version", version: "1.0", extra: "Depends: awk (>= 1.0)\n"},
	{name: "uses-alt", version: "1.0", extra: "Depends: gawk | mawk\n"},
	// Debian's npm: node-css-loader needs node-cssesc (>= 3.0~), which
	// only node-postcss-selector-parser provides, with a version.
	{name: "node-css-loader", version: "6.8.1-1", extra: "Depends: node-cssesc (>= 3.0~)\n"},
	{name: "node-postcss-selector-parser", version: "6.0.13-1", extra: "Provides: node-cssesc (= 3.0.0), node-other\n"},
	{name: "needs-newer-cssesc", version: "1.0", extra: "Depends: node-cssesc (>= 4)\n"},
	{name: "foreign", version: "1.0", arch: "arm64"},
	{name: "data-all", version: "2.0", arch: "all"},
}

func openTestRepo(t *testing.T) (*repo, *Index, *openpgp.Entity) {
	t.Helper()
	key := testKey(t, "archive")
	r := newRepo(t)
	r.publish("trixie", "amd64", basePkgs, "", key)
	ix, err := Open(context.Background(), []Source{r.source("trixie")}, "amd64", r.opts(t, key))
	if err != nil {
		t.Fatal(err)
	}
	return r, ix, key
}

func names(ps []*Package) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.Name)
	}
	return strings.Join(s, " ")
}

func TestOpenLookupRequired(t *testing.T) {
	r, ix, _ := openTestRepo(t)
	p := ix.Lookup("tool")
	if p == nil || p.Version != "1.0-1" || p.Base != r.url() || p.Size <= 0 || len(p.Depends) != 3 {
		t.Fatalf("Lookup(tool) = %+v", p)
	}
	if got := p.Depends[2][0]; got != (Dep{"python3", "any", ">=", "3.11~"}) {
		t.Errorf("python3 dep = %+v", got)
	}
	if ix.Lookup("foreign") != nil {
		t.Error("a package of another architecture was kept")
	}
	if ix.Lookup("data-all") == nil {
		t.Error("an Architecture: all package was dropped")
	}
	if ix.Lookup("nope") != nil {
		t.Error("Lookup of a missing package is not nil")
	}
	if got := strings.Join(ix.Required(), " "); got != "base-files dash libc6" {
		t.Errorf("Required() = %q", got)
	}
	if n := r.hits["dists/trixie/main/binary-amd64/Packages.xz"]; n != 1 {
		t.Errorf("Packages.xz fetched %d times", n)
	}
	if n := r.hits["dists/trixie/main/binary-amd64/Packages.gz"]; n != 0 {
		t.Errorf("Packages.gz fetched although Packages.xz was there")
	}
}

func TestOpenFallsBackToGz(t *testing.T) {
	key := testKey(t, "archive")
	r := newRepo(t)
	r.publish("trixie", "amd64", basePkgs, "", key)
	r.override["dists/trixie/main/binary-amd64/Packages.xz"] = func(w http.ResponseWriter) { http.Error(w, "gone", 404) }
	ix, err := Open(context.Background(), []Source{r.source("trixie")}, "amd64", r.opts(t, key))
	if err != nil {
		t.Fatal(err)
	}
	if ix.Lookup("libc6") == nil || r.hits["dists/trixie/main/binary-amd64/Packages.gz"] != 1 {
		t.Error("Packages.gz was not used")
	}
}

func TestHighestVersionWins(t *testing.T) {
	key := testKey(t, "archive")
	r := newRepo(t)
	r.publish("trixie", "amd64", []pkgSpec{{name: "libc6", version: "2.41-12"}, {name: "zz", version: "1.0"}}, "", key)
	r.publish("trixie-security", "amd64", []pkgSpec{{name: "libc6", version: "2.41-12+deb13u1"}, {name: "zz", version: "1.0~rc1"}}, "", key)
	ix, err := Open(context.Background(), []Source{r.source("trixie"), r.source("trixie-security")}, "amd64", r.opts(t, key))
	if err != nil {
		t.Fatal(err)
	}
	if v := ix.Lookup("libc6").Version; v != "2.41-12+deb13u1" {
		t.Errorf("libc6 = %s", v)
	}
	if v := ix.Lookup("zz").Version; v != "1.0" {
		t.Errorf("zz = %s", v)
	}
}

func TestResolve(t *testing.T) {
	_, ix, _ := openTestRepo(t)
	got, err := ix.Resolve([]string{"tool"})
	if err != nil {
		t.Fatal(err)
	}
	// awk: no real package, providers gawk and mawk -> lowest name gawk.
	// default-mta | mail-transport-agent -> exim4-daemon-light (lowest).
	if want := "exim4-daemon-light gawk libc6 python3 tool"; names(got) != want {
		t.Errorf("Resolve(tool) = %q, want %q", names(got), want)
	}
	// A provider already selected satisfies the virtual name.
	got, err = ix.Resolve([]string{"mawk", "tool", "postfix"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "libc6 mawk postfix python3 tool"; names(got) != want {
		t.Errorf("Resolve(mawk tool postfix) = %q, want %q", names(got), want)
	}
	// OR group: the first real alternative.
	got, _ = ix.Resolve([]string{"uses-alt"})
	if want := "gawk libc6 uses-alt"; names(got) != want {
		t.Errorf("Resolve(uses-alt) = %q, want %q", names(got), want)
	}
	got, _ = ix.Resolve([]string{"mawk", "uses-alt"})
	if want := "libc6 mawk uses-alt"; names(got) != want {
		t.Errorf("Resolve(mawk uses-alt) = %q, want %q", names(got), want)
	}
	// A versioned dependency met by a versioned Provides.
	got, err = ix.Resolve([]string{"node-css-loader"})
	if err != nil || names(got) != "node-css-loader node-postcss-selector-parser" {
		t.Errorf("Resolve(node-css-loader) = %q, %v", names(got), err)
	}
	// A virtual root.
	got, err = ix.Resolve([]string{"mail-transport-agent", "dash:amd64"})
	if err != nil || names(got) != "dash exim4-daemon-light libc6" {
		t.Errorf("Resolve(virtual root) = %q, %v", names(got), err)
	}
}

func TestResolveErrors(t *testing.T) {
	_, ix, _ := openTestRepo(t)
	_, err := ix.Resolve([]string{"old-thing"})
	if err == nil || !strings.Contains(err.Error(), "old-thing") || !strings.Contains(err.Error(), "libc6 2.41-12") {
		t.Errorf("unmet version: %v", err)
	}
	_, err = ix.Resolve([]string{"needs-virtual-version"})
	if err == nil || !strings.Contains(err.Error(), "no package provides that version") {
		t.Errorf("versioned dependency on an unversioned Provides: %v", err)
	}
	_, err = ix.Resolve([]string{"needs-newer-cssesc"})
	if err == nil || !strings.Contains(err.Error(), "no package provides that version") {
		t.Errorf("versioned dependency above the provided version: %v", err)
	}
	_, err = ix.Resolve([]string{"libc6", "nope1", "foreign", "dash:arm64"})
	if err == nil || !strings.Contains(err.Error(), "nope1, foreign, dash:arm64") {
		t.Errorf("missing roots: %v", err)
	}
}

func TestResolveMalformedPackage(t *testing.T) {
	key := testKey(t, "archive")
	r := newRepo(t)
	r.publish("trixie", "amd64", []pkgSpec{
		{name: "evil", version: "1.0", extra: "Filename: ../../etc/passwd\n"},
		{name: "badname_", version: "1.0"},
		{name: "badver", version: "x;rm"},
		{name: "ok", version: "1.0"},
	}, "", key)
	ix, err := Open(context.Background(), []Source{r.source("trixie")}, "amd64", r.opts(t, key))
	if err != nil {
		t.Fatal(err)
	}
	if ix.Lookup("badname_") != nil || ix.Lookup("badver") != nil || ix.Lookup("ok") == nil {
		t.Error("invalid stanzas were not skipped (or a good one was)")
	}
	_, err = ix.Resolve([]string{"evil"})
	if err == nil || !strings.Contains(err.Error(), "clean relative path") {
		t.Errorf("Resolve of a package with Filename ../../etc/passwd: %v", err)
	}
	if _, err := ix.Download(context.Background(), []*Package{ix.Lookup("evil")}, nil); err == nil {
		t.Error("Download of ../../etc/passwd succeeded")
	}
}

func TestDownload(t *testing.T) {
	r, ix, _ := openTestRepo(t)
	pkgs, err := ix.Resolve([]string{"tool"})
	if err != nil {
		t.Fatal(err)
	}
	var calls []int
	paths, err := ix.Download(context.Background(), pkgs, func(done, total int, n int64) {
		calls = append(calls, done)
		if total != len(pkgs) {
			t.Errorf("total = %d", total)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != len(pkgs) || calls[len(calls)-1] != len(pkgs) {
		t.Errorf("progress calls %v", calls)
	}
	for i, p := range pkgs {
		data, err := os.ReadFile(paths[i])
		if err != nil || sum(data) != p.SHA256 || filepath.Base(paths[i]) != filepath.Base(p.Filename) {
			t.Errorf("%s: %s: %v", p.Name, paths[i], err)
		}
	}
	// Reuse: no second fetch.
	libc := ix.Lookup("libc6")
	hits := r.hits[libc.Filename]
	if _, err := ix.Download(context.Background(), []*Package{libc}, nil); err != nil {
		t.Fatal(err)
	}
	if r.hits[libc.Filename] != hits {
		t.Error("a cached .deb was fetched again")
	}
	// A corrupted cached file is replaced.
	cached := filepath.Join(ix.cacheDir, filepath.Base(libc.Filename))
	os.WriteFile(cached, bytes.Repeat([]byte("x"), int(libc.Size)), 0o644)
	if _, err := ix.Download(context.Background(), []*Package{libc}, nil); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(cached); sum(data) != libc.SHA256 || r.hits[libc.Filename] != hits+1 {
		t.Error("a corrupted cached .deb was not replaced")
	}
	// A symlink planted in the cache is replaced, not followed.
	target := filepath.Join(t.TempDir(), "target")
	os.WriteFile(target, []byte("keep"), 0o644)
	os.Remove(cached)
	os.Symlink(target, cached)
	if _, err := ix.Download(context.Background(), []*Package{libc}, nil); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(target); string(data) != "keep" {
		t.Error("Download wrote through a symlink")
	}
	if fi, _ := os.Lstat(cached); fi == nil || !fi.Mode().IsRegular() {
		t.Error("the planted symlink is still there")
	}
}

func TestDownloadBadBodies(t *testing.T) {
	for _, tc := range []struct {
		name string
		body func(good []byte) []byte
		want string
	}{
		{"wrong hash", func(g []byte) []byte { b := bytes.Clone(g); b[len(b)-1] ^= 1; return b }, "SHA256"},
		{"over-long", func(g []byte) []byte { return append(bytes.Clone(g), "more"...) }, "the index says"},
		{"huge", func(g []byte) []byte { return make([]byte, 8<<20) }, "the index says"},
		{"short", func(g []byte) []byte { return g[:len(g)-1] }, "the index says"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ix, _ := openTestRepo(t)
			p := ix.Lookup("libc6")
			body := tc.body(r.get(p.Filename))
			r.override[p.Filename] = chunked(body)
			_, err := ix.Download(context.Background(), []*Package{p, ix.Lookup("dash")}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if _, err := os.Lstat(filepath.Join(ix.cacheDir, filepath.Base(p.Filename))); err == nil {
				t.Error("the bad .deb was left in the cache")
			}
			ents, _ := os.ReadDir(ix.cacheDir)
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), ".tmp-") {
					t.Errorf("temporary file %s left", e.Name())
				}
			}
		})
	}
}

func TestOpenAttacks(t *testing.T) {
	key := testKey(t, "archive")
	other := testKey(t, "mallory")
	cases := []struct {
		name   string
		setup  func(r *repo)
		source string
		want   string
	}{
		{"unsigned", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "", key)
			in := r.get("dists/trixie/InRelease")
			b, _ := clearsign.Decode(in)
			r.set("dists/trixie/InRelease", b.Plaintext)
		}, "trixie", "not signed"},
		{"unknown key", func(r *repo) { r.publish("trixie", "amd64", basePkgs, "", other) }, "trixie", "not signed"},
		{"modified after signing", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "", key)
			in := r.get("dists/trixie/InRelease")
			r.set("dists/trixie/InRelease", bytes.Replace(in, []byte("Architectures: all amd64"), []byte("Architectures: all amd64 arm64"), 1))
		}, "trixie", "not signed"},
		{"text before the signed block", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "", key)
			in := r.get("dists/trixie/InRelease")
			r.set("dists/trixie/InRelease", append([]byte("Valid-Until: never\n\n"), in...))
			// Leading text is ignored by the decoder and never parsed; the
			// repo still opens. Trailing text is refused (next case).
		}, "trixie", ""},
		{"text after the signed block", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "", key)
			in := r.get("dists/trixie/InRelease")
			r.set("dists/trixie/InRelease", append(bytes.Clone(in), "SHA256:\n 00 1 x\n"...))
		}, "trixie", "unsigned data after"},
		{"expired", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "Valid-Until: "+testNow.Add(-time.Minute).Format(time.RFC1123)+"\n", key)
		}, "trixie", "expired"},
		{"dated in the future", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "", key)
			in := r.get("dists/trixie/InRelease")
			b, _ := clearsign.Decode(in)
			text := strings.Replace(string(b.Plaintext)+"\n", "Date: "+testNow.Add(-time.Hour).Format(time.RFC1123), "Date: "+testNow.Add(72*time.Hour).Format(time.RFC1123), 1)
			r.set("dists/trixie/InRelease", clearsignText(t, text, key))
		}, "trixie", "in the future"},
		{"another suite's Release", func(r *repo) {
			r.publish("bookworm", "amd64", basePkgs, "", key)
			r.set("dists/trixie/InRelease", r.get("dists/bookworm/InRelease"))
		}, "trixie", "another suite"},
		{"Packages.xz hash mismatch", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "", key)
			p := "dists/trixie/main/binary-amd64/Packages.xz"
			b := bytes.Clone(r.get(p))
			b[20] ^= 0xff
			r.set(p, b)
		}, "trixie", "SHA256 does not match"},
		{"Packages.xz longer than signed", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "", key)
			p := "dists/trixie/main/binary-amd64/Packages.xz"
			r.override[p] = chunked(append(bytes.Clone(r.get(p)), 0))
		}, "trixie", "longer than"},
		{"Packages.xz longer than signed (Content-Length)", func(r *repo) {
			r.publish("trixie", "amd64", basePkgs, "", key)
			p := "dists/trixie/main/binary-amd64/Packages.xz"
			r.set(p, append(bytes.Clone(r.get(p)), 0))
		}, "trixie", "more than the"},
		{"arch not in Release", func(r *repo) { r.publish("trixie", "arm64", basePkgs, "", key) }, "trixie", "no architecture amd64"},
		{"no InRelease", func(r *repo) {}, "trixie", "404"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRepo(t)
			tc.setup(r)
			_, err := Open(context.Background(), []Source{r.source(tc.source)}, "amd64", r.opts(t, key))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestOpenSignatureByUnknownKeyAmongGood(t *testing.T) {
	key := testKey(t, "archive")
	other := testKey(t, "mallory")
	r := newRepo(t)
	r.publish("trixie", "amd64", basePkgs, "", other, key)
	if _, err := Open(context.Background(), []Source{r.source("trixie")}, "amd64", r.opts(t, key)); err != nil {
		t.Fatal(err)
	}
}

func TestOpenHugePackagesBounded(t *testing.T) {
	// A Packages.gz that decompresses past the bound (lowered here from 512
	// MiB to 4 MiB, with 40 MiB behind it) makes Open fail at the bound
	// rather than parse or hold it all.
	defer func(old int64) { maxPackagesPlain = old }(maxPackagesPlain)
	maxPackagesPlain = 4 << 20
	key := testKey(t, "archive")
	r := newRepo(t)
	var gzb bytes.Buffer
	gw, _ := gzip.NewWriterLevel(&gzb, gzip.BestSpeed)
	stanza := "Package: a0\nVersion: 1\nArchitecture: amd64\nDescription: x\n" + strings.Repeat(" "+strings.Repeat("y", 1000)+"\n", 1000) + "\n"
	for range 40 {
		io.WriteString(gw, stanza)
	}
	gw.Close()
	dir := "main/binary-amd64/"
	rel := fmt.Sprintf("Suite: trixie\nCodename: trixie\nArchitectures: amd64\nComponents: main\nSHA256:\n %s %d %sPackages.gz\n", sum(gzb.Bytes()), gzb.Len(), dir)
	r.set("dists/trixie/"+dir+"Packages.gz", gzb.Bytes())
	r.set("dists/trixie/InRelease", clearsignText(t, rel, key))
	_, err := Open(context.Background(), []Source{r.source("trixie")}, "amd64", r.opts(t, key))
	if err == nil || !strings.Contains(err.Error(), "longer than allowed") {
		t.Fatalf("err = %v", err)
	}
}

func TestParseSource(t *testing.T) {
	s, err := ParseSource("deb http://deb.debian.org/debian trixie main contrib # comment")
	if err != nil || s.URL != "http://deb.debian.org/debian" || s.Suite != "trixie" || strings.Join(s.Components, ",") != "main,contrib" {
		t.Fatalf("ParseSource = %+v, %v", s, err)
	}
	for _, bad := range []string{
		"", "deb-src http://x/debian trixie main", "deb ftp://x/debian trixie main", "deb http://x/debian trixie",
		"deb [signed-by=/x] http://x/debian trixie main", "deb http://x/debian ../../x main", "deb http://x/debian trixie ../main",
		"deb file:///srv trixie main", "deb http://x/debian ./ main", "deb http:///debian trixie main",
	} {
		if _, err := ParseSource(bad); err == nil {
			t.Errorf("ParseSource(%q) accepted", bad)
		}
	}
}

func TestDebRoundTrip(t *testing.T) {
	for _, comp := range []string{"gz", "xz", ""} {
		t.Run("data.tar."+comp, func(t *testing.T) {
			files := map[string]string{"./usr/bin/x": "#!/bin/sh\necho x\n", "./etc/x.conf": strings.Repeat("conf\n", 10000)}
			path := filepath.Join(t.TempDir(), "x.deb")
			os.WriteFile(path, makeDeb(t, "xpkg", "1:2.0-1", "amd64", comp, files), 0o644)
			st, err := DebControl(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Get("package") != "xpkg" || st.Get("Version") != "1:2.0-1" || st.Get("Description") != "test package\nlong line\n.\nmore" {
				t.Errorf("control = %q", st)
			}
			got := map[string]string{}
			err = DebData(path, func(hdr *tar.Header, r io.Reader) error {
				b, err := io.ReadAll(r)
				got[hdr.Name] = string(b)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(files) {
				t.Fatalf("got %d members", len(got))
			}
			for n, c := range files {
				if got[n] != c {
					t.Errorf("%s differs", n)
				}
			}
		})
	}
}

func TestDebRejects(t *testing.T) {
	good := makeDeb(t, "xpkg", "1.0", "amd64", "gz", map[string]string{"./a": "b"})
	for name, data := range map[string][]byte{
		"not ar":      []byte("hello"),
		"empty":       {},
		"bad version": arArchive([][2]string{{"debian-binary", "3.0\n"}}),
		"first":       arArchive([][2]string{{"control.tar.gz", "x"}, {"debian-binary", "2.0\n"}}),
		"name":        arArchive([][2]string{{"debian-binary", "2.0\n"}, {"../evil", "x"}}),
		"too big":     bytes.Replace(good, []byte("control.tar.gz  0           0     0     100644  "), []byte("control.tar.gz  0           0     0     100644  99999999"), 1),
		"no data":     arArchive([][2]string{{"debian-binary", "2.0\n"}}),
		"many":        arArchive(append([][2]string{{"debian-binary", "2.0\n"}}, make([][2]string, 20)...)),
	} {
		path := filepath.Join(t.TempDir(), "x.deb")
		os.WriteFile(path, data, 0o644)
		if err := DebData(path, func(*tar.Header, io.Reader) error { return nil }); err == nil {
			t.Errorf("%s: DebData accepted it", name)
		}
	}
}

// Debian's security archive names its component "updates/main" and keeps
// main's index under main/; apt takes it as main, and so must Open.
func TestSecurityArchiveComponents(t *testing.T) {
	key := testKey(t, "archive")
	r := newRepo(t)
	r.publish("trixie", "amd64", basePkgs, "", key)
	r.publish("trixie-security", "amd64", []pkgSpec{{name: "libc6", version: "2.41-12+deb13u1"}}, "Components: updates/main updates/contrib\n", key)
	ix, err := Open(context.Background(), []Source{r.source("trixie"), r.source("trixie-security")}, "amd64", r.opts(t, key))
	if err != nil {
		t.Fatal(err)
	}
	if p := ix.Lookup("libc6"); p == nil || p.Version != "2.41-12+deb13u1" {
		t.Errorf("libc6 = %+v, want the security update", p)
	}
	r.publish("trixie-security", "amd64", nil, "Components: updates/contrib\n", key)
	if _, err := Open(context.Background(), []Source{r.source("trixie-security")}, "amd64", r.opts(t, key)); err == nil || !strings.Contains(err.Error(), "no component main") {
		t.Errorf("a suite without main: %v", err)
	}
}

// TestDownloadStalled: a mirror (or a man in the middle of plain HTTP)
// that sends the headers and then nothing, or a trickle, must not hold a
// build forever; the client's own timeouts end at the response header.
func TestDownloadStalled(t *testing.T) {
	defer func(w time.Duration, n int64) { stallWindow, minWindowBytes = w, n }(stallWindow, minWindowBytes)
	stallWindow, minWindowBytes = 200*time.Millisecond, 1024
	for _, tc := range []struct {
		name  string
		index bool // stall the Packages file rather than a .deb
		drip  time.Duration
	}{
		{"deb silent", false, 0},
		{"deb trickle", false, 50 * time.Millisecond},
		{"index silent", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ix, key := openTestRepo(t)
			release := make(chan struct{})
			defer close(release)
			stall := func(body []byte) func(http.ResponseWriter) {
				return func(w http.ResponseWriter) {
					w.Header().Set("Content-Length", strconv.Itoa(len(body)))
					for i := 0; i < len(body); i++ {
						w.Write(body[i : i+1])
						w.(http.Flusher).Flush()
						if tc.drip == 0 {
							break
						}
						select {
						case <-time.After(tc.drip):
						case <-release:
							return
						}
					}
					<-release
				}
			}
			done := make(chan error, 1)
			if tc.index {
				name := "dists/trixie/main/binary-amd64/Packages.xz"
				h := stall(r.get(name))
				r.mu.Lock()
				r.override[name] = h
				r.mu.Unlock()
				go func() {
					_, err := Open(context.Background(), []Source{r.source("trixie")}, "amd64", r.opts(t, key))
					done <- err
				}()
			} else {
				p := ix.Lookup("libc6")
				h := stall(r.get(p.Filename))
				r.mu.Lock()
				r.override[p.Filename] = h
				r.mu.Unlock()
				go func() {
					_, err := ix.Download(context.Background(), []*Package{p}, nil)
					done <- err
				}()
			}
			select {
			case err := <-done:
				if !errors.Is(err, errStalled) && (err == nil || !strings.Contains(err.Error(), errStalled.Error())) {
					t.Fatalf("err = %v, want %v", err, errStalled)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("a stalled GET held the build (no deadline on the body)")
			}
		})
	}
}

// TestDownloadCacheNameClash: two packages whose files would be one file
// of the cache on a case-insensitive file system (a Mac's), or that differ
// only in a non-ASCII character a file system may normalise, are refused
// before anything is fetched.
func TestDownloadCacheNameClash(t *testing.T) {
	ix := &Index{conf: conf{client: defaultClient(), cacheDir: t.TempDir()}}
	pkg := func(name, filename, content string) *Package {
		return &Package{Name: name, Version: "1", Filename: filename, SHA256: sum([]byte(content)), Size: int64(len(content)), Base: "http://127.0.0.1:1/"}
	}
	_, err := ix.Download(context.Background(), []*Package{
		pkg("aa", "pool/main/x/X_1_all.deb", "a"),
		pkg("bb", "pool/main/y/x_1_all.deb", "b"),
	}, nil)
	if err == nil || !strings.Contains(err.Error(), "both want the cache file") {
		t.Errorf("X_1_all.deb and x_1_all.deb with different hashes: %v", err)
	}
	_, err = ix.Download(context.Background(), []*Package{pkg("aa", "pool/main/x/\u00e9_1_all.deb", "a")}, nil)
	if err == nil || !strings.Contains(err.Error(), "ASCII") {
		t.Errorf("a non-ASCII cache name: %v", err)
	}
}
