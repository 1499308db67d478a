package serve

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	asb "sigs.k8s.io/agent-sandbox/clients/go/sandbox"

	"github.com/kosa8/kosa8/internal/access"
	"github.com/kosa8/kosa8/internal/serve/servetest"
)

// hostMachine runs the guest's commands on the host, in a directory that
// stands for the guest's workspace: the HTTP contract, the credentials,
// the access check and the file scripts are the real ones; only the VM is
// not there.
type hostMachine struct{ dir string }

func (m hostMachine) Exec(ctx context.Context, c Command) (int, error) {
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, c.Args[0], c.Args[1:]...)
	cmd.Dir = m.dir
	if c.Dir != "" {
		cmd.Dir = c.Dir
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = c.Stdin, c.Stdout, c.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, err
	}
	return 0, nil
}

const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef"

// newServer is a Server for the sandbox "sb1" (identity id-1) over a
// temporary workspace.
func newServer(t *testing.T) (*Server, string) {
	t.Helper()
	dir := t.TempDir()
	auth, err := NewAuth(testToken, false)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{
		Machine: hostMachine{dir: dir}, Auth: auth,
		Scope: access.Only("id-1"), Target: access.Target{ID: "id-1", Name: "sb1"},
	}
	s.SetReady(true)
	return s, dir
}

func openClient(t *testing.T, url, sbName, token string) *asb.Sandbox {
	return servetest.Open(t, url, sbName, token)
}

func TestContractThroughAgentSandboxClient(t *testing.T) {
	s, dir := newServer(t)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	sb := openClient(t, hs.URL, "sb1", testToken)
	ctx := context.Background()

	res, err := sb.Run(ctx, "echo out; echo err >&2; pwd; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "out\n"+dir+"\n" || res.Stderr != "err\n" || res.ExitCode != 3 {
		t.Fatalf("run = %+v", res)
	}

	if err := sb.Write(ctx, "hello.txt", []byte("hi\x00there")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "hello.txt")); string(b) != "hi\x00there" {
		t.Fatalf("uploaded file holds %q", b)
	}
	got, err := sb.Read(ctx, "hello.txt")
	if err != nil || string(got) != "hi\x00there" {
		t.Fatalf("read = %q, %v", got, err)
	}
	// A leading "/" is the base directory, as the contract reads it.
	if got, err := sb.Read(ctx, "/hello.txt"); err != nil || string(got) != "hi\x00there" {
		t.Fatalf("read /hello.txt = %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := sb.Read(ctx, "empty"); err != nil || len(got) != 0 {
		t.Fatalf("read of an empty file = %q, %v", got, err)
	}
	var he *asb.HTTPError
	if _, err := sb.Read(ctx, "missing"); !errors.As(err, &he) || he.StatusCode != http.StatusNotFound {
		t.Fatalf("read of a missing file: %v", err)
	}

	if err := os.MkdirAll(filepath.Join(dir, "sub", "deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := sb.List(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name+":"+string(e.Type))
		if e.Name == "hello.txt" && (e.Size != 8 || e.ModTime.IsZero()) {
			t.Errorf("hello.txt listed as %+v", e)
		}
	}
	slices.Sort(names)
	if strings.Join(names, " ") != "empty:file hello.txt:file sub:directory" {
		t.Fatalf("list = %v", names)
	}
	if _, err := sb.List(ctx, "hello.txt"); !errors.As(err, &he) || he.StatusCode != http.StatusNotFound {
		t.Fatalf("list of a file: %v", err)
	}
	for p, want := range map[string]bool{"hello.txt": true, "sub/deeper": true, "nope": false} {
		if ok, err := sb.Exists(ctx, p); err != nil || ok != want {
			t.Errorf("exists %s = %v, %v", p, ok, err)
		}
	}
	// Climbing out of the base directory is refused, as the python runtime
	// refuses it.
	if _, err := sb.Read(ctx, "../outside"); !errors.As(err, &he) || he.StatusCode != http.StatusForbidden {
		t.Fatalf("read ../outside: %v", err)
	}
}

func TestUploadIntoFolders(t *testing.T) {
	s, dir := newServer(t)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	// The Go client sends plain names only; the python runtime takes
	// folders in the multipart filename ("data/in.csv"), and so does serve.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	part, _ := mw.CreateFormFile("file", "data/in.csv")
	part.Write([]byte("a,b\n"))
	mw.Close()
	req, _ := http.NewRequest("POST", hs.URL+"/upload", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload = %d", resp.StatusCode)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "data", "in.csv")); err != nil || string(b) != "a,b\n" {
		t.Fatalf("data/in.csv = %q, %v", b, err)
	}
	// Beyond the limit: 413, and nothing written.
	s.MaxUpload = 10
	body.Reset()
	mw = multipart.NewWriter(&body)
	part, _ = mw.CreateFormFile("file", "big")
	part.Write(bytes.Repeat([]byte("x"), 100))
	mw.Close()
	req, _ = http.NewRequest("POST", hs.URL+"/upload", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("upload over the limit = %d", resp.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(dir, "big")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused upload left a file: %v", err)
	}
}

// The attacks: no token, a wrong one, and a right one that names another
// sandbox through the router's header.
func TestContractRefusesWithoutCredentialOrForAnotherSandbox(t *testing.T) {
	s, dir := newServer(t)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	ctx := context.Background()
	var he *asb.HTTPError
	for _, tc := range []struct {
		name, sandbox, token string
		status               int
	}{
		{"no token", "sb1", "", http.StatusUnauthorized},
		{"wrong token", "sb1", strings.Repeat("x", 48), http.StatusUnauthorized},
		{"another sandbox", "sb2", testToken, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := openClient(t, hs.URL, tc.sandbox, tc.token)
			if _, err := sb.Run(ctx, "touch pwned"); !errors.As(err, &he) || he.StatusCode != tc.status {
				t.Fatalf("run: %v, want status %d", err, tc.status)
			}
			if err := sb.Write(ctx, "pwned", []byte("x")); !errors.As(err, &he) || he.StatusCode != tc.status {
				t.Fatalf("write: %v, want status %d", err, tc.status)
			}
			if _, err := sb.Read(ctx, "x"); !errors.As(err, &he) || he.StatusCode != tc.status {
				t.Fatalf("read: %v, want status %d", err, tc.status)
			}
			if _, err := os.Stat(filepath.Join(dir, "pwned")); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("a refused caller made a file")
			}
		})
	}
	// Health and readiness answer without a credential and tell nothing
	// else.
	for _, p := range []string{"/", "/ready"} {
		resp, err := http.Get(hs.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d", p, resp.StatusCode)
		}
	}
}

