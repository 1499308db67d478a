package oci

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// Signatures are cosign's, as `cosign sign --key` stores them (kosa8
// invents no format of its own): beside the signed manifest, under the tag
// sha256-HEX.sig of the same repository, an image manifest whose layers
// are each a simple-signing payload (application/vnd.dev.cosign.
// simplesigning.v1+json: a JSON document naming the signed manifest's
// digest and the repository) with the signature of the payload, base64,
// in the annotation dev.cosignproject.cosign/signature.
//
// VerifySignature checks such a signature offline, against a public key
// the caller pins (a release's, or the user's): sigstore's Go library
// verifies the signature bytes; kosa8 bounds and checks what the registry
// sends around them. No transparency log or certificate is consulted
// (cosign's --insecure-ignore-tlog with --key): the pinned key is the
// trust, as the pinned digest is without it.

const (
	// MediaSimpleSigning is the media type of a cosign signature payload.
	MediaSimpleSigning = "application/vnd.dev.cosign.simplesigning.v1+json"
	// SignatureAnnotation holds a payload's signature, base64.
	SignatureAnnotation = "dev.cosignproject.cosign/signature"

	maxSigLayers  = 16
	maxSigPayload = 64 << 10
	maxSigBytes   = 8 << 10
)

// ErrUnsigned: no signature by the pinned key signs the image.
var ErrUnsigned = errors.New("no valid signature by the pinned key")

// SignatureTag is the tag cosign stores the signatures of digest d under.
func SignatureTag(d string) string {
	return strings.Replace(d, ":", "-", 1) + ".sig"
}

// ParsePublicKey reads a PEM public key (cosign.pub: ECDSA, Ed25519 or
// RSA) into a verifier.
func ParsePublicKey(pemBytes []byte) (signature.Verifier, error) {
	if len(pemBytes) > 16<<10 {
		return nil, errors.New("the public key is longer than 16 KiB: not a PEM public key")
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("the public key: %w", err)
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("the public key: %w", err)
	}
	return v, nil
}

// VerifySignature checks that the manifest or index digest d in the
// repository of ref is signed by key: some signature stored beside it
// verifies, and its payload names d and the same repository.
func VerifySignature(ctx context.Context, ref, d string, key signature.Verifier, o PullOptions) error {
	if err := checkDigest(d); err != nil {
		return err
	}
	r, err := ParseReference(ref, o.insecure())
	if err != nil {
		return err
	}
	repo := r.Context().Name()
	sigRef := repo + ":" + SignatureTag(d)
	s, err := openRegistry(ctx, sigRef, &o)
	if err != nil {
		return err
	}
	b, _, err := s.manifest(ctx, "", DefaultLimits.Manifest)
	if err != nil {
		return fmt.Errorf("%w for %s@%s: the signature %s: %v", ErrUnsigned, repo, d, sigRef, err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("the signature %s does not parse: %w", sigRef, err)
	}
	if len(m.Layers) > maxSigLayers {
		return fmt.Errorf("the signature %s has %d layers, more than the %d kosa8 reads", sigRef, len(m.Layers), maxSigLayers)
	}
	var why []string
	for i, l := range m.Layers {
		if err := verifyLayer(ctx, s, l, repo, d, key); err != nil {
			why = append(why, fmt.Sprintf("signature %d: %v", i+1, err))
			continue
		}
		return nil
	}
	if len(why) == 0 {
		why = []string{"it holds none"}
	}
	return fmt.Errorf("%w for %s@%s (%s): %s", ErrUnsigned, repo, d, sigRef, strings.Join(why, "; "))
}

// verifyLayer checks one signature layer.
func verifyLayer(ctx context.Context, s source, l v1.Descriptor, repo, d string, key signature.Verifier) error {
	if string(l.MediaType) != MediaSimpleSigning {
		return fmt.Errorf("media type %q is not a cosign payload", clip(string(l.MediaType)))
	}
	if l.Size < 0 || l.Size > maxSigPayload {
		return fmt.Errorf("a payload of %d bytes, more than %d", l.Size, maxSigPayload)
	}
	sigText := l.Annotations[SignatureAnnotation]
	if sigText == "" || len(sigText) > maxSigBytes {
		return errors.New("no signature annotation, or one too long")
	}
	sig, err := base64.StdEncoding.DecodeString(sigText)
	if err != nil {
		return fmt.Errorf("the signature is not base64: %v", err)
	}
	if err := checkDigest(l.Digest.String()); err != nil {
		return err
	}
	rc, err := s.blob(ctx, l)
	if err != nil {
		return err
	}
	body, err := readLimited(rc, l.Size, "the payload")
	rc.Close()
	if err != nil {
		return err
	}
	if err := verifyDoc(body, l.Digest.String(), "the payload"); err != nil {
		return err
	}
	// The signature over the payload's bytes first: only a payload the key
	// signed is read further.
	if err := key.VerifySignature(bytes.NewReader(sig), bytes.NewReader(body)); err != nil {
		return fmt.Errorf("does not verify with the pinned key: %v", err)
	}
	var p payload.SimpleContainerImage
	if err := json.Unmarshal(body, &p); err != nil {
		return fmt.Errorf("the payload does not parse: %v", err)
	}
	if p.Critical.Type != payload.CosignSignatureType {
		return fmt.Errorf("the payload's type is %q, not a cosign image signature", clip(p.Critical.Type))
	}
	if p.Critical.Image.DockerManifestDigest != d {
		return fmt.Errorf("it signs %s, not %s", clip(p.Critical.Image.DockerManifestDigest), d)
	}
	// The identity the signer claimed: the same repository (a tag or
	// digest after it does not matter; another repository does: a
	// signature of one image copied beside another).
	claimed, err := ParseReference(p.Critical.Identity.DockerReference, nil)
	if err != nil {
		return fmt.Errorf("the payload's docker-reference %q: %v", clip(p.Critical.Identity.DockerReference), err)
	}
	if claimed.Context().Name() != repo {
		return fmt.Errorf("it was made for %s, not %s", clip(claimed.Context().Name()), repo)
	}
	return nil
}
