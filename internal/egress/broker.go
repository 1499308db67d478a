package egress

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
)

// Credential is a secret bound to a sandbox, as the broker uses it: the
// guest holds Placeholder; requests to Hosts get Header set to HeaderValue
// (which carries the real value); responses from Hosts have Value masked
// back to Placeholder.
type Credential struct {
	Name        string
	Hosts       *netpolicy.Policy // the secret's hosts as rules (port 443)
	Header      string
	HeaderValue string
	Value       []byte
	Placeholder string
}

// String never shows the value.
func (c Credential) String() string { return "credential " + c.Name }

// credentialsFor returns the credentials whose hosts include name.
func (g *Gateway) credentialsFor(name string) []*Credential {
	var out []*Credential
	for i := range g.cfg.Credentials {
		c := &g.cfg.Credentials[i]
		if c.Hosts.Decide(name, 443).Allow {
			out = append(out, c)
		}
	}
	return out
}

// placeholderForms are all placeholders of the sandbox in every form they
// could travel in.
func (g *Gateway) placeholderForms() [][]byte {
	var out [][]byte
	for _, c := range g.cfg.Credentials {
		out = append(out, secretForms([]byte(c.Placeholder))...)
	}
	return out
}

func containsAny(s string, forms [][]byte) bool {
	for _, f := range forms {
		if strings.Contains(s, string(f)) {
			return true
		}
	}
	return false
}

// maxScannedBody is the largest request body read whole and checked before
// anything is sent upstream; larger ones are checked as they stream and the
// request is cut off at a placeholder.
const maxScannedBody = 1 << 20

// isRead reports whether a request only reads: GET, HEAD, and git's fetch
// (git-upload-pack) over smart HTTP.
func isRead(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		return true
	case http.MethodPost:
		return strings.HasSuffix(r.URL.Path, "/git-upload-pack")
	}
	return false
}

// checkRequest applies the read-only rule and the placeholder rule to a
// request to an inspected host, then injects the host's credentials.
func (g *Gateway) checkRequest(r *http.Request, up *upstream, inject bool) error {
	if up.readOnly && !isRead(r) {
		return &refusal{kind: "read-only", reason: fmt.Sprintf("%s %s: %s is read-only (GET, HEAD and git fetch only)", r.Method, r.URL.Path, up.name)}
	}
	forms := g.placeholderForms()
	if len(forms) > 0 {
		// Where a placeholder may be: the declared header of a credential
		// for this host, which is about to be replaced anyway.
		mayCarry := map[string]bool{}
		for _, c := range up.creds {
			mayCarry[http.CanonicalHeaderKey(c.Header)] = true
		}
		exfil := func(where string) error {
			return &refusal{kind: "exfiltration", reason: "a secret's placeholder in " + where + " to " + up.name + ": refused"}
		}
		for k, vs := range r.Header {
			if mayCarry[k] && inject {
				continue
			}
			for _, v := range vs {
				if containsAny(v, forms) {
					return exfil("header " + k)
				}
			}
		}
		if containsAny(r.URL.RawPath+r.URL.Path+"?"+r.URL.RawQuery, forms) {
			return exfil("the URL")
		}
		if containsAny(r.Host, forms) {
			return exfil("the Host")
		}
		if r.Body != nil && r.Body != http.NoBody {
			if r.ContentLength >= 0 && r.ContentLength <= maxScannedBody {
				body, err := io.ReadAll(io.LimitReader(r.Body, maxScannedBody+1))
				r.Body.Close()
				if err != nil {
					return err
				}
				if containsAny(string(body), forms) {
					return exfil("the body")
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
			} else {
				name := up.name
				r.Body = newGuardReader(r.Body, forms, func() {
					g.audit(audit.Event{Kind: "exfiltration", Name: name, Decision: "deny", Reason: "a secret's placeholder in a streamed body: request cut off"})
				})
			}
		}
	}
	if inject {
		for _, c := range up.creds {
			r.Header.Set(c.Header, c.HeaderValue)
			g.audit(audit.Event{Kind: "broker", Name: up.name, Decision: "allow", Rule: "secret " + c.Name, Reason: "credential set in " + c.Header})
		}
		if len(up.creds) > 0 {
			// Uncompressed responses can be masked as they stream.
			r.Header.Set("Accept-Encoding", "identity")
		}
	}
	return nil
}

// maskResponse replaces the credentials' values (in every form) with their
// placeholders in a response's headers and body.
func (g *Gateway) maskResponse(resp *http.Response, creds []*Credential) error {
	if len(creds) == 0 {
		return nil
	}
	var pats, reps [][]byte
	for _, c := range creds {
		for _, f := range secretForms(c.Value) {
			pats = append(pats, f)
			reps = append(reps, []byte(c.Placeholder))
		}
	}
	// Keep longest first across credentials too.
	idx := make([]int, len(pats))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return len(pats[b]) - len(pats[a]) })
	sp, sr := make([][]byte, len(idx)), make([][]byte, len(idx))
	for i, j := range idx {
		sp[i], sr[i] = pats[j], reps[j]
	}
	for k, vs := range resp.Header {
		for i, v := range vs {
			out, _, _ := newMatcher(sp, sr).scan([]byte(v), true)
			resp.Header[k][i] = string(out)
		}
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// A tunnel (WebSocket): its frames cannot be rewritten without
		// breaking their lengths, so a credential seen in what the
		// upstream sends ends the tunnel instead.
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			return &refusal{kind: "broker", reason: "protocol switch without a tunnel"}
		}
		resp.Body = struct {
			io.Reader
			io.Writer
			io.Closer
		}{&secretTripwire{r: rwc, forms: sp, onHit: func() {
			g.audit(audit.Event{Kind: "broker", Decision: "deny", Reason: "a credential appeared in a tunnel from its host: tunnel closed"})
		}}, rwc, rwc}
		return nil
	}
	body := resp.Body
	switch strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))) {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return fmt.Errorf("decode gzip response to mask it: %w", err)
		}
		body = struct {
			io.Reader
			io.Closer
		}{zr, resp.Body}
	case "deflate":
		zr, err := zlib.NewReader(body)
		if err != nil {
			return fmt.Errorf("decode deflate response to mask it: %w", err)
		}
		body = struct {
			io.Reader
			io.Closer
		}{zr, resp.Body}
	default:
		// An encoding that cannot be decoded here cannot be masked: fail closed.
		return &refusal{kind: "broker", reason: "response in " + resp.Header.Get("Content-Encoding") + " encoding cannot be checked for secrets"}
	}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Body = newReplacingReader(body, sp, sr)
	return nil
}

