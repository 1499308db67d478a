package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/egress"
)

const (
	apiKeyValue = "sk-e2e-REAL-api-key-7f3c9a1b2d"
	gitToken    = "ghp_e2eREALgitTOKEN5e6f7a8b9c0d"
)

// apiServer stands in for an API and a git host, over HTTPS with
// certificates from a CA of its own (the "public roots" of this test).
type apiServer struct {
	port   int
	caFile string
	caPEM  []byte
	mu     sync.Mutex
	keys   []string // path and x-api-key of each request received
}

func (a *apiServer) received() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.keys, "\n")
}

func startAPIServer(t *testing.T) *apiServer {
	dir := t.TempDir()
	ca, err := egress.LoadOrCreateCA(dir, "e2e-upstream")
	if err != nil {
		t.Fatal(err)
	}
	a := &apiServer{caFile: filepath.Join(dir, egress.CACertFile), caPEM: ca.CertPEM()}
	repo := filepath.Join(dir, "git")
	for _, args := range [][]string{
		{"init", "-q", "--bare", "-b", "main", filepath.Join(repo, "repo.git")},
		{"-C", filepath.Join(repo, "repo.git"), "config", "http.receivepack", "true"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	gitCGI := &cgi.Handler{Path: "/usr/lib/git-core/git-http-backend", Env: []string{"GIT_PROJECT_ROOT=" + repo, "GIT_HTTP_EXPORT_ALL=1"}}
	wantAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("git:"+gitToken))
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.Host)
		if strings.Contains(r.URL.Path, ".git/") {
			if host == "git.test" && r.Header.Get("Authorization") != wantAuth {
				w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
				http.Error(w, "auth required", http.StatusUnauthorized)
				return
			}
			gitCGI.ServeHTTP(w, r)
			return
		}
		a.mu.Lock()
		a.keys = append(a.keys, r.URL.Path+" "+r.Header.Get("x-api-key"))
		a.mu.Unlock()
		switch r.URL.Path {
		case "/echo-gzip":
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			fmt.Fprintf(zw, "gz:%s", r.Header.Get("x-api-key"))
			zw.Close()
		case "/echo-chunks":
			k := r.Header.Get("x-api-key")
			for i := 0; i < len(k); i += 4 {
				io.WriteString(w, k[i:min(i+4, len(k))])
				w.(http.Flusher).Flush()
			}
		case "/echo-trailer":
			// As gRPC reports an error: in a trailer after the body.
			w.Header().Set("Trailer", "Grpc-Message")
			io.WriteString(w, "body\n")
			w.(http.Flusher).Flush()
			w.Header().Set("Grpc-Message", "bad key "+r.Header.Get("x-api-key"))
		case "/echo-br":
			w.Header().Set("Content-Encoding", "br")
			io.WriteString(w, "undecodable "+r.Header.Get("x-api-key"))
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Second)
			io.WriteString(w, "data: two\n\n")
		case "/-/ping":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "{}")
		default:
			fmt.Fprintf(w, "key=%s host=%s", r.Header.Get("x-api-key"), host)
		}
	})
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) }}}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	a.port = l.Addr().(*net.TCPAddr).Port
	return a
}

// scanSparse counts needles in the data of a file, reading only the
// allocated extents (disk images are mostly holes).
func scanSparse(t *testing.T, path string, needles map[string][]byte) (map[string]int, int64) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	counts := map[string]int{}
	const chunk = 8 << 20
	const overlap = 256
	buf := make([]byte, chunk+overlap)
	off := int64(0)
	for off < st.Size() {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // no more data
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			hole = st.Size()
		}
		for pos := data; pos < hole; pos += chunk {
			n, _ := f.ReadAt(buf[:min(int64(chunk+overlap), st.Size()-pos)], pos)
			for what, nd := range needles {
				// Count matches starting in this chunk only.
				window := buf[:n]
				for i := 0; ; {
					j := bytes.Index(window[i:], nd)
					if j < 0 || i+j >= chunk {
						break
					}
					counts[what]++
					i += j + 1
				}
			}
		}
		off = hole
	}
	return counts, st.Size()
}

