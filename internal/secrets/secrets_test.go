package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const realValue = "sk-test-0123456789abcdef"

func openFile(t *testing.T) *Store {
	t.Setenv("KOSA8_SECRET_BACKEND", "file")
	s, err := Open(filepath.Join(t.TempDir(), "cfg"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStoreRoundTripAndPermissions(t *testing.T) {
	s := openFile(t)
	sec := Secret{Name: "API_KEY", Hosts: []string{"API.example.com."}, Header: "x-api-key"}
	if err := s.Add(sec, []byte(realValue), false); err != nil {
		t.Fatal(err)
	}
	got, v, err := s.Get("API_KEY")
	if err != nil || string(v.Bytes()) != realValue || got.Hosts[0] != "api.example.com" || got.Format != "{value}" {
		t.Fatalf("get: %+v %v", got, err)
	}
	if err := s.Add(sec, []byte("other"), false); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := s.Add(sec, []byte("other"), true); err != nil {
		t.Fatalf("replace: %v", err)
	}
	for _, f := range []string{"secrets.json", "secret-values.json"} {
		fi, err := os.Stat(filepath.Join(s.dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v err %v", f, fi.Mode(), err)
		}
	}
	if fi, _ := os.Stat(s.dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("config dir mode %v", fi.Mode())
	}
	meta, _ := os.ReadFile(filepath.Join(s.dir, "secrets.json"))
	if bytes.Contains(meta, []byte("other")) || bytes.Contains(meta, []byte(realValue)) {
		t.Error("the metadata file holds a value")
	}
	if err := os.Chmod(filepath.Join(s.dir, "secret-values.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get("API_KEY"); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable value file was read: %v", err)
	}
	os.Chmod(filepath.Join(s.dir, "secret-values.json"), 0o600)
	if err := s.Remove("API_KEY"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get("API_KEY"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after remove: %v", err)
	}
}

func TestValidation(t *testing.T) {
	cases := map[string]Secret{
		"bad name":      {Name: "has-dash", Hosts: []string{"a.com"}},
		"no host":       {Name: "K"},
		"host with url": {Name: "K", Hosts: []string{"https://a.com"}},
		"host port":     {Name: "K", Hosts: []string{"a.com:8443"}},
		"cidr host":     {Name: "K", Hosts: []string{"10.0.0.0/8"}},
		"bad header":    {Name: "K", Hosts: []string{"a.com"}, Header: "x api key"},
		"no {value}":    {Name: "K", Hosts: []string{"a.com"}, Format: "Bearer"},
		"two {value}":   {Name: "K", Hosts: []string{"a.com"}, Format: "{value}{value}"},
		"basic colon":   {Name: "K", Hosts: []string{"a.com"}, Format: "basic:a:b"},
		"basic header":  {Name: "K", Hosts: []string{"a.com"}, Header: "x-key", Format: "basic:me"},
	}
	for name, s := range cases {
		if err := s.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for _, v := range []string{"", "a\nb", "a\rb", "a\x00b", strings.Repeat("x", 17<<10)} {
		if ValidateValue("K", []byte(v)) == nil {
			t.Errorf("value %q accepted", v)
		}
	}
}

func TestHeaderValue(t *testing.T) {
	v := NewValue([]byte("tok"))
	cases := []struct {
		format, want string
	}{
		{"{value}", "tok"},
		{"Bearer {value}", "Bearer tok"},
		{"basic:git", "Basic " + base64.StdEncoding.EncodeToString([]byte("git:tok"))},
	}
	for _, tc := range cases {
		s := Secret{Name: "K", Hosts: []string{"a.com"}, Format: tc.format}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := s.HeaderValue(v); got != tc.want {
			t.Errorf("format %q: %q, want %q", tc.format, got, tc.want)
		}
	}
}

func TestValueNeverPrints(t *testing.T) {
	v := NewValue([]byte(realValue))
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	log.Info("using", "secret", v, "wrapped", struct{ V Value }{v})
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("json", "secret", v)
	b, _ := json.Marshal(map[string]any{"v": v})
	out := logs.String() + fmt.Sprint(v) + fmt.Sprintf("%v %+v %#v %s", v, v, v, v) + string(b)
	if strings.Contains(out, realValue) {
		t.Fatalf("the value leaked into printed output:\n%s", out)
	}
	if !strings.Contains(out, "[REDACTED]") {
		t.Fatal("no redaction marker: the test checks nothing")
	}
}

func TestPlaceholder(t *testing.T) {
	a, b := NewPlaceholder(), NewPlaceholder()
	if a == b || !strings.HasPrefix(a, PlaceholderPrefix) || len(a) < len(PlaceholderPrefix)+32 {
		t.Fatalf("placeholders %q %q", a, b)
	}
	if ValidateValue("K", []byte(a)) != nil {
		t.Fatal("a placeholder cannot travel in a header")
	}
}
