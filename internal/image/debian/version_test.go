package debian

import (
	"archive/tar"
	"bytes"
	"io"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestCompareVersions(t *testing.T) {
	// Cases from dpkg's own test suite (t-version.c) and Debian policy.
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"1.0", "1.0", 0},
		{"1.0~rc1", "1.0", -1},
		{"1.0~rc1", "1.0~rc2", -1},
		{"1.0~~", "1.0~", -1},
		{"1.0~", "1.0", -1},
		{"1.0", "1.0+b1", -1},
		{"1.0a", "1.0", 1},
		{"1:0.1", "2.0", 1},
		{"0:1.0", "1.0", 0},
		{"00:1.0", "1.0", 0},
		{"1.0-1", "1.0-1.1", -1},
		{"1.0-1", "1.0", 1},
		{"1.0-0", "1.0", 0},
		{"2.30-5+b1", "2.30-5", 1},
		{"2.30-5+b1", "2.30-6", -1},
		{"2.36-9+deb12u4", "2.36-9+deb12u10", -1},
		{"1.2.3", "1.2.10", -1},
		{"1.002", "1.2", 0},
		{"0.1", "0.01", 0},
		{"1.0.0", "1.0", 1},
		{"1.0a", "1.0b", -1},
		{"1.0A", "1.0a", -1},
		{"1.0+", "1.0.", -1},
		{"1.0.", "1.0a", 1},
		{"2:1.0", "1:9.9", 1},
		{"99999999999999999999:1", "99999999999999999998:2", 1},
		{"1.0-1ubuntu1", "1.0-1", 1},
		{"3.13.5-1", "3.11~", 1},
	} {
		if got := CompareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := CompareVersions(tc.b, tc.a); got != -tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
}

