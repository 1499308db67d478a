//go:build !linux

package qemu

import (
	"os"
	"syscall"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// confinePlan is empty off Linux: macOS has no Landlock and no seccomp,
// and QEMU runs as the user (see the README).
type confinePlan struct{}

// runsAsOwnUID: never here.
func runsAsOwnUID(*Confinement) bool { return false }

func planConfinement(c *Confinement, binary string, ram *os.File, _ bool, spec *vmspec.Spec, accel vmm.Accel, _ int) (*confinePlan, error) {
	return nil, nil
}

func (p *confinePlan) enterThread() error                 { return nil }
func (p *confinePlan) prepare(ram *os.File, _ bool) error { return nil }
func (p *confinePlan) apply(attr *syscall.SysProcAttr)    {}
func (p *confinePlan) close()                             {}
func (p *confinePlan) handOver(path string) error         { return nil }
func (p *confinePlan) String() string                     { return "none" }
