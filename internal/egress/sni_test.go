package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// realHello captures the ClientHello crypto/tls sends for cfg.
func realHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c, s := net.Pipe()
	go func() {
		_ = tls.Client(c, cfg).Handshake()
	}()
	var buf bytes.Buffer
	_ = s.SetReadDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(io.TeeReader(s, &buf))
	// One record header plus its body is the whole hello from crypto/tls.
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(r, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatal(err)
	}
	s.Close()
	c.Close()
	return append(hdr, body...)
}

func TestPeekMatchesCryptoTLS(t *testing.T) {
	cases := []*tls.Config{
		{ServerName: "api.example.com"},
		{ServerName: "registry.npmjs.org", NextProtos: []string{"h2", "http/1.1"}},
		// X25519MLKEM768 makes the hello over 1 KiB.
		{ServerName: "pq.example.org", CurvePreferences: []tls.CurveID{tls.X25519MLKEM768, tls.X25519}},
		{ServerName: "", InsecureSkipVerify: true},
	}
	for _, cfg := range cases {
		raw := realHello(t, cfg)
		r := bufio.NewReader(bytes.NewReader(raw))
		h, n, err := peekClientHello(r)
		if err != nil {
			t.Fatalf("%q: %v", cfg.ServerName, err)
		}
		if h.ServerName != cfg.ServerName {
			t.Errorf("SNI %q, want %q", h.ServerName, cfg.ServerName)
		}
		if len(cfg.NextProtos) > 0 && len(h.ALPN) != len(cfg.NextProtos) {
			t.Errorf("ALPN %v, want %v", h.ALPN, cfg.NextProtos)
		}
		if n != len(raw) {
			t.Errorf("consumed %d of %d bytes", n, len(raw))
		}
		if r.Buffered() != len(raw) {
			t.Error("peek consumed bytes")
		}
	}
}

// fragment splits a single-record hello into records of at most size bytes
// of handshake data each.
func fragment(raw []byte, size int) []byte {
	body := raw[5:]
	var out []byte
	for len(body) > 0 {
		n := min(size, len(body))
		out = append(out, 22, 3, 1, byte(n>>8), byte(n))
		out = append(out, body[:n]...)
		body = body[n:]
	}
	return out
}

func TestPeekReassemblesRecordsAndSegments(t *testing.T) {
	raw := realHello(t, &tls.Config{ServerName: "split.example.com", CurvePreferences: []tls.CurveID{tls.X25519MLKEM768}})
	frag := fragment(raw, 100)
	// Arrives one byte at a time, as tiny TCP segments would.
	pr, pw := io.Pipe()
	go func() {
		for _, b := range frag {
			pw.Write([]byte{b})
		}
		pw.Close()
	}()
	h, n, err := peekClientHello(bufio.NewReaderSize(pr, 70<<10))
	if err != nil || h.ServerName != "split.example.com" || n != len(frag) {
		t.Fatalf("fragmented hello: %+v n=%d/%d err=%v", h, n, len(frag), err)
	}
}

func TestPeekRejects(t *testing.T) {
	good := realHello(t, &tls.Config{ServerName: "ok.example"})
	withSNI := func(name string) []byte {
		// Rebuild a hello with a forged server_name entry list.
		sni := []byte{0, 0}
		entry := append([]byte{0, byte(len(name) >> 8), byte(len(name))}, name...)
		list := append([]byte{byte(len(entry) >> 8), byte(len(entry))}, entry...)
		sni = append(sni, byte(len(list)>>8), byte(len(list)))
		sni = append(sni, list...)
		return helloWithExtensions(sni)
	}
	dup := func() []byte {
		one := []byte{0, 0, 0, 8, 0, 6, 0, 0, 3, 'a', '.', 'b'}
		return helloWithExtensions(append(one, one...))
	}
	cases := map[string][]byte{
		"not tls":         []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"truncated":       good[:len(good)-10],
		"nul in sni":      withSNI("ok.example\x00.evil.net"),
		"space in sni":    withSNI("ok example"),
		"dup extension":   dup(),
		"huge record":     {22, 3, 1, 0xff, 0xff},
		"not clienthello": {22, 3, 1, 0, 4, 2, 0, 0, 0},
		"huge hello":      {22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if h, _, err := peekClientHello(bufio.NewReaderSize(bytes.NewReader(in), 70<<10)); err == nil {
				t.Fatalf("accepted: %+v", h)
			}
		})
	}
}

// helloWithExtensions builds a minimal ClientHello record with exts.
func helloWithExtensions(exts []byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...)
	body = append(body, 0)                // session id
	body = append(body, 0, 2, 0x13, 0x01) // one cipher suite
	body = append(body, 1, 0)             // null compression
	body = append(body, byte(len(exts)>>8), byte(len(exts)))
	body = append(body, exts...)
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{22, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
}

func FuzzPeekClientHello(f *testing.F) {
	f.Add(realHello(f, &tls.Config{ServerName: "fuzz.example"}))
	f.Add(fragment(realHello(f, &tls.Config{ServerName: "a.b"}), 7))
	f.Add(helloWithExtensions([]byte{0, 0, 0, 5, 0, 3, 0, 0, 0}))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, n, err := peekClientHello(bufio.NewReaderSize(bytes.NewReader(in), 70<<10))
		if err != nil {
			return
		}
		if n > len(in) {
			t.Fatalf("consumed %d of %d bytes", n, len(in))
		}
		for i := 0; i < len(h.ServerName); i++ {
			if c := h.ServerName[i]; c <= 0x20 || c >= 0x7f {
				t.Fatalf("server name with byte %#x", c)
			}
		}
	})
}
