package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/guest"
)

// WorkloadCgroup holds every process the agent starts, so that the host
// can freeze them all around a checkpoint (cgroup v2 freezer) while the
// agent itself keeps running.
const WorkloadCgroup = "/sys/fs/cgroup/kosa8-work"

// SetupWorkloads creates the workload cgroup; the agent then starts its
// processes in it.
func (a *Agent) SetupWorkloads() error {
	if err := os.Mkdir(WorkloadCgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fd, err := unix.Open(WorkloadCgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	a.cgroupFD = fd
	return nil
}

// freeze stops (or resumes) every workload process, and the container
// engine's subtree when there is one, and waits until the kernel says they
// are.
func (a *Agent) freeze(on bool) error {
	if a.cgroupFD <= 0 {
		return nil // not PID 1 (tests): nothing to freeze
	}
	groups := []string{WorkloadCgroup}
	if _, err := os.Stat(DockerCgroup + "/cgroup.freeze"); err == nil {
		groups = append(groups, DockerCgroup)
	}
	v := "0"
	if on {
		v = "1"
	}
	for _, g := range groups {
		if err := os.WriteFile(g+"/cgroup.freeze", []byte(v), 0o644); err != nil {
			return fmt.Errorf("freeze workloads (%s): %w", g, err)
		}
	}
	want := "frozen " + v
	deadline := time.Now().Add(5 * time.Second)
	for _, g := range groups {
		for {
			b, err := os.ReadFile(g + "/cgroup.events")
			if err == nil && strings.Contains(string(b), want) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("workloads (%s) did not reach %q", g, want)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

// restored runs after the VM was restored from a checkpoint: fresh host
// entropy goes into the kernel's pool and the CRNG is reseeded from it
// (a plain write to /dev/urandom does not reseed on 6.1), the clock is
// stepped to the host's, and only then do the workloads run again.
func (a *Agent) restored(req *guest.Request) error {
	if len(req.Entropy) >= 32 {
		if err := reseed(req.Entropy); err != nil {
			return fmt.Errorf("reseed the RNG: %w", err)
		}
	}
	if !req.Time.IsZero() {
		ts := unix.NsecToTimespec(req.Time.UnixNano())
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("set clock: %w", err)
		}
	}
	if err := takeHostname(req.Hostname); err != nil {
		return err
	}
	if err := a.takeMachineID(req.MachineID); err != nil {
		return err
	}
	if req.NewBootID && os.Getpid() == 1 { // the guest's init only: tests run the agent as a plain process
		if err := renewBootID(); err != nil {
			return fmt.Errorf("a new boot id: %w", err)
		}
		a.log.Info("restored as another machine: a new boot id")
	}
	a.log.Info("restored: RNG reseeded, clock stepped")
	return a.freeze(false)
}

const (
	rndAddEntropy = 0x40085203 // _IOW('R', 0x03, int[2])
	rndReseedCRNG = 0x5207     // _IO('R', 0x07)
)

func reseed(entropy []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	n := len(entropy) &^ 3
	info := make([]byte, 8+n)
	*(*int32)(unsafe.Pointer(&info[0])) = int32(n * 8)
	*(*int32)(unsafe.Pointer(&info[4])) = int32(n)
	copy(info[8:], entropy[:n])
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		return e
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndReseedCRNG, 0); e != 0 {
		return e
	}
	return nil
}
