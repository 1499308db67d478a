// Package serve is `kosa8 serve`: one sandbox per process, answered over
// TCP for a Kubernetes pod. It speaks the runtime contract of
// kubernetes-sigs/agent-sandbox (what its sandbox-router forwards to port
// 8888 and its Go and Python clients call, as its example python runtime
// answers it) and mounts kosa8's own API beside it:
//
//	GET  /                       health: {"status":"ok",...} (no credential needed)
//	GET  /ready                  200 once the guest's agent answers, else 503 (the readiness probe)
//	POST /execute                {"command": "..."} → {"stdout","stderr","exit_code"}; run by /bin/sh -c
//	POST /upload                 multipart field "file"; its filename (may hold folders) is the path
//	GET  /download/{path...}     the file's bytes; 404 {"message"} when it is not a file
//	GET  /list/{path...}         [{"name","size","type":"file"|"directory","mod_time"}]
//	GET  /exists/{path...}       {"path","exists"}
//	     /kosa8/v1/...           kosa8's own API (internal/api.Routes), but /v1/debug/
//
// Paths are read as the contract reads them: under the base directory
// (the sandbox's workspace in the guest by default), a leading "/"
// dropped, ".." above the base refused with 403. Everything else than the
// two health routes needs a credential (a token, or a client certificate
// when the listener does mTLS) and passes the faces' one access check
// (access.Scope.Check): a request naming another sandbox in the router's
// X-Sandbox-ID header is refused, whatever its credential, so a caller
// reaches only the sandbox this process holds.
//
// Errors answer {"message": "..."} as the python runtime does. The
// differences from that runtime: /execute runs its command with /bin/sh -c
// (the runtime split it with shlex and ran no shell; sandboxd and the Go
// client's sandboxd path use sh -c), and each of its streams is capped at
// MaxOutput.
package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kosa8/kosa8/internal/access"
	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/termsafe"
)

// Command is a command to run in the guest, as the sandbox's user.
type Command struct {
	Args           []string
	Dir            string // "" is the guest's default: the workspace, else the user's home
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Timeout        time.Duration // 0: none
}

// Machine runs commands in the sandbox's guest. The exit code is the
// command's own; an error means it could not be run or followed.
type Machine interface {
	Exec(ctx context.Context, c Command) (exit int, err error)
}

// Limits of one request.
const (
	MaxOutput        = 8 << 20   // per stream of /execute (the Go client reads 16 MiB of JSON)
	maxRequestJSON   = 1 << 20   // the body of /execute
	defaultMaxUpload = 256 << 20 // the clients' own default MaxUploadSize
	notThere         = 44        // the file scripts' exit code for "no such file or directory"
)

// Server answers one sandbox.
type Server struct {
	Machine Machine
	Auth    *Auth
	// Scope is the callers' access (access.Only of this sandbox's
	// identity) and Target this sandbox, as the check reads it; Name is
	// what the router's X-Sandbox-ID names it by (the pod's name).
	Scope  *access.Scope
	Target access.Target
	// BaseDir is the guest folder the contract's paths are under and
	// commands start in; "" is the guest's default.
	BaseDir     string
	ExecTimeout time.Duration // 0: 300 s, the python runtime's default
	MaxUpload   int64         // 0: 256 MiB
	// API serves kosa8's own API (paths /v1/...); nil for none.
	API http.Handler
	Log *slog.Logger

	ready atomic.Bool
}

// SetReady says whether the guest answers (the readiness probe's answer).
func (s *Server) SetReady(ok bool) { s.ready.Store(ok) }

// Ready says whether the readiness probe is answered 200.
func (s *Server) Ready() bool { return s.ready.Load() }

