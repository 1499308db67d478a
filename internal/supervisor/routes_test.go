package supervisor

import (
	"slices"
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
