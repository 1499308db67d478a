package oci

import "testing"

// TestLocalGuard: which addresses a registry connection may reach.
func TestLocalGuard(t *testing.T) {
	proxy := map[string]bool{"127.0.0.1:3128": true}
	cases := []struct {
		addr       string
		loopbackOK bool
		ok         bool
	}{
		{"192.0.2.7:443", false, true},
		{"[2001:db8::1]:443", false, true},
		{"127.0.0.1:5000", false, false},
		{"127.0.0.1:5000", true, true},
		{"[::1]:5000", false, false},
		{"169.254.169.254:80", false, false},
		{"169.254.169.254:80", true, false},
		{"[fe80::1]:80", true, false},
		{"0.0.0.0:80", false, false},
		{"224.0.0.1:80", false, false},
		{"127.0.0.1:3128", false, true}, // the user's proxy
	}
	for _, c := range cases {
		err := localGuard(c.loopbackOK, proxy)("tcp", c.addr, nil)
		if (err == nil) != c.ok {
			t.Errorf("%s (loopback allowed %v): %v, want allowed=%v", c.addr, c.loopbackOK, err, c.ok)
		}
	}
}
