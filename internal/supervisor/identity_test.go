package supervisor

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/sandbox"
)

// A request naming another sandbox's identity than the supervisor's (its
// caller opened a sandbox that was removed since, and this one was made
// under the name) is refused before any handler runs; one naming this
// sandbox, or none, is served.
func TestRequestsNameTheSandboxTheyMean(t *testing.T) {
	s := &supervisor{sb: &sandbox.Sandbox{Config: sandbox.Config{Name: "dev", ID: "id-new"}}}
	served := 0
	h := s.sameSandbox(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))
	for _, tc := range []struct {
		id   string
		code int
	}{{"id-new", 200}, {"", 200}, {"id-old", http.StatusConflict}} {
		before := served
		req := httptest.NewRequest("POST", "/v1/exec", nil)
		if tc.id != "" {
			req.Header.Set(api.SandboxIDHeader, tc.id)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.code || (tc.code == 200) != (served > before) {
			t.Errorf("id %q: %d %s (served %v)", tc.id, rec.Code, rec.Body, served > before)
		}
		if tc.code != 200 && !strings.Contains(rec.Body.String(), "not the one you opened") {
			t.Errorf("id %q: %s", tc.id, rec.Body)
		}
	}
	// The API the supervisor serves is wrapped so.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/v1/status", nil)
	req.Header.Set(api.SandboxIDHeader, "id-old")
	s.routes().ServeHTTP(rec, req)
	if rec.Code != http.StatusConflict {
		t.Errorf("routes() answered a request for another sandbox: %d %s", rec.Code, rec.Body)
	}
}
