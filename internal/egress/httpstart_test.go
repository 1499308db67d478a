package egress

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// The first bytes decide how a guest connection is checked: a request
// begun and left waiting is undecided (refused), never raw bytes.
func TestHTTPStart(t *testing.T) {
	cases := []struct {
		name  string
		send  string
		close bool
		want  int
	}{
		{"a request", "GET / HTTP/1.1\r\n", false, startHTTP},
		{"half a method, then silence", "GE", false, startUndecided},
		{"half a method, then the end", "PO", true, startUndecided},
		{"a leading CRLF", "\r\nGET / HTTP/1.1\r\n", false, startOther},
		{"a lower-case method", "get / HTTP/1.1\r\n", false, startOther},
		{"another protocol", "SSH-2.0-OpenSSH\r\n", false, startOther},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			go func() {
				_, _ = b.Write([]byte(tc.send))
				if tc.close {
					b.Close()
				}
			}()
			start := time.Now()
			if got := httpStart(bufio.NewReader(a), a); got != tc.want {
				t.Fatalf("httpStart(%q) = %d, want %d", tc.send, got, tc.want)
			}
			if time.Since(start) > 5*time.Second {
				t.Fatal("no deadline")
			}
			b.Close()
		})
	}
}
