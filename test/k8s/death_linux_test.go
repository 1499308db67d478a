//go:build linux

package k8s

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel send sig to cmd when the test's process ends,
// so a test killed by its timeout leaves no API server (nor pod) behind.
func dieWithTest(cmd *exec.Cmd, sig syscall.Signal) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: sig}
}
