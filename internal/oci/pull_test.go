package oci_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/oci/ocitest"
	"github.com/kosa8/kosa8/internal/vmspec"
)

func testImage(arch, marker string) v1.Image {
	return ocitest.Image(arch, v1.Config{Env: []string{"PATH=/usr/bin:/bin", "MARK=" + marker}, WorkingDir: "/srv", User: "1001"},
		ocitest.Layer([]ocitest.Entry{{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/arch", Body: arch + " " + marker}}),
		ocitest.Layer([]ocitest.Entry{{Name: "etc/.wh.arch"}, {Name: "srv/", Type: tar.TypeDir}}))
}

// countingTransport counts the blob requests a pull makes.
type countingTransport struct {
	next  http.RoundTripper
	blobs atomic.Int32
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/blobs/") {
		c.blobs.Add(1)
	}
	return c.next.RoundTrip(r)
}

// TestPullFromRealRegistry pushes a two-platform index to Debian's
// docker-registry on loopback and pulls it: the sandbox's architecture is
// chosen, every blob lands in the cache under its digest, the image's
// config is readable, and a second pull fetches no blob again.
func TestPullFromRealRegistry(t *testing.T) {
	reg := ocitest.StartRegistry(t, nil)
	amd, arm := testImage("amd64", "a"), testImage("arm64", "b")
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}})
	ref, err := name.ParseReference(reg.Addr + "/test/multi:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	cache := oci.NewCache(t.TempDir())
	ct := &countingTransport{next: http.DefaultTransport}
	for _, tc := range []struct {
		arch vmspec.Arch
		img  v1.Image
	}{{vmspec.AMD64, amd}, {vmspec.ARM64, arm}} {
		rec, err := oci.Pull(context.Background(), cache, ref.String(), oci.PullOptions{Arch: tc.arch, Transport: ct})
		if err != nil {
			t.Fatalf("pull %s: %v", tc.arch, err)
		}
		want, _ := tc.img.Digest()
		if rec.Manifest != want.String() {
			t.Errorf("%s: pulled manifest %s, want %s", tc.arch, rec.Manifest, want)
		}
		if rec.Index == "" || len(rec.Layers) != 2 || rec.Arch() != tc.arch {
			t.Errorf("%s: record %+v", tc.arch, rec)
		}
		for _, l := range rec.Layers {
			b, err := os.ReadFile(cache.BlobPath(l.Digest))
			if err != nil || oci.Digest(b) != l.Digest {
				t.Errorf("layer %s not in the cache under its digest (%v)", l.Digest, err)
			}
		}
		cfg, err := oci.ReadConfig(cache, rec)
		if err != nil || cfg.Config.WorkingDir != "/srv" || cfg.Config.User != "1001" {
			t.Errorf("config %+v, %v", cfg, err)
		}
	}
	n := ct.blobs.Load()
	// Per platform a config and two layers, the second layer the same in
	// both images: stored, and fetched, once.
	if n != 5 {
		t.Errorf("two pulls fetched %d blobs, want 5", n)
	}
	d, _ := amd.Digest()
	if _, err := oci.Pull(context.Background(), cache, reg.Addr+"/test/multi@"+d.String(), oci.PullOptions{Arch: vmspec.AMD64, Transport: ct}); err != nil {
		t.Fatalf("pull by digest: %v", err)
	}
	if got := ct.blobs.Load(); got != n {
		t.Errorf("a pull of cached blobs fetched %d more", got-n)
	}
	recs, _ := cache.Records()
	if len(recs) != 3 {
		t.Errorf("%d records, want 3", len(recs))
	}
	if _, err := oci.Pull(context.Background(), cache, reg.Addr+"/test/absent:1", oci.PullOptions{Arch: vmspec.AMD64}); err == nil || !strings.Contains(err.Error(), "MANIFEST_UNKNOWN") && !strings.Contains(err.Error(), "unknown") {
		t.Errorf("pull of a missing image: %v", err)
	}
}

