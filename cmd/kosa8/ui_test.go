package main

import (
	"bytes"
	"testing"
)

func TestSanitize(t *testing.T) {
	cases := []struct {
		in, want  string
		keepLines bool
	}{
		{"plain", "plain", false},
		{"\x1b[2J\x1b]0;pwned\x07name", "?[2J?]0;pwned?name", false},
		{"a\nb\tc", "a?b?c", false},
		{"a\nb\tc\r", "a\nb\tc?", true},
		{"\u202eevil", "?evil", false},   // right-to-left override
		{"c1\u009bcsi", "c1?csi", false}, // C1 control
		{"ünïcode ok", "ünïcode ok", false},
	}
	for _, tc := range cases {
		if got := sanitize(tc.in, tc.keepLines); got != tc.want {
			t.Errorf("sanitize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	var buf bytes.Buffer
	_, _ = sanitizeWriter{&buf}.Write([]byte("ok\x1b[31m\xff\n"))
	if buf.String() != "ok?[31m?\n" {
		t.Errorf("sanitizeWriter: %q", buf.String())
	}
}
