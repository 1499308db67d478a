package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// The registry protocol (the ping, Basic and Bearer token auth with the
// user's keychain, the scheme) is go-containerregistry's; the fetches are
// ours, so that every document and blob goes through one bounded, checked
// path (PutBlob, readLimited) and no blob is fetched from a layer's foreign
// URLs.

// AnonymousKeychain gives no credentials for any registry: pulls of images
// the user did not name (a repository's dev container) go without the
// user's.
var AnonymousKeychain authn.Keychain = anonymousKeychain{}

type anonymousKeychain struct{}

func (anonymousKeychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	return authn.Anonymous, nil
}

// registrySource reads an image from a registry.
type registrySource struct {
	ref    name.Reference
	client *http.Client
}

func openRegistry(ctx context.Context, src string, o *PullOptions) (*registrySource, error) {
	ref, err := ParseReference(src, o.insecure())
	if err != nil {
		return nil, err
	}
	client, err := registryClient(ctx, ref.Context(), o, transport.PullScope)
	if err != nil {
		return nil, err
	}
	return &registrySource{ref: ref, client: client}, nil
}

// ParseReference parses a registry reference; registries named in insecure
// may be reached over plain HTTP.
func ParseReference(src string, insecure []string) (name.Reference, error) {
	if len(src) > 1024 {
		return nil, fmt.Errorf("image reference of %d characters: too long", len(src))
	}
	ref, err := name.ParseReference(src)
	if err != nil {
		return nil, fmt.Errorf("%q is not an image reference (registry/repository:tag or @sha256:...) nor a path: %w", clip(src), err)
	}
	for _, h := range insecure {
		if ref.Context().RegistryStr() == h {
			return name.ParseReference(src, name.Insecure)
		}
	}
	return ref, nil
}

// registryClient is an HTTP client speaking to repo's registry with the
// user's credentials for scope (pull or push).
func registryClient(ctx context.Context, repo name.Repository, o *PullOptions, scope string) (*http.Client, error) {
	auth, err := authn.Resolve(ctx, o.keychain(), repo)
	if err != nil {
		return nil, fmt.Errorf("registry credentials for %s (docker/podman config): %w", repo.RegistryStr(), err)
	}
	rt, err := transport.NewWithContext(ctx, repo.Registry, auth, o.guardedTransport(ctx, repo.Registry), []string{repo.Scope(scope)})
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", repo.RegistryStr(), err)
	}
	return &http.Client{Transport: rt, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("more than 5 redirects")
		}
		return nil
	}}, nil
}

// keychain finds registry credentials: o.Keychain, else the user's.
func (o *PullOptions) keychain() authn.Keychain {
	if o.Keychain != nil {
		return o.Keychain
	}
	return authn.DefaultKeychain
}

// remoteOptions are go-containerregistry's options for a push to reg:
// the user's credentials over the guarded transport.
func (o *PullOptions) remoteOptions(ctx context.Context, reg name.Registry) []remote.Option {
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(o.keychain()), remote.WithTransport(o.guardedTransport(ctx, reg))}
}

// guardedTransport is the transport every fetch from and push to reg goes
// through: plain HTTP only where plainHTTPGuard allows it and, over Go's
// default transport, no connection to this host's loopback (unless reg
// itself is on loopback) nor to link-local addresses. A registry may send
// a blob fetch elsewhere (a CDN); it may not send it, nor its token
// exchange, to a local admin port or a cloud's metadata service.
func (o *PullOptions) guardedTransport(ctx context.Context, reg name.Registry) http.RoundTripper {
	base := o.Transport
	if base == nil {
		t := remote.DefaultTransport.(*http.Transport).Clone()
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
			Control: localGuard(loopbackHost(hostOnly(reg.RegistryStr())), proxyAddrs(ctx, reg.RegistryStr()))}
		t.DialContext = d.DialContext
		base = t
	}
	return &plainHTTPGuard{next: base, insecure: o.insecure()}
}

// plainHTTPGuard refuses plain HTTP except to loopback and to registries
// the user named insecure: go-containerregistry would also fall back to it
// for private (RFC 1918) addresses, where anyone on the path reads and
// changes what is pulled.
type plainHTTPGuard struct {
	next     http.RoundTripper
	insecure []string
}

func (g *plainHTTPGuard) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" && !loopbackHost(r.URL.Hostname()) && !g.allowed(r.URL) {
		return nil, fmt.Errorf("plain HTTP to %s refused: kosa8 speaks plain HTTP only to registries on loopback and to those named in %s", r.URL.Host, InsecureEnv)
	}
	return g.next.RoundTrip(r)
}

