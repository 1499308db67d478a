//go:build !linux

package checkpoint

import "os"

// SoftDirty is Linux's; elsewhere every checkpoint copies all the RAM.
type SoftDirty struct{}

func ProbeSoftDirty() error { return ErrNoSoftDirty }

func NewSoftDirty(pid int, ram *os.File, size int64) (*SoftDirty, error) {
	return nil, ErrNoSoftDirty
}

func (t *SoftDirty) Dirty() (*Pages, error) { return nil, ErrNoSoftDirty }
func (t *SoftDirty) Reset() (bool, error)   { return true, ErrNoSoftDirty }
func (t *SoftDirty) Close() error           { return nil }
