package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/egress"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/netstack"
)

// upstreamServer serves /small and /1m over HTTPS on all interfaces, with
// certificates for any name from a CA of its own.
func upstreamServer() (*httptest.Server, int, *x509.CertPool) {
	big := strings.Repeat("x", 1<<20)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/1m" {
			io.WriteString(w, big)
			return
		}
		io.WriteString(w, "ok")
	})
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	must(err)
	dir, err := os.MkdirTemp("", "kosa8-bench-up-")
	must(err)
	defer os.RemoveAll(dir)
	ca, err := egress.LoadOrCreateCA(dir, "upstream")
	must(err)
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = l
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(hi.ServerName) }}
	srv.StartTLS()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	return srv, l.Addr().(*net.TCPAddr).Port, roots
}

// newConnLatency times n fresh connections: dial, TLS handshake, one request.
func newConnLatency(dial func(ctx context.Context) (net.Conn, error), serverName string, n int) time.Duration {
	var lat []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		c, err := dial(context.Background())
		must(err)
		tc := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
		must(tc.Handshake())
		fmt.Fprintf(tc, "GET /small HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", serverName)
		_, err = io.ReadAll(tc)
		must(err)
		tc.Close()
		lat = append(lat, time.Since(t0))
	}
	return pct(lat, 50)
}

type netFigures struct {
	P50, P99 time.Duration
	MBps     float64
}

// measureHTTPS makes n small requests on one kept-alive connection, then
// m 1 MiB ones, through dial.
func measureHTTPS(dial func(ctx context.Context) (net.Conn, error), serverName string, n, m int) netFigures {
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
			return tc, tc.HandshakeContext(ctx)
		},
		MaxIdleConnsPerHost: 1,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	get := func(path string) int64 {
		resp, err := client.Get("https://" + serverName + path)
		must(err)
		k, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return k
	}
	get("/small") // handshake outside the timings
	var lat []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		get("/small")
		lat = append(lat, time.Since(t0))
	}
	t0 := time.Now()
	var total int64
	for i := 0; i < m; i++ {
		total += get("/1m")
	}
	return netFigures{pct(lat, 50), pct(lat, 99), float64(total) / time.Since(t0).Seconds() / 1e6}
}

// inProcessPath joins a user-space guest (netstack.Peer) to kosa8's stack
// and gateway, with no VM: the cost of kosa8's own network path. TLS to
// bench.test passes through; api.test is bound to a credential, so the
// broker terminates it.
func inProcessPath(port int, name string, roots *x509.CertPool) (func(ctx context.Context) (net.Conn, error), func()) {
	pol, err := netpolicy.Parse([]string{fmt.Sprintf("bench.test:%d", port), fmt.Sprintf("api.test:%d", port)}, netpolicy.ParseOptions{})
	must(err)
	names, err := egress.OpenNameMap("", 0)
	must(err)
	dir, err := os.MkdirTemp("", "kosa8-bench-ca-")
	must(err)
	defer os.RemoveAll(dir)
	ca, err := egress.LoadOrCreateCA(dir, "bench")
	must(err)
	hosts, _ := netpolicy.Parse([]string{"api.test"}, netpolicy.ParseOptions{})
	lo := netip.MustParseAddr("127.0.0.1")
	gw := egress.New(egress.Config{Policy: pol, Names: names, CA: ca, UpstreamRoots: roots,
		Overrides: map[string]netip.Addr{"bench.test": lo, "api.test": lo},
		Credentials: []egress.Credential{{Name: "K", Hosts: hosts, Header: "x-api-key", HeaderValue: "real-value",
			Value: []byte("real-value"), Placeholder: "kosa8-ph-bench"}}})
	ip, err := names.Assign(name)
	must(err)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	must(err)
	hc, err := net.FileConn(os.NewFile(uintptr(fds[0]), "h"))
	must(err)
	gc, err := net.FileConn(os.NewFile(uintptr(fds[1]), "g"))
	must(err)
	st, err := netstack.New(hc, gw, nil)
	must(err)
	peer, err := netstack.NewPeer(gc)
	must(err)
	dial := func(ctx context.Context) (net.Conn, error) { return peer.DialTCP(ctx, ip.AsSlice(), uint16(port)) }
	return dial, func() { peer.Close(); st.Close() }
}

func fmtNet(f netFigures) string {
	return fmt.Sprintf("p50 %s, p99 %s, %.0f MB/s", ms(f.P50), ms(f.P99), f.MBps)
}

