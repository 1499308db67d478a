package qemu

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

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
