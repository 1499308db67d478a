package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// curl, a real client, through the broker: HTTP/2 and HTTP/1.1 with its
// trailers shown raw, masked.
func TestCurlThroughBroker(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed on this machine")
	}
	e := newBrokerEnv(t, nil)
	e.g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", e.port))
	}
	ip := syntheticFor(t, e.g, "api.test")
	l, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go e.g.HandleTCP(flowTo(netip.AddrPortFrom(ip, 443)), func() (net.Conn, error) { return c, nil })
		}
	}()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, e.ca.CertPEM(), 0o644)
	port := l.Addr().(*net.TCPAddr).Port
	for want, args := range map[string][]string{
		"proto=HTTP/2.0 key=" + placeholder:        {"-sS", "-m", "20", "-H", "x-api-key: " + placeholder, "https://api.test/v1/messages"},
		"Grpc-Message: invalid key " + placeholder: {"-sS", "-m", "20", "--http1.1", "--raw", "-H", "x-api-key: " + placeholder, "https://api.test/echo-trailer"},
	} {
		args = append(args, "--cacert", ca, "--connect-to", fmt.Sprintf("api.test:443:127.0.0.1:%d", port))
		out, err := exec.Command("curl", args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) || strings.Contains(string(out), apiKey) {
			t.Errorf("curl %v: %v\n%s", args, err, out)
		}
	}
}
