package guest

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func ctl(k ControlKind, gen uint64) []byte {
	b, _ := Control{Kind: k, Generation: gen}.MarshalBinary()
	return b
}

func TestReadControlSkipsGarbage(t *testing.T) {
	cases := map[string][]byte{
		"clean":           ctl(Hello, 7),
		"leading garbage": append([]byte("\x00\x00\x00\x0cKSAxKSA8"), ctl(Hello, 7)...),
		"bad crc first":   append(func() []byte { b := ctl(Hello, 7); b[19] ^= 1; return b }(), ctl(Hello, 7)...),
		"bad kind first":  append(func() []byte { b := ctl(Hello, 7); b[4] = 9; return b }(), ctl(Hello, 7)...),
		"partial magic":   append([]byte("KSKSAKS"), ctl(Hello, 7)...),
		"yamux frame":     append([]byte{0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, ctl(Hello, 7)...),
		"ack then hello":  append(ctl(Ack, 3), ctl(Hello, 7)...),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			r := bufio.NewReader(bytes.NewReader(in))
			var c Control
			var err error
			for {
				c, err = ReadControl(r)
				if err != nil || c.Kind == Hello {
					break
				}
			}
			if err != nil || c != (Control{Kind: Hello, Generation: 7}) {
				t.Fatalf("got %+v, %v", c, err)
			}
		})
	}
	if _, err := ReadControl(bufio.NewReader(bytes.NewReader([]byte("no frame in here at all, just text")))); !errors.Is(err, io.EOF) {
		t.Fatalf("garbage only: err = %v, want EOF", err)
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	payloads := [][]byte{nil, []byte("x"), bytes.Repeat([]byte("a"), MaxFrame)}
	for _, p := range payloads {
		if err := WriteFrame(&buf, FrameStdout, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range payloads {
		f, err := ReadFrame(&buf)
		if err != nil || f.Kind != FrameStdout || !bytes.Equal(f.Payload, p) {
			t.Fatalf("frame of %d bytes: kind %d len %d err %v", len(p), f.Kind, len(f.Payload), err)
		}
	}
	if err := WriteFrame(&buf, FrameStdout, make([]byte, MaxFrame+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized write: %v", err)
	}
}

func TestReadFrameRejects(t *testing.T) {
	cases := map[string][]byte{
		"too large":    {byte(FrameStdout), 0x00, 0x10, 0x00, 0x01},
		"kind zero":    {0, 0, 0, 0, 0},
		"unknown kind": {99, 0, 0, 0, 0},
		"truncated":    {byte(FrameStdout), 0, 0, 0, 5, 'a'},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := ReadFrame(bytes.NewReader(in)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func FuzzReadFrame(f *testing.F) {
	var ok bytes.Buffer
	_ = WriteFrame(&ok, FrameExit, []byte(`{"code":0}`))
	f.Add(ok.Bytes())
	f.Add([]byte{byte(FrameStdout), 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		fr, err := ReadFrame(bytes.NewReader(in))
		if err != nil {
			return
		}
		if len(fr.Payload) > MaxFrame || len(fr.Payload)+5 > len(in) {
			t.Fatalf("frame of %d bytes from %d input bytes", len(fr.Payload), len(in))
		}
	})
}

func FuzzReadControl(f *testing.F) {
	f.Add(ctl(Hello, 1))
	f.Add(append([]byte("KSA8KSA8"), ctl(Start, 99)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := ReadControl(bufio.NewReader(bytes.NewReader(in)))
		if err != nil {
			return
		}
		// Whatever was found must be exactly a frame present in the input.
		if !bytes.Contains(in, ctl(c.Kind, c.Generation)) {
			t.Fatalf("control %+v not present in input", c)
		}
	})
}

func TestExecRequestValidate(t *testing.T) {
	bad := []ExecRequest{{}, {Argv: []string{""}}, {Argv: []string{"x"}, Env: []string{"NOEQUALS"}}, {Argv: []string{"x"}, Env: []string{"=v"}}, {Argv: []string{"x"}, Env: []string{"A\x00B=c"}},
		{Argv: []string{"x"}, ID: "a\r\nX: y"}, {Argv: []string{"x"}, ID: strings.Repeat("a", 65)}, {Argv: []string{"x"}, ID: "a b"}}
	for _, r := range bad {
		if r.Validate() == nil {
			t.Errorf("accepted %+v", r)
		}
	}
	good := ExecRequest{Argv: []string{"ls"}, Env: []string{"A=", "B=c=d"}, ID: "0123abcdEF-_." + strings.Repeat("a", 51)}
	if err := good.Validate(); err != nil {
		t.Error(err)
	}
}
