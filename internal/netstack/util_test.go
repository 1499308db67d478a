package netstack

import "os"

func osFile(fd int, name string) *os.File { return os.NewFile(uintptr(fd), name) }
