package wsync

import "golang.org/x/sys/unix"

// syncFS syncs the whole filesystem holding fd.
func syncFS(fd int) error { return unix.Syncfs(fd) }
