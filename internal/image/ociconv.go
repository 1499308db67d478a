package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	kgzip "github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/image/unpack"
	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// Images converted from OCI images: the image's layers, untrusted tar
// archives, become the read-only ext4 root that sandboxes share, with
// kosa8's kernel, initramfs and agent unchanged.
//
//	CACHE/images/ARCH/o-KEY-TIME/     one conversion of an OCI image (KEY hashes its manifest digest)
//	    manifest.json                 written last; OCI names the image, its config and what was added
//	    kernel/                       hard links to the base image's kernel
//	    rootfs.ext4                   the unpacked layers
//	    convert.log                   what the converter VM printed
//
// The host decompresses each layer from the cache (gzip, zstd or none),
// checks it against its diff id and the bounds (a decompression bomb stops
// at the first byte past them), and writes it onto a raw disk, sparse. The
// tar archives are parsed in the converter VM only: a VM of the base image
// (its root a throwaway overlay) with that disk read-only and a blank one,
// on which it makes ext4, unpacks the layers with kosa8-agent's unpack
// command (package unpack: whiteouts, links resolved inside the root,
// bounds), adds the few files a sandbox needs and the image lacks, and
// reports what it found. Nothing of the image is ever extracted on the
// host's file system.
//
// For speed under TCG the VM does the least it can: the host has already
// decompressed, the filesystem is made without a journal and the journal
// added at the end (no journal writes while unpacking), its size is set
// once from the layers' size (the file stays sparse on the host, so no
// e2fsck/resize2fs pass shrinks it), and the layers are read straight off a
// raw disk.

// ociConvVersion changes when the conversion changes what an image holds.
const ociConvVersion = 2

// OCISource describes the OCI image an image was converted from.
type OCISource struct {
	Name     string `json:"name"`
	Ref      string `json:"ref"`
	Manifest string `json:"manifest"`
	Platform string `json:"platform"`
	// The image config's Env, WorkingDir and User: commands get the first
	// two; a User other than root is the sandbox's default user.
	Env        []string     `json:"env,omitempty"`
	WorkingDir string       `json:"working_dir,omitempty"`
	User       *unpack.User `json:"user,omitempty"`
	// What the converter VM found and added.
	Shell string `json:"shell,omitempty"`
	Sudo  bool   `json:"sudo"`
	// OS is the image's /etc/os-release ID; Packages its package manager
	// (apt, apk or none): what a derived image over it installs with.
	OS       string        `json:"os,omitempty"`
	Packages string        `json:"packages,omitempty"`
	Added    []string      `json:"added,omitempty"`
	Stats    *unpack.Stats `json:"stats,omitempty"`
}

// ShortDigest is the manifest digest shortened for listings.
func (o *OCISource) ShortDigest() string {
	_, h, _ := strings.Cut(o.Manifest, ":")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// Missing lists what kosa8 expects inside and the image lacks.
func (o *OCISource) Missing() []string {
	var m []string
	if o.Shell == "" {
		m = append(m, "a shell (/bin/sh): give every command with its path")
	} else if o.Shell != "/bin/bash" {
		m = append(m, "bash (login shells are "+o.Shell+")")
	}
	if !o.Sudo {
		m = append(m, "sudo (run root commands with --user root)")
	}
	return m
}

// OCIKey names the converted image of an OCI manifest.
func OCIKey(manifest string) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("kosa8-oci v%d\x00%s", ociConvVersion, manifest)))
	return "o-" + hex.EncodeToString(h[:])[:16]
}

// LookupOCI returns the newest conversion of rec beside base.
func (s Store) LookupOCI(base *Image, rec *oci.Record) (*Image, error) {
	dirs, _ := filepath.Glob(filepath.Join(filepath.Dir(base.Dir), OCIKey(rec.Manifest)+"-*"))
	slices.Sort(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		if img, err := s.Open(dirs[i]); err == nil {
			return img, nil
		}
	}
	return nil, fmt.Errorf("%w: %s is not converted yet", ErrNoImage, rec.Name)
}

// ConvertOptions control a conversion.
type ConvertOptions struct {
	BuildOptions
	// Layers makes the converter VM's root: an overlay on the base's.
	Layers vmm.DiskLayers
	// Limits bound the decompressed layers (zero: oci.DefaultLimits).
	Limits *oci.Limits
}

