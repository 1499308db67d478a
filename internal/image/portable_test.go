package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"

	"github.com/kosa8/kosa8/internal/image/debian"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// debMember is one member of a test package's data.tar.
type debMember struct {
	name, link string
	typ        byte
	mode       int64
	data       []byte
}

// writeTestDeb writes a .deb (ar: debian-binary, control.tar.gz,
// data.tar.gz) holding members to dir/name_1_all.deb.
func writeTestDeb(t *testing.T, dir, name string, members []debMember) string {
	t.Helper()
	tgz := func(fill func(tw *tar.Writer)) []byte {
		var b bytes.Buffer
		gz := gzip.NewWriter(&b)
		tw := tar.NewWriter(gz)
		fill(tw)
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		gz.Close()
		return b.Bytes()
	}
	control := tgz(func(tw *tar.Writer) {
		c := fmt.Sprintf("Package: %s\nVersion: 1\nArchitecture: all\nMaintainer: t <t@example.org>\nDescription: test\n", name)
		tw.WriteHeader(&tar.Header{Name: "./control", Mode: 0o644, Size: int64(len(c)), Typeflag: tar.TypeReg})
		tw.Write([]byte(c))
	})
	data := tgz(func(tw *tar.Writer) {
		for _, m := range members {
			h := &tar.Header{Name: m.name, Typeflag: m.typ, Mode: m.mode, Linkname: m.link, Size: int64(len(m.data))}
			if m.typ != tar.TypeReg {
				h.Size = 0
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if m.typ == tar.TypeReg {
				tw.Write(m.data)
			}
		}
	})
	var ar bytes.Buffer
	ar.WriteString("!<arch>\n")
	for _, f := range []struct {
		name string
		data []byte
	}{{"debian-binary", []byte("2.0\n")}, {"control.tar.gz", control}, {"data.tar.gz", data}} {
		fmt.Fprintf(&ar, "%-16s%-12d%-6d%-6d%-8o%-10d`\n", f.name, 0, 0, 0, 0o644, len(f.data))
		ar.Write(f.data)
		if len(f.data)%2 == 1 {
			ar.WriteByte('\n')
		}
	}
	p := filepath.Join(dir, name+"_1_all.deb")
	if err := os.WriteFile(p, ar.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDebPath(t *testing.T) {
	for in, want := range map[string]string{
		"./":                      "",
		".":                       "",
		"./bin/sh":                "usr/bin/sh",
		"./bin":                   "",
		"./lib64/":                "",
		"./lib/x86_64-linux-gnu/": "usr/lib/x86_64-linux-gnu",
		"./lib64/ld.so":           "usr/lib64/ld.so",
		"./usr/share/doc/":        "usr/share/doc",
		"./etc/passwd":            "etc/passwd",
		"./binary/x":              "binary/x",
	} {
		got, err := debPath(in)
		if err != nil || got != want {
			t.Errorf("debPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"../etc/passwd", "./usr/../../x", "/etc/passwd", "./a//b", "./a/./b"} {
		if got, err := debPath(bad); err == nil {
			t.Errorf("debPath(%q) = %q, want an error", bad, got)
		}
	}
}

func TestUnpackKernel(t *testing.T) {
	dir := t.TempDir()
	var ko bytes.Buffer
	xw, err := xz.NewWriter(&ko)
	if err != nil {
		t.Fatal(err)
	}
	xw.Write([]byte("module bytes"))
	xw.Close()
	deb := writeTestDeb(t, dir, "linux-image-6.12.9-cloud-amd64", []debMember{
		{name: "./boot/", typ: tar.TypeDir, mode: 0o755},
		{name: "./boot/vmlinuz-6.12.9-cloud-amd64", typ: tar.TypeReg, mode: 0o644, data: []byte("kernel")},
		{name: "./usr/lib/modules/6.12.9-cloud-amd64/kernel/fs/ext4/ext4.ko.xz", typ: tar.TypeReg, mode: 0o644, data: ko.Bytes()},
		{name: "./usr/lib/modules/6.12.9-cloud-amd64/modules.order", typ: tar.TypeReg, mode: 0o644, data: []byte("kernel/fs/ext4/ext4.ko\n")},
		{name: "./usr/lib/modules/6.12.9-cloud-amd64/build", typ: tar.TypeSymlink, link: "/usr/src/x"},
	})
	out := filepath.Join(dir, "kernel")
	kver, err := unpackKernel(deb, out)
	if err != nil || kver != "6.12.9-cloud-amd64" {
		t.Fatalf("unpackKernel = %q, %v", kver, err)
	}
	for p, want := range map[string]string{
		"vmlinuz": "kernel",
		"6.12.9-cloud-amd64/kernel/fs/ext4/ext4.ko": "module bytes",
		"6.12.9-cloud-amd64/modules.order":          "kernel/fs/ext4/ext4.ko\n",
		"version":                                   "6.12.9-cloud-amd64\n",
	} {
		if b, err := os.ReadFile(filepath.Join(out, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(out, "6.12.9-cloud-amd64", "build")); err == nil {
		t.Error("the module tree's symlink out of it was kept")
	}

	// A package whose member climbs out of the tree is refused.
	evil := writeTestDeb(t, dir, "evil", []debMember{
		{name: "./boot/vmlinuz-1", typ: tar.TypeReg, mode: 0o644, data: []byte("k")},
		{name: "./usr/lib/modules/1/../../../../../x", typ: tar.TypeReg, mode: 0o644, data: []byte("x")},
	})
	if _, err := unpackKernel(evil, filepath.Join(dir, "k2")); err == nil {
		t.Error("a member climbing out was unpacked")
	}
}

func TestWriteTree(t *testing.T) {
	dir := t.TempDir()
	pkgs := []*debian.Package{{Name: "a"}, {Name: "b"}}
	file := map[string]string{
		"a": writeTestDeb(t, dir, "a", []debMember{
			{name: "./", typ: tar.TypeDir, mode: 0o755},
			{name: "./bin/", typ: tar.TypeDir, mode: 0o755},
			{name: "./bin/a", typ: tar.TypeReg, mode: 0o755, data: []byte("A1")},
			{name: "./bin/a2", typ: tar.TypeLink, link: "./bin/a"},
			{name: "./tmp/", typ: tar.TypeDir, mode: 0o1777},
			{name: "./etc/x.d/conf", typ: tar.TypeReg, mode: 0o644, data: []byte("c")},
		}),
		"b": writeTestDeb(t, dir, "b", []debMember{
			{name: "./usr/bin/a", typ: tar.TypeReg, mode: 0o755, data: []byte("A2")},
			{name: "./usr/bin/sh", typ: tar.TypeSymlink, link: "dash"},
			{name: "./bin", typ: tar.TypeSymlink, link: "usr/bin"},
			{name: "./dev/null", typ: tar.TypeChar},
		}),
	}
	r := Recipe{Arch: vmspec.AMD64, Suite: "trixie", Mirrors: []string{"deb http://m/debian trixie main"}}
	dst := filepath.Join(dir, "tree.tar")
	size, err := writeTree(dst, r, pkgs, file)
	if err != nil {
		t.Fatal(err)
	}
	if size%(1<<20) != 0 {
		t.Errorf("size %d is not whole MiB", size)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type entry struct {
		typ  byte
		link string
		mode int64
		data string
	}
	last := map[string]entry{}
	var order []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		name := strings.TrimSuffix(h.Name, "/")
		last[name] = entry{h.Typeflag, h.Linkname, h.Mode, string(b)}
		order = append(order, name)
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if e := last[l]; e.typ != tar.TypeSymlink || e.link != "usr/"+l {
			t.Errorf("%s = %+v, want a link to usr/%s", l, e, l)
		}
	}
	if e := last["usr/bin"]; e.typ != tar.TypeDir {
		t.Errorf("usr/bin = %+v: a package's link bin -> usr/bin replaced the directory", e)
	}
	if e := last["usr/bin/a"]; e.data != "A2" {
		t.Errorf("usr/bin/a = %q: the later package's file must come last", e.data)
	}
	if i, j := slices.Index(order, "usr/bin"), slices.Index(order, "bin"); i < 0 || i > j {
		t.Errorf("usr/bin (%d) must come before the link bin (%d)", i, j)
	}
	if e := last["usr/bin/a2"]; e.typ != tar.TypeLink || e.link != "usr/bin/a" {
		t.Errorf("hard link = %+v", e)
	}
	if e := last["tmp"]; e.mode != 0o1777 {
		t.Errorf("tmp mode %o", e.mode)
	}
	if _, ok := last["dev/null"]; ok {
		t.Error("a device node from a package was kept")
	}
	for _, p := range []string{"var/lib/dpkg/status", "var/lib/dpkg/info", "var/cache/apt/archives/a_1_all.deb", "var/cache/apt/archives/b_1_all.deb", "etc/kosa8/network.md"} {
		if _, ok := last[p]; !ok {
			t.Errorf("%s missing", p)
		}
	}
	if e := last["etc/apt/sources.list"]; e.data != "deb http://m/debian trixie main\n" {
		t.Errorf("sources.list = %q", e.data)
	}
	for _, name := range order {
		if name == "bin" || name == "sbin" || name == "lib" || name == "lib64" {
			continue
		}
		for _, l := range []string{"bin/", "sbin/", "lib/", "lib64/"} {
			if strings.HasPrefix(name, l) {
				t.Errorf("%s is written through the link %s", name, l)
			}
		}
	}

	evil := writeTestDeb(t, dir, "evil", []debMember{{name: "./../x", typ: tar.TypeReg, mode: 0o644, data: []byte("x")}})
	if _, err := writeTree(filepath.Join(dir, "t2.tar"), r, []*debian.Package{{Name: "evil"}}, map[string]string{"evil": evil}); err == nil {
		t.Error("a member climbing out was written to the tree")
	}
}

func TestAddBuilderFiles(t *testing.T) {
	dir := t.TempDir()
	debs := []string{
		writeTestDeb(t, dir, "e2fsprogs", []debMember{
			{name: "./usr/sbin/mke2fs", typ: tar.TypeReg, mode: 0o755, data: []byte("mke2fs")},
			{name: "./usr/sbin/mkfs.ext4", typ: tar.TypeLink, link: "./usr/sbin/mke2fs"},
			{name: "./usr/share/doc/e2fsprogs/README", typ: tar.TypeReg, mode: 0o644, data: []byte("doc")},
		}),
		writeTestDeb(t, dir, "dash", []debMember{
			{name: "./bin/dash", typ: tar.TypeReg, mode: 0o755, data: []byte("dash")},
		}),
	}
	var buf bytes.Buffer
	c := newCPIOWriter(&buf)
	if err := addBuilderFiles(c, vmspec.ARM64, debs, "install"); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	files := readCPIO(t, buf.Bytes())
	for p, want := range map[string]string{
		"usr/sbin/mke2fs":    "mke2fs",
		"usr/sbin/mkfs.ext4": "mke2fs",
		"usr/bin/dash":       "dash",
		"usr/bin/sh":         "->dash",
		"bin":                "->usr/bin",
		"lib":                "->usr/lib",
		"kosa8/install.sh":   "install",
	} {
		if got, ok := files[p]; !ok || got != want {
			t.Errorf("%s = %q (%v), want %q", p, got, ok, want)
		}
	}
	if _, ok := files["lib64"]; ok {
		t.Error("arm64 has no lib64 link")
	}
	if _, ok := files["usr/share/doc/e2fsprogs/README"]; ok {
		t.Error("documentation went into the initramfs")
	}
	if !strings.Contains(files["kosa8/build.sh"], "mke2fs") {
		t.Error("no build script")
	}
}

// readCPIO reads a newc archive into name -> contents ("->target" for a
// symlink, "/" for a directory).
func readCPIO(t *testing.T, b []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	hex := func(s []byte) int {
		var n int
		fmt.Sscanf(string(s), "%x", &n)
		return n
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; off+110 <= len(b); {
		h := b[off : off+110]
		if string(h[:6]) != "070701" {
			t.Fatalf("bad magic at %d", off)
		}
		mode, size, nlen := hex(h[14:22]), hex(h[54:62]), hex(h[94:102])
		name := string(b[off+110 : off+110+nlen-1])
		off = align(off + 110 + nlen)
		data := string(b[off : off+size])
		off = align(off + size)
		if name == "TRAILER!!!" {
			break
		}
		// The kernel makes no parent directory: each must come first.
		if d := filepath.Dir(name); d != "." {
			if _, ok := out[d]; !ok {
				t.Errorf("%s comes before its directory", name)
			}
		}
		if _, dup := out[name]; dup && mode&0o170000 != cpioFile {
			t.Errorf("%s written twice", name)
		}
		switch mode & 0o170000 {
		case cpioSymlink:
			out[name] = "->" + data
		case cpioDir:
			out[name] = "/"
		default:
			out[name] = data
		}
	}
	return out
}

// TestUnpackKernelHostile: unpackKernel writes only inside its new
// directory, refuses one that exists (a link planted there would be
// followed by MkdirAll), and bounds what compressed modules unpack to.
func TestUnpackKernelHostile(t *testing.T) {
	dir := t.TempDir()
	kernel := []debMember{
		{name: "./boot/vmlinuz-6.12.9-cloud-amd64", typ: tar.TypeReg, mode: 0o644, data: []byte("kernel")},
		{name: "./usr/lib/modules/6.12.9-cloud-amd64/modules.order", typ: tar.TypeReg, mode: 0o644, data: []byte("\n")},
	}
	deb := writeTestDeb(t, dir, "linux-image", kernel)
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, plant := range map[string]func(k string){
		"version link": func(k string) {
			os.Mkdir(k, 0o755)
			os.Symlink(filepath.Join(outside, "version"), filepath.Join(k, "version"))
		},
		"module dir link": func(k string) {
			os.Mkdir(k, 0o755)
			os.Symlink(outside, filepath.Join(k, "6.12.9-cloud-amd64"))
		},
		"dir is a link": func(k string) { os.Symlink(outside, k) },
	} {
		k := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		plant(k)
		if _, err := unpackKernel(deb, k); err == nil {
			t.Errorf("%s: unpackKernel used a directory that existed", name)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("%s: unpackKernel wrote through a planted link: %v", name, ents)
		}
	}

	// Compressed modules: a few KiB each that unpack to 8 MiB.
	var ko bytes.Buffer
	xw, err := xz.NewWriter(&ko)
	if err != nil {
		t.Fatal(err)
	}
	xw.Write(make([]byte, 8<<20))
	xw.Close()
	bomb := slices.Clone(kernel)
	for i := range 4 {
		bomb = append(bomb, debMember{name: fmt.Sprintf("./usr/lib/modules/6.12.9-cloud-amd64/m%d.ko.xz", i), typ: tar.TypeReg, mode: 0o644, data: ko.Bytes()})
	}
	defer func(old int64) { maxKernelTotal = old }(maxKernelTotal)
	maxKernelTotal = 20 << 20
	_, err = unpackKernel(writeTestDeb(t, dir, "bomb", bomb), filepath.Join(dir, "k-bomb"))
	if err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("modules unpacking to 32 MiB with a bound of 20: %v", err)
	}
}

// TestAddBuilderFilesHostile: the initramfs's files are held in memory and
// a hard link writes its target's bytes again, so the total is bounded;
// a hard link to nothing held is an error, not an empty program.
func TestAddBuilderFilesHostile(t *testing.T) {
	dir := t.TempDir()
	big := bytes.Repeat([]byte("x"), 8<<20)
	chain := []debMember{{name: "./usr/bin/big", typ: tar.TypeReg, mode: 0o755, data: big}}
	for i := range 80 { // 81 × 8 MiB, from a tar of 8 MiB and 80 headers
		chain = append(chain, debMember{name: fmt.Sprintf("./usr/bin/l%d", i), typ: tar.TypeLink, link: "./usr/bin/big"})
	}
	for name, members := range map[string][]debMember{
		"hard-link chain": chain,
		"link to nothing": {{name: "./usr/bin/x", typ: tar.TypeLink, link: "./usr/bin/missing"}},
		"link to a doc": {
			{name: "./usr/share/doc/x/README", typ: tar.TypeReg, mode: 0o644, data: []byte("doc")},
			{name: "./usr/bin/x", typ: tar.TypeLink, link: "./usr/share/doc/x/README"},
		},
		"link to a dir": {
			{name: "./usr/lib/d/", typ: tar.TypeDir, mode: 0o755},
			{name: "./usr/bin/x", typ: tar.TypeLink, link: "./usr/lib/d"},
		},
	} {
		deb := writeTestDeb(t, dir, strings.ReplaceAll(name, " ", "-"), members)
		var n countWriter
		c := newCPIOWriter(&n)
		err := addBuilderFiles(c, vmspec.AMD64, []string{deb}, "install")
		if err == nil {
			err = c.Close()
		}
		if err == nil {
			t.Errorf("%s: accepted (%d MiB of initramfs)", name, n>>20)
		}
		if n > maxBuilderTotal+1<<20 {
			t.Errorf("%s: %d MiB written, more than the bound", name, n>>20)
		}
	}
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

// TestBuilderStep: a progress line is fixed text and a count, whatever the
// builder VM prints.
func TestBuilderStep(t *testing.T) {
	for line, want := range map[string]string{
		"kosa8: step mkfs":                   "making the root filesystem",
		"kosa8: step install 583":            "installing 583 packages in the guest (under emulation: tens of minutes)",
		"kosa8: step install \x1b]0;pwn\x07": "installing the packages in the guest (under emulation: tens of minutes)",
		"kosa8: step install 1 2":            "installing the packages in the guest (under emulation: tens of minutes)",
		"kosa8: step \x1b[2J":                "",
		"kosa8: step":                        "",
		"Setting up x ...":                   "",
	} {
		if got := builderStep(line); got != want {
			t.Errorf("builderStep(%q) = %q, want %q", line, got, want)
		}
	}
}

// A builder VM that cannot boot under an acceleration kosa8 chose (a
// paravirtualized /dev/kvm that passes the probe) is booted again under
// TCG; one the user forced is not.
func TestBootBuilderFallsBackToTCG(t *testing.T) {
	kvm := &vmmtest.Driver{AccelAs: vmm.KVM, StartErr: errors.New("MSR 0x10a")}
	tcg := &vmmtest.Driver{StartErr: errors.New("tcg broken too")}
	var asked []vmm.Accel
	var recordedBefore []string
	opts := BuildOptions{NewDriver: func(arch vmspec.Arch, a vmm.Accel) (vmm.Driver, error) {
		asked = append(asked, a)
		// While the TCG builder boots (minutes), kvm's failure is on
		// record already: doctor and new starts must not take it as usable.
		recordedBefore = kvm.Failures()
		return tcg, nil
	}}
	spec := &vmspec.Spec{Name: "image-builder", Arch: vmspec.AMD64}
	_, _, err := bootBuilder(context.Background(), kvm, spec, opts, func(string) {}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "MSR 0x10a") || !strings.Contains(err.Error(), "under tcg too: tcg broken too") {
		t.Errorf("err = %v", err)
	}
	if !slices.Equal(asked, []vmm.Accel{vmm.TCG}) {
		t.Errorf("drivers asked for %v, want one tcg", asked)
	}
	if f := kvm.Failures(); len(f) != 0 {
		t.Errorf("recorded %q although tcg failed too", f)
	}
	if len(recordedBefore) != 1 || !strings.HasPrefix(recordedBefore[0], "kvm: ") {
		t.Errorf("kvm's failure was not on record while the tcg builder booted: %q", recordedBefore)
	}

	asked = nil
	opts.Accel = vmm.KVM
	_, _, err = bootBuilder(context.Background(), kvm, spec, opts, func(string) {}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "KOSA8_ACCEL=tcg") || len(asked) != 0 {
		t.Errorf("forced kvm: err = %v, drivers asked for %v", err, asked)
	}
}

// TestDpkgCount: the builder's install shows a phase and a count from
// dpkg's own lines, bounded by the number of packages announced; nothing
// is counted before the announcement, and a guest's own text never
// reaches the phase line.
func TestDpkgCount(t *testing.T) {
	var d dpkgCount
	if _, _, _, ok := d.line("Unpacking early (1.0) ..."); ok {
		t.Fatal("counted before the install step")
	}
	if _, _, _, ok := d.line("kosa8: step install 3"); ok {
		t.Fatal("the announcement is not a count")
	}
	type got struct {
		phase       string
		done, total int
		ok          bool
	}
	lines := []struct {
		line string
		want got
	}{
		{"Selecting previously unselected package a.", got{}},
		{"Unpacking a (1.0) ...", got{"installing 3 packages in the guest: unpacking (under emulation: tens of minutes)", 1, 3, true}},
		{"Unpacking b \x1b[2J ...", got{"", 2, 3, true}},
		{"Unpacking c ...", got{"", 3, 3, true}},
		{"Unpacking d, one the guest printed itself ...", got{"", 3, 3, true}},
		{"Setting up a (1.0) ...", got{"installing 3 packages in the guest: setting up (under emulation: tens of minutes)", 1, 3, true}},
		{"Setting up b ...", got{"", 2, 3, true}},
		{"Processing triggers for man-db ...", got{}},
	}
	for _, l := range lines {
		phase, done, total, ok := d.line(l.line)
		if g := (got{phase, done, total, ok}); g != l.want {
			t.Errorf("line %q: %+v, want %+v", l.line, g, l.want)
		}
	}
	for _, bad := range []string{"kosa8: step install x", "kosa8: step install 0", "kosa8: step install 99999999"} {
		var d dpkgCount
		d.line(bad)
		if _, _, _, ok := d.line("Unpacking a ..."); ok {
			t.Errorf("%q: counted without a valid announcement", bad)
		}
	}
}
