package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// steerableDNS is a fake upstream resolver whose answers the test changes
// (to rebind a name), counting the questions per name.
type steerableDNS struct {
	addr  string
	mu    sync.Mutex
	a     map[string]string
	asked map[string]int
}

func startSteerableDNS(t *testing.T, answers map[string]string) *steerableDNS {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &steerableDNS{addr: pc.LocalAddr().String(), a: answers, asked: map[string]int{}}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(q)
		if len(q.Question) == 1 {
			name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
			d.mu.Lock()
			d.asked[name]++
			ip, ok := d.a[name]
			d.mu.Unlock()
			switch {
			case !ok:
				r.Rcode = dns.RcodeNameError
			case q.Question[0].Qtype == dns.TypeA:
				r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(ip)})
			}
		}
		w.WriteMsg(r)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return d
}

func (d *steerableDNS) set(name, ip string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[name] = ip
}

func (d *steerableDNS) count(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[name]
}

// serveOn answers every request with who and the Host asked for, on
// addr only.
func serveOn(t *testing.T, addr, who string) int {
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", who, r.Host)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// TestNetPinnedPrivateAddress, from inside a guest: an allowed name that
// resolves to a private, documentation or this host's own address is
// refused with a page naming the address and the pin that fixes it, as
// net blocked does; the pin (given at creation, by 'net approve --yes', or
// answered on 'net approve --json') reaches exactly that address for that
// name only, and a later DNS answer for it (rebinding) is never looked up.
// A name the allow-list refuses gets the refusal page over HTTPS too, and
// 'net approve' without a terminal refuses at once.
func TestNetPinnedPrivateAddress(t *testing.T) {
	ip := hostIP(t) // private, documentation or public: always this host's own
	port := serveOn(t, ip+":0", "pinned")
	// The same port on loopback answers differently: where a rebound
	// name would land if the gateway looked it up again.
	serveOn(t, fmt.Sprintf("127.0.0.1:%d", port), "REBOUND")
	up := startSteerableDNS(t, map[string]string{"corp.test": ip, "other.test": ip, "early.test": ip, "json.test": ip})
	env := []string{"KOSA8_NET_RESOLVER=" + up.addr}
	name := "pin"
	p := fmt.Sprint(port)
	r := runWith(t, env, "create", name, "--no-workspace", "--allow", "corp.test:80,443,"+p, "--allow", "other.test",
		"--allow", "pin:early.test:"+p, "--allow", "json.test:"+p)
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	// A pin given at creation is resolved then, and stored with its address.
	if rules := must(t, "net", "ls", name).stdout; !strings.Contains(rules, "pin:early.test:"+p+"="+ip+"\n") {
		t.Fatalf("rules after create: %q", rules)
	}
	if r := runWith(t, env, "start", name); r.code != 0 {
		t.Fatalf("start: %s", r)
	}
	curl := func(url string) result {
		t.Helper()
		return run(t, "", "exec", name, "--", "curl", "-sS", "-m", "20", url)
	}
	get := func(host string) string {
		t.Helper()
		r := curl(fmt.Sprintf("http://%s:%s/", host, p))
		if r.code != 0 {
			t.Fatalf("curl %s:%s: %s", host, p, r)
		}
		return r.stdout
	}
	if b := get("early.test"); b != "pinned early.test:"+p+"\n" {
		t.Fatalf("the name pinned at creation: %q", b)
	}

	// Allowed, resolving to this host: refused. On port 80 the page says
	// why and the pin that fixes it (nothing upstream is reached); on the
	// test server's port the connection is reset.
	if r := curl("http://corp.test/"); !strings.Contains(r.stdout, "corp.test was refused: corp.test resolved to "+ip+" (") ||
		!strings.Contains(r.stdout, "  kosa8 net allow pin pin:corp.test\n") {
		t.Fatalf("the refusal page for an allowed name at a private address: %s", r)
	}
	if r := curl("http://corp.test:" + p + "/"); r.code == 0 || strings.Contains(r.stdout, "pinned") {
		t.Fatalf("an allowed name at a private address reached: %s", r)
	}
	bl := must(t, "net", "blocked", name)
	if !strings.Contains(bl.stdout, "pin:corp.test:"+p) || !strings.Contains(bl.stdout, "resolved to "+ip) || !strings.Contains(bl.stderr, "kosa8 net allow pin ") {
		t.Fatalf("net blocked:\n%s", bl)
	}
	// No terminal: refused at once.
	start := time.Now()
	if r := run(t, "", "net", "approve", name); r.code != 125 || !strings.Contains(r.stderr, "needs a terminal") || time.Since(start) > 30*time.Second {
		t.Fatalf("net approve without a terminal: %s (after %s)", r, time.Since(start))
	}
	if r := must(t, "net", "approve", name, "--yes", "pin:corp.test:"+p); r.stdout != "allowed: pin:corp.test:"+p+"="+ip+"\n" {
		t.Fatalf("net approve --yes: %s", r)
	}
	asked := up.count("corp.test")
	if b := get("corp.test"); b != "pinned corp.test:"+p+"\n" {
		t.Fatalf("the pinned name: %q", b)
	}
	// Rebinding: the name now resolves to loopback; the pin holds, and
	// the name is not even looked up.
	up.set("corp.test", "127.0.0.1")
	if b := get("corp.test"); b != "pinned corp.test:"+p+"\n" {
		t.Fatalf("the pinned name after its DNS answer changed: %q", b)
	}
	if n := up.count("corp.test"); n != asked {
		t.Fatalf("a pinned name was looked up %d times", n-asked)
	}
	// Another name at the pinned address gets nothing from the pin.
	if r := curl("http://other.test/"); strings.Contains(r.stdout, "pinned") || !strings.Contains(r.stdout, "kosa8 net allow pin pin:other.test\n") {
		t.Fatalf("a name that merely resolves to a pinned address: %s", r)
	}

	// A refused name: the page over HTTPS, with the sandbox CA.
	if r := must(t, "exec", name, "--", "sh", "-c", "getent hosts denied.test; curl -sS -m 20 https://denied.test/x"); !strings.Contains(r.stdout, "198.19.255.254") ||
		!strings.Contains(r.stdout, "denied.test was refused: no rule allows denied.test") || !strings.Contains(r.stdout, "  kosa8 net allow pin denied.test\n") {
		t.Fatalf("a refused name over HTTPS:\n%s", r)
	}

	// A program answers refusals on a JSON stream.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := kosa8Cmd(ctx, "net", "approve", name, "--json")
	in, _ := cmd.StdinPipe()
	outp, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); cmd.Wait() }()
	lines := bufio.NewScanner(outp)
	time.Sleep(time.Second) // the stream opens before the refusal it is to see
	go kosa8Cmd(ctx, "exec", name, "--", "curl", "-sS", "-m", "20", "http://json.test:"+p+"/").Run()
	var offer struct{ Event, Rule, Address string }
	for lines.Scan() {
		if json.Unmarshal(lines.Bytes(), &offer) == nil && offer.Event == "refused" && strings.Contains(offer.Rule, "json.test") {
			break
		}
	}
	if offer.Rule != "pin:json.test:"+p || offer.Address != ip {
		t.Fatalf("offered %+v", offer)
	}
	fmt.Fprintf(in, `{"rule":%q,"allow":true}`+"\n", offer.Rule)
	var answer struct {
		Event, Rule, Error string
		Allowed            bool
	}
	for lines.Scan() {
		if json.Unmarshal(lines.Bytes(), &answer) == nil && answer.Event == "answered" {
			break
		}
	}
	if !answer.Allowed || answer.Rule != offer.Rule {
		t.Fatalf("answered %+v", answer)
	}
	io.WriteString(in, "")
	if b := get("json.test"); b != "pinned json.test:"+p+"\n" {
		t.Fatalf("the name allowed on the JSON stream: %q", b)
	}
	// The login banner names this sandbox.
	if r := must(t, "exec", name, "--", "cat", "/etc/motd"); !strings.Contains(r.stdout, "kosa8 net blocked pin ") {
		t.Fatalf("motd: %q", r.stdout)
	}
}