// ConvertOCI converts the pulled image rec into a root filesystem beside
// base (whose kernel it shares and whose VM unpacks it), unless done
// before.
func (s Store) ConvertOCI(ctx context.Context, base *Image, cache oci.Cache, rec *oci.Record, o ConvertOptions) (*Image, error) {
	if img, err := s.LookupOCI(base, rec); err == nil {
		return img, nil
	}
	progress, logw := o.Progress, o.Log
	if progress == nil {
		progress = func(string) {}
	}
	if logw == nil {
		logw = io.Discard
	}
	lim := oci.DefaultLimits
	if o.Limits != nil {
		lim = *o.Limits
	}
	if rec.Arch() != base.Manifest.Recipe.Arch {
		return nil, fmt.Errorf("%s is a %s image, and the base is %s", rec.Name, rec.Arch(), base.Manifest.Recipe.Arch)
	}
	cfg, err := oci.ReadConfig(cache, rec)
	if err != nil {
		return nil, err
	}
	src := &OCISource{Name: rec.Name, Ref: rec.Ref, Manifest: rec.Manifest, Platform: rec.Platform, WorkingDir: cfg.Config.WorkingDir}
	if err := checkImageConfig(cfg.Config.Env, cfg.Config.WorkingDir, cfg.Config.User); err != nil {
		return nil, fmt.Errorf("%s: %w", rec.Name, err)
	}
	src.Env = cfg.Config.Env
	archDir := filepath.Dir(base.Dir)
	key := OCIKey(rec.Manifest)
	lock, err := lockFile(ctx, filepath.Join(archDir, "."+key+".lock"), func() { progress("waiting for another conversion of this image") })
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if img, err := s.LookupOCI(base, rec); err == nil {
		return img, nil
	}
	work, err := os.MkdirTemp(archDir, ".build-"+key+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, err
	}
	start := time.Now()
	progress(fmt.Sprintf("decompressing %d layers of %s (on the host, each checked against its diff id)", len(rec.Layers), rec.Name))
	layersDisk := filepath.Join(work, "layers.raw")
	layers, total, err := writeLayersDisk(ctx, cache, rec, layersDisk, lim)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logw, "kosa8: %d layers, %d bytes uncompressed, decompressed in %s\n", len(layers), total, time.Since(start).Round(time.Millisecond))
	rootfs := filepath.Join(out, "rootfs.ext4")
	// Room for the files, ext4's metadata and a margin; sparse on the host.
	size := (total + total/4 + 256<<20 + 1<<20 - 1) &^ (1<<20 - 1)
	if err := makeSparse(rootfs, size); err != nil {
		return nil, err
	}
	rep, stats, err := runConverter(ctx, base, work, layersDisk, rootfs, layers, cfg.Config.User, lim, o, progress, logw)
	if err != nil {
		return nil, fmt.Errorf("converting %s: %w", rec.Name, err)
	}
	src.Shell, src.Sudo, src.Added, src.User, src.Stats = rep.Shell, rep.Sudo, rep.Added, rep.User, stats
	src.OS, src.Packages = rep.OS, rep.Packages
	_ = os.Chmod(rootfs, 0o444)
	if err := linkTree(filepath.Join(base.Dir, "kernel"), filepath.Join(out, "kernel")); err != nil {
		return nil, fmt.Errorf("link the base's kernel: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(work, "convert.log")); err == nil {
		_ = os.WriteFile(filepath.Join(out, "convert.log"), b, 0o644)
	}
	m := base.Manifest
	m.Key, m.Built, m.RootFSBytes, m.Derived, m.BaseDir, m.OCI = key, time.Now().UTC(), size, nil, base.Dir, src
	dst, err := install(out, archDir, m)
	if err != nil {
		return nil, err
	}
	progress(fmt.Sprintf("converted %s in %s", rec.Name, time.Since(start).Round(time.Second)))
	return s.Open(dst)
}

// maxConvertLog bounds a conversion's log.
const maxConvertLog = 16 << 20

// boundedLog writes to w until left bytes are written, then one line that
// says the rest was dropped, then nothing; it never fails a write.
type boundedLog struct {
	mu   sync.Mutex
	w    io.Writer
	left int64
	cut  bool
}