// Handler is the server's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "message": "kosa8 sandbox runtime is active."})
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		if !s.Ready() {
			writeJSON(w, http.StatusServiceUnavailable, message("the sandbox is not ready"))
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("POST /execute", s.guard(s.execute))
	mux.Handle("POST /upload", s.guard(s.upload))
	mux.Handle("GET /download/{path...}", s.guard(s.download))
	mux.Handle("GET /list/{path...}", s.guard(s.list))
	mux.Handle("GET /exists/{path...}", s.guard(s.exists))
	if s.API != nil {
		mux.Handle("/kosa8/v1/", s.guard(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/kosa8/v1/debug/") {
				writeJSON(w, http.StatusForbidden, message("kosa8's debug routes are not served over the network"))
				return
			}
			if r.Method == http.MethodPost && path.Clean(r.URL.Path) == "/kosa8/v1/ports" {
				// A forward on all interfaces would open a listener on
				// the pod's IP that asks no credential: only loopback
				// ones (for the pod's other containers) are served.
				var pf api.PortForward
				b, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
				if err != nil || json.Unmarshal(b, &pf) != nil {
					writeJSON(w, http.StatusBadRequest, message("a port forward is JSON: {\"host_port\":N,\"guest_port\":M}"))
					return
				}
				if pf.AllInterfaces {
					s.logf(r, "refused: a port forward on all interfaces")
					writeJSON(w, http.StatusForbidden, message("a port forward on all interfaces is not served over the network (it would take no credential): forward on loopback, and expose the port through the pod's Service"))
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(b))
				r.ContentLength = int64(len(b))
			}
			http.StripPrefix("/kosa8", s.API).ServeHTTP(w, r)
		}))
	}
	return mux
}

// guard authenticates the caller, then asks the one access check whether
// it may act on the sandbox the request names.
func (s *Server) guard(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.Auth.Check(r); err != nil {
			s.logf(r, "refused: %v", err)
			w.Header().Set("WWW-Authenticate", `Bearer realm="kosa8"`)
			writeJSON(w, http.StatusUnauthorized, message(err.Error()))
			return
		}
		t := s.Target
		if id := r.Header.Get("X-Sandbox-ID"); id != "" && id != s.Target.Name {
			// The router names another sandbox: it is not this one,
			// whatever its name once was here.
			t = access.Target{Name: id}
		}
		if err := s.Scope.Check(t); err != nil {
			s.logf(r, "refused: %v", err)
			writeJSON(w, http.StatusForbidden, message(termsafe.Clean(err.Error(), false)))
			return
		}
		if !s.Ready() {
			// 503 is one the clients retry.
			writeJSON(w, http.StatusServiceUnavailable, message("the sandbox is not ready (starting, or suspending)"))
			return
		}
		h(w, r)
	})
}

func (s *Server) logf(r *http.Request, format string, args ...any) {
	if s.Log != nil {
		s.Log.Info(termsafe.Clean(fmt.Sprintf(format, args...), false), "method", r.Method, "path", termsafe.Clean(r.URL.Path, false), "remote", r.RemoteAddr)
	}
}

type executeRequest struct {
	Command string `json:"command"`
}

type executeResponse struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestJSON))
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, message("the body must be {\"command\": \"...\"}: "+err.Error()))
		return
	}
	if req.Command == "" || strings.ContainsRune(req.Command, 0) {
		writeJSON(w, http.StatusUnprocessableEntity, message("command must be a non-empty string without NUL"))
		return
	}
	timeout := s.ExecTimeout
	if timeout <= 0 {
		timeout = 300 * time.Second
	}
	stdout, stderr := &capped{max: MaxOutput}, &capped{max: MaxOutput}
	code, err := s.Machine.Exec(r.Context(), Command{
		Args: []string{"/bin/sh", "-c", req.Command}, Dir: s.BaseDir,
		Stdout: stdout, Stderr: stderr, Timeout: timeout,
	})
	resp := executeResponse{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: code}
	if err != nil {
		// As the python runtime: a command that could not be run is
		// exit code 1 and a message on stderr, not an HTTP error.
		resp = executeResponse{Stderr: "Failed to execute command: " + err.Error(), ExitCode: 1}
	}
	if stdout.over || stderr.over {
		resp.Stderr += fmt.Sprintf("\n[kosa8: output beyond %d MiB per stream was dropped]", MaxOutput>>20)
	}
	writeJSON(w, http.StatusOK, resp)
}