func buildGoClient(t *testing.T) string {
	src := `package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	req, _ := http.NewRequest("GET", os.Args[1], nil)
	req.Header.Set("x-api-key", os.Getenv("API_KEY"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	b, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(b))
}
`
	return buildForGuest(t, src)
}

func TestSecrets(t *testing.T) {
	api := startAPIServer(t)
	plain := startServers(t) // a plain-HTTP host the placeholder must not reach
	p := api.port
	env := []string{
		"KOSA8_SECRET_BACKEND=file",
		"KOSA8_UPSTREAM_CA=" + api.caFile,
		"KOSA8_NET_OVERRIDES=api.test=127.0.0.1,git.test=127.0.0.1,pass.test=127.0.0.1,other.test=127.0.0.1",
	}
	add := func(stdin string, args ...string) {
		t.Helper()
		cmd := kosa8Cmd(t.Context(), append([]string{"secret", "add"}, args...)...)
		cmd.Env = append(cmd.Env, env...)
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("secret add: %v %s", err, out)
		}
	}
	add(apiKeyValue+"\n", "API_KEY", "--host", "api.test", "--header", "x-api-key")
	add(gitToken, "GIT_TOKEN", "--host", "git.test", "--format", "basic:git")
	if r := runWith(t, env, "secret", "add", "API_KEY", "--host", "api.test"); r.code == 0 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("duplicate secret: %s", r)
	}
	if r := runWith(t, env, "secret", "ls"); strings.Contains(r.stdout, apiKeyValue) || !strings.Contains(r.stdout, "API_KEY") {
		t.Fatalf("secret ls: %s", r)
	}

	name := "secrets"
	r := runWith(t, env, "create", name, "--secret", "API_KEY", "--secret", "GIT_TOKEN",
		"--allow", fmt.Sprintf("api.test:%d", p), "--allow", fmt.Sprintf("git.test:%d", p),
		"--allow", fmt.Sprintf("pass.test:%d", p), "--allow", fmt.Sprintf("other.test:%d", plain.httpPort))
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	if r := runWith(t, env, "create", "x-unknown", "--secret", "NOPE"); r.code == 0 || !strings.Contains(r.stderr, "no such secret") {
		t.Fatalf("unknown secret: %s", r)
	}
	if r := runWith(t, env, "start", name); r.code != 0 {
		t.Fatalf("start: %s", r)
	}
	// The test CA stands in for the public roots the guest already trusts.
	ic := kosa8Cmd(t.Context(), "exec", "-i", "-u", "root", name, "--", "sh", "-c", "cat >> /etc/ssl/certs/ca-certificates.crt")
	ic.Stdin = bytes.NewReader(api.caPEM)
	if out, err := ic.CombinedOutput(); err != nil {
		t.Fatalf("install test roots: %v %s", err, out)
	}
	sh := func(script string) result {
		t.Helper()
		return run(t, "", "exec", name, "--", "sh", "-c", script)
	}
	ph := strings.TrimSpace(sh("echo $API_KEY").stdout)
	if !strings.HasPrefix(ph, "kosa8-ph-") {
		t.Fatalf("API_KEY inside is %q, want a placeholder", ph)
	}
	// A process that lives through the whole test, using the key.
	sh(fmt.Sprintf(`(nohup sh -c 'while true; do curl -s -H "x-api-key: $API_KEY" https://api.test:%d/ >/dev/null; sleep 1; done' >/dev/null 2>&1 &)`, p))

	t.Run("injected upstream, placeholder inside", func(t *testing.T) {
		r := sh(fmt.Sprintf(`curl -sS -m 30 -H "x-api-key: $API_KEY" https://api.test:%d/v1/messages`, p))
		if r.code != 0 || r.stdout != "key="+ph+" host=api.test" {
			sup, _ := os.ReadFile(filepath.Join(ls(t)[name].Dir, "supervisor.log"))
			t.Fatalf("guest saw: %s\nnet log:\n%s\nsupervisor log:\n%s", r, tail(must(t, "net", "log", name).stdout, 3000), tail(string(sup), 3000))
		}
		if !strings.Contains(api.received(), apiKeyValue) {
			t.Fatalf("the API never received the real key: %q", api.received())
		}
		for _, path := range []string{"/echo-gzip", "/echo-chunks"} {
			r := sh(fmt.Sprintf(`curl -sS -m 30 --compressed -H "x-api-key: $API_KEY" https://api.test:%d%s`, p, path))
			if r.code != 0 || strings.Contains(r.stdout, apiKeyValue) || !strings.Contains(r.stdout, ph) {
				t.Fatalf("%s: %s", path, r)
			}
		}
	})
	t.Run("trailers and encodings masked", func(t *testing.T) {
		// --raw shows the chunked framing, trailers included.
		h2 := `const h=require("http2");const c=h.connect("https://api.test:%d");const r=c.request({":path":"/echo-trailer","x-api-key":process.env.API_KEY});` +
			`r.on("trailers",t=>console.log("h2 trailer:",t["grpc-message"]));r.on("data",()=>{});r.on("end",()=>c.close());r.end()`
		r := sh(fmt.Sprintf(`curl -sS -m 30 --http1.1 --raw -H "x-api-key: $API_KEY" https://api.test:%d/echo-trailer; echo; node -e '`+h2+`'`, p, p))
		if strings.Contains(r.stdout, apiKeyValue) || strings.Count(r.stdout, "bad key "+ph) < 2 {
			t.Fatalf("trailer echo (HTTP/1.1 and HTTP/2):\n%s", r)
		}
		r = sh(fmt.Sprintf(`curl -sS -m 30 -H "x-api-key: $API_KEY" https://api.test:%d/echo-br`, p))
		if strings.Contains(r.stdout, apiKeyValue) || !strings.Contains(r.stdout, "cannot be checked") {
			t.Fatalf("br response: %s", r)
		}
		if sec := must(t, "net", "log", "--security", name).stdout; !strings.Contains(sec, "br encoding cannot be checked") {
			t.Fatalf("the refused br response is not in the security log:\n%s", sec)
		}
	})
	t.Run("placeholder passes to its own host, refused elsewhere", func(t *testing.T) {
		// An agent's history carries the placeholder back to its API: it
		// passes there unchanged, wherever it is.
		for what, script := range map[string]string{
			"query": fmt.Sprintf(`curl -sS -m 30 "https://api.test:%d/search?q=$API_KEY"`, p),
			"body":  fmt.Sprintf(`curl -sS -m 30 -H "x-api-key: $API_KEY" -d "note=$API_KEY" https://api.test:%d/issues`, p),
		} {
			if r := sh(script); r.code != 0 || strings.Contains(r.stdout, "refused") {
				t.Errorf("%s to the secret's own host: %s", what, r)
			}
		}
		if got := api.received(); !strings.Contains(got, "/search") || !strings.Contains(got, "/issues "+apiKeyValue) {
			t.Fatalf("the requests with the placeholder did not reach the API: %s", got)
		}
		for what, script := range map[string]string{
			"header to another host": fmt.Sprintf(`curl -sS -m 30 -H "x-api-key: $API_KEY" http://other.test:%d/`, plain.httpPort),
			"query to another host":  fmt.Sprintf(`curl -sS -m 30 "http://other.test:%d/?q=$API_KEY"`, plain.httpPort),
		} {
			if r := sh(script); !strings.Contains(r.stdout, "placeholder") {
				t.Errorf("%s: not refused: %s", what, r)
			}
		}
		if n := strings.Count(must(t, "net", "log", "--security", name).stdout, "exfiltration"); n < 2 {
			t.Fatalf("%d exfiltration events in the security log, want 2", n)
		}
	})
	t.Run("git push with basic auth", func(t *testing.T) {
		r := sh(fmt.Sprintf(`set -e; cd /tmp; rm -rf w; git init -q -b main w; cd w
			git -c user.email=a@b -c user.name=agent commit -q --allow-empty -m first
			git push -q https://git.test:%d/repo.git main 2>&1
			git ls-remote https://git.test:%d/repo.git`, p, p))
		if r.code != 0 || !strings.Contains(r.stdout, "refs/heads/main") {
			t.Fatalf("git push: %s", r)
		}
	})
	t.Run("server-sent events stream", func(t *testing.T) {
		r := sh(fmt.Sprintf(`curl -sSN -m 30 https://api.test:%d/sse | while read -r l; do [ -n "$l" ] && echo "$(date +%%s.%%N) $l"; done`, p))
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 2 {
			t.Fatalf("events: %s", r)
		}
		var t1, t2 float64
		fmt.Sscanf(lines[0], "%f", &t1)
		fmt.Sscanf(lines[1], "%f", &t2)
		if t2-t1 < 1.5 {
			t.Fatalf("events %.2fs apart: the first was held back until the second (%q)", t2-t1, lines)
		}
	})
	t.Run("client matrix", func(t *testing.T) {
		goget := buildGoClient(t)
		cp := kosa8Cmd(t.Context(), "exec", "-i", name, "--", "sh", "-c", "cat > /tmp/goget && chmod +x /tmp/goget")
		f, err := os.Open(goget)
		if err != nil {
			t.Fatal(err)
		}
		cp.Stdin = f
		if out, err := cp.CombinedOutput(); err != nil {
			t.Fatalf("copy the Go client: %v %s", err, out)
		}
		f.Close()
		clients := map[string]string{
			"curl":   `curl -sS -m 30 -H "x-api-key: $API_KEY" %s/`,
			"python": `python3 -c "import os,requests; print(requests.get('%s/', headers={'x-api-key': os.environ['API_KEY']}, timeout=30).text)"`,
			"node":   `node -e "require('https').get('%s/', {headers: {'x-api-key': process.env.API_KEY}}, r => r.on('data', d => process.stdout.write(d))).on('error', e => {console.error(e.message); process.exit(1)})"`,
			"go":     `/tmp/goget %s/`,
			"npm":    `npm ping --registry %s/ --fetch-timeout 30000 2>&1 && echo key=ok`,
			"git":    `git ls-remote %s/repo.git && echo key=ok`,
		}
		for _, host := range []string{"api.test", "pass.test"} {
			for client, tmpl := range clients {
				base := fmt.Sprintf("https://%s:%d", host, p)
				r := sh(fmt.Sprintf(tmpl, base))
				if r.code != 0 || !strings.Contains(r.stdout, "key=") {
					t.Errorf("%s → %s: %s", client, host, r)
				}
				if strings.Contains(r.stdout, apiKeyValue) {
					t.Errorf("%s → %s: the real key reached the guest", client, host)
				}
			}
		}
	})
	t.Run("no real value in RAM or on disk", func(t *testing.T) {
		sh("sync")
		sb := ls(t)[name]
		ram := filepath.Join(t.TempDir(), "ram")
		f, err := os.Create(ram)
		if err != nil {
			t.Fatal(err)
		}
		dump := kosa8Cmd(t.Context(), "debug", "memory", name)
		var stderr bytes.Buffer
		dump.Stdout, dump.Stderr = f, &stderr
		if err := dump.Run(); err != nil {
			t.Fatalf("dump RAM: %v %s", err, stderr.String())
		}
		f.Close()
		needles := map[string][]byte{
			"value":          []byte(apiKeyValue),
			"base64 value":   []byte(base64.StdEncoding.EncodeToString([]byte(apiKeyValue))),
			"git token":      []byte(gitToken),
			"git basic auth": []byte(base64.StdEncoding.EncodeToString([]byte("git:" + gitToken))),
		}
		files := []string{ram}
		filepath.Walk(sb.Dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				files = append(files, p)
			}
			return nil
		})
		placeholders := 0
		needles["placeholder"] = []byte(ph)
		for _, file := range files {
			counts, size := scanSparse(t, file, needles)
			for what, c := range counts {
				if what != "placeholder" && c != 0 {
					t.Errorf("%s: the %s occurs %d times", file, what, c)
				}
			}
			if file == ram {
				placeholders = counts["placeholder"]
				if size < 256<<20 {
					t.Fatalf("RAM dump is only %d bytes", size)
				}
			}
		}
		if placeholders == 0 {
			t.Fatal("the placeholder is not in the RAM dump either: the scan would find nothing")
		}
		t.Logf("scanned %d files (RAM dump and the state directory); the placeholder occurs %d times in RAM, the real values 0 times", len(files), placeholders)
	})
	_ = context.Background
}