func (g *plainHTTPGuard) allowed(u *url.URL) bool {
	for _, h := range g.insecure {
		if h == u.Host || h == u.Hostname() {
			return true
		}
	}
	return false
}

// hostOnly is host:port's host.
func hostOnly(hp string) string {
	if h, _, err := net.SplitHostPort(hp); err == nil {
		return h
	}
	return hp
}

// localGuard refuses connections to link-local and unspecified addresses,
// and to loopback unless loopbackOK, after name resolution (a name that
// resolves to 127.0.0.1 is refused as 127.0.0.1 is). Through an HTTP proxy
// the check applies to the proxy, which the user chose.
func localGuard(loopbackOK bool, proxies map[string]bool) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		if proxies[address] {
			return nil // the user's proxy (HTTPS_PROXY), on loopback perhaps
		}
		ip := net.ParseIP(host)
		if ip == nil {
			return fmt.Errorf("registry connection to %q: not an address", address)
		}
		switch {
		case ip.IsLoopback() && !loopbackOK:
			return fmt.Errorf("registry connection to %s refused: only a registry on loopback may send kosa8 to loopback", address)
		case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() || ip.IsMulticast():
			return fmt.Errorf("registry connection to %s refused: a link-local, multicast or unspecified address", address)
		}
		return nil
	}
}

// proxyAddrs are the addresses of the proxy the environment names for
// registry (host:port with each address its name resolves to).
func proxyAddrs(ctx context.Context, registry string) map[string]bool {
	u, err := http.ProxyFromEnvironment(&http.Request{URL: &url.URL{Scheme: "https", Host: registry}})
	if err != nil || u == nil {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "socks5": "1080"}[u.Scheme]
		if port == "" {
			port = "80"
		}
	}
	addrs, err := net.DefaultResolver.LookupHost(ctx, u.Hostname())
	if err != nil {
		return nil
	}
	m := map[string]bool{}
	for _, a := range addrs {
		m[net.JoinHostPort(a, port)] = true
	}
	return m
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func (s *registrySource) name() string { return s.ref.Name() }
func (s *registrySource) kind() string { return SourceRegistry }

func (s *registrySource) url(kind, id string) string {
	u := url.URL{Scheme: "https", Host: s.ref.Context().RegistryStr(), Path: "/v2/" + s.ref.Context().RepositoryStr() + "/" + kind + "/" + id}
	return u.String()
}

var manifestAccept = strings.Join([]string{MediaOCIIndex, MediaOCIManifest, MediaDockerList, MediaDockerManifest}, ",")

func (s *registrySource) manifest(ctx context.Context, d string, max int64) ([]byte, string, error) {
	id := d
	if id == "" {
		id = s.ref.Identifier()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url("manifests", id), nil)
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Accept", manifestAccept)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("fetch the manifest of %s: %w", s.name(), err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return nil, "", fmt.Errorf("fetch the manifest of %s: %w", s.name(), err)
	}
	if resp.ContentLength > max {
		return nil, "", fmt.Errorf("the manifest of %s is %d bytes, more than the %d allowed: %w", s.name(), resp.ContentLength, max, ErrTooLarge)
	}
	what := "the manifest of " + s.name()
	b, err := readLimited(resp.Body, max, what)
	if err != nil {
		return nil, "", err
	}
	if d == "" {
		if dd, ok := s.ref.(name.Digest); ok {
			d = dd.DigestStr()
		}
	}
	if err := verifyDoc(b, d, what); err != nil {
		return nil, "", err
	}
	mt, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	if mt == "" || mt == "application/json" || mt == "application/octet-stream" {
		mt = sniffMediaType(b)
	}
	return b, strings.TrimSpace(mt), nil
}

func (s *registrySource) blob(ctx context.Context, desc v1.Descriptor) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url("blobs", desc.Digest.String()), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		resp.Body.Close()
		return nil, err
	}
	if resp.ContentLength >= 0 && resp.ContentLength != desc.Size {
		resp.Body.Close()
		if resp.ContentLength > desc.Size {
			return nil, fmt.Errorf("the registry sends %d bytes where the descriptor says %d: %w", resp.ContentLength, desc.Size, ErrTooLarge)
		}
		return nil, fmt.Errorf("the registry sends %d bytes where the descriptor says %d", resp.ContentLength, desc.Size)
	}
	return resp.Body, nil
}