// The file scripts run in the guest as the sandbox's user, so the guest's
// own permissions apply. Exit notThere means no such file (or not one of
// the kind asked for).
const (
	scriptRead = `[ -f "$1" ] || exit 44; exec cat -- "$1"`
	// An upload is two commands: the bytes go to a temporary file beside
	// the target (its name printed first), then it is renamed over the
	// target only if every byte arrived; an upload cut short or over the
	// limit removes it instead (its stdin ends either way, so one command
	// could not tell).
	scriptWrite  = `set -e; dir=$(dirname -- "$1"); mkdir -p -- "$dir"; tmp=$(mktemp -- "$dir/.kosa8-upload.XXXXXX"); printf '%s\0' "$tmp"; cat > "$tmp"`
	scriptCommit = `chmod 644 -- "$1" && mv -f -- "$1" "$2"`
	scriptAbort  = `rm -f -- "$1"`
	scriptList   = `[ -d "$1" ] || exit 44; cd -- "$1" && exec find -L . -mindepth 1 -maxdepth 1 -printf '%y\0%s\0%T@\0%f\0'`
	scriptExists = `[ -e "$1" ] || [ -L "$1" ] || exit 44`
)

func (s *Server) pathOf(w http.ResponseWriter, p string) (string, bool) {
	gp, err := contractPath(s.BaseDir, p)
	if errors.Is(err, ErrOutside) {
		writeJSON(w, http.StatusForbidden, message("Access denied: "+err.Error()))
		return "", false
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, message(err.Error()))
		return "", false
	}
	return gp, true
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	limit := s.MaxUpload
	if limit <= 0 {
		limit = defaultMaxUpload
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit+64<<10) // the file and the multipart framing
	mr, err := r.MultipartReader()
	if err != nil {
		writeJSON(w, http.StatusBadRequest, message("the body must be multipart/form-data with a field \"file\": "+err.Error()))
		return
	}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			writeJSON(w, http.StatusBadRequest, message("no field \"file\" in the upload"))
			return
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, message("read the upload: "+err.Error()))
			return
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		// The raw name: FileName() would keep only its last element, and
		// the contract allows folders ("data/input.csv").
		name := rawFileName(part)
		gp, ok := s.pathOf(w, name)
		if !ok {
			return
		}
		stderr, tmpName := &capped{max: 4 << 10}, &capped{max: maxPath + 1}
		body := &limitedReader{r: part, left: limit}
		code, err := s.Machine.Exec(r.Context(), Command{
			Args: []string{"/bin/sh", "-c", scriptWrite, "sh", gp}, Dir: s.BaseDir, Stdin: body, Stdout: tmpName, Stderr: stderr,
		})
		tmp, named := strings.CutSuffix(tmpName.String(), "\x00")
		complete := err == nil && code == 0 && !body.over && body.err == nil && named
		if !complete && named {
			_, _ = s.Machine.Exec(context.WithoutCancel(r.Context()), Command{Args: []string{"/bin/sh", "-c", scriptAbort, "sh", tmp}, Dir: s.BaseDir, Timeout: 30 * time.Second})
		}
		if complete {
			code, err = s.Machine.Exec(r.Context(), Command{Args: []string{"/bin/sh", "-c", scriptCommit, "sh", tmp, gp}, Dir: s.BaseDir, Stderr: stderr})
		}
		switch {
		case body.over:
			writeJSON(w, http.StatusRequestEntityTooLarge, message(fmt.Sprintf("File upload failed: larger than %d bytes", limit)))
		case body.err != nil:
			writeJSON(w, http.StatusBadRequest, message("File upload failed: the upload was cut short: "+body.err.Error()))
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, message("File upload failed: "+err.Error()))
		case code != 0 || !named:
			writeJSON(w, http.StatusInternalServerError, message("File upload failed: "+termsafe.Clean(strings.TrimSpace(stderr.String()), false)))
		default:
			writeJSON(w, http.StatusOK, message(fmt.Sprintf("File '%s' uploaded successfully.", termsafe.Clean(name, false))))
		}
		return
	}
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	gp, ok := s.pathOf(w, r.PathValue("path"))
	if !ok {
		return
	}
	// The status waits for the first byte, so that "no such file" is a 404
	// and a file is streamed as it is read, never held here whole.
	lw := &lazyWriter{w: w, typ: "application/octet-stream"}
	stderr := &capped{max: 4 << 10}
	code, err := s.Machine.Exec(r.Context(), Command{
		Args: []string{"/bin/sh", "-c", scriptRead, "sh", gp}, Dir: s.BaseDir, Stdout: lw, Stderr: stderr,
	})
	if lw.started {
		return // the body is under way: an error can only cut it short
	}
	switch {
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, message("Download failed: "+err.Error()))
	case code == notThere:
		writeJSON(w, http.StatusNotFound, message("File not found"))
	case code != 0:
		writeJSON(w, http.StatusInternalServerError, message("Download failed: "+termsafe.Clean(strings.TrimSpace(stderr.String()), false)))
	default:
		lw.start()
	}
}

