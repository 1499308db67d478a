package ocitest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// Signatures as cosign stores them ('cosign sign --key'): an OCI image at
// REPO:sha256-HEX.sig whose layers are simple-signing payloads, each with
// its signature (base64) in an annotation. The tests make them with
// sigstore's signer, as cosign does; kosa8 only verifies.

// CosignSig is a payload and its signature.
type CosignSig struct{ Payload, Sig []byte }

// CosignPayload is the payload cosign signs for digest d of repo.
func CosignPayload(t testing.TB, repo, d string) []byte {
	t.Helper()
	dg, err := name.NewDigest(repo + "@" + d)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(payload.Cosign{Image: dg})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Sign signs p with s.
func Sign(t testing.TB, s signature.Signer, p []byte) CosignSig {
	t.Helper()
	sig, err := s.SignMessage(bytes.NewReader(p))
	if err != nil {
		t.Fatal(err)
	}
	return CosignSig{p, sig}
}

// PushCosignSignatures stores sigs beside digest d of repo.
func PushCosignSignatures(t testing.TB, repo, d string, sigs ...CosignSig) {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, s := range sigs {
		var err error
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:       static.NewLayer(s.Payload, "application/vnd.dev.cosign.simplesigning.v1+json"),
			Annotations: map[string]string{"dev.cosignproject.cosign/signature": base64.StdEncoding.EncodeToString(s.Sig)},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ref, err := name.ParseReference(repo + ":" + strings.Replace(d, ":", "-", 1) + ".sig")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
}
