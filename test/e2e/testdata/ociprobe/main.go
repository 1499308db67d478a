// ociprobe runs inside a sandbox of a test OCI image: it prints an
// extended attribute in hex (busybox has no getfattr).
//
//	ociprobe xattr PATH NAME
package main

import (
	"fmt"
	"os"
	"syscall"
)

func main() {
	if len(os.Args) != 4 || os.Args[1] != "xattr" {
		fmt.Fprintln(os.Stderr, "usage: ociprobe xattr PATH NAME")
		os.Exit(2)
	}
	b := make([]byte, 1024)
	n, err := syscall.Getxattr(os.Args[2], os.Args[3], b)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%x\n", b[:n])
}
