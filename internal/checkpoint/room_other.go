//go:build !linux

package checkpoint

// MemoryToSpare: elsewhere the RAM file is an ordinary file (macOS), not
// memory the host cannot reclaim; the driver's RAM file checks its room.
func MemoryToSpare(need int64) error { return nil }
