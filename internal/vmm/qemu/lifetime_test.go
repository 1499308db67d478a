package qemu

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The supervisor stand-in of the tests below, when the test binary runs
// as one (KOSA8_WATCHDOG_HELPER=1): it starts a child in a process group
// of its own without a parent-death signal (the macOS case), and its
// watchdog; prints the child's pid; then waits to be killed, or
// (KOSA8_WATCHDOG_RELEASE=1) lets the child end first and releases the
// watchdog as the driver does.
func init() {
	if os.Getenv("KOSA8_WATCHDOG_HELPER") != "1" {
		return
	}
	child := exec.Command("sleep", "300")
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := child.Start(); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	dog, err := startWatchdog(child.Process.Pid)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Printf("child %d watchdog %d\n", child.Process.Pid, dog.cmd.Process.Pid)
	if os.Getenv("KOSA8_WATCHDOG_RELEASE") == "1" {
		child.Process.Kill()
		child.Wait()
		dog.release()
		fmt.Println("released")
	}
	time.Sleep(time.Minute)
	os.Exit(0)
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

func startHelper(t *testing.T, release bool) (helper *exec.Cmd, child, dog int) {
	t.Helper()
	helper = exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), "KOSA8_WATCHDOG_HELPER=1", "KOSA8_WATCHDOG_RELEASE="+map[bool]string{true: "1"}[release])
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if n, _ := fmt.Sscanf(sc.Text(), "child %d watchdog %d", &child, &dog); n == 2 {
			break
		}
	}
	if child == 0 {
		t.Fatal("the helper did not start its child")
	}
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	if release {
		for sc.Scan() && sc.Text() != "released" {
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return helper, child, dog
}

// QEMU must not outlive its supervisor where the kernel has no
// parent-death signal: kill -9 of the supervisor, and the watchdog kills
// QEMU's group.
func TestWatchdogKillsQEMUWithSupervisor(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	helper, child, _ := startHelper(t, false)
	if !alive(child) {
		t.Fatal("the child is not running")
	}
	helper.Process.Signal(syscall.SIGKILL)
	helper.Wait()
	for deadline := time.Now().Add(5 * time.Second); alive(child); {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still runs 5 s after its supervisor was killed", child)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A QEMU that ended first is released: the watchdog exits without a kill,
// and never signals a group whose id may be reused.
func TestWatchdogReleased(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	helper, _, dog := startHelper(t, true)
	for deadline := time.Now().Add(5 * time.Second); alive(dog); {
		if time.Now().After(deadline) {
			t.Fatalf("watchdog %d still waits 5 s after its release", dog)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A bystander in a group of its own with the same lifetime is untouched
	// when the released supervisor then dies.
	by := exec.Command("sleep", "30")
	by.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := by.Start(); err != nil {
		t.Fatal(err)
	}
	defer by.Process.Kill()
	helper.Process.Signal(syscall.SIGKILL)
	helper.Wait()
	time.Sleep(200 * time.Millisecond)
	if !alive(by.Process.Pid) {
		t.Fatal("a process outside the watched group was killed")
	}
}
