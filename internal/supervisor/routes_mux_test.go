package supervisor

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/api"
)

// Each documented route is the pattern the mux itself picks for its method
// and path, and a few undocumented method/path pairs are not served.
func TestRoutesInMux(t *testing.T) {
	mux, _ := (&supervisor{}).routeMux()
	for _, r := range api.Routes {
		method, path, _ := strings.Cut(r.Pattern, " ")
		path = strings.NewReplacer("{id}", "x", "{port}", "1").Replace(path)
		if _, got := mux.Handler(httptest.NewRequest(method, path, nil)); got != r.Pattern {
			t.Errorf("%s %s: mux picks %q, want %q", method, path, got, r.Pattern)
		}
	}
	for _, p := range []string{"PUT /v1/status", "GET /v1/exec", "GET /v1/checkpoints", "GET /v1/rewind"} {
		method, path, _ := strings.Cut(p, " ")
		if _, got := mux.Handler(httptest.NewRequest(method, path, nil)); got != "" {
			t.Errorf("%s served by %q", p, got)
		}
	}
}
