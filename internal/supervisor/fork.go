package supervisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/linediff"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// Forks (sandbox/fork.go has their files). The source's part is one
// checkpoint (POST /v1/fork): its pause is all a fork costs the source.
// A fork's part is here: its first start restores that checkpoint's
// machine from the source's directory, on new layers over its frozen
// disks, as a new machine (new identity); it runs the command it was made
// for, if any, and records how it ended and what it changed.

// maxForks bounds one fork request.
const maxForks = 64

// handleFork takes the checkpoint that count forks start from.
func (s *supervisor) handleFork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Count < 1 || req.Count > maxForks {
		writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: fmt.Sprintf("fork into %d: use 1 to %d", req.Count, maxForks)})
		return
	}
	// How many fit is decided before anything is made: the checkpoint
	// takes the RAM in use on the disk, each fork a copy of it in memory.
	snap, err := snapshotter(s.currentMachine())
	if err != nil {
		writeJSON(w, http.StatusNotImplemented, api.ErrorResponse{Error: err.Error()})
		return
	}
	inUse := int64(s.sb.Config.MemoryMiB) << 20 // private RAM: at most all of it
	if ram := snap.RAM(); ram != nil {
		inUse = checkpoint.Allocated(ram)
	}
	if err := sandbox.CheckForkRoom(s.sb.Dir, req.Count, inUse, true); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, sandbox.ErrForkRoom) {
			code = http.StatusInsufficientStorage
		}
		writeJSON(w, code, api.ErrorResponse{Error: err.Error()})
		return
	}
	msg := req.Message
	if msg == "" {
		msg = fmt.Sprintf("fork into %d", req.Count)
	}
	meta, err := s.checkpoint(r.Context(), msg, "fork")
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: "the checkpoint to fork from: " + err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, meta)
}

// forkFirst reports whether this start is a fork's first: its machine is
// to be restored from its source's checkpoint.
func (s *supervisor) forkFirst() bool {
	if s.sb.Config.Fork == nil {
		return false
	}
	rec, err := s.sb.ForkRecord()
	return err == nil && rec.Restored.IsZero()
}

