package main

import (
	"encoding/json"
	"fmt"
	"net/http"
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
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: kosa8-exec\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
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
