package oci_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/oci/ocitest"
)

// TestVerifySignature checks cosign signatures stored in a real registry
// (Debian's docker-registry) against a pinned key, offline: a good one
// passes; a missing one, one by another key, a payload altered after
// signing, a signature of another image or made for another repository,
// and a signature tag holding too many layers are refused.
func TestVerifySignature(t *testing.T) {
	reg := startRegistry(t)
	repo := reg + "/kosa8/base"
	d := pushTestImage(t, repo+":1", testImage("amd64", "signed"))
	other := pushTestImage(t, repo+":2", testImage("amd64", "other"))
	unsigned := pushTestImage(t, repo+":3", testImage("amd64", "unsigned"))
	sv, _, err := signature.NewDefaultECDSASignerVerifier()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := sv.PublicKey()
	pem, _ := cryptoutils.MarshalPublicKeyToPEM(pub)
	key, err := oci.ParsePublicKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	stranger, _, _ := signature.NewDefaultECDSASignerVerifier()

	// Signed: a stranger's signature first, then the pinned key's.
	ocitest.PushCosignSignatures(t, repo, d, ocitest.Sign(t, stranger, ocitest.CosignPayload(t, repo, d)), ocitest.Sign(t, sv, ocitest.CosignPayload(t, repo, d)))
	if err := oci.VerifySignature(context.Background(), repo+"@"+d, d, key, oci.PullOptions{}); err != nil {
		t.Errorf("a good signature: %v", err)
	}

	refuse := func(what, dd, want string) {
		t.Helper()
		err := oci.VerifySignature(context.Background(), repo+"@"+dd, dd, key, oci.PullOptions{})
		if err == nil || !errors.Is(err, oci.ErrUnsigned) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v (want %q)", what, err, want)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}
	refuse("unsigned", unsigned, "sha256-")

	// The pinned key's signature of d, stored beside another image.
	good := ocitest.Sign(t, sv, ocitest.CosignPayload(t, repo, d))
	ocitest.PushCosignSignatures(t, repo, other, good)
	refuse("another image's signature", other, "not "+other)

	// A payload changed after it was signed.
	p := ocitest.CosignPayload(t, repo, other)
	s := ocitest.Sign(t, sv, p)
	s.Payload = append(bytes.TrimSuffix(s.Payload, []byte("}")), []byte(`,"x":1}`)...)
	ocitest.PushCosignSignatures(t, repo, other, s)
	refuse("an altered payload", other, "does not verify")

	// Signed by a stranger only.
	ocitest.PushCosignSignatures(t, repo, other, ocitest.Sign(t, stranger, ocitest.CosignPayload(t, repo, other)))
	refuse("a stranger's key", other, "does not verify")

	// A good signature made for another repository, copied here.
	ocitest.PushCosignSignatures(t, repo, other, ocitest.Sign(t, sv, ocitest.CosignPayload(t, reg+"/elsewhere/app", other)))
	refuse("another repository's signature", other, "made for")

	// Bounds: more layers than read.
	var many []ocitest.CosignSig
	for i := 0; i < 17; i++ {
		many = append(many, ocitest.Sign(t, stranger, ocitest.CosignPayload(t, repo, other)))
	}
	ocitest.PushCosignSignatures(t, repo, other, many...)
	if err := oci.VerifySignature(context.Background(), repo+"@"+other, other, key, oci.PullOptions{}); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("17 signature layers: %v", err)
	}

	if _, err := oci.ParsePublicKey([]byte("not a key")); err == nil {
		t.Error("a non-key parsed")
	}
}
