package egress

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
)

// dnsTTL is the lifetime of a synthetic answer. Bindings never change, and
// the policy is checked again at connect time, so caching is harmless.
const dnsTTL = 300

// AnswerDNS builds the reply to one DNS query. It never asks a real
// resolver, so a query cannot carry data out: a name the policy allows
// gets its synthetic address, its other record types an empty answer; a
// name it refuses gets RefusedAddr (the refusal page), briefly, and its
// other types an empty answer; a name that is no host name, or carries a
// secret's placeholder, NXDOMAIN. A query that does not parse gets no
// reply (nil).
func (g *Gateway) AnswerDNS(query []byte) []byte {
	var q dns.Msg
	if err := q.Unpack(query); err != nil {
		g.auditRepeat(audit.Event{Kind: "dns", Decision: "deny", Reason: "malformed query"})
		return nil
	}
	r := new(dns.Msg)
	r.SetReply(&q)
	r.RecursionAvailable = true
	r.Compress = true
	if q.Response || q.Opcode != dns.OpcodeQuery {
		r.Rcode = dns.RcodeNotImplemented
		return pack(r)
	}
	if len(q.Question) != 1 {
		r.Rcode = dns.RcodeFormatError
		return pack(r)
	}
	qu := q.Question[0]
	qtype := dns.TypeToString[qu.Qtype]
	if qtype == "" {
		qtype = "TYPE" + itoa(int(qu.Qtype))
	}
	name := strings.ToLower(strings.TrimSuffix(qu.Name, "."))
	ev := audit.Event{Kind: "dns", Name: name, QType: qtype}
	if qu.Qclass != dns.ClassINET {
		r.Rcode = dns.RcodeRefused
		ev.Decision, ev.Reason = "deny", "class "+dns.ClassToString[qu.Qclass]
		g.auditRepeat(ev)
		return pack(r)
	}
	norm, d, exfil, err := g.decideName(name)
	if exfil {
		ev.Kind = "exfiltration"
	}
	if !d.Allow {
		ev.Decision, ev.Reason = "deny", d.Reason
		if err != nil || ev.Kind == "exfiltration" {
			r.Rcode = dns.RcodeNameError
			g.auditRepeat(ev)
			return pack(r)
		}
		// A name the allow-list refuses points at the refusal page (one
		// fixed address for every such name, so nothing is bound and
		// nothing but that address comes back), briefly: an agent that
		// connects reads why, and the command that allows it, where
		// NXDOMAIN told it only that the name does not exist.
		if qu.Qtype == dns.TypeA || qu.Qtype == dns.TypeANY {
			r.Answer = append(r.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: qu.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: refusedTTL},
				A:   RefusedAddr.AsSlice(),
			})
			ev.Answer = RefusedAddr.String() + " (the refusal page)"
		}
		g.auditRepeat(ev)
		return pack(r)
	}
	ev.Decision, ev.Rule, ev.Name = "allow", d.Rule, norm
	if qu.Qtype == dns.TypeA || qu.Qtype == dns.TypeANY {
		addr, err := g.names.Assign(norm)
		if err != nil {
			r.Rcode = dns.RcodeServerFailure
			ev.Decision, ev.Reason = "deny", err.Error()
			g.auditRepeat(ev)
			return pack(r)
		}
		r.Answer = append(r.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: qu.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
			A:   addr.AsSlice(),
		})
		ev.Answer = addr.String()
	}
	// Other types (AAAA, HTTPS, TXT, …) of an allowed name: an empty
	// answer (NODATA). The guest has IPv4 only, and HTTPS records would
	// offer ECH and alternative endpoints the broker cannot check.
	// Repeats are summed up, as dropped packets are: a guest asking the
	// same name in a loop costs one record per window.
	g.auditRepeat(ev)
	return pack(r)
}

// decideName is whether name resolves for the guest (DNS, and a proxy's
// CONNECT): a name the policy allows on some port, or a host of a bound
// secret. exfil reports a name that carries a secret's placeholder, err
// one that is no host name.
func (g *Gateway) decideName(name string) (norm string, d netpolicy.Decision, exfil bool, err error) {
	norm, err = netpolicy.NormalizeHost(name)
	switch {
	case containsAny(name, g.placeholderForms()):
		return norm, netpolicy.Decision{Reason: "a secret's placeholder in a DNS query"}, true, err
	case err != nil:
		d.Reason = err.Error()
	default:
		d = g.policy().AllowsName(norm)
		if !d.Allow && !d.Denied && len(g.credentialsFor(norm)) > 0 {
			d = netpolicy.Decision{Allow: true, Rule: "secret " + g.credentialsFor(norm)[0].Name}
		}
	}
	return norm, d, false, err
}

func pack(m *dns.Msg) []byte {
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

func itoa(n int) string {
	var b [12]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// ServeDNSPacket answers queries on a packet conn until it closes.
func (g *Gateway) ServeDNSPacket(ctx context.Context, pc net.PacketConn) {
	buf := make([]byte, 4096)
	for ctx.Err() == nil {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if reply := g.AnswerDNS(buf[:n]); reply != nil {
			if len(reply) > 512 && !hasEDNS(buf[:n]) {
				reply = truncate(reply)
			}
			_, _ = pc.WriteTo(reply, addr)
		}
	}
}

func hasEDNS(q []byte) bool {
	var m dns.Msg
	return m.Unpack(q) == nil && m.IsEdns0() != nil
}

// truncate marks an oversized UDP reply truncated so the client retries over TCP.
func truncate(reply []byte) []byte {
	var m dns.Msg
	if m.Unpack(reply) != nil {
		return nil
	}
	m.Answer = nil
	m.Truncated = true
	return pack(&m)
}

// ServeDNSStream answers length-prefixed queries on a TCP connection.
func (g *Gateway) ServeDNSStream(c net.Conn) {
	defer c.Close()
	var hdr [2]byte
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint16(hdr[:])
		q := make([]byte, n)
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		reply := g.AnswerDNS(q)
		if reply == nil {
			return
		}
		out := make([]byte, 2+len(reply))
		binary.BigEndian.PutUint16(out, uint16(len(reply)))
		copy(out[2:], reply)
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}
