package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netstack"
)

// ProxyPort is the gateway's port of an HTTP CONNECT proxy. It reaches
// exactly what a direct connection reaches (the same policy, the same
// checks of the TLS and HTTP inside: a CONNECT is a lookup and a
// connection in one), but says why when it refuses: the status line of
// its 403 carries the reason and the 'kosa8 net allow' that approves the
// host. Go's HTTP client puts that line in its error, so a program that
// goes through it (the guest's dockerd: a refused 'docker pull') shows
// the user what happened where a direct connection only fails to resolve.
const ProxyPort = 3128

// ProxyURL is the proxy as the guest names it.
func ProxyURL() string {
	return "http://" + netip.AddrPortFrom(netstack.GatewayIP, ProxyPort).String()
}

// ServeProxy serves the CONNECT proxy on the stack's gateway address until
// ctx ends.
func (g *Gateway) ServeProxy(ctx context.Context, st *netstack.Stack) error {
	l, err := st.ListenTCP(ProxyPort)
	if err != nil {
		return fmt.Errorf("CONNECT proxy: %w", err)
	}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go g.serveProxyConn(c)
		}
	}()
	return nil
}

// maxConnectRequest bounds a CONNECT request with its headers.
const maxConnectRequest = 16 << 10

// serveProxyConn reads one CONNECT request and carries the connection, or
// answers why not.
func (g *Gateway) serveProxyConn(c net.Conn) {
	if n := g.conns.Add(1); n > int64(g.cfg.MaxConns) {
		g.conns.Add(-1)
		c.Close()
		return
	}
	defer g.connDone()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(c, 4096)
	req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(br, maxConnectRequest)))
	if err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	target, status, why := g.proxyTarget(req)
	if status != 0 {
		proxyRefuse(c, status, why)
		return
	}
	up, ev := g.connect(context.Background(), target.dst)
	if up == nil {
		g.audit(ev)
		text := "kosa8: " + target.host + " could not be reached: " + ev.Reason
		status := http.StatusBadGateway
		if fix := g.fixFor(ev, target.dst.Port()); fix != "" || policyRefusal(ev.Reason) {
			status, text = http.StatusForbidden, g.refusalLine(target.host, ev.Reason, fix)
		}
		proxyRefuse(c, status, text)
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		up.conn.Close()
		c.Close()
		return
	}
	// What the client sent after its request (it should wait for the
	// 200, but may not) is read first.
	g.serve(&bufferedConn{Conn: c, r: br}, up)
}

type proxyDest struct {
	host string
	dst  netip.AddrPort
}

// proxyTarget checks a CONNECT request and turns it into the address a
// direct connection would use: a name the guest may resolve becomes its
// synthetic address, as a DNS answer would make it. A refusal returns its
// status and the reason line; it is recorded as a refused lookup is
// (repeats summed up, so a guest asking in a loop cannot flood the log).
func (g *Gateway) proxyTarget(req *http.Request) (proxyDest, int, string) {
	if req.Method != http.MethodConnect {
		return proxyDest{}, http.StatusMethodNotAllowed, "kosa8: this proxy only tunnels (CONNECT host:port)"
	}
	host, portText, err := net.SplitHostPort(req.RequestURI)
	port, perr := strconv.ParseUint(portText, 10, 16)
	if err != nil || perr != nil || port == 0 {
		return proxyDest{}, http.StatusBadRequest, "kosa8: CONNECT needs host:port"
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		// An address: as a direct connection to it (CIDR rules only).
		return proxyDest{host: ip.String(), dst: netip.AddrPortFrom(ip.Unmap(), uint16(port))}, 0, ""
	}
	norm, d, exfil, nerr := g.decideName(host)
	ev := audit.Event{Kind: "tcp", Name: norm, Dest: "proxy:" + portText}
	if exfil {
		ev.Kind, ev.Decision, ev.Reason = "exfiltration", "deny", "a secret's placeholder in a proxy's CONNECT"
		g.auditRepeat(ev)
		return proxyDest{}, http.StatusForbidden, "kosa8: refused"
	}
	if !d.Allow {
		if nerr != nil {
			ev.Decision, ev.Reason = "deny", d.Reason
			g.auditRepeat(ev)
			return proxyDest{}, http.StatusBadRequest, "kosa8: not a host name"
		}
		ev.Decision, ev.Reason = "deny", d.Reason
		g.auditRepeat(ev)
		return proxyDest{}, http.StatusForbidden, g.refusalLine(norm, d.Reason, g.fixFor(ev, uint16(port)))
	}
	addr, err := g.names.Assign(norm)
	if err != nil {
		ev.Decision, ev.Reason = "deny", err.Error()
		g.auditRepeat(ev)
		return proxyDest{}, http.StatusServiceUnavailable, "kosa8: " + err.Error()
	}
	return proxyDest{host: norm, dst: netip.AddrPortFrom(addr, uint16(port))}, 0, ""
}

// refusalLine is RefusalText in one line, for a status line: what was
// refused, why, and the command that lets it through.
func (g *Gateway) refusalLine(host, reason, fix string) string {
	line := fmt.Sprintf("kosa8: %s was refused: %s; this sandbox's network is allow-listed", host, strings.TrimSuffix(reason, "."))
	if fix != "" {
		return line + ": ask the user to run '" + fix + "'"
	}
	return line + ": 'kosa8 net blocked " + g.sandboxName() + "' lists what was refused"
}

// proxyRefuse answers a CONNECT with status and line (as the status line's
// reason, which Go's client shows, and as the body), then closes.
func proxyRefuse(c net.Conn, status int, line string) {
	defer c.Close()
	line = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, line)
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	body := line + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, line, len(body), body)
}
