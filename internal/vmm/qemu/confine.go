package qemu

// Confinement names what QEMU may touch on the host besides what a start
// adds itself (its kernel, initramfs, writable disk layers and console
// log): a compromised QEMU reaches nothing else. How it is enforced
// depends on the host (confine_linux.go); elsewhere it is not.
type Confinement struct {
	// ReadWrite: directories whose files QEMU reads, and writes those
	// handed to it (its disk layers: the top ones at start, a
	// checkpoint's new ones as it switches to them). It creates, renames
	// and removes nothing there: the folder stays the supervisor's, so a
	// compromised QEMU cannot plant a link where the supervisor (root)
	// makes the next layer.
	ReadWrite []string
	// ReadOnly: files and directories it reads (the image, the disk
	// layers a chain is built on).
	ReadOnly []string
}
