package qemu

// Confinement names what QEMU may touch on the host besides what a start
// adds itself (its kernel, initramfs, writable disk layers and console
// log): a compromised QEMU reaches nothing else. How it is enforced
// depends on the host (confine_linux.go); elsewhere it is not.
type Confinement struct {
	// ReadWrite: directories QEMU creates files in (a checkpoint's new
	// disk layers).
	ReadWrite []string
	// ReadOnly: files and directories it reads (the image, the disk
	// layers a chain is built on).
	ReadOnly []string
}
