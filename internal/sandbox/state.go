package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Files in a sandbox's directory.
const (
	configFile    = "sandbox.json"
	stateFile     = "state.json"
	lockFile      = "supervisor.lock"
	APISocket     = "api.sock"
	RootDisk      = "root.qcow2"
	ConsoleLog    = "console.log"
	SupervisorLog = "supervisor.log"
)

// WriteJSONAtomic replaces path with v, never leaving half a file, and
// durably: the file and the directory entry are synced before it returns.
func WriteJSONAtomic(path string, v any) error {
	return writeAtomic(path, v, true)
}

func writeAtomic(path string, v any, indent bool) error {
	var b []byte
	var err error
	if indent {
		b, err = json.MarshalIndent(v, "", "  ")
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(b, '\n'))
}

// writeFileAtomic replaces path with b: a temporary file, synced, renamed
// over it, the directory synced.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	f.Close()
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes the entries of dir durable (a rename, a removal).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// maxJSONFile bounds the state files read: they live in a directory only
// the user writes, but a damaged file must not take the CLI down.
const maxJSONFile = 1 << 20

func readJSON(path string, v any) error {
	return readJSONMax(path, v, maxJSONFile)
}

// readJSONMax reads path as JSON; a file over max bytes is damaged.
func readJSONMax(path string, v any, max int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return err
	}
	if int64(len(b)) > max {
		return fmt.Errorf("%s is damaged: larger than %d bytes", path, max)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s is damaged: %w", path, err)
	}
	return nil
}

// supervisorAlive reports whether a supervisor holds the sandbox's lock.
// The lock is released by the kernel when the supervisor dies however it
// dies, so a stale state.json cannot make a dead sandbox look alive.
func supervisorAlive(dir string) bool {
	f, err := os.Open(filepath.Join(dir, lockFile))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// editLockFile serialises the changes made to a stopped sandbox.
const editLockFile = "edit.lock"

// maxEditWait bounds how long a change to a stopped sandbox waits for
// another one to finish.
const maxEditWait = 30 * time.Second

// lockStopped is what a change to a stopped sandbox holds (its rules,
// ports, checkpoints): a shared lock on the supervisor's lock file, so no
// supervisor starts meanwhile (it takes that lock exclusively) while the
// sandbox does not look alive (supervisorAlive probes for an exclusive
// holder), and an exclusive one on edit.lock, so changes run one at a
// time. A running (or starting) sandbox is ErrRunning: its supervisor
// makes the change.
func lockStopped(dir string) (release func(), err error) {
	ef, err := openLock(dir, editLockFile)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(maxEditWait)
	if err := flockPolling(ef, syscall.LOCK_EX, func(int) bool { return time.Now().Before(deadline) }); err != nil {
		ef.Close()
		return nil, fmt.Errorf("another change to this sandbox has not finished after %s: %w", maxEditWait, err)
	}
	sf, err := openLock(dir, lockFile)
	if err != nil {
		ef.Close()
		return nil, err
	}
	if err := flockPolling(sf, syscall.LOCK_SH, func(tries int) bool { return tries < 20 }); err != nil {
		sf.Close()
		ef.Close()
		return nil, ErrRunning
	}
	return func() { sf.Close(); ef.Close() }, nil
}

// openLock opens (creating it) the lock file name in dir.
func openLock(dir, name string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
}

// flockPolling takes the lock how (LOCK_EX, LOCK_SH) on f, trying again
// every 10 ms while another holds it and keepTrying(tries so far) says so.
// It returns the last error: EWOULDBLOCK when it gave up.
func flockPolling(f *os.File, how int, keepTrying func(tries int) bool) error {
	for i := 0; ; i++ {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil || !errors.Is(err, syscall.EWOULDBLOCK) || !keepTrying(i) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// LockSupervisor takes the sandbox's supervisor lock for the life of the
// process, or fails if another supervisor holds it.
func LockSupervisor(dir string) (*os.File, error) {
	f, err := openLock(dir, lockFile)
	if err != nil {
		return nil, err
	}
	// Shared holders are ls's probe (an instant) and a stopped sandbox's
	// edit (lockStopped): wait for them, bounded; an exclusive holder is
	// another supervisor.
	start := time.Now()
	err = flockPolling(f, syscall.LOCK_EX, func(tries int) bool {
		return time.Since(start) <= maxEditWait && (tries < 20 || !supervisorAlive(dir))
	})
	if err != nil {
		f.Close()
		return nil, ErrRunning
	}
	return f, nil
}