func randVersion(r *rand.Rand) string {
	const chars = "0123456789abz.+~ABZ"
	part := func(alphabet string, n int) string {
		var b strings.Builder
		b.WriteByte("0123456789"[r.IntN(10)])
		for range r.IntN(n) {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	v := part(chars, 6)
	if r.IntN(3) == 0 {
		v = []string{"0", "1", "2"}[r.IntN(3)] + ":" + v
	}
	if r.IntN(2) == 0 {
		v += "-" + part(chars, 4)
	}
	return v
}

// TestCompareVersionsDpkg compares random pairs against the real dpkg.
func TestCompareVersionsDpkg(t *testing.T) {
	dpkg, err := exec.LookPath("dpkg")
	if err != nil {
		t.Skip("dpkg is not installed: no reference to compare with")
	}
	r := rand.New(rand.NewPCG(1, 2))
	n := 150
	if testing.Short() {
		n = 30
	}
	for range n {
		a, b := randVersion(r), randVersion(r)
		if r.IntN(4) == 0 {
			b = a[:len(a)/2+1] + string("~+.a0"[r.IntN(5)])
			if !validVersion(b) {
				b = a
			}
		}
		want := 0
		if exec.Command(dpkg, "--compare-versions", a, "lt", b).Run() == nil {
			want = -1
		} else if exec.Command(dpkg, "--compare-versions", a, "gt", b).Run() == nil {
			want = 1
		}
		if got := CompareVersions(a, b); got != want {
			t.Errorf("CompareVersions(%q, %q) = %d, dpkg says %d", a, b, got, want)
		}
	}
}

func TestValidVersionAndName(t *testing.T) {
	for _, v := range []string{"1.0", "1:2.3-4", "2.30-5+b1", "1.0~rc1-0.1~bpo", "0", "1.0-1-2"} {
		if !validVersion(v) {
			t.Errorf("validVersion(%q) = false", v)
		}
	}
	for _, v := range []string{"", "a1.0", ":1.0", "x:1.0", "1.0-", "1.0 1", "1.0/x", "1.0-a_b", "1:2:3"} {
		if validVersion(v) {
			t.Errorf("validVersion(%q) = true", v)
		}
	}
	for _, n := range []string{"libc6", "g++", "libstdc++6", "python3.13", "0ad"} {
		if !validName(n) {
			t.Errorf("validName(%q) = false", n)
		}
	}
	for _, n := range []string{"", "a", "Libc", "-x", ".x", "a_b", "a/b", "a b"} {
		if validName(n) {
			t.Errorf("validName(%q) = true", n)
		}
	}
}

func TestParseDeps(t *testing.T) {
	g, err := ParseDeps("libc6 (>= 2.36), default-mta | mail-transport-agent,\n python3:any (<< 3.14~), foo (<1), bar(=1.0)")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]Dep{
		{{"libc6", "", ">=", "2.36"}},
		{{"default-mta", "", "", ""}, {"mail-transport-agent", "", "", ""}},
		{{"python3", "any", "<<", "3.14~"}},
		{{"foo", "", "<=", "1"}},
		{{"bar", "", "=", "1.0"}},
	}
	if len(g) != len(want) {
		t.Fatalf("got %v", g)
	}
	for i := range want {
		if len(g[i]) != len(want[i]) {
			t.Fatalf("group %d: %v", i, g[i])
		}
		for j := range want[i] {
			if g[i][j] != want[i][j] {
				t.Errorf("group %d alt %d = %+v, want %+v", i, j, g[i][j], want[i][j])
			}
		}
	}
	for _, bad := range []string{"a,", ",a", "a | ", "foo [amd64]", "foo <!nocheck>", "Foo", "foo (>= )", "foo (~ 1)", "foo (>= 1", "foo:", "foo:AMD64", "foo bar"} {
		if _, err := ParseDeps(bad); err == nil {
			t.Errorf("ParseDeps(%q) accepted", bad)
		}
	}
	if g, err := ParseDeps("  "); g != nil || err != nil {
		t.Errorf("empty field: %v, %v", g, err)
	}
}

func TestParseStanzas(t *testing.T) {
	in := "Package: a\nDescription: one\n two\n .\n three\n\n\n# comment\nPackage: b\r\nversion: 1\r\n\n"
	var got []Stanza
	if err := ParseStanzas(strings.NewReader(in), func(s Stanza) error { got = append(got, s); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Get("description") != "one\ntwo\n.\nthree" || got[1].Get("Version") != "1" || got[1]["version"] != "1" {
		t.Fatalf("got %q", got)
	}
	for name, bad := range map[string]string{
		"continuation first": " x\n",
		"no colon":           "Package a\n",
		"duplicate":          "A: 1\na: 2\n",
		"long line":          "A: " + strings.Repeat("x", maxLineLen) + "\n",
		"many fields":        strings.Repeat("", 0) + manyFields(maxStanzaFields+1),
		"long stanza":        "A: x\n" + strings.Repeat(" "+strings.Repeat("y", 1000)+"\n", 5000),
	} {
		if err := ParseStanzas(strings.NewReader(bad), func(Stanza) error { return nil }); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func manyFields(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("F")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(string(rune('a'+i%26)) + string(rune('a'+i/26)))
		b.WriteString(": v\n")
	}
	return b.String()
}

func FuzzParseStanzas(f *testing.F) {
	f.Add([]byte("Package: a\nDescription: x\n y\n\nPackage: b\n"))
	f.Add([]byte("A: 1\r\n\r\n#c\nB:\n .\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := 0
		_ = ParseStanzas(bytes.NewReader(data), func(s Stanza) error {
			n++
			if len(s) == 0 || len(s) > maxStanzaFields {
				t.Fatalf("stanza with %d fields", len(s))
			}
			for k := range s {
				if s.Get(k) != s[k] {
					t.Fatalf("Get(%q) differs", k)
				}
			}
			return nil
		})
		if n > len(data) {
			t.Fatalf("%d stanzas from %d bytes", n, len(data))
		}
	})
}

func FuzzParseDeps(f *testing.F) {
	f.Add("libc6 (>= 2.36), a | b:any, c (<< 1:2.0~rc1-1)")
	f.Add("foo [amd64] <!nocheck>")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseDeps(s)
		if err != nil {
			return
		}
		for _, grp := range g {
			if len(grp) == 0 {
				t.Fatal("empty group")
			}
			for _, d := range grp {
				if !validName(d.Name) || (d.Op != "") != (d.Version != "") || (d.Version != "" && !validVersion(d.Version)) {
					t.Fatalf("bad dep %+v from %q", d, s)
				}
				// What String prints parses back to the same dependency.
				again, err := ParseDeps(d.String())
				if err != nil || len(again) != 1 || len(again[0]) != 1 || again[0][0] != d {
					t.Fatalf("%+v round-trips to %+v, %v", d, again, err)
				}
			}
		}
	})
}

func FuzzCompareVersions(f *testing.F) {
	f.Add("1.0~rc1", "1.0")
	f.Add("1:0.1", "2.0")
	f.Add("2.30-5+b1", "2.30-5")
	f.Add("x:1", "0:1")
	f.Fuzz(func(t *testing.T, a, b string) {
		ab, ba := CompareVersions(a, b), CompareVersions(b, a)
		if ab != -ba {
			t.Fatalf("CompareVersions(%q, %q) = %d but reversed %d", a, b, ab, ba)
		}
		if ab < -1 || ab > 1 {
			t.Fatalf("result %d", ab)
		}
		if CompareVersions(a, a) != 0 {
			t.Fatalf("%q != itself", a)
		}
	})
}

func FuzzDebData(f *testing.F) {
	f.Add(makeDeb(f, "a", "1.0", "amd64", "gz", map[string]string{"./x": "y"}))
	f.Add(makeDeb(f, "a", "1.0", "amd64", "xz", map[string]string{"./x": "y"}))
	f.Add(makeDeb(f, "a", "1.0", "amd64", "", map[string]string{"./x": "y"}))
	f.Add([]byte("!<arch>\n"))
	// Inputs of up to a few MiB at ratios of 10000:1 would otherwise spend
	// seconds each decompressing; the bound itself is what is exercised.
	defer func(old int64) { maxUnpacked = old }(maxUnpacked)
	maxUnpacked = 16 << 20
	// The input is read in memory, not written to a file and opened twice:
	// go test -fuzz minimizes every new-coverage input before it reports
	// any count, trying up to n²/2 candidates (3 million for the 2.4 KiB
	// uncompressed seed) for up to -fuzzminimizetime (60s). At the 250µs a
	// file round trip costs, that was every second of a 10s or 30s run,
	// shown as 0 execs/sec (TestFuzzDebDataFast).
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzDeb(data)
	})
}

