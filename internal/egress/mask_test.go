package egress

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"
)

const secret = "sk-live-AbC+/=9 x"

func maskAll(t *testing.T, in string, chunk int) string {
	t.Helper()
	pats := secretForms([]byte(secret))
	reps := make([][]byte, len(pats))
	for i := range reps {
		reps[i] = []byte("PH")
	}
	var src io.Reader = strings.NewReader(in)
	if chunk > 0 {
		src = &chunked{s: in, n: chunk}
	}
	out, err := io.ReadAll(newReplacingReader(src, pats, reps))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// chunked returns n bytes per Read, splitting patterns everywhere.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := min(c.n, len(c.s), len(p))
	copy(p, c.s[:k])
	c.s = c.s[k:]
	return k, nil
}

func TestMaskAllForms(t *testing.T) {
	forms := []string{
		secret,
		base64.StdEncoding.EncodeToString([]byte(secret)),
		base64.RawURLEncoding.EncodeToString([]byte(secret)),
		url.QueryEscape(secret),
		url.PathEscape(secret),
	}
	for _, f := range forms {
		in := `{"echo":"` + f + `","again":"` + f + `"}`
		for _, chunk := range []int{0, 1, 2, 3, 7, 64} {
			got := maskAll(t, in, chunk)
			if strings.Contains(got, secret) || strings.Contains(got, f) {
				t.Fatalf("form %q split by %d survived: %q", f, chunk, got)
			}
			if strings.Count(got, "PH") != 2 {
				t.Fatalf("form %q split by %d: %q", f, chunk, got)
			}
		}
	}
	if got := maskAll(t, "nothing secret here", 1); got != "nothing secret here" {
		t.Fatalf("changed clean text: %q", got)
	}
	if got := maskAll(t, "sk-live-AbC", 3); got != "sk-live-AbC" {
		t.Fatalf("a partial match at EOF must be passed on: %q", got)
	}
}

// TestMaskDoesNotDelayEvents: a server-sent event that cannot be part of
// the secret comes out at once.
func TestMaskDoesNotDelayEvents(t *testing.T) {
	pr, pw := io.Pipe()
	r := newReplacingReader(pr, [][]byte{[]byte(secret)}, [][]byte{[]byte("PH")})
	go pw.Write([]byte("data: hello\n\n"))
	buf := make([]byte, 64)
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "data: hello\n\n" {
		t.Fatalf("event delayed or changed: %q %v", buf[:n], err)
	}
	pw.Close()
}

func TestGuardStopsBeforePassing(t *testing.T) {
	ph := "kosa8-ph-0123456789abcdef"
	body := "harmless " + strings.Repeat("x", 100) + ph + " tail"
	tripped := false
	r := newGuardReader(iotest.OneByteReader(strings.NewReader(body)), [][]byte{[]byte(ph)}, func() { tripped = true })
	out, err := io.ReadAll(r)
	if !errors.Is(err, errExfiltration) || !tripped {
		t.Fatalf("err %v tripped %v", err, tripped)
	}
	if bytes.Contains(out, []byte("kosa8-ph-0123456789abcdef")) {
		t.Fatalf("the placeholder was passed on: %q", out)
	}
	clean, err := io.ReadAll(newGuardReader(strings.NewReader("kosa8-ph-but-not-ours"), [][]byte{[]byte(ph)}, nil))
	if err != nil || string(clean) != "kosa8-ph-but-not-ours" {
		t.Fatalf("clean body: %q %v", clean, err)
	}
}

func FuzzMask(f *testing.F) {
	f.Add("prefix "+secret+" suffix", 3)
	f.Add(base64.StdEncoding.EncodeToString([]byte(secret)), 1)
	f.Fuzz(func(t *testing.T, in string, chunk int) {
		if chunk <= 0 || chunk > 1000 {
			chunk = 1
		}
		got := maskAll(t, in, chunk)
		if strings.Contains(got, secret) {
			t.Fatalf("secret survived in %q", got)
		}
		for _, f := range secretForms([]byte(secret)) {
			if strings.Contains(got, string(f)) && !strings.Contains(in, string(f)) {
				t.Fatalf("masking created form %q: %q → %q", f, in, got)
			}
		}
		if !strings.ContainsAny(in, "sc") && got != in {
			t.Fatalf("text that cannot start any form changed: %q → %q", in, got)
		}
	})
}

