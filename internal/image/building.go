package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// Building describes a base image build under way: the build holds the
// lock of its architecture's folder in the cache, and writes this into
// the lock file once it holds it.
type Building struct {
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	Log     string    `json:"log,omitempty"`
}

// String says what is going on and what to do, for an error or doctor.
func (b Building) String() string {
	s := "being built now"
	if !b.Started.IsZero() {
		s += fmt.Sprintf(" (started %s, %s ago", b.Started.Local().Format("15:04"), time.Since(b.Started).Round(time.Minute))
		if b.PID > 0 {
			s += fmt.Sprintf(", process %d", b.PID)
		}
		s += ")"
	}
	return s
}

// Wait is what to do meanwhile.
func (b Building) Wait() string {
	if b.Log != "" {
		return "wait for it to finish; 'tail -f " + b.Log + "' follows it"
	}
	return "wait for it to finish"
}

// BuildingNow tells whether a build of arch's base image is under way in
// this cache (another process holds its lock), and what it recorded.
func (s Store) BuildingNow(arch vmspec.Arch) (Building, bool) {
	f, err := os.Open(filepath.Join(s.archDir(arch), ".lock"))
	if err != nil {
		return Building{}, false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return Building{}, false // nobody holds it
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		return Building{}, false
	}
	var b Building
	data, _ := io.ReadAll(io.LimitReader(f, 4096))
	_ = json.Unmarshal(data, &b)
	return b, true
}

// recordBuilding writes what BuildingNow reads into the held lock file.
func recordBuilding(lock *os.File, logPath string) {
	b, _ := json.Marshal(Building{PID: os.Getpid(), Started: time.Now().UTC(), Log: logPath})
	if lock.Truncate(0) == nil {
		_, _ = lock.WriteAt(b, 0)
	}
}