func TestNotReadyIs503(t *testing.T) {
	s, _ := newServer(t)
	s.SetReady(false)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("ready = %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", hs.URL+"/execute", strings.NewReader(`{"command":"true"}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("execute while not ready = %d", resp.StatusCode)
	}
}

func TestNewAuthRefusesNothingAndShortTokens(t *testing.T) {
	if _, err := NewAuth("", false); err == nil {
		t.Error("no credential at all was taken")
	}
	if _, err := NewAuth("short", false); err == nil {
		t.Error("a short token was taken")
	}
}

// kosa8's own API is served under /kosa8/v1/ to the same callers, its
// debug routes (the guest's RAM) never, however the path is spelled.
func TestKosa8APIBesideTheContract(t *testing.T) {
	s, _ := newServer(t)
	var got []string
	s.API = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path)
		w.WriteHeader(http.StatusOK)
	})
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	do := func(method, path, token string) int {
		req, _ := http.NewRequest(method, hs.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := do("GET", "/kosa8/v1/net", testToken); c != http.StatusOK {
		t.Fatalf("GET /kosa8/v1/net = %d", c)
	}
	if c := do("GET", "/kosa8/v1/net", ""); c != http.StatusUnauthorized {
		t.Fatalf("GET /kosa8/v1/net without a token = %d", c)
	}
	for _, p := range []string{"/kosa8/v1/debug/memory", "/kosa8/v1/deb%75g/memory", "/kosa8/v1/x/../debug/memory", "/kosa8/v1//debug/memory"} {
		if c := do("GET", p, testToken); c == http.StatusOK {
			t.Errorf("GET %s reached kosa8's API", p)
		}
	}
	if strings.Join(got, ",") != "GET /v1/net" {
		t.Fatalf("kosa8's API was asked %v", got)
	}
}

// A caller with the token may forward ports on loopback (the pod's other
// containers), never on all interfaces: that listener on the pod's IP
// would take no credential at all.
func TestNoPortForwardOnAllInterfaces(t *testing.T) {
	s, _ := newServer(t)
	var got []string
	s.API = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+" "+string(b))
		w.WriteHeader(http.StatusOK)
	})
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	post := func(p, body string) int {
		req, _ := http.NewRequest("POST", hs.URL+p, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, b := range []string{`{"host_port":8080,"guest_port":80,"all_interfaces":true}`, `{"host_port":8080,"guest_port":80,"ALL_INTERFACES":true}`,
		`{"all_interfaces":false,"all_interfaces":true,"host_port":1,"guest_port":1}`} {
		for _, p := range []string{"/kosa8/v1/ports", "/kosa8/v1/./ports", "/kosa8/v1/x/../ports"} {
			if c := post(p, b); c == http.StatusOK {
				t.Errorf("POST %s %s = %d", p, b, c)
			}
		}
	}
	if len(got) != 0 {
		t.Fatalf("kosa8's API was asked %v", got)
	}
	const ok = `{"host_port":8080,"guest_port":80}`
	if c := post("/kosa8/v1/ports", ok); c != http.StatusOK {
		t.Fatalf("a loopback forward = %d", c)
	}
	if len(got) != 1 || got[0] != "POST /v1/ports "+ok {
		t.Fatalf("kosa8's API was asked %q", got)
	}
}
