package egress

import (
	"bytes"
	"encoding/pem"
	"testing"
)

func TestExtraRoots(t *testing.T) {
	a, err := LoadOrCreateCA(t.TempDir(), "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateCA(t.TempDir(), "b")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := a.Leaf("x.test")
	if err != nil {
		t.Fatal(err)
	}
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not for the guest")})
	host := bytes.Join([][]byte{a.CertPEM(), []byte("junk\n"), keyPEM, leafPEM, b.CertPEM(), b.CertPEM()}, nil)
	got := ExtraRoots(host, a.CertPEM())
	if !bytes.Equal(got, b.CertPEM()) {
		t.Fatalf("extra roots:\n%s\nwant only b's certificate:\n%s", got, b.CertPEM())
	}
	if bytes.Contains(got, []byte("PRIVATE KEY")) {
		t.Fatal("a key crossed")
	}
	if len(ExtraRoots(host, host)) != 0 {
		t.Fatal("roots the guest holds were added again")
	}
}
