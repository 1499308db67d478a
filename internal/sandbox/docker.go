package sandbox

import (
	"context"
	"fmt"
)

// DockerConfig is a sandbox's container engine (--docker): Docker inside
// the guest, its data (/var/lib/docker) on a disk of its own, DockerDisk,
// which every checkpoint keeps with the root and workspace disks and which
// the synced workspace never holds.
type DockerConfig struct {
	// DiskGiB is the size of the engine's disk (sparse: it takes the
	// space its images and containers use).
	DiskGiB int `json:"disk_gib"`
}

const (
	// DockerDisk is the engine's disk in the sandbox's directory: raw
	// ext4, its layers above it made by checkpoints as the others are.
	DockerDisk = "docker.img"
	// DefaultDockerDiskGiB is its size unless --docker-disk says.
	DefaultDockerDiskGiB = 32
)

// createDockerDisk makes the engine's empty disk, its root root's.
func createDockerDisk(ctx context.Context, path string, gib int) error {
	if err := createExt4(ctx, path, "kosa8-docker", gib, 0, 0); err != nil {
		return fmt.Errorf("format the container engine's disk: %w", err)
	}
	return nil
}
