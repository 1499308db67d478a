package vmm

import (
	"fmt"
	"os"
	"syscall"
)

// SocketPair makes a connected pair of unix stream sockets, both
// close-on-exec (set under the fork lock, so no child started meanwhile
// inherits them): the host's end and the one to hand to the VMM, as
// StartOptions.Net.
func SocketPair(name string) (host, vmm *os.File, err error) {
	syscall.ForkLock.RLock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair for %s: %w", name, err)
	}
	return os.NewFile(uintptr(fds[0]), name+"-host"), os.NewFile(uintptr(fds[1]), name+"-vmm"), nil
}
