package debian

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"
)

// TestNetworkTrixie opens the real trixie index with the embedded keys and
// resolves a base system. It needs the network, so it runs only with
// KOSA8_NET_TESTS=1.
func TestNetworkTrixie(t *testing.T) {
	if os.Getenv("KOSA8_NET_TESTS") != "1" {
		t.Skip("needs the network to reach deb.debian.org: set KOSA8_NET_TESTS=1")
	}
	src, err := ParseSource("deb http://deb.debian.org/debian trixie main")
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			start := time.Now()
			ix, err := Open(ctx, []Source{src}, arch, Options{Log: func(m string) { t.Log(m) }})
			if err != nil {
				t.Fatal(err)
			}
			opened := time.Since(start)
			roots := append(ix.Required(), "apt", "python3", "build-essential")
			pkgs, err := ix.Resolve(roots)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: Open took %v; %d required, %d packages resolved", arch, opened.Round(time.Millisecond), len(roots)-3, len(pkgs))
			var names []string
			for _, p := range pkgs {
				names = append(names, p.Name)
			}
			for _, want := range []string{"libc6", "dpkg", "apt", "python3", "gcc", "base-files", "bash"} {
				if !slices.Contains(names, want) {
					t.Errorf("%s missing from the closure", want)
				}
			}
			if len(pkgs) < 100 || len(pkgs) > 400 {
				t.Errorf("%d packages resolved, expected 100-400", len(pkgs))
			}
		})
	}
}
