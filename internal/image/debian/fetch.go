package debian

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// A body must keep arriving: the client's timeouts end at the response
// header, and the caller's context (kosa8 setup's) has no deadline, so a
// mirror or a man in the middle that sends the headers and then nothing,
// or a byte a minute, would hold a build forever. A GET whose body brings
// fewer than minWindowBytes in a stallWindow is cancelled: a floor of
// about 1 KiB/s, far below any link a build can use. Variables so that
// the test need not wait a minute.
var (
	stallWindow    = 60 * time.Second
	minWindowBytes = int64(64 << 10)
)

// errStalled is the cause of a GET cancelled by its stall watch.
var errStalled = errors.New("the mirror sent too little for too long (less than 64 KiB a minute)")

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
	ctx, cancel := context.WithCancelCause(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel(nil)
		return nil, &statusError{url: url, code: resp.StatusCode}
	}
	if resp.ContentLength > limit {
		resp.Body.Close()
		cancel(nil)
		return nil, fmt.Errorf("GET %s: %d bytes, more than the %d expected", url, resp.ContentLength, limit)
	}
	resp.Body = watchStall(ctx, resp.Body, cancel)
	return resp, nil
}

// stallWatch is a response body whose request is cancelled (with
// errStalled) when a stallWindow passes bringing fewer than minWindowBytes.
type stallWatch struct {
	body   io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	n      int64 // bytes read in the current window
	timer  *time.Timer
}

func watchStall(ctx context.Context, body io.ReadCloser, cancel context.CancelCauseFunc) io.ReadCloser {
	w := &stallWatch{body: body, ctx: ctx, cancel: cancel}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = time.AfterFunc(stallWindow, w.check)
	return w
}

func (w *stallWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n < minWindowBytes {
		w.cancel(errStalled)
		return
	}
	w.n = 0
	w.timer.Reset(stallWindow)
}

func (w *stallWatch) Read(p []byte) (int, error) {
	n, err := w.body.Read(p)
	w.mu.Lock()
	w.n += int64(n)
	if err == io.EOF {
		w.timer.Stop() // the whole body came: nothing left to watch
	}
	w.mu.Unlock()
	if err != nil && err != io.EOF && context.Cause(w.ctx) == errStalled {
		err = errStalled
	}
	return n, err
}

func (w *stallWatch) Close() error {
	w.mu.Lock()
	w.timer.Stop()
	w.mu.Unlock()
	err := w.body.Close()
	w.cancel(nil)
	return err
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
