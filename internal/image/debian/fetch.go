package debian

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// defaultClient has connect and response-header timeouts but no overall
// one: a .deb of hundreds of MiB on a slow link is legitimate, and the
// caller's context bounds the whole build.
func defaultClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}}
}

// statusError is a non-200 answer; Open falls back to another compression
// of a Packages file only on these, never on a bad hash.
type statusError struct {
	url  string
	code int
}

func (e *statusError) Error() string {
	return fmt.Sprintf("GET %s: HTTP %d", e.url, e.code)
}

// get starts a GET of url, failing early on a status other than 200 and on
// a Content-Length above limit.
func (c *conf) get(ctx context.Context, url string, limit int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, &statusError{url: url, code: resp.StatusCode}
	}
	if resp.ContentLength > limit {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %d bytes, more than the %d expected", url, resp.ContentLength, limit)
	}
	return resp, nil
}

// fetch reads url whole into memory, at most limit bytes (one more is read
// to tell an over-long body from an exact one).
func (c *conf) fetch(ctx context.Context, url string, limit int64) ([]byte, error) {
	start := time.Now()
	resp, err := c.get(ctx, url, limit)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %v", url, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("GET %s: body longer than the %d bytes expected", url, limit)
	}
	c.logf("fetched %s (%d bytes, %d ms)", url, len(data), time.Since(start).Milliseconds())
	return data, nil
}
