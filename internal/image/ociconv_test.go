package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/oci/ocitest"
)

func gz(b []byte) []byte {
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

// putLayer stores a gzip layer of tarBytes in the cache.
func putLayer(t *testing.T, c oci.Cache, tarBytes []byte) oci.Layer {
	t.Helper()
	z := gz(tarBytes)
	d, err := c.PutBytes(z, "layer")
	if err != nil {
		t.Fatal(err)
	}
	return oci.Layer{Digest: d, Size: int64(len(z)), MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", DiffID: oci.Digest(tarBytes)}
}

// TestLayersDisk: layers are decompressed onto the disk at 1 MiB
// boundaries, sparse; a decompression bomb stops at the bound, a layer
// whose bytes are not its diff id is refused.
func TestLayersDisk(t *testing.T) {
	c := oci.NewCache(t.TempDir())
	a := ocitest.Tar([]ocitest.Entry{{Name: "a", Body: "hello"}})
	b := ocitest.Tar([]ocitest.Entry{{Name: "zeros", Body: strings.Repeat("\x00", 8<<20)}})
	rec := &oci.Record{Name: "t", Layers: []oci.Layer{putLayer(t, c, a), putLayer(t, c, b)}}
	p := filepath.Join(t.TempDir(), "layers.raw")
	layers, total, err := writeLayersDisk(t.Context(), c, rec, p, oci.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 || layers[0].Off != 0 || layers[1].Off != 1<<20 || total != int64(len(a)+len(b)) {
		t.Fatalf("layers %+v total %d", layers, total)
	}
	f, _ := os.Open(p)
	defer f.Close()
	tr := tar.NewReader(io.NewSectionReader(f, layers[1].Off, layers[1].Size))
	if h, err := tr.Next(); err != nil || h.Name != "zeros" {
		t.Fatalf("second layer: %v %v", h, err)
	}
	var st syscall.Stat_t
	if syscall.Stat(p, &st); st.Blocks*512 > 1<<20 {
		t.Errorf("%d bytes allocated for 8 MiB of zeros: not sparse", st.Blocks*512)
	}

	// A bomb: 256 MiB of zeros in a few hundred KiB of gzip, with the
	// ratio's floor at 16 MiB (1 GiB by default).
	lim := oci.DefaultLimits
	lim.RatioFloor = 16 << 20
	var bomb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&bomb, gzip.BestSpeed)
	chunk := make([]byte, 1<<20)
	for i := 0; i < 256; i++ {
		zw.Write(chunk)
	}
	zw.Close()
	d, _ := c.PutBytes(bomb.Bytes(), "bomb")
	rec = &oci.Record{Name: "bomb", Layers: []oci.Layer{{Digest: d, Size: int64(bomb.Len()), MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", DiffID: oci.Digest(nil)}}}
	start := time.Now()
	_, _, err = writeLayersDisk(t.Context(), c, rec, filepath.Join(t.TempDir(), "bomb.raw"), lim)
	if !errors.Is(err, errBomb) {
		t.Errorf("bomb: %v", err)
	}
	t.Logf("bomb refused after %s", time.Since(start))

	// The diff id does not match.
	l := putLayer(t, c, a)
	l.DiffID = oci.Digest([]byte("other"))
	rec = &oci.Record{Name: "lie", Layers: []oci.Layer{l}}
	if _, _, err := writeLayersDisk(t.Context(), c, rec, filepath.Join(t.TempDir(), "lie.raw"), oci.DefaultLimits); !errors.Is(err, oci.ErrDigest) {
		t.Errorf("diff id mismatch: %v", err)
	}
}

// TestConvOutputChecked: what the converter VM reports is held to what it
// may say.
func TestConvOutputChecked(t *testing.T) {
	stats := `{"members":3}`
	for _, tc := range []struct {
		report string
		ok     bool
		user   bool
	}{
		{`{"shell":"/bin/sh","sudo":false,"added":["/etc/passwd"]}`, true, false},
		{`{"shell":"/bin/sh","sudo":true,"user":{"name":"node","uid":1000,"gid":1000}}`, true, true},
		{`{"shell":"/tmp/evil"}`, false, false},
		{`{"shell":"/bin/sh","added":["\u001b[2Jx"]}`, false, false},
		{`{"shell":"/bin/sh","user":{"name":"root2","uid":0,"gid":0}}`, true, false},
		{`{"shell":"/bin/sh","user":{"name":"Bad Name","uid":5,"gid":5}}`, true, false},
		{`{"shell":"/bin/sh","extra":1}`, false, false},
	} {
		rep, _, err := parseConvOutput(stats, tc.report)
		if (err == nil) != tc.ok || (err == nil && (rep.User != nil) != tc.user) {
			t.Errorf("%s: %+v %v", tc.report, rep, err)
		}
	}
}

func TestCheckImageConfig(t *testing.T) {
	if err := checkImageConfig([]string{"PATH=/bin", "A="}, "/app", "node"); err != nil {
		t.Error(err)
	}
	for _, bad := range [][]string{{"=x"}, {"A B=1"}, {"noequals"}} {
		if checkImageConfig(bad, "", "") == nil {
			t.Errorf("env %q accepted", bad)
		}
	}
	if checkImageConfig(nil, "relative", "") == nil || checkImageConfig(nil, "", "a\nb") == nil {
		t.Error("a relative WorkingDir or a User with a newline accepted")
	}
}

// TestInstallArtifactChecks: a pulled kosa8 image of another recipe than
// this kosa8's base is refused before anything is written (setup then
// builds), and so is one whose root filesystem is not the size its
// manifest says.
func TestInstallArtifactChecks(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	c := oci.NewCache(t.TempDir())
	want := DefaultRecipe("amd64")
	other := want.WithPackages("cowsay")
	cfg, _ := json.Marshal(Manifest{Key: other.Key(), Recipe: other, KernelVersion: "6.12.0-test"})
	_, err := s.InstallArtifact(t.Context(), c, &oci.PulledArtifact{Ref: "r", Config: cfg}, want, nil)
	if !errors.Is(err, ErrRecipeMismatch) {
		t.Errorf("another recipe: %v", err)
	}
	for _, kv := range []string{"../../etc", "6.1/x", ""} {
		cfg, _ = json.Marshal(Manifest{Key: want.Key(), Recipe: want, KernelVersion: kv})
		if _, err := s.InstallArtifact(t.Context(), c, &oci.PulledArtifact{Ref: "r", Config: cfg}, want, nil); err == nil || !strings.Contains(err.Error(), "kernel version") {
			t.Errorf("kernel version %q: %v", kv, err)
		}
	}
	// A root filesystem larger than the manifest says.
	var z bytes.Buffer
	zw, _ := zstd.NewWriter(&z)
	zw.Write(make([]byte, 2<<20))
	zw.Close()
	rd, _ := c.PutBytes(z.Bytes(), "rootfs")
	kd, _ := c.PutBytes([]byte("k"), "kernel")
	md, _ := c.PutBytes([]byte("m"), "modules")
	cfg, _ = json.Marshal(Manifest{Key: want.Key(), Recipe: want, KernelVersion: "6.12.0-test", RootFSBytes: 1 << 20})
	art := &oci.PulledArtifact{Ref: "r", Config: cfg, Blobs: []oci.Blob{
		{MediaType: oci.MediaRootFS, Digest: rd, Size: int64(z.Len())}, {MediaType: oci.MediaKernel, Digest: kd, Size: 1}, {MediaType: oci.MediaKernelModule, Digest: md, Size: 1}}}
	if _, err := s.InstallArtifact(t.Context(), c, art, want, nil); err == nil || !strings.Contains(err.Error(), "more than the 1048576 bytes") {
		t.Errorf("an oversized root filesystem: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(s.Dir, "images", "amd64", "*")); len(left) != 0 {
		t.Errorf("a refused install left %v", left)
	}
}

// The converter VM's output is the guest's: its log keeps the first
// maxConvertLog bytes and a line saying the rest was cut, however much
// the converter prints.
func TestConvertLogIsBounded(t *testing.T) {
	var buf strings.Builder
	l := &boundedLog{w: &buf, left: 1000}
	line := []byte(strings.Repeat("x", 99) + "\n")
	for i := 0; i < 100_000; i++ {
		if n, err := l.Write(line); n != len(line) || err != nil {
			t.Fatalf("write %d: %d %v", i, n, err)
		}
	}
	if got := buf.Len(); got > 1200 || !strings.HasSuffix(buf.String(), "it passed 16 MiB)\n") || !strings.HasPrefix(buf.String(), string(line)) {
		t.Fatalf("log of %d bytes ending %q", got, buf.String()[max(0, got-80):])
	}
}