// TestPullWithCredentials: a registry asking for Basic auth is pulled from
// with the credentials of the user's docker config, and of a credential
// helper it names; without them the error says unauthorized.
func TestPullWithCredentials(t *testing.T) {
	reg := ocitest.StartRegistry(t, map[string]string{"alice": "s3cret-pw"})
	img := testImage("amd64", "auth")
	ref, _ := name.ParseReference(reg.Addr + "/private/img:1")
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("DOCKER_CONFIG", filepath.Join(home, ".docker"))
	t.Setenv("REGISTRY_AUTH_FILE", "")
	t.Setenv("XDG_RUNTIME_DIR", "")
	writeConfig := func(v any) {
		os.MkdirAll(filepath.Join(home, ".docker"), 0o700)
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(home, ".docker", "config.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cache := oci.NewCache(t.TempDir())
	_, err := oci.Pull(context.Background(), cache, ref.String(), oci.PullOptions{Arch: vmspec.AMD64})
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
		t.Fatalf("pull without credentials: %v", err)
	}
	writeConfig(map[string]any{"auths": map[string]any{reg.Addr: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte("alice:s3cret-pw"))}}})
	// The push uses the same keychain (go-containerregistry's default).
	if err := remote.Write(ref, img, remote.WithAuthFromKeychain(defaultKeychain())); err != nil {
		t.Fatal(err)
	}
	if _, err := oci.Pull(context.Background(), cache, ref.String(), oci.PullOptions{Arch: vmspec.AMD64}); err != nil {
		t.Fatalf("pull with the docker config's credentials: %v", err)
	}
	// A credential helper: docker-credential-kosa8test on the PATH.
	bin := t.TempDir()
	helper := "#!/bin/sh\nread server\nprintf '{\"ServerURL\":\"%s\",\"Username\":\"alice\",\"Secret\":\"s3cret-pw\"}' \"$server\"\n"
	if err := os.WriteFile(filepath.Join(bin, "docker-credential-kosa8test"), []byte(helper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	writeConfig(map[string]any{"credHelpers": map[string]string{reg.Addr: "kosa8test"}})
	cache2 := oci.NewCache(t.TempDir())
	if _, err := oci.Pull(context.Background(), cache2, ref.String(), oci.PullOptions{Arch: vmspec.AMD64}); err != nil {
		t.Fatalf("pull with a credential helper's credentials: %v", err)
	}
}

// fakeRegistry serves one manifest and the blobs given, through handle
// where set (hostile registries).
type fakeRegistry struct {
	manifest     []byte
	manifestType string
	blobs        map[string][]byte
	handle       func(w http.ResponseWriter, r *http.Request, digest string) bool
	requested    []string
}

func (f *fakeRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requested = append(f.requested, r.URL.Path)
	switch {
	case r.URL.Path == "/v2/":
		w.WriteHeader(200)
	case strings.Contains(r.URL.Path, "/manifests/"):
		w.Header().Set("Content-Type", f.manifestType)
		w.Write(f.manifest)
	case strings.Contains(r.URL.Path, "/blobs/"):
		d := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		if f.handle != nil && f.handle(w, r, d) {
			return
		}
		b, ok := f.blobs[d]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	default:
		http.NotFound(w, r)
	}
}

func manifestFor(t *testing.T, img v1.Image) ([]byte, map[string][]byte) {
	t.Helper()
	m, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	blobs := map[string][]byte{}
	cfg, _ := img.RawConfigFile()
	cd, _ := img.ConfigName()
	blobs[cd.String()] = cfg
	ls, _ := img.Layers()
	for _, l := range ls {
		d, _ := l.Digest()
		rc, _ := l.Compressed()
		var b bytes.Buffer
		b.ReadFrom(rc)
		blobs[d.String()] = b.Bytes()
	}
	return m, blobs
}

func blobFiles(t *testing.T, c oci.Cache) []string {
	var out []string
	for _, d := range []string{"blobs/sha256", "tmp"} {
		ents, _ := os.ReadDir(filepath.Join(c.Dir, d))
		for _, e := range ents {
			out = append(out, d+"/"+e.Name())
		}
	}
	return out
}

// TestHostileRegistries: what a registry sends is bounded and checked.
// Each case gets an error naming the problem, and leaves no layer or
// partial download in the cache.
func TestHostileRegistries(t *testing.T) {
	img := testImage("amd64", "h")
	good, blobs := manifestFor(t, img)
	ls, _ := img.Layers()
	layer0, _ := ls[0].Digest()
	var m v1.Manifest
	json.Unmarshal(good, &m)
	withConfigSize := func(n int64) []byte {
		mm := m
		mm.Config.Size = n
		b, _ := json.Marshal(mm)
		return b
	}
	cases := []struct {
		name string
		reg  *fakeRegistry
		want string
		is   error
	}{
		{"manifest of 5 MiB", &fakeRegistry{manifest: append(good, bytes.Repeat([]byte(" "), 5<<20)...), manifestType: oci.MediaOCIManifest},
			"more than 4194304", oci.ErrTooLarge},
		{"config of 100 MiB", &fakeRegistry{manifest: withConfigSize(100 << 20), manifestType: oci.MediaOCIManifest, blobs: blobs},
			"config is 104857600 bytes", oci.ErrTooLarge},
		{"more bytes than the descriptor", &fakeRegistry{manifest: good, manifestType: oci.MediaOCIManifest, blobs: blobs,
			handle: func(w http.ResponseWriter, r *http.Request, d string) bool {
				if d != layer0.String() {
					return false
				}
				// No Content-Length: the body itself runs long.
				w.(http.Flusher).Flush()
				w.Write(blobs[d])
				w.Write(bytes.Repeat([]byte{0}, 1<<20))
				return true
			}}, "more than the", oci.ErrTooLarge},
		{"Content-Length above the descriptor", &fakeRegistry{manifest: good, manifestType: oci.MediaOCIManifest, blobs: blobs,
			handle: func(w http.ResponseWriter, r *http.Request, d string) bool {
				if d != layer0.String() {
					return false
				}
				b := append(append([]byte{}, blobs[d]...), 1, 2, 3)
				w.Header().Set("Content-Length", fmt.Sprint(len(b)))
				w.Write(b)
				return true
			}}, "where the descriptor says", oci.ErrTooLarge},
		{"digest mismatch", &fakeRegistry{manifest: good, manifestType: oci.MediaOCIManifest, blobs: blobs,
			handle: func(w http.ResponseWriter, r *http.Request, d string) bool {
				if d != layer0.String() {
					return false
				}
				b := append([]byte{}, blobs[d]...)
				b[len(b)/2] ^= 0xff
				w.Write(b)
				return true
			}}, "hash to", oci.ErrDigest},
		{"schema 1", &fakeRegistry{manifest: []byte(`{"schemaVersion":1}`), manifestType: "application/vnd.docker.distribution.manifest.v1+prettyjws"},
			"schema 1", nil},
		{"foreign layer", &fakeRegistry{manifest: bytes.Replace(good, []byte(`"application/vnd.oci.image.layer.v1.tar+gzip"`), []byte(`"application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"`), 1),
			manifestType: oci.MediaOCIManifest, blobs: blobs}, "foreign", nil},
		{"not a digest", &fakeRegistry{manifest: bytes.Replace(good, []byte(layer0.String()), []byte("sha256:../../../etc/passwd"), 1),
			manifestType: oci.MediaOCIManifest, blobs: blobs}, "hash", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.reg)
			defer srv.Close()
			cache := oci.NewCache(t.TempDir())
			host := strings.TrimPrefix(srv.URL, "http://")
			_, err := oci.Pull(context.Background(), cache, host+"/x/y:1", oci.PullOptions{Arch: vmspec.AMD64})
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("pull: %v, want an error with %q", err, tc.want)
			}
			for _, f := range blobFiles(t, cache) {
				if strings.Contains(f, layer0.Hex) || strings.HasPrefix(f, "tmp/") {
					t.Errorf("left in the cache: %s", f)
				}
			}
			if tc.name == "config of 100 MiB" {
				for _, p := range tc.reg.requested {
					if strings.Contains(p, "/blobs/") {
						t.Errorf("fetched %s although the config's descriptor was too large", p)
					}
				}
			}
		})
	}
}

