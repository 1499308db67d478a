package egress

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
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
	// OverBasic sets Header only on a request that carries HTTP Basic
	// auth already (a container registry's login: its token exchange
	// takes Basic auth, and the bearer tokens it hands out must pass to
	// the same host unchanged).
	OverBasic bool
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
	return g.placeholderFormsExcept(nil)
}

// placeholderFormsExcept are the placeholders of every credential but own
// (those of the host a request goes to), in every form.
func (g *Gateway) placeholderFormsExcept(own []*Credential) [][]byte {
	var out [][]byte
	for i := range g.cfg.Credentials {
		c := &g.cfg.Credentials[i]
		if slices.Contains(own, c) {
			continue
		}
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
//
// The placeholder rule: a secret's placeholder passes unchanged wherever it
// appears in a request to one of that secret's own hosts (an agent's
// conversation history carries it back to its API, and refusing it there
// kills the session; it is worthless anyway), and only the declared
// header is replaced by the real value. To any other host it is refused
// and logged as an exfiltration attempt: the tripwire.
func (g *Gateway) checkRequest(r *http.Request, up *upstream, inject bool) error {
	if up.readOnly && !isRead(r) {
		return &refusal{kind: "read-only", reason: fmt.Sprintf("%s %s: %s is read-only (GET, HEAD and git fetch only)", r.Method, r.URL.Path, up.name)}
	}
	if own := g.placeholderFormsOf(up.creds); len(own) > 0 {
		// Noted, not refused: where the agent's own placeholder went.
		for k, vs := range r.Header {
			if inject && slices.ContainsFunc(up.creds, func(c *Credential) bool { return http.CanonicalHeaderKey(c.Header) == k }) {
				continue
			}
			if slices.ContainsFunc(vs, func(v string) bool { return containsAny(v, own) }) {
				g.auditRepeat(audit.Event{Kind: "broker", Name: up.name, Decision: "allow", Reason: "a secret's placeholder in header " + k + " to its own host: passed unchanged"})
			}
		}
		if containsAny(r.URL.RawPath+r.URL.Path+"?"+r.URL.RawQuery, own) {
			g.auditRepeat(audit.Event{Kind: "broker", Name: up.name, Decision: "allow", Reason: "a secret's placeholder in the URL to its own host: passed unchanged"})
		}
	}
	forms := g.placeholderFormsExcept(up.creds)
	if len(forms) > 0 {
		exfil := func(where string) error {
			return &refusal{kind: "exfiltration", reason: "a secret's placeholder in " + where + " to " + up.name + ", which is not one of its hosts: refused"}
		}
		for k, vs := range r.Header {
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
					g.audit(audit.Event{Kind: "exfiltration", Name: name, Decision: "deny", Reason: "a secret's placeholder in a streamed body to a host not its own: request cut off"})
				})
			}
		}
	}
	if inject {
		for _, c := range up.creds {
			if c.OverBasic && !isBasic(r.Header.Get("Authorization")) {
				continue
			}
			r.Header.Set(c.Header, c.HeaderValue)
			if c.OverBasic {
				dropOfflineToken(r.URL)
			}
			g.auditRepeat(audit.Event{Kind: "broker", Name: up.name, Decision: "allow", Rule: "secret " + c.Name, Reason: "credential set in " + c.Header})
		}
		if len(up.creds) > 0 {
			// Responses are masked after decoding: ask for no encoding
			// (a server that sends one anyway gets it decoded if it is
			// gzip or deflate, and refused otherwise).
			r.Header.Set("Accept-Encoding", "identity")
		}
	}
	return nil
}

// dropOfflineToken removes a token request's offline_token (Docker's
// client asks for one when it logs in): the refresh token it would bring
// is a lasting credential, made from the real login, that the guest would
// keep. Without it the registry hands out short-lived tokens only, and the
// client logs in again (through the broker) when they expire.
func dropOfflineToken(u *url.URL) {
	if u.RawQuery == "" {
		return
	}
	q := u.Query()
	if !q.Has("offline_token") {
		return
	}
	q.Del("offline_token")
	u.RawQuery = q.Encode()
}

// isBasic reports an HTTP Basic authorization header.
func isBasic(v string) bool {
	scheme, _, _ := strings.Cut(strings.TrimSpace(v), " ")
	return strings.EqualFold(scheme, "Basic")
}

// placeholderFormsOf are the placeholders of creds in every form.
func (g *Gateway) placeholderFormsOf(creds []*Credential) [][]byte {
	var out [][]byte
	for _, c := range creds {
		out = append(out, secretForms([]byte(c.Placeholder))...)
	}
	return out
}

// basicLogin is the user of an HTTP Basic header value carrying value.
func basicLogin(header string, value []byte) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(tok))
	if err != nil {
		return "", false
	}
	user, pw, ok := strings.Cut(string(b), ":")
	if !ok || pw != string(value) {
		return "", false
	}
	return user, true
}