// guestScript measures the same from inside the VM with Python.
const guestScript = `
import http.client, ssl, time, json, sys
host, port, n, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = http.client.HTTPSConnection(host, port, context=ssl._create_unverified_context())
def get(p):
    c.request("GET", p); r = c.getresponse(); return len(r.read())
get("/small")
lat = []
for i in range(n):
    t = time.perf_counter(); get("/small"); lat.append(time.perf_counter() - t)
lat.sort()
t = time.perf_counter(); total = sum(get("/1m") for i in range(m)); el = time.perf_counter() - t
print(json.dumps({"p50": lat[len(lat)//2], "p99": lat[min(len(lat)-1, (len(lat)*99)//100)], "mbps": total/el/1e6}))
`

func runPython(args ...string) netFigures {
	out, err := exec.Command(args[0], args[1:]...).Output()
	must(err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r struct{ P50, P99, Mbps float64 }
	must(json.Unmarshal([]byte(lines[len(lines)-1]), &r))
	return netFigures{time.Duration(r.P50 * 1e9), time.Duration(r.P99 * 1e9), r.Mbps}
}

func benchNet() {
	_, cleanup := setupHome()
	defer cleanup()
	accel := hostAccel()
	srv, port, roots := upstreamServer()
	defer srv.Close()
	var rows []row

	fmt.Fprintln(os.Stderr, "in-process: direct loopback vs kosa8's stack and gateway...")
	direct := measureHTTPS(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	}, "bench.test", 500, 20)
	dial, stop := inProcessPath(port, "bench.test", roots)
	via := measureHTTPS(dial, "bench.test", 500, 20)
	passNew := newConnLatency(dial, "bench.test", 100)
	stop()
	bdial, bstop := inProcessPath(port, "api.test", roots)
	brokered := measureHTTPS(bdial, "api.test", 500, 20)
	brokerNew := newConnLatency(bdial, "api.test", 100)
	bstop()
	rows = append(rows,
		row{"HTTPS, Go client, direct loopback", fmtNet(direct), "none", "baseline (no VM)"},
		row{"HTTPS, Go client, through kosa8 stack+gateway", fmtNet(via), "none",
			fmt.Sprintf("+%s p50 per request; %.0f%% of direct throughput", ms(via.P50-direct.P50), 100*via.MBps/direct.MBps)},
		row{"  same, TLS terminated by the broker (secret bound)", fmtNet(brokered), "none",
			fmt.Sprintf("+%s p50 per kept-alive request vs passthrough", ms(brokered.P50-via.P50))},
		row{"new connection (TCP+TLS+request), passthrough", ms(passNew), "none", "p50 of 100"},
		row{"new connection (TCP+TLS+request), broker", ms(brokerNew), "none", fmt.Sprintf("+%s vs passthrough", ms(brokerNew-passNew))},
	)

	fmt.Fprintln(os.Stderr, "VM: python in the guest vs python on the host...")
	script := filepath.Join(os.TempDir(), "kosa8-bench-https.py")
	must(os.WriteFile(script, []byte(guestScript), 0o644))
	defer os.Remove(script)
	hostFig := runPython("python3", script, "127.0.0.1", fmt.Sprint(port), "200", "10")
	name := "bench-net"
	cmd := exec.Command(filepath.Join(*binDir, "kosa8"), "run", "-d", "--name", name, "--allow", fmt.Sprintf("bench.test:%d", port))
	cmd.Env = append(os.Environ(), "KOSA8_NET_OVERRIDES=bench.test=127.0.0.1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		must(fmt.Errorf("start sandbox: %v\n%s", err, out))
	}
	defer kosa8("rm", "-f", name)
	kosa8("exec", name, "--", "sh", "-c", "cat > /tmp/b.py <<'EOF'\n"+guestScript+"\nEOF")
	guestFig := runPython(filepath.Join(*binDir, "kosa8"), "exec", name, "--", "python3", "/tmp/b.py", "bench.test", fmt.Sprint(port), "200", "10")
	a := string(accel)
	rows = append(rows,
		row{"HTTPS, Python, on the host", fmtNet(hostFig), "none", "baseline"},
		row{"HTTPS, Python, in the sandbox", fmtNet(guestFig), a,
			fmt.Sprintf("%.1fx host p50; %.0f%% of host throughput (guest CPU emulated under tcg)", float64(guestFig.P50)/float64(hostFig.P50), 100*guestFig.MBps/hostFig.MBps)},
	)
	printTable("kosa8 network", rows, accel)
}
