package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/sandbox"
)

// lookUp asks the network's DNS for name's A record, as the guest would,
// and returns the answer's code.
func lookUp(t *testing.T, n *network, name string) int {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var a dns.Msg
	if err := a.Unpack(n.gw.AnswerDNS(b)); err != nil {
		t.Fatalf("DNS answer for %s: %v", name, err)
	}
	return a.Rcode
}

// The refused-hosts stream against the real network of a fake machine:
// the stream is open once the answer's header is in, and from then on
// each host the network refuses (here a DNS lookup the policy refuses) is
// a JSON line of it, as it happens; a record of a host allowed since is
// not a candidate and is left out, and so is an allowed lookup. The
// client's going away ends the stream's handler.
func TestAPIRefusedStreamOnAFakeMachine(t *testing.T) {
	r := newFakeRig(t, true)
	s := r.s
	_, srv := serveFakeAPI(t, s)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.sb.Path(sandbox.APISocket))
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://kosa8/v1/net/refused", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("GET /v1/net/refused: %s, %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() api.Blocked {
		t.Helper()
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the stream ended")
			}
			var b api.Blocked
			if err := json.Unmarshal([]byte(line), &b); err != nil {
				t.Fatalf("stream line %q: %v", line, err)
			}
			return b
		case <-time.After(5 * time.Second):
			t.Fatal("no line on the stream in 5s")
			return api.Blocked{}
		}
	}

	// A refused name is answered (with the refusal page's address) and
	// recorded as refused.
	if rc := lookUp(t, s.net, "refused.test"); rc != dns.RcodeSuccess {
		t.Fatalf("the network answered a refused name with %s, want the refusal page", dns.RcodeToString[rc])
	}
	if b := next(); b.Host != "refused.test" || b.Port != 0 || b.Rule != "refused.test" || b.Count != 1 || b.Last.IsZero() {
		t.Errorf("streamed %+v, want refused.test's lookup, once, with its time", b)
	}

	if code, body := apiCall(t, s.routes(), "POST", "/v1/net/allow", `{"rules":["allowed.test"]}`); code != http.StatusOK {
		t.Fatalf("allow: %d %s", code, body)
	}
	s.net.audit.Add(audit.Event{Kind: "dns", Decision: "deny", Name: "allowed.test", Reason: "refused before the allow"})
	if rc := lookUp(t, s.net, "allowed.test"); rc != dns.RcodeSuccess {
		t.Fatalf("the network answered an allowed name with %s", dns.RcodeToString[rc])
	}
	lookUp(t, s.net, "second.test")
	if b := next(); b.Host != "second.test" {
		t.Errorf("streamed %+v, want second.test: nothing about allowed.test", b)
	}

	cancel()
	shut, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	if err := srv.Shutdown(shut); err != nil {
		t.Errorf("the stream's handler did not end once its client went away: %v", err)
	}
}