func TestSecretTripwire(t *testing.T) {
	key := "sk-real-key-DO-NOT-LEAK-42"
	forms := secretForms([]byte(key))
	clean := "hello sk-real- world, sk-re almost, and " + key[:tripwireHold-1]
	for cut := 1; cut < len(clean); cut++ {
		tw := &secretTripwire{r: &chunked{s: clean, n: cut}, forms: forms}
		got, err := io.ReadAll(tw)
		if err != nil || string(got) != clean {
			t.Fatalf("cut %d: clean stream changed: %q, %v", cut, got, err)
		}
	}
	dirty := "data: " + key + " end"
	for cut := 1; cut < len(dirty); cut++ {
		hit := false
		tw := &secretTripwire{r: &chunked{s: dirty, n: cut}, forms: forms, onHit: func() { hit = true }}
		got, err := io.ReadAll(tw)
		if !errors.Is(err, errExfiltration) || !hit {
			t.Fatalf("cut %d: the key passed without a trip: %q, %v", cut, got, err)
		}
		if strings.Contains(string(got), key[:tripwireHold]) {
			t.Fatalf("cut %d: the start of the key passed: %q", cut, got)
		}
	}
}

// maskSSE runs in through the event-stream masker, n bytes per read.
func maskSSE(t *testing.T, in string, chunk int) string {
	t.Helper()
	pats := secretForms([]byte(secret))
	reps := make([][]byte, len(pats))
	for i := range reps {
		reps[i] = []byte("PH")
	}
	out, err := io.ReadAll(newEventStreamReplacingReader(&chunked{s: in, n: chunk}, pats, reps))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// sseData is the data a client joining an event stream reads: each data
// line's value, concatenated.
func sseData(stream string) string {
	var b strings.Builder
	for _, line := range strings.FieldsFunc(stream, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			b.WriteString(strings.TrimPrefix(v, " "))
		}
	}
	return b.String()
}

// A key an upstream echoes split across data lines of one event stream (in
// one event or two, with event, id and comment lines between) is masked:
// the client joining the data reads the placeholder, and the events keep
// their framing.
func TestMaskKeySplitAcrossEventStreamLines(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString([]byte(secret))
	for name, in := range map[string]string{
		"two data lines of one event": "data: before " + secret[:9] + "\ndata: " + secret[9:] + " after\n\n",
		"two events":                  "data: " + secret[:10] + "\n\ndata: " + secret[10:] + "\n\n",
		"three pieces, CRLF":          "data: " + secret[:8] + "\r\n\r\ndata:" + secret[8:12] + "\r\n\r\ndata: " + secret[12:] + "\r\n\r\n",
		"fields between":              "event: delta\ndata: " + secret[:11] + "\n\n: keep-alive\n\nid: 7\nevent: delta\ndata: " + secret[11:] + "\n\n",
		"empty data line between":     "data: " + secret[:9] + "\ndata:\ndata: " + secret[9:] + "\n\n",
		"base64, split":               "data: " + b64[:12] + "\n\ndata: " + b64[12:] + "\n\n",
	} {
		for _, chunk := range []int{1, 2, 5, 64, 4096} {
			got := maskSSE(t, in, chunk)
			if data := sseData(got); strings.Contains(data, secret) || strings.Contains(data, b64[:len(b64)-1]) || !strings.Contains(data, "PH") {
				t.Errorf("%s, %d bytes a read: the joined data reads %q (stream %q)", name, chunk, data, got)
			}
			if strings.Count(got, "data:") != strings.Count(in, "data:") {
				t.Errorf("%s: the framing changed: %q → %q", name, in, got)
			}
		}
	}
	// Text that only looks like a start of the key, and events in between,
	// pass unchanged; a short prefix at a line's end holds nothing back.
	for _, in := range []string{
		"data: " + secret[:9] + "\n\ndata: not the rest\n\n",
		"data: sk-\n\ndata: live\n\n",
		"data: " + secret[:9] + "\n\n: comment\n\n",
	} {
		if got := maskSSE(t, in, 3); got != in {
			t.Errorf("changed %q to %q", in, got)
		}
	}
	pr, pw := io.Pipe()
	r := newEventStreamReplacingReader(pr, [][]byte{[]byte(secret)}, [][]byte{[]byte("PH")})
	go pw.Write([]byte("data: ask\n\n"))
	buf := make([]byte, 64)
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "data: ask\n\n" {
		t.Fatalf("an event ending in a short prefix of the key was held back: %q %v", buf[:n], err)
	}
	pw.Close()
}

func FuzzMaskEventStream(f *testing.F) {
	f.Add("data: "+secret[:9]+"\n\ndata: "+secret[9:]+"\n\n", 3)
	f.Add("event: x\ndata: "+secret+"\n\n", 1)
	f.Fuzz(func(t *testing.T, in string, chunk int) {
		if chunk <= 0 || chunk > 1000 {
			chunk = 1
		}
		got := maskSSE(t, in, chunk)
		if strings.Contains(got, secret) {
			t.Fatalf("secret survived in %q", got)
		}
		if !strings.ContainsAny(in, "sc") && got != in {
			t.Fatalf("text that cannot start any form changed: %q → %q", in, got)
		}
	})
}
