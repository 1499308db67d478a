package qemu

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// fakeQEMU writes PREFIX/usr/bin/qemu-system-x86_64, a script answering
// --version and -L help (dataDirs, with @P@ standing for PREFIX) as a QEMU
// would, and the data folders given.
func fakeQEMU(t *testing.T, version, dataDirs string, dirs ...string) (prefix, bin string) {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("shell script stands in for QEMU")
	}
	prefix = t.TempDir()
	bin = filepath.Join(prefix, "usr/bin/qemu-system-x86_64")
	for _, d := range append(dirs, "usr/bin") {
		if err := os.MkdirAll(filepath.Join(prefix, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dataDirs = strings.ReplaceAll(dataDirs, "@P@", prefix)
	script := "#!/bin/sh\ncase \"$1\" in\n--version) echo 'QEMU emulator version " + version + " (Debian)'; echo 'Copyright';;\n" +
		"-L) printf '%s\\n' " + dataDirs + ";;\nesac\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return prefix, bin
}

func TestProbe(t *testing.T) {
	ctx := context.Background()
	t.Run("debian 10 unpacked under a prefix", func(t *testing.T) {
		t.Setenv(DataDirEnv, "")
		// Built for /usr: QEMU itself searches only /usr's folders.
		prefix, bin := fakeQEMU(t, "10.0.2", "/usr/share/qemu /usr/share/seabios", "usr/share/qemu", "usr/share/seabios")
		if err := os.WriteFile(filepath.Join(prefix, "usr/share/qemu/qboot.rom"), make([]byte, 64<<10), 0o644); err != nil {
			t.Fatal(err)
		}
		inst, err := Probe(ctx, bin, vmspec.AMD64)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Version != (Version{10, 0, 2}) || inst.VersionLine != "QEMU emulator version 10.0.2 (Debian)" {
			t.Errorf("version %v %q", inst.Version, inst.VersionLine)
		}
		want := []string{filepath.Join(prefix, "usr/share/qemu"), filepath.Join(prefix, "usr/share/seabios")}
		if !slices.Equal(inst.DataDirs, want) {
			t.Errorf("DataDirs = %q, want %q", inst.DataDirs, want)
		}
		if inst.Firmware != filepath.Join(prefix, "usr/share/qemu/qboot.rom") || inst.FirmwareName() != "qboot.rom" {
			t.Errorf("Firmware = %q", inst.Firmware)
		}
	})
	t.Run("relocatable build finds its own data", func(t *testing.T) {
		t.Setenv(DataDirEnv, "")
		// -L help lists PREFIX/usr/bin/../share/qemu: nothing to add.
		_, bin := fakeQEMU(t, "7.2.22", "@P@/usr/bin/../share/qemu", "usr/share/qemu")
		inst, err := Probe(ctx, bin, vmspec.AMD64)
		if err != nil {
			t.Fatal(err)
		}
		if len(inst.DataDirs) != 0 || inst.Firmware != "" {
			t.Errorf("DataDirs %q, Firmware %q: want none (no qboot.rom there)", inst.DataDirs, inst.Firmware)
		}
	})
	t.Run("KOSA8_QEMU_DATADIR", func(t *testing.T) {
		_, bin := fakeQEMU(t, "9.2.0", "/usr/share/qemu")
		d := t.TempDir()
		t.Setenv(DataDirEnv, d)
		inst, err := Probe(ctx, bin, vmspec.AMD64)
		if err != nil || !slices.Equal(inst.DataDirs, []string{d}) {
			t.Fatalf("DataDirs %q, %v", inst.DataDirs, err)
		}
		t.Setenv(DataDirEnv, filepath.Join(d, "missing"))
		if _, err := Probe(ctx, bin, vmspec.AMD64); err == nil {
			t.Fatal("a missing data folder accepted")
		}
	})
	t.Run("too old", func(t *testing.T) {
		t.Setenv(DataDirEnv, "")
		_, bin := fakeQEMU(t, "7.1.0", "/usr/share/qemu")
		inst, err := Probe(ctx, bin, vmspec.AMD64)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Supported() == nil {
			t.Fatal("QEMU 7.1 accepted")
		}
	})
}

// KOSA8_QEMU names the QEMU for the guests it was meant for: an x86-64
// QEMU given there must not run an arm64 guest, and a wrapper of another
// name applies to every guest.
func TestFindBinaryOverride(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"qemu-system-x86_64", "qemu-system-aarch64", "my-qemu"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	x86 := filepath.Join(dir, "qemu-system-x86_64")
	for _, tc := range []struct {
		env  string
		arch vmspec.Arch
		want string
	}{
		{x86, vmspec.AMD64, x86},
		{x86, vmspec.ARM64, filepath.Join(dir, "qemu-system-aarch64")},
		{filepath.Join(dir, "my-qemu"), vmspec.ARM64, filepath.Join(dir, "my-qemu")},
		{"", vmspec.ARM64, filepath.Join(dir, "qemu-system-aarch64")},
	} {
		t.Setenv("KOSA8_QEMU", tc.env)
		if got, err := FindBinary(tc.arch, ""); err != nil || got != tc.want {
			t.Errorf("KOSA8_QEMU=%s, %s guest: %q, %v; want %q", tc.env, tc.arch, got, err, tc.want)
		}
	}
}

// A probe is answered from the cache until the binary or a folder its
// data came from changes.
func TestProbeCached(t *testing.T) {
	ctx := context.Background()
	t.Setenv(DataDirEnv, "")
	prefix, bin := fakeQEMU(t, "10.0.2", "/usr/share/qemu", "usr/share/qemu")
	// The fake counts its runs.
	runs := filepath.Join(t.TempDir(), "runs")
	script, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	counted := strings.Replace(string(script), "#!/bin/sh\n", "#!/bin/sh\necho >> "+runs+"\n", 1)
	if err := os.WriteFile(bin, []byte(counted), 0o755); err != nil {
		t.Fatal(err)
	}
	// Stamps an hour old: a change below cannot fall in the same clock
	// tick as the making (file times are coarse).
	old := time.Now().Add(-time.Hour)
	for _, p := range []string{bin, filepath.Join(prefix, "usr/share/qemu")} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	nruns := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "\n")
	}
	dir := t.TempDir()
	first, err := ProbeCached(ctx, bin, vmspec.AMD64, dir)
	if err != nil || nruns() != 2 {
		t.Fatalf("first probe: %v, %d QEMU runs", err, nruns())
	}
	again, err := ProbeCached(ctx, bin, vmspec.AMD64, dir)
	if err != nil || nruns() != 2 || !reflect.DeepEqual(again, first) {
		t.Fatalf("second probe: %+v, %v, %d QEMU runs (want the cached %+v)", again, err, nruns(), first)
	}

	// Firmware appears in its data folder: probed again, and found.
	if err := os.WriteFile(filepath.Join(prefix, "usr/share/qemu/qboot.rom"), make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	inst, err := ProbeCached(ctx, bin, vmspec.AMD64, dir)
	if err != nil || nruns() != 4 || inst.FirmwareName() != "qboot.rom" {
		t.Fatalf("after qboot.rom appeared: %+v, %v, %d QEMU runs", inst, err, nruns())
	}

	// Another QEMU at the same path (an upgrade): probed again.
	if err := os.WriteFile(bin, []byte(strings.Replace(counted, "10.0.2", "10.1.10", 1)), 0o755); err != nil {
		t.Fatal(err)
	}
	inst, err = ProbeCached(ctx, bin, vmspec.AMD64, dir)
	if err != nil || nruns() != 6 || inst.Version != (Version{10, 1, 10}) {
		t.Fatalf("after an upgrade: %+v, %v, %d QEMU runs", inst, err, nruns())
	}

	// A damaged cache is probed past, and no cache dir means no cache.
	if err := os.WriteFile(filepath.Join(dir, probeCacheFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ProbeCached(ctx, bin, vmspec.AMD64, dir); err != nil || nruns() != 8 {
		t.Fatalf("past a damaged cache: %v, %d QEMU runs", err, nruns())
	}
	if _, err := ProbeCached(ctx, bin, vmspec.AMD64, ""); err != nil || nruns() != 10 {
		t.Fatalf("without a cache: %v, %d QEMU runs", err, nruns())
	}
}