// fuzzDeb is FuzzDebData's body: DebControl and DebData on the .deb data.
func fuzzDeb(data []byte) {
	r := bytes.NewReader(data)
	if tr, closeDec, err := openTarAt(r, int64(len(data)), "control"); err == nil {
		_, _ = readControl(tr, "fuzz.deb")
		closeDec()
	}
	if tr, closeDec, err := openTarAt(r, int64(len(data)), "data"); err == nil {
		_ = walkData(tr, "fuzz.deb", func(hdr *tar.Header, r io.Reader) error {
			_, err := io.Copy(io.Discard, io.LimitReader(r, 1<<20))
			return err
		})
		closeDec()
	}
}

// TestFuzzDebDataFast keeps FuzzDebData's body cheap enough for go test
// -fuzz to minimize a new input in seconds: the minimizer first removes one
// byte at a time, then every run of bytes, each candidate one call. The
// body once wrote a file and opened it twice per call (about 250µs; a few
// µs in memory), so a 30s run spent its time minimizing at 0 execs/sec.
func TestFuzzDebDataFast(t *testing.T) {
	defer func(old int64) { maxUnpacked = old }(maxUnpacked)
	maxUnpacked = 16 << 20
	var cands [][]byte
	for _, comp := range []string{"gz", "xz", ""} {
		seed := makeDeb(t, "a", "1.0", "amd64", comp, map[string]string{"./x": "y"})
		for i := range seed {
			cands = append(cands, append(append([]byte{}, seed[:i]...), seed[i+1:]...))
		}
	}
	best := time.Duration(1 << 62)
	for range 3 {
		start := time.Now()
		for _, c := range cands {
			fuzzDeb(c)
		}
		best = min(best, time.Since(start))
	}
	if mean := best / time.Duration(len(cands)); mean > 100*time.Microsecond {
		t.Errorf("FuzzDebData's body takes %v a call on the seeds' one-byte deletions; more than 100µs makes minimizing a 2 KiB input outlast -fuzztime", mean)
	}
}
