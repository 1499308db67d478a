package serve

import (
	"bytes"
	"io"
	"net/http"
)

// capped keeps the first max bytes written to it; over records that more
// came.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	n := len(p)
	if room := c.max - c.buf.Len(); len(p) > room {
		c.over = true
		p = p[:max(0, room)]
	}
	c.buf.Write(p)
	return n, nil
}

func (c *capped) Bytes() []byte  { return c.buf.Bytes() }
func (c *capped) String() string { return c.buf.String() }

// limitedReader reads at most left bytes of r; over records that r had
// more, and then it reads as an error, so the upload fails.
type limitedReader struct {
	r    io.Reader
	left int64
	over bool
	err  error // a read error of r other than EOF (the upload cut short)
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		var one [1]byte
		if n, _ := l.r.Read(one[:]); n > 0 {
			l.over = true
			return 0, errTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if err != nil && err != io.EOF {
		l.err = err
	}
	return n, err
}

type tooLarge struct{}

func (tooLarge) Error() string { return "the upload is larger than allowed" }

var errTooLarge error = tooLarge{}

// lazyWriter sends the status 200 and its content type with the first
// byte written, so a handler can still answer an error while nothing is.
type lazyWriter struct {
	w       http.ResponseWriter
	typ     string
	started bool
}

func (l *lazyWriter) start() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", l.typ)
		l.w.WriteHeader(http.StatusOK)
	}
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	l.start()
	return l.w.Write(p)
}