type listEntry struct {
	Name    string  `json:"name"`
	Size    int64   `json:"size"`
	Type    string  `json:"type"`
	ModTime float64 `json:"mod_time"`
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	gp, ok := s.pathOf(w, r.PathValue("path"))
	if !ok {
		return
	}
	out, stderr := &capped{max: 16 << 20}, &capped{max: 4 << 10}
	code, err := s.Machine.Exec(r.Context(), Command{
		Args: []string{"/bin/sh", "-c", scriptList, "sh", gp}, Dir: s.BaseDir, Stdout: out, Stderr: stderr,
	})
	switch {
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, message("List files failed: "+err.Error()))
		return
	case code == notThere:
		writeJSON(w, http.StatusNotFound, message("Path is not a directory"))
		return
	case code != 0:
		writeJSON(w, http.StatusInternalServerError, message("List files failed: "+termsafe.Clean(strings.TrimSpace(stderr.String()), false)))
		return
	case out.over:
		writeJSON(w, http.StatusInternalServerError, message("List files failed: the listing is larger than 16 MiB"))
		return
	}
	entries, err := parseList(out.Bytes())
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, message("List files failed: "+err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, entries)
}

// parseList reads find's -printf '%y\0%s\0%T@\0%f\0' output: four
// NUL-ended fields an entry (names hold any byte but NUL).
func parseList(b []byte) ([]listEntry, error) {
	fields := strings.Split(string(b), "\x00")
	if len(fields) > 0 && fields[len(fields)-1] == "" {
		fields = fields[:len(fields)-1]
	}
	if len(fields)%4 != 0 {
		return nil, fmt.Errorf("malformed listing from the guest (%d fields)", len(fields))
	}
	out := make([]listEntry, 0, len(fields)/4)
	for i := 0; i < len(fields); i += 4 {
		size, err := strconv.ParseInt(fields[i+1], 10, 64)
		if err != nil || size < 0 {
			return nil, fmt.Errorf("malformed size %q in the listing", termsafe.Clean(fields[i+1], false))
		}
		mt, err := strconv.ParseFloat(fields[i+2], 64)
		if err != nil {
			return nil, fmt.Errorf("malformed time %q in the listing", termsafe.Clean(fields[i+2], false))
		}
		e := listEntry{Name: fields[i+3], Size: size, Type: "file", ModTime: mt}
		if fields[i] == "d" {
			e.Type = "directory"
		}
		out = append(out, e)
	}
	return out, nil
}

func (s *Server) exists(w http.ResponseWriter, r *http.Request) {
	p := r.PathValue("path")
	gp, ok := s.pathOf(w, p)
	if !ok {
		return
	}
	code, err := s.Machine.Exec(r.Context(), Command{Args: []string{"/bin/sh", "-c", scriptExists, "sh", gp}, Dir: s.BaseDir})
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, message("Exists failed: "+err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": p, "exists": code == 0})
}

func message(m string) map[string]string { return map[string]string{"message": m} }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// rawFileName is a multipart part's filename parameter as sent, folders
// included (mime/multipart's FileName keeps only the last element).
func rawFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}
