package egress

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
)

// ClientHello limits. A ClientHello with post-quantum key shares runs to a
// few kilobytes over several TCP segments and possibly several TLS records;
// anything past these bounds is refused rather than buffered.
const (
	maxHelloBytes  = 64 << 10 // handshake message
	maxRecordBytes = 16384 + 2048
)

var (
	errNotTLS    = errors.New("not a TLS handshake")
	errHelloSize = errors.New("ClientHello too large")
)

// ClientHello is what the broker needs from a TLS ClientHello.
type ClientHello struct {
	ServerName string
	ALPN       []string
	HasECH     bool
}

// peekClientHello reads the TLS records that carry the first handshake
// message from r without consuming them, reassembles the ClientHello and
// parses it. It returns the number of bytes the records take in r, so the
// caller can pass them on unchanged.
func peekClientHello(r *bufio.Reader) (*ClientHello, int, error) {
	var msg []byte
	off := 0
	for {
		hdr, err := peekAt(r, off, 5)
		if err != nil {
			return nil, 0, err
		}
		if hdr[0] != 22 { // handshake
			return nil, 0, errNotTLS
		}
		if hdr[1] != 3 {
			return nil, 0, fmt.Errorf("TLS record version %d.%d", hdr[1], hdr[2])
		}
		n := int(binary.BigEndian.Uint16(hdr[3:5]))
		if n == 0 || n > maxRecordBytes {
			return nil, 0, fmt.Errorf("TLS record of %d bytes", n)
		}
		body, err := peekAt(r, off+5, n)
		if err != nil {
			return nil, 0, err
		}
		off += 5 + n
		msg = append(msg, body...)
		if len(msg) >= 4 {
			if msg[0] != 1 { // client_hello
				return nil, 0, errors.New("first handshake message is not a ClientHello")
			}
			want := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
			if want > maxHelloBytes {
				return nil, 0, errHelloSize
			}
			if len(msg) >= 4+want {
				h, err := parseClientHello(msg[4 : 4+want])
				return h, off, err
			}
		}
		if off > maxHelloBytes+5*8 {
			return nil, 0, errHelloSize
		}
	}
}

// peekAt returns n bytes at offset off of r's stream without consuming them.
func peekAt(r *bufio.Reader, off, n int) ([]byte, error) {
	b, err := r.Peek(off + n)
	if err != nil {
		return nil, err
	}
	return b[off:], nil
}

// parseClientHello parses a ClientHello body (after the 4-byte handshake
// header). It refuses anything ambiguous: a repeated extension, a second
// name in server_name, a name with bytes no host name has.
func parseClientHello(b []byte) (*ClientHello, error) {
	s := cursor(b)
	if !s.skip(2 + 32) { // legacy_version, random
		return nil, errors.New("short ClientHello")
	}
	if _, ok := s.vec8(); !ok { // session id
		return nil, errors.New("bad session id")
	}
	if cs, ok := s.vec16(); !ok || len(cs)%2 != 0 || len(cs) == 0 {
		return nil, errors.New("bad cipher suites")
	}
	if _, ok := s.vec8(); !ok { // compression methods
		return nil, errors.New("bad compression methods")
	}
	h := &ClientHello{}
	if len(s) == 0 {
		return h, nil // no extensions
	}
	exts, ok := s.vec16()
	if !ok || len(s) != 0 {
		return nil, errors.New("bad extensions block")
	}
	seen := map[uint16]bool{}
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec16()
		if !ok1 || !ok2 {
			return nil, errors.New("bad extension")
		}
		if seen[typ] {
			return nil, fmt.Errorf("extension %d repeated", typ)
		}
		seen[typ] = true
		switch typ {
		case 0: // server_name
			name, err := parseServerName(data)
			if err != nil {
				return nil, err
			}
			h.ServerName = name
		case 16: // application_layer_protocol_negotiation
			list, ok := data.vec16()
			if !ok || len(data) != 0 {
				return nil, errors.New("bad ALPN")
			}
			for len(list) > 0 {
				p, ok := list.vec8()
				if !ok || len(p) == 0 {
					return nil, errors.New("bad ALPN protocol")
				}
				h.ALPN = append(h.ALPN, string(p))
			}
		case 0xfe0d: // encrypted_client_hello
			h.HasECH = true
		}
	}
	return h, nil
}

func parseServerName(data cursor) (string, error) {
	list, ok := data.vec16()
	if !ok || len(data) != 0 {
		return "", errors.New("bad server_name extension")
	}
	name := ""
	for len(list) > 0 {
		typ, ok1 := list.u8()
		n, ok2 := list.vec16()
		if !ok1 || !ok2 {
			return "", errors.New("bad server_name entry")
		}
		if typ != 0 {
			continue // not host_name: ignored, as RFC 6066 allows
		}
		if name != "" {
			return "", errors.New("two host names in server_name")
		}
		if len(n) == 0 || len(n) > 255 {
			return "", errors.New("bad server name length")
		}
		for _, c := range n {
			if c <= 0x20 || c >= 0x7f {
				return "", fmt.Errorf("server name has byte 0x%02x", c)
			}
		}
		name = string(n)
	}
	return name, nil
}

// cursor reads big-endian TLS vectors.
type cursor []byte

func (c *cursor) skip(n int) bool {
	if len(*c) < n {
		return false
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) u8() (byte, bool) {
	if len(*c) < 1 {
		return 0, false
	}
	v := (*c)[0]
	*c = (*c)[1:]
	return v, true
}

func (c *cursor) u16() (uint16, bool) {
	if len(*c) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*c)
	*c = (*c)[2:]
	return v, true
}

func (c *cursor) vec8() (cursor, bool) {
	n, ok := c.u8()
	if !ok || len(*c) < int(n) {
		return nil, false
	}
	v := (*c)[:n]
	*c = (*c)[n:]
	return v, true
}

func (c *cursor) vec16() (cursor, bool) {
	n, ok := c.u16()
	if !ok || len(*c) < int(n) {
		return nil, false
	}
	v := (*c)[:n]
	*c = (*c)[n:]
	return v, true
}