// maskResponse replaces the credentials' values (in every form) with their
// placeholders in everything a response from their host carries: header
// names and values, the body (decoded first), and the trailers (gRPC puts
// its errors there), which are masked when the body ends, before the proxy
// copies them.
//
// A body in an encoding the broker cannot decode (br, zstd, …: it asks for
// none, so a server sends one only when it ignores that) cannot be
// checked, so it is refused and the refusal logged; an empty body passes.
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
		// A Basic login travels as base64 of USER:VALUE, whose encoding
		// shares no bytes with VALUE's own (a server echoing the
		// Authorization header would hand the guest the real login): it
		// is masked whole, to the base64 of USER:PLACEHOLDER.
		if user, ok := basicLogin(c.HeaderValue, c.Value); ok {
			login := base64.StdEncoding.EncodeToString([]byte(user + ":" + string(c.Value)))
			masked := base64.StdEncoding.EncodeToString([]byte(user + ":" + c.Placeholder))
			pats = append(pats, []byte(login), []byte(strings.TrimRight(login, "=")))
			reps = append(reps, []byte(masked), []byte(strings.TrimRight(masked, "=")))
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
	maskHeader(resp.Header, sp, sr)
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
	// Trailers are filled in as the body ends; the proxy reads them after
	// closing the body.
	trailers := func() { maskHeader(resp.Trailer, sp, sr) }
	if resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength == 0 {
		trailers()
		return nil
	}
	body, err := decodeBody(resp.Body, resp.Header.Values("Content-Encoding"))
	if err != nil {
		return &refusal{kind: "broker", reason: err.Error()}
	}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	replacing := newReplacingReader
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		replacing = newEventStreamReplacingReader
	}
	resp.Body = &closeHook{ReadCloser: replacing(body, sp, sr), after: trailers}
	return nil
}

// maskHeader replaces the patterns in a header's names and values.
func maskHeader(h http.Header, pats, reps [][]byte) {
	for k, vs := range h {
		for i, v := range vs {
			out, _, _ := newMatcher(pats, reps).scan([]byte(v), true)
			vs[i] = string(out)
		}
		if out, _, hit := newMatcher(pats, reps).scan([]byte(k), true); hit {
			delete(h, k)
			h[string(out)] = vs
		}
	}
}

// closeHook runs after once the body is closed.
type closeHook struct {
	io.ReadCloser
	after func()
	done  bool
}

func (c *closeHook) Close() error {
	err := c.ReadCloser.Close()
	if !c.done {
		c.done = true
		c.after()
	}
	return err
}

// maxEncodings bounds a Content-Encoding list: each layer is a
// decompressor.
const maxEncodings = 4

// decodeBody undoes the content codings of a response, last applied
// first. It knows identity, gzip and deflate (zlib, or raw deflate as some
// servers send); any other is an error that says the body cannot be
// checked.
func decodeBody(body io.ReadCloser, values []string) (io.ReadCloser, error) {
	var codings []string
	for _, v := range values {
		for _, c := range strings.Split(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	if len(codings) > maxEncodings {
		return nil, fmt.Errorf("response with %d content encodings cannot be checked for secrets", len(codings))
	}
	for _, c := range codings {
		if c != "gzip" && c != "x-gzip" && c != "deflate" {
			return nil, fmt.Errorf("response in %s encoding cannot be checked for secrets: refused (kosa8 decodes gzip and deflate only)", c)
		}
	}
	var r io.Reader = body
	for i := len(codings) - 1; i >= 0; i-- {
		switch codings[i] {
		case "gzip", "x-gzip":
			zr, err := gzip.NewReader(r)
			if err != nil {
				return nil, fmt.Errorf("decode gzip response to mask it: %w", err)
			}
			r = zr
		case "deflate":
			br := bufio.NewReader(r)
			if h, err := br.Peek(2); err == nil && h[0]&0x0f == 8 && (int(h[0])<<8|int(h[1]))%31 == 0 {
				zr, err := zlib.NewReader(br)
				if err != nil {
					return nil, fmt.Errorf("decode deflate response to mask it: %w", err)
				}
				r = zr
			} else {
				r = flate.NewReader(br)
			}
		}
	}
	return struct {
		io.Reader
		io.Closer
	}{r, body}, nil
}

// guestHandshakeTimeout bounds the guest's TLS handshake with the broker.
const guestHandshakeTimeout = time.Minute

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
	// The guest's side of the handshake gets longer: a guest under TCG on
	// a loaded host took over 15 s for it here.
	gctx, gcancel := context.WithTimeout(context.Background(), guestHandshakeTimeout)
	defer gcancel()
	upTLS := tls.Client(up.conn, g.tlsConfigFor(up.name, alpn))
	if err := upTLS.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("upstream TLS with %s: %v", up.name, err)
	}
	upAt := time.Now()
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
	if err := guestTLS.HandshakeContext(gctx); err != nil {
		upTLS.Close()
		return fmt.Errorf("guest TLS for %s: %v", up.name, err)
	}
	target := up.ev.Upstream
	return g.proxy(guestTLS, proxySpec{
		up:     up,
		scheme: "https",
		first:  upTLS,
		// Used only if the guest's handshake was quick: the upstream may
		// have given up on an idle connection meanwhile.
		firstUntil: upAt.Add(5 * time.Second),
		h2:         proto == "h2",
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
