package qemu

import (
	"context"
	"fmt"
	"os"
	"time"
)

// Pause stops the guest's CPUs.
func (m *Machine) Pause(ctx context.Context) error { return m.qmp.Execute(ctx, "stop", nil, nil) }

// Resume starts them again (also after an outgoing migration, when QEMU
// takes its disks back first).
func (m *Machine) Resume(ctx context.Context) error { return m.qmp.Execute(ctx, "cont", nil, nil) }

// SnapshotDisk makes the disk's current file read-only history and sends
// new writes to a new qcow2 overlay on top of it.
func (m *Machine) SnapshotDisk(ctx context.Context, id, overlay string) error {
	return m.qmp.Execute(ctx, "blockdev-snapshot-sync", map[string]any{
		"device": id, "snapshot-file": overlay, "format": "qcow2", "mode": "absolute-paths",
	}, nil)
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
	if err := m.qmp.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": "kosa8-migrate"}, f); err != nil {
		return err
	}
	if err := m.qmp.Execute(ctx, cmd, map[string]any{"uri": "fd:kosa8-migrate"}, nil); err != nil {
		return err
	}
	return m.waitMigration(ctx)
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
