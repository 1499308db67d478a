// Package guest holds what the host and kosa8-agent (the guest's PID 1) say
// to each other, the host-side client, and the agent's own logic.
//
// # Channel
//
// The host and the agent share one byte stream: a virtio-serial port in the
// guest, a socket in the supervisor. The stream outlives either end's idea of
// a session (a rewound guest still holds the old one), so every session
// starts with a control handshake that both ends can find in a stream full
// of stale bytes:
//
//	host → guest   HELLO(gen)   repeated until acknowledged
//	guest → host   ACK(gen)     once per HELLO it sees
//	host → guest   START(gen)   then a yamux client session
//	guest          yamux server session after START(gen)
//
// A control frame is 20 bytes: "KSA8", kind, three zero bytes, the
// generation (big endian uint64), and a CRC-32 (IEEE) of the first 16 bytes.
// A reader slides over the stream one byte at a time until a frame checks
// out, so garbage before a valid frame is discarded. yamux frames start with
// a zero version byte, never with 'K', so a stale yamux stream cannot be
// taken for a control frame by accident, and a control frame breaks a stale
// yamux session at once ("invalid protocol version").
//
// # Streams
//
// Each operation is one yamux stream opened by the host. On it both sides
// speak frames: a kind byte, a big-endian uint32 length, the payload. The
// first frame is a Request (JSON), answered by a Response (JSON); what
// follows depends on the operation (stdio and exit for exec, data for files).
package guest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// ControlKind says what a control frame announces.
type ControlKind byte

const (
	Hello ControlKind = 1
	Ack   ControlKind = 2
	Start ControlKind = 3
)

const controlSize = 20

var controlMagic = [4]byte{'K', 'S', 'A', '8'}

// Control is a handshake frame.
type Control struct {
	Kind       ControlKind
	Generation uint64
}

// MarshalBinary encodes c as the 20 bytes sent on the wire.
func (c Control) MarshalBinary() ([]byte, error) {
	b := make([]byte, controlSize)
	copy(b, controlMagic[:])
	b[4] = byte(c.Kind)
	binary.BigEndian.PutUint64(b[8:16], c.Generation)
	binary.BigEndian.PutUint32(b[16:20], crc32.ChecksumIEEE(b[:16]))
	return b, nil
}

// parseControl reports whether b (at least 20 bytes) starts with a valid frame.
func parseControl(b []byte) (Control, bool) {
	if len(b) < controlSize || !bytes.Equal(b[:4], controlMagic[:]) || b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return Control{}, false
	}
	if crc32.ChecksumIEEE(b[:16]) != binary.BigEndian.Uint32(b[16:20]) {
		return Control{}, false
	}
	k := ControlKind(b[4])
	if k != Hello && k != Ack && k != Start {
		return Control{}, false
	}
	return Control{Kind: k, Generation: binary.BigEndian.Uint64(b[8:16])}, true
}

// ReadControl discards bytes from r until a valid control frame, and returns it.
func ReadControl(r *bufio.Reader) (Control, error) {
	for {
		b, err := r.Peek(controlSize)
		if err != nil {
			return Control{}, err
		}
		if c, ok := parseControl(b); ok {
			_, _ = r.Discard(controlSize)
			return c, nil
		}
		// Skip to the next possible start of a frame.
		skip := 1
		if i := bytes.IndexByte(b[1:], controlMagic[0]); i >= 0 {
			skip = i + 1
		} else {
			skip = controlSize
		}
		_, _ = r.Discard(skip)
	}
}

// WriteControl writes one control frame.
func WriteControl(w io.Writer, c Control) error {
	b, _ := c.MarshalBinary()
	_, err := w.Write(b)
	return err
}

// FrameKind says what a stream frame carries.
type FrameKind byte

const (
	FrameRequest  FrameKind = 1  // JSON Request, host → guest, first on a stream
	FrameResponse FrameKind = 2  // JSON Response, guest → host
	FrameStdin    FrameKind = 3  // bytes for the process's stdin
	FrameStdinEOF FrameKind = 4  // stdin closed
	FrameStdout   FrameKind = 5  // bytes from stdout (and the PTY)
	FrameStderr   FrameKind = 6  // bytes from stderr
	FrameResize   FrameKind = 7  // JSON WindowSize
	FrameSignal   FrameKind = 8  // one byte: the signal number
	FrameExit     FrameKind = 9  // JSON ExitStatus, last frame of an exec
	FrameData     FrameKind = 10 // file contents
	FrameEOF      FrameKind = 11 // end of file contents
	FrameError    FrameKind = 12 // JSON Response with an error, ends the stream
)

// MaxFrame caps a frame's payload. A peer that announces more is broken or
// hostile; the stream is dropped rather than buffered.
const MaxFrame = 1 << 20

// ErrFrameTooLarge is returned for a frame over MaxFrame.
var ErrFrameTooLarge = errors.New("frame exceeds 1 MiB")

// Frame is one unit on a stream.
type Frame struct {
	Kind    FrameKind
	Payload []byte
}

// WriteFrame writes one frame. Payloads over MaxFrame are the caller's bug.
func WriteFrame(w io.Writer, kind FrameKind, payload []byte) error {
	if len(payload) > MaxFrame {
		return ErrFrameTooLarge
	}
	// One write per frame keeps frames whole when several goroutines share w
	// behind a mutex, and saves a syscall per frame.
	buf := make([]byte, 5+len(payload))
	buf[0] = byte(kind)
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(payload)))
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one frame, refusing payloads over MaxFrame.
func ReadFrame(r io.Reader) (Frame, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return Frame{}, ErrFrameTooLarge
	}
	if hdr[0] == 0 || FrameKind(hdr[0]) > FrameError {
		return Frame{}, fmt.Errorf("unknown frame kind %d", hdr[0])
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return Frame{Kind: FrameKind(hdr[0]), Payload: p}, nil
}
