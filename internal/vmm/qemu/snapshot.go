package qemu

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Pause stops the guest's CPUs.
func (m *Machine) Pause(ctx context.Context) error { return m.qmp.Execute(ctx, "stop", nil, nil) }

// Resume starts them again (also after an outgoing migration, when QEMU
// takes its disks back first).
func (m *Machine) Resume(ctx context.Context) error { return m.qmp.Execute(ctx, "cont", nil, nil) }

// SnapshotDisk makes the disk's current file read-only history and sends
// new writes to overlay, a qcow2 layer made on top of it beforehand (mode
// existing: QEMU opens it rather than creating it in the pause, which took
// a file creation and fsyncs that waited on everything else the host had
// to write, 37 to 900 ms).
func (m *Machine) SnapshotDisk(ctx context.Context, id, overlay string) error {
	if err := m.plan.handOver(overlay); err != nil {
		return err
	}
	return m.qmp.Execute(ctx, "blockdev-snapshot-sync", map[string]any{
		"device": id, "snapshot-file": overlay, "format": "qcow2", "mode": "existing",
	}, nil)
}

// migrationTransport is how a migration stream reaches QEMU.
type migrationTransport int

const (
	// viaFd: getfd, then "fd:NAME". QEMU 9.1 deprecated it for regular
	// files ("fd: migration to a file is deprecated. Use file: instead.")
	// and newer QEMU refuses it for them.
	viaFd migrationTransport = iota
	// viaFdset: add-fd, then "file:/dev/fdset/N" (QEMU 9.0 brought fdsets
	// to file: migration). The descriptor's access mode must be the one
	// QEMU opens the file with: write-only out, read-only in.
	viaFdset
)

// transportFor chooses the migration transport for QEMU v.
func transportFor(v Version) migrationTransport {
	if v.AtLeast(9, 1) {
		return viaFdset
	}
	return viaFd
}

// migrationURI is the URI for the transport: fdset is add-fd's set id.
func migrationURI(t migrationTransport, fdset int) string {
	if t == viaFdset {
		return "file:/dev/fdset/" + strconv.Itoa(fdset)
	}
	return "fd:kosa8-migrate"
}

// migrateFD runs an outgoing ("migrate") or incoming ("migrate-incoming")
// migration through f, passed over QMP: QEMU's sandbox forbids exec:
// migration. With ignoreShared the stream skips RAM in shared memory: the
// host copies the RAM file itself, and the stream carries device state only
// (tens of kilobytes, milliseconds).
func (m *Machine) migrateFD(ctx context.Context, cmd string, f *os.File, ignoreShared bool) error {
	if err := m.qmp.Execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": ignoreShared}},
	}, nil); err != nil {
		return err
	}
	t := transportFor(m.version)
	fdset := 0
	if t == viaFdset {
		mode := os.O_WRONLY
		if cmd == "migrate-incoming" {
			mode = os.O_RDONLY
		}
		g, err := withAccessMode(f, mode)
		if err != nil {
			return err
		}
		if g != f {
			defer g.Close()
		}
		var added struct {
			FdsetID int `json:"fdset-id"`
		}
		if err := m.qmp.execute(ctx, "add-fd", map[string]any{"opaque": "kosa8-migrate"}, &added, g); err != nil {
			return err
		}
		fdset = added.FdsetID
		// QEMU holds its own duplicate while the stream is open; the set
		// goes once that is closed, so nothing stays open in QEMU. Removed
		// whatever became of the migration, within a deadline of its own.
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = m.qmp.Execute(rctx, "remove-fd", map[string]any{"fdset-id": fdset}, nil)
		}()
	} else if err := m.qmp.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": "kosa8-migrate"}, f); err != nil {
		return err
	}
	if err := m.qmp.Execute(ctx, cmd, map[string]any{"uri": migrationURI(t, fdset)}, nil); err != nil {
		return err
	}
	return m.waitMigration(ctx)
}

// withAccessMode returns f, or a new descriptor of the same file opened
// with mode when f's access mode differs (a checkpoint's device file is
// created read-write; add-fd matches descriptors by access mode).
func withAccessMode(f *os.File, mode int) (*os.File, error) {
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		return nil, fmt.Errorf("migration file: %w", err)
	}
	if fl&unix.O_ACCMODE == mode {
		return f, nil
	}
	// A fresh open file description, its own offset at 0: the stream is
	// written from the start of the (empty) file, or read from its start.
	g, err := os.OpenFile(fdPath(f), mode, 0)
	if err != nil {
		return nil, fmt.Errorf("reopen migration file %s: %w", f.Name(), err)
	}
	return g, nil
}

// SaveDevices writes the device state to w. The guest must be paused.
func (m *Machine) SaveDevices(ctx context.Context, w *os.File) error {
	return m.migrateFD(ctx, "migrate", w, true)
}

// LoadDevices reads device state from r into a machine started Incoming.
func (m *Machine) LoadDevices(ctx context.Context, r *os.File) error {
	return m.migrateFD(ctx, "migrate-incoming", r, true)
}

func (m *Machine) waitMigration(ctx context.Context) error {
	for {
		var st struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		if err := m.qmp.Execute(ctx, "query-migrate", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.Error)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.done:
			return fmt.Errorf("QEMU exited during migration%s", m.stderr.Suffix())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// SaveAll migrates the whole machine, RAM included, to w: QEMU's plain
// migration, the baseline checkpoints are measured against.
func (m *Machine) SaveAll(ctx context.Context, w *os.File) error {
	return m.migrateFD(ctx, "migrate", w, false)
}

// LoadAll reads a stream SaveAll wrote, RAM included, into a machine
// started Incoming (vmm.FullLoader).
func (m *Machine) LoadAll(ctx context.Context, r *os.File) error {
	return m.migrateFD(ctx, "migrate-incoming", r, false)
}

// fdPath names f for reopening: its descriptor where the system has
// /proc/self/fd, else the name it was opened by.
func fdPath(f *os.File) string {
	if runtime.GOOS == "linux" {
		return "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	}
	return f.Name()
}