// TestPlainHTTPOnlyToLoopback: plain HTTP is refused to a registry that is
// not on loopback unless the user named it insecure.
func TestPlainHTTPOnlyToLoopback(t *testing.T) {
	// 192.0.2.1 (TEST-NET-1) is never dialled: the guard refuses first,
	// and the https attempt goes to a transport that fails at once.
	failing := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Scheme == "http" {
			t.Errorf("plain HTTP request to %s went out", r.URL)
		}
		return nil, errors.New("no network in tests")
	})
	cache := oci.NewCache(t.TempDir())
	_, err := oci.Pull(context.Background(), cache, "192.168.0.10:5000/x/y:1", oci.PullOptions{Arch: vmspec.AMD64, Transport: failing})
	if err == nil {
		t.Fatal("pulled over a failing transport")
	}
	if !strings.Contains(err.Error(), "plain HTTP to 192.168.0.10:5000 refused") && !strings.Contains(err.Error(), "no network") {
		t.Errorf("error: %v", err)
	}
	// Named insecure: the plain HTTP request is let through.
	var sawHTTP atomic.Bool
	tr := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Scheme == "http" {
			sawHTTP.Store(true)
		}
		return nil, errors.New("no network in tests")
	})
	_, _ = oci.Pull(context.Background(), cache, "192.168.0.10:5000/x/y:1", oci.PullOptions{Arch: vmspec.AMD64, Transport: tr, Insecure: []string{"192.168.0.10:5000"}})
	if !sawHTTP.Load() {
		t.Error("a registry named insecure was not tried over plain HTTP")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestPullLayoutAndArchives: an OCI layout directory, a docker save
// tarball (as go-containerregistry writes it), a legacy one with
// uncompressed layer.tar members, and an OCI archive are pulled into the
// cache with the same layers.
func TestPullLayoutAndArchives(t *testing.T) {
	img := testImage("amd64", "local")
	dir := t.TempDir()
	lp := filepath.Join(dir, "layout")
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img})
	if _, err := layout.Write(lp, idx); err != nil {
		t.Fatal(err)
	}
	cache := oci.NewCache(t.TempDir())
	want, _ := img.Digest()
	rec, err := oci.Pull(context.Background(), cache, lp, oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil {
		t.Fatalf("layout: %v", err)
	}
	if rec.Manifest != want.String() || rec.Source != oci.SourceLayout {
		t.Errorf("layout record %+v", rec)
	}
	// A layout for another architecture is refused, naming it.
	if _, err := oci.Pull(context.Background(), cache, lp, oci.PullOptions{Arch: vmspec.ARM64}); err == nil || !strings.Contains(err.Error(), "amd64") {
		t.Errorf("pull of an amd64 layout for arm64: %v", err)
	}

	// docker save (go-containerregistry's tarball.Write writes its format).
	tp := filepath.Join(dir, "saved.tar")
	tag, _ := name.NewTag("example.com/app:1")
	f, _ := os.Create(tp)
	if err := tarball.Write(tag, img, f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rec, err = oci.Pull(context.Background(), cache, tp, oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil {
		t.Fatalf("docker save tarball: %v", err)
	}
	ls, _ := img.Layers()
	for i, l := range ls {
		d, _ := l.Digest()
		if rec.Layers[i].Digest != d.String() || rec.Layers[i].MediaType != string(types.OCILayer) {
			t.Errorf("tarball layer %d: %+v, want %s gzip", i, rec.Layers[i], d)
		}
	}

	// Legacy docker save: uncompressed ID/layer.tar members.
	cfg, _ := img.RawConfigFile()
	var legacy bytes.Buffer
	tw := tar.NewWriter(&legacy)
	add := func(n string, b []byte) {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	var names []string
	for i, l := range ls {
		rc, _ := l.Uncompressed()
		var b bytes.Buffer
		b.ReadFrom(rc)
		n := fmt.Sprintf("layer%d/layer.tar", i)
		add(n, b.Bytes())
		names = append(names, n)
	}
	add("cfg.json", cfg)
	mj, _ := json.Marshal([]map[string]any{{"Config": "cfg.json", "RepoTags": []string{"app:legacy"}, "Layers": names}})
	add("manifest.json", mj)
	tw.Close()
	lt := filepath.Join(dir, "legacy.tar")
	os.WriteFile(lt, legacy.Bytes(), 0o644)
	rec, err = oci.Pull(context.Background(), cache, lt, oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil {
		t.Fatalf("legacy docker save tarball: %v", err)
	}
	cf, _ := img.ConfigFile()
	for i := range ls {
		if rec.Layers[i].Digest != cf.RootFS.DiffIDs[i].String() || rec.Layers[i].MediaType != string(types.OCIUncompressedLayer) {
			t.Errorf("legacy layer %d: %+v", i, rec.Layers[i])
		}
	}

	// OCI archive: the layout in a tar.
	var oa bytes.Buffer
	tw = tar.NewWriter(&oa)
	filepath.Walk(lp, func(p string, fi os.FileInfo, err error) error {
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(lp, p)
			tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
			tw.Write(b)
		}
		return nil
	})
	tw.Close()
	op := filepath.Join(dir, "oci.tar")
	os.WriteFile(op, oa.Bytes(), 0o644)
	rec, err = oci.Pull(context.Background(), cache, op, oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil || rec.Manifest != want.String() {
		t.Fatalf("OCI archive: %v %+v", err, rec)
	}

	// Prune keeps what the records reach; after the records go, nothing.
	if _, err := cache.Prune(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cache.BlobPath(rec.Layers[0].Digest)); err != nil {
		t.Errorf("prune removed a live layer: %v", err)
	}
	recs, _ := cache.Records()
	for _, r := range recs {
		cache.RemoveRecord(r)
	}
	freed, _ := cache.Prune(nil)
	if left := blobFiles(t, cache); len(left) != 0 || freed == 0 {
		t.Errorf("after removing every record, prune freed %d and left %v", freed, left)
	}
}

func defaultKeychain() authn.Keychain { return authn.DefaultKeychain }

func startRegistry(t *testing.T) string { return ocitest.StartRegistry(t, nil).Addr }

func pushTestImage(t *testing.T, ref string, img v1.Image) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return d.String()
}

// TestRegistryCannotSendThePullToLoopback: a registry that is not on
// loopback redirects a blob fetch to a server on this host's loopback (as
// it would to a local admin port, or to a cloud's metadata service on a
// link-local address); the pull fails and the loopback server sees nothing.
func TestRegistryCannotSendThePullToLoopback(t *testing.T) {
	ip := nonLoopbackAddr(t)
	var hit atomic.Int32
	inside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit.Add(1)
		w.Write([]byte("secret"))
	}))
	defer inside.Close()

	img := testImage("amd64", "redirect")
	good, blobs := manifestFor(t, img)
	reg := &fakeRegistry{manifest: good, manifestType: oci.MediaOCIManifest, blobs: blobs,
		handle: func(w http.ResponseWriter, r *http.Request, d string) bool {
			http.Redirect(w, r, inside.URL+"/latest/meta-data/"+d, http.StatusTemporaryRedirect)
			return true
		}}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skipf("no listener on %s: %v", ip, err)
	}
	srv := httptest.NewUnstartedServer(reg)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	host := ln.Addr().String()

	_, err = oci.Pull(context.Background(), oci.NewCache(t.TempDir()), host+"/x/y:1",
		oci.PullOptions{Arch: vmspec.AMD64, Insecure: []string{host}})
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("pull through a redirect to loopback: %v, want it refused", err)
	}
	if n := hit.Load(); n != 0 {
		t.Fatalf("the loopback server got %d request(s)", n)
	}
	// The same redirect from a registry on loopback is followed (a test
	// registry, a local mirror).
	local := httptest.NewServer(reg)
	defer local.Close()
	_, _ = oci.Pull(context.Background(), oci.NewCache(t.TempDir()), strings.TrimPrefix(local.URL, "http://")+"/x/y:1", oci.PullOptions{Arch: vmspec.AMD64})
	if hit.Load() == 0 {
		t.Fatal("a loopback registry's redirect to loopback was not followed: the guard is too wide")
	}
}

// nonLoopbackAddr is an address of this host's that is not loopback nor
// link-local, or the test skips.
func nonLoopbackAddr(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skipf("interface addresses: %v", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("this host has no IPv4 address besides loopback and link-local")
	return ""
}
