//go:build linux

// kosa8-agent is the guest's PID 1: it boots the guest from the initramfs
// and serves the host over a virtio-serial port. It never exits: PID 1
// exiting panics the kernel.
package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/kosa8/kosa8/internal/guest/agent"
	"github.com/kosa8/kosa8/internal/image/unpack"
)

func main() {
	// In the image converter VM, run as a command (not PID 1): unpack an
	// OCI image's layers (package unpack).
	if len(os.Args) > 1 && os.Args[1] == "unpack" {
		os.Exit(unpack.Main(os.Args[2:], os.Stdout, os.Stderr))
	}
	start := time.Now()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("who", "kosa8-agent")
	// The first line userspace prints: benchmarks time the boot up to it.
	log.Info("kosa8-agent starting")
	if os.Getpid() != 1 {
		log.Error("kosa8-agent runs as the guest's PID 1 only")
		os.Exit(2)
	}
	p, err := agent.Boot(log)
	if err != nil {
		fail(log, "boot", err)
	}
	dev, err := agent.FindPort(p.Port, 10*time.Second)
	if err != nil {
		fail(log, "channel", err)
	}
	port, err := agent.OpenPort(dev)
	if err != nil {
		fail(log, "channel", err)
	}
	a := agent.New(agent.Config{Log: log, DefaultUser: p.User, PID1: true, Startup: time.Since(start), RootGrown: p.RootGrown})
	if err := a.SetupWorkloads(); err != nil {
		log.Warn("workload cgroup (checkpoints cannot freeze processes)", "err", err)
	}
	log.Info("ready", "ms", time.Since(start).Milliseconds(), "port", dev, "user", p.User)
	for {
		err := agent.ServeChannel(context.Background(), port, a.Handle, log)
		log.Error("channel", "err", err)
		time.Sleep(time.Second)
	}
}

// fail reports a boot error on the console and powers off: the host sees
// the message in the console log and QEMU exits instead of hanging.
func fail(log *slog.Logger, what string, err error) {
	log.Error("fatal: "+what, "err", err)
	agent.PowerOffNow()
}
