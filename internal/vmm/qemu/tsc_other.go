//go:build !amd64

package qemu

// HostTSCkHz is only meaningful on x86-64.
func HostTSCkHz() int { return 0 }

// HostTSCkHzIn is HostTSCkHz.
func HostTSCkHzIn(string) int { return 0 }
