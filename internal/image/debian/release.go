package debian

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/clearsign"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
)

const (
	maxInRelease  = 8 << 20
	maxSignatures = 16
	// maxClockSkew is how far ahead of the host's clock a Release's Date
	// may be before it is taken for a forged or misdated one, as apt does.
	maxClockSkew = 24 * time.Hour
)

// release is what Open uses of a verified Release file.
type release struct {
	suite, codename  string
	date, validUntil time.Time
	archs            map[string]bool
	components       map[string]bool
	files            map[string]fileSum // path under dists/SUITE/ -> size and hash
}

type fileSum struct {
	size   int64
	sha256 string
}

// verifyInRelease checks data (a dists/SUITE/InRelease) against keyring and
// returns the signed plaintext, exactly as it was signed, for parsing. One
// good signature by a keyring key suffices: Debian signs with several keys
// (old and new, EdDSA and RSA), and one of them being unknown, expired or
// bad must not matter while another verifies. Each signature is checked on
// its own because the library stops at the first one whose issuer it
// knows.
func verifyInRelease(data []byte, keyring openpgp.KeyRing, now func() time.Time) ([]byte, error) {
	block, rest := clearsign.Decode(data)
	if block == nil {
		return nil, errors.New("not a clearsigned message")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("unsigned data after the signed message")
	}
	raw, err := io.ReadAll(io.LimitReader(block.ArmoredSignature.Body, maxInRelease))
	if err != nil {
		return nil, fmt.Errorf("reading the signature: %v", err)
	}
	cfg := &packet.Config{Time: now}
	var errs []string
	good := 0
	br := bytes.NewReader(raw)
	for n := 0; br.Len() > 0; n++ {
		if n >= maxSignatures {
			return nil, fmt.Errorf("more than %d signature packets", maxSignatures)
		}
		start := len(raw) - br.Len()
		p, err := packet.Read(br)
		if err != nil {
			return nil, fmt.Errorf("reading signature packet %d: %v", n+1, err)
		}
		sig, ok := p.(*packet.Signature)
		if !ok {
			return nil, fmt.Errorf("packet %d of the signature block is not a signature", n+1)
		}
		one := raw[start : len(raw)-br.Len()]
		_, _, err = openpgp.VerifyDetachedSignature(keyring, bytes.NewReader(block.Bytes), bytes.NewReader(one), cfg)
		if err == nil {
			good++
			continue
		}
		issuer := "unknown issuer"
		if sig.IssuerKeyId != nil {
			issuer = fmt.Sprintf("key %016X", *sig.IssuerKeyId)
		}
		errs = append(errs, fmt.Sprintf("%s: %v", issuer, err))
	}
	if good == 0 {
		if len(errs) == 0 {
			return nil, errors.New("no signatures")
		}
		return nil, fmt.Errorf("no good signature (%s)", strings.Join(errs, "; "))
	}
	// block.Bytes is the signed text with CRLF line ends (the form that
	// was hashed); Release files use LF.
	return bytes.ReplaceAll(block.Bytes, []byte("\r\n"), []byte("\n")), nil
}

// parseRelease reads the fields Open relies on from verified Release text.
func parseRelease(text []byte) (*release, error) {
	var st Stanza
	err := ParseStanzas(bytes.NewReader(text), func(s Stanza) error {
		if st != nil {
			return errors.New("more than one stanza")
		}
		st = s
		return nil
	})
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, errors.New("empty Release")
	}
	r := &release{
		suite:      st.Get("Suite"),
		codename:   st.Get("Codename"),
		archs:      map[string]bool{},
		components: map[string]bool{},
		files:      map[string]fileSum{},
	}
	for _, a := range strings.Fields(st.Get("Architectures")) {
		r.archs[a] = true
	}
	for _, c := range strings.Fields(st.Get("Components")) {
		r.components[c] = true
	}
	if d := st.Get("Date"); d != "" {
		if r.date, err = parseReleaseTime(d); err != nil {
			return nil, fmt.Errorf("Date: %v", err)
		}
	}
	if v := st.Get("Valid-Until"); v != "" {
		if r.validUntil, err = parseReleaseTime(v); err != nil {
			return nil, fmt.Errorf("Valid-Until: %v", err)
		}
	}
	sums := st.Get("SHA256")
	if sums == "" {
		return nil, errors.New("no SHA256 field")
	}
	for _, line := range strings.Split(sums, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 || !validSHA256(f[0]) {
			return nil, fmt.Errorf("bad SHA256 line %q", clip(line))
		}
		size, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || size < 0 {
			return nil, fmt.Errorf("bad size in SHA256 line %q", clip(line))
		}
		r.files[f[2]] = fileSum{size: size, sha256: f[0]}
	}
	return r, nil
}

// checkValidity applies the Release's own time bounds: Valid-Until stops a
// mirror from replaying an old signed Release forever, and a Date far ahead
// of the clock means a misdated or forged one.
func checkValidity(r *release, now time.Time) error {
	if !r.validUntil.IsZero() && now.After(r.validUntil) {
		return fmt.Errorf("the Release expired at %s (Valid-Until); the mirror serves a stale copy, or the host's clock is wrong", r.validUntil.UTC().Format(time.RFC1123))
	}
	if !r.date.IsZero() && r.date.After(now.Add(maxClockSkew)) {
		return fmt.Errorf("the Release is dated %s, in the future; check the host's clock", r.date.UTC().Format(time.RFC1123))
	}
	return nil
}

func parseReleaseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC1123, time.RFC1123Z, "Mon, 2 Jan 2006 15:04:05 MST", "Mon, 2 Jan 2006 15:04:05 -0700"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("bad time %q", clip(s))
}

func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isDigit(c) && !('a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
