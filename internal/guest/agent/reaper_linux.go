package agent

import (
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper owns every wait for child processes. As PID 1 the agent inherits
// all orphans and must reap them; a wait4(-1) loop would also take the exit
// status of the processes it started itself, so those are registered here
// and their status is handed over instead of being waited for separately.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan unix.WaitStatus{}}
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, unix.SIGCHLD)
	go func() {
		for {
			r.reapAll()
			<-sig
		}
	}()
	return r
}

// start runs fn, which starts a process, while holding the lock the reaper
// needs to hand out a status: a child that exits at once is still found.
func (r *reaper) start(fn func() (*os.Process, error)) (*os.Process, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := fn()
	if err != nil {
		return nil, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[p.Pid] = ch
	return p, ch, nil
}

func (r *reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		if ch, ok := r.waiters[pid]; ok {
			ch <- ws
			delete(r.waiters, pid)
		}
		r.mu.Unlock()
	}
}

// pending reports how many started processes have not exited.
func (r *reaper) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters)
}
