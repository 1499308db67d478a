package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
)

var httpMethods = []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "OPTIONS ", "PATCH ", "TRACE ", "CONNECT ", "PRI "}

// How a guest's first bytes start.
const (
	startOther     = iota // no HTTP method begins this way
	startHTTP             // a method and its space
	startUndecided        // a method's first letters, then silence or the end
)

// httpStart reads (without consuming) up to a method's length of gr within
// two seconds. A guest that sends "GE" and waits is undecided, never
// "other": passing it as raw bytes would skip the Host check of the
// request it completes later.
func httpStart(gr *bufio.Reader, conn net.Conn) int {
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	for n := 1; n <= 8; n++ {
		b, err := gr.Peek(n)
		if err != nil {
			if n == 1 {
				return startOther
			}
			return startUndecided
		}
		matched := false
		for _, m := range httpMethods {
			if strings.HasPrefix(m, string(b)) {
				matched = true
				if len(m) == n {
					return startHTTP
				}
			}
		}
		if !matched {
			return startOther
		}
	}
	return startOther
}

// bufferedConn reads first what a bufio.Reader already took from the conn.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConnListener hands out one connection, then waits to be closed.
type oneConnListener struct {
	conn   net.Conn
	once   sync.Once
	closed chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.conn })
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// refusal is a request the gateway turned away; it ends the connection.
type refusal struct {
	reason string
	kind   string // audit kind: http, exfiltration, read-only
}

func (r *refusal) Error() string { return r.reason }

// proxySpec describes one connection to serve with the HTTP proxy.
type proxySpec struct {
	up     *upstream
	scheme string   // http or https
	first  net.Conn // the connection already dialled (TLS for https)
	// firstUntil: after this, first is dropped unused and a new
	// connection dialled (zero: no limit). A server waits only so long
	// for a request on a new connection (Go's HTTP/2 server 10 s), and a
	// slow guest can take longer than that over its own handshake.
	firstUntil time.Time
	redial     func(ctx context.Context) (net.Conn, error)
	h2         bool
	// onRequest may refuse a request (a *refusal) or change it.
	onRequest func(r *http.Request) error
	// onResponse may change a response.
	onResponse func(r *http.Response) error
}

// proxy serves the guest's connection with Go's own HTTP server and sends
// each request on with a reverse proxy to the address checked for the
// name. Every request's Host (:authority in HTTP/2) must be that name.
// Parsing with net/http on both sides means the upstream sees only
// requests this side parsed and checked: ambiguous framing cannot smuggle
// one past it.
func (g *Gateway) proxy(conn net.Conn, spec proxySpec) error {
	up := spec.up
	var (
		refused atomic.Pointer[refusal]
		first   = spec.first
		fmu     sync.Mutex
	)
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		fmu.Lock()
		c := first
		first = nil
		fmu.Unlock()
		if c != nil {
			if spec.firstUntil.IsZero() || time.Now().Before(spec.firstUntil) {
				return c, nil
			}
			c.Close()
		}
		// A second connection goes to the same checked address.
		return spec.redial(ctx)
	}
	transport := &http.Transport{
		DisableCompression:  true, // the guest's Accept-Encoding passes as it is (or as onRequest sets it)
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   spec.h2,
	}
	if spec.scheme == "https" {
		transport.DialTLSContext = dial
	} else {
		transport.DialContext = dial
	}
	defer transport.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = spec.scheme
			pr.Out.URL.Host = up.name
			pr.Out.Host = pr.In.Host
		},
		Transport:      transport,
		FlushInterval:  -1, // stream: server-sent events arrive as sent
		ErrorLog:       log.New(io.Discard, "", 0),
		ModifyResponse: spec.onResponse,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var rf *refusal
			if errors.As(err, &rf) {
				// A response refused (it could not be checked): say so
				// in the audit log and to the guest.
				g.audit(audit.Event{Kind: rf.kind, Name: up.name, Dest: up.ev.Dest, Decision: "deny", Reason: rf.reason})
				http.Error(w, "kosa8: "+rf.reason, http.StatusForbidden)
				return
			}
			if errors.Is(err, errExfiltration) {
				w.WriteHeader(http.StatusForbidden)
				return
			}
			g.log.Debug("upstream request failed", "host", up.name, "err", err)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	refuse := func(w http.ResponseWriter, rf *refusal) {
		refused.Store(rf)
		g.audit(audit.Event{Kind: rf.kind, Name: up.name, Dest: up.ev.Dest, Decision: "deny", Reason: rf.reason})
		w.Header().Set("Connection", "close")
		http.Error(w, "kosa8: "+rf.reason, http.StatusForbidden)
	}
	l := &oneConnListener{conn: conn, closed: make(chan struct{})}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if norm, err := netpolicy.NormalizeHost(host); err != nil || norm != up.name {
			refuse(w, &refusal{reason: fmt.Sprintf("HTTP Host %q does not match %s", r.Host, up.name), kind: "http"})
			return
		}
		if spec.onRequest != nil {
			if err := spec.onRequest(r); err != nil {
				var rf *refusal
				if !errors.As(err, &rf) {
					rf = &refusal{reason: err.Error(), kind: "http"}
				}
				refuse(w, rf)
				return
			}
		}
		hw := &hijackWatch{ResponseWriter: w}
		rp.ServeHTTP(hw, r)
		if hw.hijacked {
			// An upgraded connection (WebSocket) was carried to its end
			// inside ServeHTTP: the guest's connection is done.
			l.Close()
		}
	})

	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			// Not on StateHijacked: the handler is still carrying an
			// upgraded connection then, and closes the listener itself.
			if st == http.StateClosed {
				l.Close()
			}
		},
	}
	_ = srv.Serve(l)
	if r := refused.Load(); r != nil {
		return r
	}
	return nil
}

// proxyHTTP serves a plain-HTTP connection.
func (g *Gateway) proxyHTTP(guest net.Conn, gr *bufio.Reader, up *upstream, onRequest func(*http.Request) error) error {
	target := up.ev.Upstream
	return g.proxy(&bufferedConn{Conn: guest, r: gr}, proxySpec{
		up:     up,
		scheme: "http",
		first:  up.conn,
		redial: func(ctx context.Context) (net.Conn, error) {
			return g.dialUpstream(ctx, target)
		},
		onRequest: onRequest,
	})
}

// tlsConfigFor is how the broker connects upstream: the name's certificate
// verified against the host's roots.
func (g *Gateway) tlsConfigFor(name string, alpn []string) *tls.Config {
	return &tls.Config{ServerName: name, RootCAs: g.cfg.UpstreamRoots, NextProtos: alpn, MinVersion: tls.VersionTLS12}
}

// hijackWatch notes whether the reverse proxy took the connection over (a
// protocol switch).
type hijackWatch struct {
	http.ResponseWriter
	hijacked bool
}

func (h *hijackWatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h.hijacked = true
	return http.NewResponseController(h.ResponseWriter).Hijack()
}

// Unwrap lets http.ResponseController reach Flush and the rest.
func (h *hijackWatch) Unwrap() http.ResponseWriter { return h.ResponseWriter }