// broker terminates the guest's TLS with a certificate from the sandbox's
// CA, connects to the real host (verified against the host's roots,
// offering the ALPN protocols the guest offered, so both sides speak
// whatever the server chose), and proxies requests one by one.
func (g *Gateway) broker(guest net.Conn, gr *bufio.Reader, up *upstream, hello *ClientHello) error {
	if g.cfg.CA == nil {
		return errors.New("inspection needs the sandbox CA")
	}
	var alpn []string
	for _, p := range hello.ALPN {
		if p == "h2" || p == "http/1.1" {
			alpn = append(alpn, p)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	upTLS := tls.Client(up.conn, g.tlsConfigFor(up.name, alpn))
	if err := upTLS.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("upstream TLS with %s: %v", up.name, err)
	}
	proto := upTLS.ConnectionState().NegotiatedProtocol
	leaf, err := g.cfg.CA.Leaf(up.name)
	if err != nil {
		return err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{*leaf}, MinVersion: tls.VersionTLS12}
	if proto != "" {
		cfg.NextProtos = []string{proto}
	}
	guestTLS := tls.Server(&bufferedConn{Conn: guest, r: gr}, cfg)
	if err := guestTLS.HandshakeContext(ctx); err != nil {
		upTLS.Close()
		return fmt.Errorf("guest TLS for %s: %v", up.name, err)
	}
	target := up.ev.Upstream
	return g.proxy(guestTLS, proxySpec{
		up:     up,
		scheme: "https",
		first:  upTLS,
		h2:     proto == "h2",
		redial: func(ctx context.Context) (net.Conn, error) {
			c, err := g.dialUpstream(ctx, target)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, g.tlsConfigFor(up.name, alpn))
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return tc, nil
		},
		onRequest: func(r *http.Request) error {
			if r.Header.Get("Upgrade") != "" {
				// Uncompressed frames, so that the tunnel's tripwire sees
				// what passes.
				r.Header.Del("Sec-WebSocket-Extensions")
			}
			return g.checkRequest(r, up, true)
		},
		onResponse: func(r *http.Response) error { return g.maskResponse(r, up.creds) },
	})
}

// secretTripwire passes a stream through and fails it (for good) once any
// of forms appears, also across read boundaries. Bytes that may be the
// start of a form (at least tripwireHold of them) wait for what follows;
// shorter starts pass, so an interactive stream never stalls on a byte or
// two that happen to begin a key.
type secretTripwire struct {
	r     io.Reader
	forms [][]byte
	onHit func()
	tail  []byte // the end of what was let through
	held  []byte // may begin a form: not let through yet
	out   []byte // let through, not read yet
	err   error
}

const tripwireHold = 8

func (t *secretTripwire) Read(p []byte) (int, error) {
	for len(t.out) == 0 {
		if t.err != nil {
			return 0, t.err
		}
		buf := make([]byte, max(len(p), 4096))
		n, err := t.r.Read(buf)
		data := append(t.held, buf[:n]...)
		t.held = nil
		win := append(append([]byte(nil), t.tail...), data...)
		for _, f := range t.forms {
			if bytes.Contains(win, f) {
				t.err, t.out = errExfiltration, nil
				if t.onHit != nil {
					t.onHit()
				}
				return 0, t.err
			}
		}
		h := 0
		if err == nil {
			h = min(t.startOfForm(win), len(data))
		} else {
			t.err = err // what is left goes out, then the error
		}
		t.out, t.held = data[:len(data)-h], append([]byte(nil), data[len(data)-h:]...)
		keep := 0
		for _, f := range t.forms {
			keep = max(keep, len(f)-1)
		}
		t.tail = append(t.tail, t.out...)
		if len(t.tail) > keep {
			t.tail = append([]byte(nil), t.tail[len(t.tail)-keep:]...)
		}
	}
	n := copy(p, t.out)
	t.out = t.out[n:]
	return n, nil
}

// startOfForm is the length of the longest end of data (what passed and
// what came) that begins a form, if at least tripwireHold long, else 0.
func (t *secretTripwire) startOfForm(data []byte) int {
	h := 0
	for _, f := range t.forms {
		for k := min(len(f)-1, len(data)); k >= tripwireHold && k > h; k-- {
			if bytes.HasSuffix(data, f[:k]) {
				h = k
				break
			}
		}
	}
	return h
}
