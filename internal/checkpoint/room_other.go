//go:build !linux

package checkpoint

import "os"

// MemoryToSpare: elsewhere the RAM file is an ordinary file (macOS), not
// memory the host cannot reclaim; the driver's RAM file checks its room.
func MemoryToSpare(need int64) error { return nil }

// ShmToSpare: guest RAM is not on a tmpfs here.
func ShmToSpare(f *os.File, need, keep int64) error { return nil }

// HostRoom: not measured here (guest RAM is an ordinary file, not memory
// the host cannot reclaim); Known is false.
func HostRoom() (Room, error) { return Room{}, nil }
