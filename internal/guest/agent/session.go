package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kosa8/kosa8/internal/guest"
)

// StreamHandler serves one stream opened by the host.
type StreamHandler func(ctx context.Context, s net.Conn)

// ServeChannel runs the guest half of the channel on port for as long as the
// port can be read: it waits for a HELLO, acknowledges it, waits for START,
// and serves a yamux session until the stream breaks or a newer HELLO
// arrives, then starts over. It returns only when reading the port fails,
// which on a virtio-serial port (see portConn) it never does.
func ServeChannel(ctx context.Context, port io.ReadWriter, handle StreamHandler, log *slog.Logger) error {
	br := bufio.NewReaderSize(port, 64<<10)
	for {
		gen, err := handshake(br, port, log)
		if err != nil {
			return err
		}
		log.Info("host connected", "generation", gen)
		rest, err := serveSession(ctx, br, port, handle, log)
		if err != nil {
			return err
		}
		// Bytes the dead session did not consume may hold the next HELLO.
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(rest), br), 64<<10)
	}
}

// handshake returns the generation the host started.
func handshake(br *bufio.Reader, w io.Writer, log *slog.Logger) (uint64, error) {
	var gen uint64
	acked := false
	for {
		c, err := guest.ReadControl(br)
		if err != nil {
			return 0, err
		}
		switch c.Kind {
		case guest.Hello:
			// Acknowledge every HELLO: the host repeats it until it sees an
			// ACK and skips the extra ones before its yamux session.
			gen, acked = c.Generation, true
			if err := guest.WriteControl(w, guest.Control{Kind: guest.Ack, Generation: gen}); err != nil {
				log.Warn("write ack", "err", err)
			}
		case guest.Start:
			if acked && c.Generation == gen {
				return gen, nil
			}
		}
	}
}

// serveSession runs one yamux session fed from br until it ends. It returns
// the bytes it read from br that the session did not consume.
func serveSession(ctx context.Context, br *bufio.Reader, w io.Writer, handle StreamHandler, log *slog.Logger) ([]byte, error) {
	pr, pw := io.Pipe()
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false // the host probes; a paused host must not kill the session
	cfg.StreamOpenTimeout = 0
	// Bulk transfers (the first workspace sync) stall on the 256 KiB
	// default window; memory per stream only grows while data is in flight.
	cfg.MaxStreamWindowSize = 4 << 20
	cfg.ConnectionWriteTimeout = time.Hour // writes block while the host end is away
	cfg.LogOutput = io.Discard
	sess, err := yamux.Server(&pipeConn{r: pr, w: w}, cfg)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-sess.CloseChan()
		pr.CloseWithError(errors.New("session closed"))
	}()
	go func() {
		for {
			s, err := sess.AcceptStream()
			if err != nil {
				return
			}
			go handle(sctx, s)
		}
	}()
	// Only this loop reads br, so when the session dies the bytes it did not
	// take are known exactly and go back to the handshake scanner. It
	// follows yamux's framing too: a byte that should start a frame header
	// but is not version 0 is a new host's HELLO (after a restore the old
	// session is still here), which ends the session at once instead of
	// being swallowed by it, which would cost a HELLO interval.
	var cur frameCursor
	buf := make([]byte, 32<<10)
	for {
		n, err := br.Read(buf)
		if err != nil {
			sess.Close()
			return nil, err
		}
		if i := cur.feed(buf[:n]); i >= 0 {
			_, _ = pw.Write(buf[:i])
			sess.Close()
			log.Info("session ended: the host started over")
			return append([]byte(nil), buf[i:n]...), nil
		}
		m, werr := pw.Write(buf[:n])
		if werr != nil {
			sess.Close()
			log.Info("session ended", "err", werr)
			return append([]byte(nil), buf[m:n]...), nil
		}
	}
}

// pipeConn adapts the session's reader and the port's writer to the
// io.ReadWriteCloser yamux wants. Close leaves the port open.
type pipeConn struct {
	r *io.PipeReader
	w io.Writer
}

func (p *pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *pipeConn) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *pipeConn) Close() error                { return p.r.Close() }

// frameCursor follows yamux frame boundaries in a byte stream: 12-byte
// headers (version 0, type, flags, stream id, length) and, for data frames,
// length bytes of payload.
type frameCursor struct {
	hdr     [12]byte
	have    int    // header bytes seen so far
	payload uint32 // payload bytes still to come
}

// feed advances over b and returns the offset of the first byte that
// cannot be yamux (a header not starting with version 0), or -1.
func (c *frameCursor) feed(b []byte) int {
	for i := 0; i < len(b); {
		if c.payload > 0 {
			n := len(b) - i
			if uint64(n) > uint64(c.payload) {
				n = int(c.payload)
			}
			i += n
			c.payload -= uint32(n)
			continue
		}
		if c.have == 0 && b[i] != 0 {
			return i
		}
		c.hdr[c.have] = b[i]
		c.have++
		i++
		if c.have == len(c.hdr) {
			c.have = 0
			if c.hdr[1] == 0 { // data
				c.payload = uint32(c.hdr[8])<<24 | uint32(c.hdr[9])<<16 | uint32(c.hdr[10])<<8 | uint32(c.hdr[11])
			}
		}
	}
	return -1
}