func (b *boundedLog) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case int64(len(p)) <= b.left:
		b.left -= int64(len(p))
		_, _ = b.w.Write(p)
	case !b.cut:
		b.cut = true
		_, _ = b.w.Write(p[:b.left])
		b.left = 0
		_, _ = io.WriteString(b.w, "\nkosa8: the converter's log is cut here (it passed 16 MiB)\n")
	}
	return len(p), nil
}

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkImageConfig bounds what of the image config reaches commands.
func checkImageConfig(env []string, dir, user string) error {
	if len(env) > 1000 {
		return fmt.Errorf("the image config sets %d environment variables, more than 1000", len(env))
	}
	for _, e := range env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || !envKeyRE.MatchString(k) || len(e) > 64<<10 || strings.ContainsRune(e, 0) {
			return fmt.Errorf("the image config's environment entry %q is not KEY=VALUE", clipText(e))
		}
	}
	if dir != "" && (!strings.HasPrefix(dir, "/") || len(dir) > 4096 || strings.ContainsRune(dir, 0)) {
		return fmt.Errorf("the image config's WorkingDir %q is not an absolute path", clipText(dir))
	}
	if len(user) > 256 || strings.ContainsAny(user, "\x00\n") {
		return fmt.Errorf("the image config's User %q is not a user", clipText(user))
	}
	return nil
}

func clipText(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strconv.Quote(s)
}

// writeLayersDisk decompresses rec's layers one after another onto a new
// raw disk at p, each at a 1 MiB boundary and sparse (runs of zeros are
// holes), checking each against its diff id and the bounds. It returns
// where each layer is and their total size.
func writeLayersDisk(ctx context.Context, cache oci.Cache, rec *oci.Record, p string, lim oci.Limits) ([]unpack.Layer, int64, error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var layers []unpack.Layer
	var off, total int64
	for i, l := range rec.Layers {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		n, err := decompressLayer(cache, l, f, off, lim.Unpacked-total, lim)
		if err != nil {
			return nil, 0, fmt.Errorf("layer %d of %s: %w", i+1, rec.Name, err)
		}
		layers = append(layers, unpack.Layer{Off: off, Size: n})
		total += n
		off = (off + n + 1<<20 - 1) &^ (1<<20 - 1)
		if n == 0 {
			off += 1 << 20
		}
	}
	if err := f.Truncate(off + 1<<20); err != nil {
		return nil, 0, err
	}
	return layers, total, f.Close()
}

// errBomb: a layer grows past the bounds when decompressed.
var errBomb = errors.New("a decompression bomb?")

func decompressLayer(cache oci.Cache, l oci.Layer, w io.WriterAt, off, room int64, lim oci.Limits) (int64, error) {
	comp, err := oci.LayerCompression(l.MediaType)
	if err != nil {
		return 0, err
	}
	bf, err := cache.OpenBlob(l.Digest)
	if err != nil {
		return 0, fmt.Errorf("%w (pull the image again)", err)
	}
	defer bf.Close()
	// The blob was checked when it was stored; read again here, the
	// digest is checked again on the way (a damaged cache is caught).
	ch := sha256.New()
	var r io.Reader = io.TeeReader(bufio.NewReaderSize(bf, 1<<20), ch)
	switch comp {
	case oci.Gzip:
		zr, err := kgzip.NewReader(r)
		if err != nil {
			return 0, fmt.Errorf("not gzip: %w", err)
		}
		defer zr.Close()
		r = zr
	case oci.Zstd:
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20), zstd.WithDecoderMaxMemory(512<<20))
		if err != nil {
			return 0, err
		}
		defer zr.Close()
		r = zr
	}
	// At most the room left in the image's bound and, past the ratio's
	// floor, Ratio times the compressed size.
	max := room
	if lim.Ratio > 0 {
		max = min(room, lim.Ratio*l.Size)
		max = min(room, maxInt(max, lim.RatioFloor))
	}
	dh := sha256.New()
	n, err := copySparseAt(w, off, io.TeeReader(io.LimitReader(r, max+1), dh), max)
	if err != nil {
		if errors.Is(err, errBomb) {
			return n, fmt.Errorf("its %d bytes decompress to more than %d (past %d times its size, or the image's %d bytes in all): %w", l.Size, max, lim.Ratio, lim.Unpacked, errBomb)
		}
		return n, fmt.Errorf("decompress: %w", err)
	}
	if comp != oci.Uncompressed {
		// The rest of the compressed stream: the digest covers it all.
		if _, err := io.Copy(io.Discard, io.TeeReader(bf, ch)); err != nil {
			return n, err
		}
	}
	if got := "sha256:" + hex.EncodeToString(dh.Sum(nil)); got != l.DiffID {
		return n, fmt.Errorf("its uncompressed bytes hash to %s, and the image config says %s: %w", got, l.DiffID, oci.ErrDigest)
	}
	if comp == oci.Uncompressed {
		return n, nil
	}
	if got := "sha256:" + hex.EncodeToString(ch.Sum(nil)); got != l.Digest {
		return n, fmt.Errorf("the cached blob hashes to %s, not %s (run 'kosa8 image prune' and pull again): %w", got, l.Digest, oci.ErrDigest)
	}
	return n, nil
}

