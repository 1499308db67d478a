// Package ocitest makes OCI images and a real registry for tests: layers
// from hand-written tar entries (hostile ones included), images of them,
// and Debian's docker-registry (the CNCF distribution server) started on
// loopback.
package ocitest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/bcrypt"
)

// Entry is one tar member of a test layer.
type Entry struct {
	Name     string
	Type     byte // tar.TypeReg when 0
	Mode     int64
	Body     string
	Link     string // symlink or hard link target
	UID, GID int
	PAX      map[string]string
}

// Tar returns the uncompressed tar of entries.
func Tar(entries []Entry) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Uid: e.UID, Gid: e.GID, Linkname: e.Link,
			ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX, PAXRecords: e.PAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			panic(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, e.Body)
		}
	}
	tw.Close()
	return b.Bytes()
}

// Gzip compresses b.
func Gzip(b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

// Layer is a gzip layer of entries.
func Layer(entries []Entry) v1.Layer {
	return RawLayer(Tar(entries))
}

// RawLayer is a gzip layer of an uncompressed tar (any bytes).
func RawLayer(tarBytes []byte) v1.Layer {
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		panic(err)
	}
	return l
}

// Image is an OCI image of layers for arch, with cfg's Env, WorkingDir,
// User and Entrypoint.
func Image(arch string, cfg v1.Config, layers ...v1.Layer) v1.Image {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		panic(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		panic(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		panic(err)
	}
	return img
}

// Registry is a docker-registry process on loopback.
type Registry struct {
	Addr string // 127.0.0.1:PORT
	Dir  string // its storage
}

// Binary is Debian's docker-registry.
const Binary = "/usr/bin/docker-registry"

// StartRegistry starts docker-registry on a free loopback port, with
// storage in a test directory, and stops it when the test ends. With users
// (name → password) it asks for Basic auth (htpasswd). It skips the test,
// saying why, where the package is not installed.
func StartRegistry(t testing.TB, users map[string]string) *Registry {
	t.Helper()
	if _, err := RegistryBinary(); err != nil {
		t.Skip(err.Error())
	}
	r, stop, err := RunRegistry(t.TempDir(), users)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return r
}

// RegistryBinary finds docker-registry.
func RegistryBinary() (string, error) {
	if _, err := os.Stat(Binary); err == nil {
		return Binary, nil
	}
	if p, err := exec.LookPath("docker-registry"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("docker-registry is not installed (apt-get install docker-registry): the tests against a real registry need it")
}

// RunRegistry starts docker-registry with its files in dir, and returns
// it and the function that stops it.
func RunRegistry(dir string, users map[string]string) (*Registry, func(), error) {
	bin, err := RegistryBinary()
	if err != nil {
		return nil, nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	addr := l.Addr().String()
	l.Close()
	auth := ""
	if len(users) > 0 {
		var lines []string
		for u, p := range users {
			h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
			if err != nil {
				return nil, nil, err
			}
			lines = append(lines, u+":"+string(h))
		}
		pw := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(pw, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return nil, nil, err
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: kosa8-test\n    path: %s\n", pw)
	}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
%s`, filepath.Join(dir, "data"), addr, auth)
	cp := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cp, []byte(cfg), 0o644); err != nil {
		return nil, nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, "serve", cp)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 || resp.StatusCode == 401 {
				break
			}
		}
		if time.Now().After(deadline) {
			stop()
			b, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			return nil, nil, fmt.Errorf("docker-registry did not answer on %s within 30 s: %v\n%s", addr, err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return &Registry{Addr: addr, Dir: dir}, stop, nil
}

// SparseTar is a tar of one old-GNU sparse member, name, of realSize bytes
// of which only the last is data: a few kilobytes of archive claiming
// realSize bytes of file.
func SparseTar(name string, realSize int64) []byte {
	hdr := make([]byte, 512)
	octal := func(b []byte, v int64) {
		s := fmt.Sprintf("%0*o", len(b)-1, v)
		copy(b, s)
	}
	copy(hdr[0:100], name)
	octal(hdr[100:108], 0o644)
	octal(hdr[108:116], 0)
	octal(hdr[116:124], 0)
	octal(hdr[124:136], 1) // bytes stored in the archive
	octal(hdr[136:148], 1700000000)
	hdr[156] = 'S'
	copy(hdr[257:265], "ustar  \x00")
	octal(hdr[386:398], realSize-1) // the one data region: the last byte
	octal(hdr[398:410], 1)
	octal(hdr[483:495], realSize)
	for i := 148; i < 156; i++ {
		hdr[i] = ' '
	}
	var sum int64
	for _, c := range hdr {
		sum += int64(c)
	}
	copy(hdr[148:156], fmt.Sprintf("%06o\x00 ", sum))
	data := make([]byte, 512)
	data[0] = 'x'
	out := append(hdr, data...)
	return append(out, make([]byte, 1024)...)
}
