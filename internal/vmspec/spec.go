// Package vmspec describes a virtual machine independently of the VMM that
// runs it. A driver (internal/vmm/qemu) translates it into its own terms.
package vmspec

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
)

// Arch is a guest CPU architecture, named as Go names it.
type Arch string

const (
	AMD64 Arch = "amd64"
	ARM64 Arch = "arm64"
)

// HostArch is the architecture of this machine.
func HostArch() Arch { return Arch(runtime.GOARCH) }

// SetupCommand is the command that builds the base image for a (and
// installs its QEMU): what an error about either missing tells the user.
func SetupCommand(a Arch) string {
	if a != HostArch() {
		return "kosa8 setup --arch " + string(a)
	}
	return "kosa8 setup"
}

// ParseArch reads a guest architecture as a user types it: Go's and
// Debian's names, or the kernel's (uname -m). Empty is the host's.
func ParseArch(s string) (Arch, error) {
	switch s {
	case "":
		return HostArch(), nil
	case "amd64", "x86_64", "x86-64":
		return AMD64, nil
	case "arm64", "aarch64":
		return ARM64, nil
	}
	return "", fmt.Errorf("architecture %q is not supported: use amd64 (x86_64) or arm64 (aarch64)", s)
}

// Spec is one machine.
type Spec struct {
	Name      string `json:"name"`
	Arch      Arch   `json:"arch"`
	CPUs      int    `json:"cpus"`
	MemoryMiB int    `json:"memory_mib"`

	Kernel  string `json:"kernel"`
	Initrd  string `json:"initrd"`
	Cmdline string `json:"cmdline"`

	Disks []Disk `json:"disks"`

	// ConsoleLog receives the guest's serial console.
	ConsoleLog string `json:"console_log,omitempty"`
	// AgentPort is the virtio-serial port name of the host↔agent channel.
	AgentPort string `json:"agent_port"`
	// Net attaches the one NIC to a stream socket served by the host.
	Net *Net `json:"net,omitempty"`
	// VirtioFS attaches folders served by virtiofsd. Only the benchmarks
	// use it, to measure the workspace disk against a shared folder:
	// kosa8 never shares a host folder into a sandbox.
	VirtioFS []VirtioFS `json:"virtiofs,omitempty"`
}

// VirtioFS is a vhost-user-fs device: Tag is what the guest mounts,
// Socket the virtiofsd socket that serves it.
type VirtioFS struct {
	Tag    string `json:"tag"`
	Socket string `json:"socket"`
}

// Disk is a block device. The guest finds it by its ID, which is also its
// serial number there (/sys/block/vd*/serial), not by its name: the kernel
// names disks in the order it probes them, which depends on the machine.
type Disk struct {
	ID       string `json:"id"` // at most 20 bytes, no "," "=" or space
	Path     string `json:"path"`
	Format   string `json:"format"` // qcow2 or raw
	ReadOnly bool   `json:"read_only,omitempty"`
	// Scratch disks need not survive a crash of the host: the VMM may
	// ignore the guest's flushes (the image builder's disk, discarded
	// unless the build finishes).
	Scratch bool `json:"scratch,omitempty"`
}

// Net is the guest's only network interface.
type Net struct {
	MAC string `json:"mac"`
}

// Validate reports what is wrong with s, all at once.
func (s *Spec) Validate() error {
	var errs []error
	if s.Name == "" {
		errs = append(errs, errors.New("vm: no name"))
	}
	switch s.Arch {
	case AMD64, ARM64:
	default:
		errs = append(errs, fmt.Errorf("vm: unsupported architecture %q", s.Arch))
	}
	if s.CPUs < 1 || s.CPUs > 64 {
		errs = append(errs, fmt.Errorf("vm: %d CPUs is out of range (1–64)", s.CPUs))
	}
	if s.MemoryMiB < 128 {
		errs = append(errs, fmt.Errorf("vm: %d MiB of memory is too little (at least 128)", s.MemoryMiB))
	}
	if s.Kernel == "" || s.Initrd == "" {
		errs = append(errs, errors.New("vm: kernel and initrd are required"))
	}
	for i, d := range s.Disks {
		if d.ID == "" || d.Path == "" {
			errs = append(errs, fmt.Errorf("vm: disk %d needs an id and a path", i))
		}
		if len(d.ID) > 20 || strings.ContainsAny(d.ID, ",= ") {
			// virtio-blk serial numbers hold 20 bytes.
			errs = append(errs, fmt.Errorf("vm: disk id %q: at most 20 bytes, without ',', '=' or spaces", d.ID))
		}
		if d.Format != "qcow2" && d.Format != "raw" {
			errs = append(errs, fmt.Errorf("vm: disk %s has unknown format %q", d.ID, d.Format))
		}
	}
	if s.AgentPort == "" {
		errs = append(errs, errors.New("vm: no agent port"))
	}
	return errors.Join(errs...)
}
