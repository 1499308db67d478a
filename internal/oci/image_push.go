package oci

import (
	"context"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// PushV1Image uploads a runnable container image (kosa8's own pod image,
// internal/podimage) to ref, with the credentials, transport and
// plain-HTTP rule of a pull, and returns its manifest's digest.
func PushV1Image(ctx context.Context, ref string, img v1.Image, o PullOptions) (string, error) {
	r, err := ParseReference(ref, o.insecure())
	if err != nil {
		return "", err
	}
	if err := remote.Write(r, img, o.remoteOptions(ctx, r.Context().Registry)...); err != nil {
		return "", fmt.Errorf("push %s: %w", clip(ref), err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// WriteLayout writes img into an OCI image layout folder (made if need
// be; an image already there is kept beside it), named by the annotation
// org.opencontainers.image.ref.name = tag, and returns its digest.
func WriteLayout(dir, tag string, img v1.Image) (string, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		if p, err = layout.Write(dir, empty.Index); err != nil {
			return "", fmt.Errorf("make the OCI layout %s: %w", dir, err)
		}
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
		return "", fmt.Errorf("write the image into %s: %w", dir, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}