// copySparseAt copies r to w at off, skipping blocks of zeros, failing
// with errBomb past max bytes.
func copySparseAt(w io.WriterAt, off int64, r io.Reader, max int64) (int64, error) {
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := io.ReadFull(r, buf)
		if k > 0 {
			if n+int64(k) > max {
				return n, errBomb
			}
			for b := 0; b < k; b += 64 << 10 {
				e := min(b+64<<10, k)
				if !zeros(buf[b:e]) {
					if _, werr := w.WriteAt(buf[b:e], off+n+int64(b)); werr != nil {
						return n, werr
					}
				}
			}
			n += int64(k)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

func zeros(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Serial numbers of the converter VM's disks.
const (
	convLayersSerial = "layers"
	convOutSerial    = "oci"
)

// converterShell runs in the converter VM as root: $1 the layers
// (OFF:SIZE,...), $2 the bound on their members, $3 the image's User.
const converterShell = `set -eu
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
disk() {
  for d in /sys/block/vd*; do
    if [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ]; then echo "/dev/${d##*/}"; return; fi
  done
  echo "kosa8: no disk with serial $1" >&2; exit 1
}
layers=$(disk ` + convLayersSerial + `)
out=$(disk ` + convOutSerial + `)
unpack="/run/kosa8/agent unpack"
echo "kosa8: step count"
n=$($unpack count -disk "$layers" -layers "$1" -max-files "$2")
echo "kosa8: step mkfs"
# At least the default density of inodes (one per 16 KiB), more for an
# image of many small files; no journal while unpacking (added after).
inodes=$(( $(blockdev --getsize64 "$out") / 16384 ))
[ "$inodes" -gt $(( n + n / 2 + 16384 )) ] || inodes=$(( n + n / 2 + 16384 ))
mke2fs -q -F -t ext4 -O ^has_journal -N "$inodes" -L kosa8-root -b 4096 -m 0 -E nodiscard "$out"
mkdir -p /mnt/oci
mount -t ext4 -o noatime,nosuid,nodev "$out" /mnt/oci
echo "kosa8: step unpack-layers $n"
stats=$($unpack apply -disk "$layers" -root /mnt/oci -layers "$1" -max-files "$2")
report=$($unpack fixup -root /mnt/oci -ca /etc/ssl/certs/ca-certificates.crt -user "$3")
umount /mnt/oci
echo "kosa8: step journal"
tune2fs -O has_journal "$out" >/dev/null
sync
echo "KOSA8-STATS $stats"
echo "KOSA8-REPORT $report"
`

// Deadlines of the converter VM.
const (
	convRunTimeout = 60 * time.Minute
	convMemoryMiB  = 1024
)

// runConverter boots the converter VM and unpacks the layers in it.
func runConverter(ctx context.Context, base *Image, work, layersDisk, rootfs string, layers []unpack.Layer, user string, lim oci.Limits, o ConvertOptions, progress func(string), logw io.Writer) (_ *unpack.Report, _ *unpack.Stats, err error) {
	if o.Agent == "" {
		return nil, nil, errors.New("converting an image boots a converter VM: kosa8-agent is needed ('make build')")
	}
	if o.NewDriver == nil || o.Layers == nil {
		return nil, nil, errors.New("converting an image boots a converter VM, and no VMM driver was given")
	}
	logf, err := os.Create(filepath.Join(work, "convert.log"))
	if err != nil {
		return nil, nil, err
	}
	defer logf.Close()
	// What the converter VM prints is the guest's (an unpacker a layer
	// subverted could print without end): bounded.
	logw = &boundedLog{w: io.MultiWriter(logw, logf), left: maxConvertLog}
	initrd, err := base.Initramfs(o.Agent)
	if err != nil {
		return nil, nil, err
	}
	root := filepath.Join(work, "root."+o.Layers.Format())
	if err := o.Layers.Create(ctx, root, base.RootFS(), "raw", 0); err != nil {
		return nil, nil, fmt.Errorf("the converter VM's root: %w", err)
	}
	arch := base.Manifest.Recipe.Arch
	drv, err := o.NewDriver(arch, o.Accel)
	if err != nil {
		return nil, nil, err
	}
	console := filepath.Join(work, "console.log")
	spec := &vmspec.Spec{
		Name: "image-converter", Arch: arch, CPUs: 1, MemoryMiB: convMemoryMiB,
		Kernel: base.Kernel().Image, Initrd: initrd,
		Cmdline:    fmt.Sprintf("panic=-1 loglevel=4 kosa8.user=%s kosa8.uid=%d kosa8.gid=%d kosa8.hostname=kosa8-convert", firstBootUser, firstBootUID, firstBootUID),
		ConsoleLog: console,
		AgentPort:  firstBootPort,
		Disks: []vmspec.Disk{
			{ID: "root", Path: root, Format: o.Layers.Format(), Scratch: true},
			{ID: convLayersSerial, Path: layersDisk, Format: "raw", ReadOnly: true},
			{ID: convOutSerial, Path: rootfs, Format: "raw", Scratch: true},
		},
	}
	start := time.Now()
	m, c, err := bootBuilder(ctx, drv, spec, o.BuildOptions, func(s string) { progress(strings.Replace(s, "builder", "converter", 1)) }, logw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w%s", err, consoleLines(console, 15))
	}
	refused := false // the unpacker refused the image: its words say why
	defer func() {
		select {
		case <-m.Done():
		default:
			_ = m.Kill()
		}
		if err != nil && !refused {
			err = fmt.Errorf("%w%s", err, consoleLines(console, 10))
		}
	}()
	defer c.Close()
	fmt.Fprintf(logw, "kosa8: converter VM: agent up after %s\n", time.Since(start).Round(time.Millisecond))
	var spec2 []string
	for _, l := range layers {
		spec2 = append(spec2, fmt.Sprintf("%d:%d", l.Off, l.Size))
	}
	runCtx, cancel := context.WithTimeout(ctx, convRunTimeout)
	defer cancel()
	conn, _, err := c.Exec(runCtx, &guest.ExecRequest{Argv: []string{"/bin/sh", "-c", converterShell, "sh", strings.Join(spec2, ","), strconv.Itoa(lim.Files), user}, User: "root", Dir: "/"})
	if err != nil {
		return nil, nil, fmt.Errorf("start the conversion: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(runCtx, func() { conn.Close() })
	defer stop()
	t0 := time.Now()
	var statsLine, reportLine string
	stdout := newLineLog(logw, func(line string) {
		if s := convStep(line); s != "" {
			fmt.Fprintf(logw, "kosa8: converter VM: %s, at %s\n", s, time.Since(t0).Round(time.Millisecond))
			progress(s)
		}
		if v, ok := strings.CutPrefix(line, "KOSA8-STATS "); ok {
			statsLine = v
		}
		if v, ok := strings.CutPrefix(line, "KOSA8-REPORT "); ok {
			reportLine = v
		}
	})
	stderr := newLineLog(logw, func(string) {})
	st, err := guest.Pump(conn, guest.StdIO{Stdout: stdout, Stderr: stderr})
	stdout.Close()
	last := stderr.Close()
	if err == nil && runCtx.Err() != nil {
		err = runCtx.Err()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("the converter VM: %w", err)
	}
	if st.Code != 0 || st.Error != "" {
		lines, ok := convErrorLines(last)
		if ok {
			refused = true
			return nil, nil, fmt.Errorf("the image was refused:\n%s", lines)
		}
		return nil, nil, fmt.Errorf("the converter VM failed (exit status %d%s):\n%s", st.Code, st.Error, lines)
	}
	fmt.Fprintf(logw, "kosa8: converter VM: done after %s\n", time.Since(start).Round(time.Millisecond))
	stopCtx, cancelStop := context.WithTimeout(ctx, builderStopTimeout)
	defer cancelStop()
	_ = c.Poweroff(stopCtx) // the script synced the disk
	if err := m.Wait(stopCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(logw, "kosa8: converter VM: %v\n", err)
	}
	return parseConvOutput(statsLine, reportLine)
}

// convErrorLines keeps the unpacker's own errors (what the user needs:
// which layer and member, which bound) from the VM's last lines.
func convErrorLines(last string) (string, bool) {
	var keep []string
	for _, l := range strings.Split(last, "\n") {
		if strings.HasPrefix(l, "kosa8-unpack: ") {
			keep = append(keep, l)
		}
	}
	if len(keep) == 0 {
		return last, false
	}
	return strings.Join(keep, "\n"), true
}

// convStep is the progress line for a line the converter printed: fixed
// words only (a member name never reaches the progress line).
func convStep(line string) string {
	step, ok := strings.CutPrefix(line, "kosa8: step ")
	if !ok {
		return ""
	}
	what, n, _ := strings.Cut(step, " ")
	switch what {
	case "count":
		return "counting the image's files (in the converter VM)"
	case "mkfs":
		return "making the root filesystem"
	case "unpack-layers":
		if n == "" || len(n) > 8 || strings.Trim(n, "0123456789") != "" {
			n = "the"
		}
		return "unpacking " + n + " files and directories (in the converter VM, under the image's bounds)"
	case "journal":
		return "finishing the root filesystem"
	}
	return ""
}

// osIDRE is an os-release ID.
var osIDRE = regexp.MustCompile(`^[a-z0-9._-]{1,32}$`)

// userNameRE is the agent's rule for the default user's name.
var userNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// parseConvOutput reads the converter VM's report: it unpacked hostile
// layers, so every field is checked before it is used.
func parseConvOutput(statsLine, reportLine string) (*unpack.Report, *unpack.Stats, error) {
	var st unpack.Stats
	var rep unpack.Report
	if len(statsLine) > 64<<10 || len(reportLine) > 64<<10 {
		return nil, nil, errors.New("the converter VM's report is too long")
	}
	if err := json.Unmarshal([]byte(statsLine), &st); err != nil {
		return nil, nil, fmt.Errorf("the converter VM's statistics: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(reportLine)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		return nil, nil, fmt.Errorf("the converter VM's report: %w", err)
	}
	switch rep.Shell {
	case "", "/bin/bash", "/bin/sh", "/usr/bin/bash", "/usr/bin/sh":
	default:
		return nil, nil, fmt.Errorf("the converter VM reports the shell %q", clipText(rep.Shell))
	}
	if !osIDRE.MatchString(rep.OS) {
		rep.OS = ""
	}
	switch rep.Packages {
	case "", "apt", "apk":
	default:
		return nil, nil, fmt.Errorf("the converter VM reports the package manager %s", clipText(rep.Packages))
	}
	if len(rep.Added) > 32 {
		rep.Added = rep.Added[:32]
	}
	for i, a := range rep.Added {
		if len(a) > 64 || !strings.HasPrefix(a, "/") || strings.ContainsAny(a, "\x00\n\x1b") {
			return nil, nil, fmt.Errorf("the converter VM reports adding %s", clipText(a))
		}
		rep.Added[i] = a
	}
	if u := rep.User; u != nil {
		// The sandbox's default user is a named account with a group of
		// its own; an image User that is not (root's group, say) leaves
		// kosa8's user the default.
		if !userNameRE.MatchString(u.Name) || u.UID <= 0 || u.UID > 1<<31-2 || u.GID <= 0 || u.GID > 1<<31-2 {
			rep.User = nil
		}
	}
	return &rep, &st, nil
}

// lockFile takes an exclusive lock on p, telling waiting when it must
// wait; unlock by closing the file.
func lockFile(ctx context.Context, p string, waiting func()) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := flock(f, false); err == nil {
		return f, nil
	}
	if waiting != nil {
		waiting()
	}
	done := make(chan error, 1)
	go func() { done <- flock(f, true) }()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	case <-ctx.Done():
		f.Close()
		return nil, ctx.Err()
	}
}

func maxInt(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

func flock(f *os.File, block bool) error {
	how := syscall.LOCK_EX
	if !block {
		how |= syscall.LOCK_NB
	}
	return syscall.Flock(int(f.Fd()), how)
}
