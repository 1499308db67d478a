package egress

import (
	"bufio"
	"context"
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

// looksLikeHTTP reports whether the guest's first bytes start an HTTP/1
// request. It waits briefly for enough bytes to tell.
func looksLikeHTTP(gr *bufio.Reader, conn net.Conn) bool {
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	for n := 1; n <= 8; n++ {
		b, err := gr.Peek(n)
		if err != nil {
			return false
		}
		matched := false
		for _, m := range httpMethods {
			if strings.HasPrefix(m, string(b)) {
				matched = true
				if len(m) == n {
					return true
				}
			}
		}
		if !matched {
			return false
		}
	}
	return false
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

// requestHook may refuse or change a request on its way upstream (the
// secrets broker injects credentials here).
type requestHook func(r *http.Request) error

// proxyHTTP serves the guest's HTTP/1 connection with Go's own server and
// forwards each request with a reverse proxy to the address checked for
// up.name. Every request's Host must be that name. Parsing with net/http
// on both sides means the upstream sees only requests this side parsed
// and checked (no smuggling past it with ambiguous framing).
func (g *Gateway) proxyHTTP(guest net.Conn, gr *bufio.Reader, up *upstream, hook requestHook) error {
	var (
		refused atomic.Pointer[string]
		first   = up.conn
		fmu     sync.Mutex
	)
	target := up.ev.Upstream // the checked ip:port
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			fmu.Lock()
			c := first
			first = nil
			fmu.Unlock()
			if c != nil {
				return c, nil
			}
			// A second connection goes to the same checked address.
			return g.cfg.Dial(ctx, "tcp4", target)
		},
		DisableCompression:  true, // pass the guest's Accept-Encoding through untouched
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	defer transport.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target
			pr.Out.Host = pr.In.Host
		},
		Transport:     transport,
		FlushInterval: -1, // stream: server-sent events arrive as sent
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			g.log.Debug("upstream request failed", "host", up.name, "err", err)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		norm, err := netpolicy.NormalizeHost(host)
		if err != nil || norm != up.name {
			reason := fmt.Sprintf("HTTP Host %q does not match %s", r.Host, up.name)
			refused.Store(&reason)
			g.audit(audit.Event{Kind: "http", Name: up.name, Dest: up.ev.Dest, Decision: "deny", Reason: reason})
			w.Header().Set("Connection", "close")
			http.Error(w, "kosa8: "+reason, http.StatusForbidden)
			return
		}
		if hook != nil {
			if err := hook(r); err != nil {
				reason := err.Error()
				refused.Store(&reason)
				w.Header().Set("Connection", "close")
				http.Error(w, "kosa8: "+reason, http.StatusForbidden)
				return
			}
		}
		rp.ServeHTTP(w, r)
	})
	l := &oneConnListener{conn: &bufferedConn{Conn: guest, r: gr}, closed: make(chan struct{})}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				l.Close()
			}
		},
	}
	_ = srv.Serve(l)
	if r := refused.Load(); r != nil {
		return errors.New(*r)
	}
	return nil
}