// prepareForkRestore puts new layers over the fork's checkpoint's frozen
// disks (a start that stopped short may have written to the last ones)
// and returns the checkpoint to restore, its files read from the source's
// directory through a root held open (close it), or nil when this QEMU
// cannot load its device state: then the fork boots from those disks.
func (s *supervisor) prepareForkRestore() (*checkpoint.Meta, error) {
	meta, dir, err := s.sb.ForkCheckpoint()
	if err != nil {
		return nil, err
	}
	next, err := s.sb.NewOverlays(s.sb.SourceLayers(meta), checkpoint.NewID())
	if err != nil {
		return nil, fmt.Errorf("new disk layers over %s's checkpoint %s: %w", s.sb.Config.Fork.Source, meta.ID, err)
	}
	if err := s.sb.SaveActiveDisks(next); err != nil {
		s.sb.RemoveLayers(next)
		return nil, err
	}
	if err := sandbox.GCDisks(s.sb); err != nil {
		s.log.Warn("remove the fork's unused disk layers", "err", err)
	}
	if ok, why := meta.Loadable(s.qemuVersion, s.qemuFirmware); !ok {
		s.log.Warn("the fork's checkpoint was saved by another QEMU build: cold boot from its disks", "why", why)
		s.setStatus(func(st *api.Status) { st.ColdBoot = why })
		return nil, nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	meta.Root = root
	// Its RAM mapped copy-on-write where the VMM can: the forks of one
	// checkpoint share its pages (a checkpoint with its RAM in the
	// device state has no file to map).
	meta.MapRAM = !meta.RAMInStream
	return meta, nil
}

// forkRestored records that the fork's machine is up: later starts are
// its own (a boot, or its own checkpoints).
func (s *supervisor) forkRestored() {
	s.forkUp = true
	if err := s.sb.UpdateForkRecord(func(r *sandbox.ForkRecord) { r.Restored = time.Now().UTC() }); err != nil {
		s.log.Warn("record the fork's start", "err", err)
	}
}

// maxForkOutput bounds the forked command's output kept on the host.
const maxForkOutput = 8 << 20

// runForkCommand runs the command the fork was made for, once, as 'kosa8
// exec' would (the sandbox's user, its environment, in the workspace),
// its output to fork-output.log, and records its exit and then the
// fork's changes. A rewind of the fork re-attaches to it.
func (s *supervisor) runForkCommand(ctx context.Context) {
	rec, err := s.sb.ForkRecord()
	if err != nil || len(rec.Command) == 0 || !rec.Started.IsZero() {
		return
	}
	record := func(f func(*sandbox.ForkRecord)) {
		if err := s.sb.UpdateForkRecord(f); err != nil {
			s.log.Warn("record the forked command", "err", err)
		}
	}
	fail := func(err error) {
		s.log.Warn("forked command", "err", err)
		record(func(r *sandbox.ForkRecord) { r.Ended, r.Error = time.Now().UTC(), err.Error() })
	}
	env, err := s.sb.GuestEnv()
	if err != nil {
		fail(err)
		return
	}
	req := &guest.ExecRequest{Argv: rec.Command, Env: env}
	if s.sb.Config.Workspace != nil {
		req.Dir = s.sb.Config.Workspace.Path
	}
	out, err := os.OpenFile(s.sb.Path(sandbox.ForkOutputFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		fail(err)
		return
	}
	defer out.Close()
	w := &cappedWriter{w: out, left: maxForkOutput}
	client := s.currentClient()
	stream, resp, err := client.Exec(ctx, req)
	if err != nil {
		fail(fmt.Errorf("run %q: %w", rec.Command[0], err))
		return
	}
	record(func(r *sandbox.ForkRecord) { r.Started = time.Now().UTC() })
	s.log.Info("forked command started", "id", resp.ID, "argv0", rec.Command[0])
	var st *guest.ExitStatus
	for {
		st, err = guest.Pump(stream, guest.StdIO{Stdout: w, Stderr: w})
		stream.Close()
		if err == nil || ctx.Err() != nil {
			break
		}
		// The stream broke: a rewind replaced the machine (the process
		// lives on if it ran at the checkpoint), or the sandbox stops.
		actx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		next, nerr := s.nextClient(actx, client)
		if nerr == nil {
			stream, _, nerr = next.Attach(actx, resp.ID)
			client = next
		}
		cancel()
		if nerr != nil {
			break
		}
	}
	if err != nil {
		fail(fmt.Errorf("the command could not be followed to its end: %w", err))
		return
	}
	if st.Error != "" {
		fail(errors.New(st.Error))
		return
	}
	code := st.Code
	record(func(r *sandbox.ForkRecord) { r.Ended, r.ExitCode = time.Now().UTC(), &code })
	s.log.Info("forked command ended", "exit_code", code, "signal", st.Signal)
	s.recordChanges(ctx)
}

// recordChanges keeps the fork's changes, summed up, in its record (for
// 'kosa8 fork ls' once it is stopped).
func (s *supervisor) recordChanges(ctx context.Context) {
	if s.sb.Config.Fork == nil || s.ws == nil || s.ws.engine == nil {
		return
	}
	// A pass first: the command's last writes may not have been seen yet
	// (its change summary was empty when the watcher's pass came later).
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	s.ws.syncNow(pctx, nil)
	cancel()
	sum, err := s.changeSummary(ctx)
	if err != nil {
		s.log.Warn("sum up the fork's changes", "err", err)
		return
	}
	if err := s.sb.UpdateForkRecord(func(r *sandbox.ForkRecord) { r.Changes = sum }); err != nil {
		s.log.Warn("record the fork's changes", "err", err)
	}
}

// cappedWriter keeps what fits in left bytes and drops the rest, saying so
// once at the cut.
type cappedWriter struct {
	w    io.Writer
	left int64
	cut  bool
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	if c.left <= 0 {
		if !c.cut {
			c.cut = true
			_, _ = io.WriteString(c.w, "\n[kosa8: output cut here: more than 8 MiB]\n")
		}
		return len(p), nil
	}
	q := p
	if int64(len(q)) > c.left {
		q = q[:c.left]
	}
	n, err := c.w.Write(q)
	c.left -= int64(n)
	if err != nil {
		return n, err
	}
	return len(p), nil
}

// changeSummary sums up the workspace's pending and held changes: per
// path, the lines added and removed against the host's version, for text
// files up to api.MaxSummaryFile on both sides. The host's file is read
// through the sync's root (never through a link), the guest's through its
// agent, each bounded.
func (s *supervisor) changeSummary(ctx context.Context) (*api.ChangeSummary, error) {
	if s.ws == nil || s.ws.engine == nil {
		return nil, errors.New("this sandbox has no workspace")
	}
	st := s.ws.engine.Status()
	sum := &api.ChangeSummary{Files: []api.FileChange{}, Taken: time.Now().UTC()}
	counted := 0
	add := func(c wsync.Change, held string) {
		fc := api.FileChange{Path: c.Path, Kind: c.Kind, Held: held}
		if counted < maxCountedChanges {
			// Each count reads up to two files of MaxSummaryFile: a
			// guest with a million changed files would have the host
			// read and compare them all at each summary.
			counted++
			fc.Added, fc.Removed, fc.Note = s.countLines(ctx, c)
		} else {
			fc.Note = fmt.Sprintf("not counted: lines are counted in the first %d changed files only", maxCountedChanges)
		}
		sum.Added += fc.Added
		sum.Removed += fc.Removed
		sum.Files = append(sum.Files, fc)
	}
	for _, c := range st.Pending {
		add(c, "")
	}
	for _, c := range st.Held {
		add(c, c.Why)
	}
	return sum, nil
}

// maxCountedChanges bounds the changes whose lines a summary counts.
const maxCountedChanges = 2000

// countLines counts the lines change c adds and removes, or says why not.
func (s *supervisor) countLines(ctx context.Context, c wsync.Change) (added, removed int, note string) {
	var newer []byte
	if c.Guest != nil {
		switch {
		case c.Guest.Type == 'l':
			return 0, 0, "a link"
		case c.Guest.Type == 'd':
			return 0, 0, "a folder"
		case c.Guest.Size > api.MaxSummaryFile:
			return 0, 0, "too large to count"
		}
		b, err := readBounded(ctx, s.ws.readGuest, c.Path)
		if err != nil {
			return 0, 0, "unreadable in the sandbox: " + err.Error()
		}
		newer = b
	}
	host := &wsync.HostSide{Root: s.ws.root}
	older, err := readBounded(ctx, host.Read, c.Path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		older = nil
	case errors.Is(err, errTooLarge):
		return 0, 0, "too large to count"
	case err != nil:
		if e, _ := s.ws.root.Lstat(c.Path); e != nil && e.Type != 'f' {
			older = nil // a folder or a link on the host: nothing to count
		} else {
			return 0, 0, "unreadable on the host: " + err.Error()
		}
	}
	if binary(older) || binary(newer) {
		return 0, 0, "binary"
	}
	a, r, exact := linediff.Count(older, newer)
	if !exact {
		note = "lines counted as sets (a change too large to compare line by line)"
	}
	return a, r, note
}

var errTooLarge = errors.New("larger than the summary's limit")

// readBounded reads p through read, at most api.MaxSummaryFile bytes.
func readBounded(ctx context.Context, read func(context.Context, string) (io.ReadCloser, error), p string) ([]byte, error) {
	rc, err := read(ctx, p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, api.MaxSummaryFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > api.MaxSummaryFile {
		return nil, errTooLarge
	}
	return b, nil
}

// binary: a NUL in the first 8 KiB, as git and diff decide.
func binary(b []byte) bool {
	return bytes.IndexByte(b[:min(len(b), 8<<10)], 0) >= 0
}

// lockApply takes the folder's apply lock: writes that an apply (or an
// approve) makes in the host folder go one sandbox at a time, as forks of
// one folder may each be applied. It waits at most a minute for another.
func lockApply(home, folder string) (*os.File, error) {
	if home == "" {
		return nil, errors.New("internal error: the supervisor does not know KOSA8_HOME (the folders' locks)")
	}
	dir := filepath.Join(home, "locks")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(folder))
	p := filepath.Join(dir, hex.EncodeToString(sum[:16])+".apply")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another sandbox's apply to %s has not finished after a minute: try again", folder)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
