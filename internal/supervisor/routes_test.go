package supervisor

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/api"
)

// api.Routes is the API's documentation: every route in it is served, and
// routes() panics on one that is not in it, so the two cannot drift.
func TestRoutesDocumentedAndServed(t *testing.T) {
	_, registered := (&supervisor{}).routeMux()
	for _, r := range api.Routes {
		if !slices.Contains(registered, r.Pattern) {
			t.Errorf("%s is documented in Routes but not served", r.Pattern)
		}
		if r.Doc == "" {
			t.Errorf("%s has no documentation", r.Pattern)
		}
	}
	if len(registered) != len(api.Routes) {
		t.Errorf("%d routes served, %d documented", len(registered), len(api.Routes))
	}
}

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
