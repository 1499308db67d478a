package supervisor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// launch starts QEMU and connects to the agent: a cold boot, or (restore
// set) a restore of the checkpoint's RAM and devices.
func (s *supervisor) launch(ctx context.Context, restore *checkpoint.Meta) error {
	st, err := s.startVMM(ctx, restore, s.disks())
	if err != nil {
		return err
	}
	return s.bringUp(ctx, st, restore)
}

// startedVMM is a QEMU started for the sandbox that is not yet its
// machine: its guest boots, or (a restore) waits for its device state.
type startedVMM struct {
	m        vmm.Machine
	netHost  *os.File // the network link's host end, served once it is the sandbox's
	ramCopy  string   // how a restore's RAM copy went, for the log
	private  bool     // its RAM is mapped copy-on-write (RAMTemplate): not the host's to copy
	t0, tRun time.Time
}

// discard kills a QEMU that never became the sandbox's.
func (v *startedVMM) discard() {
	v.netHost.Close()
	_ = v.m.Kill()
}

// startVMM starts QEMU on disks, with the checkpoint's RAM if restore is
// set (the RAM kept ready for it, or a copy made while QEMU starts).
func (s *supervisor) startVMM(ctx context.Context, restore *checkpoint.Meta, disks []vmspec.Disk) (*startedVMM, error) {
	qemuNet, hostNet, err := s.net.newLink()
	if err != nil {
		return nil, err
	}
	defer qemuNet.Close() // QEMU has its own copy; ours would hide QEMU's exit from the stack
	spec := *s.spec
	spec.Disks = disks
	opts := vmm.StartOptions{Stderr: logWriter{s.log}, Net: qemuNet}
	v := &startedVMM{netHost: hostNet}
	exact := false
	switch {
	case restore == nil:
	case restore.RAMInStream:
		// The device state carries the RAM: nothing to copy first.
		opts.Incoming, exact = true, true
		v.ramCopy = "in the device state"
	case restore.MapRAM && s.canMapRAM():
		// A fork: its source's checkpoint's RAM mapped copy-on-write,
		// shared with the other forks until each writes its pages.
		tpl, err := s.openRestore(restore, checkpoint.RAMFile)
		if err != nil {
			hostNet.Close()
			return nil, err
		}
		opts.Incoming, opts.RAMTemplate, exact = true, tpl, true
		v.private, v.ramCopy = true, "mapped copy-on-write"
	default:
		opts.Incoming = true
		// The RAM kept ready: the checkpoint's (nothing to copy), or
		// another's, resident, to copy over (faster than new pages).
		if opts.RAM, exact = s.takeRewindRAM(restore.ID); exact {
			v.ramCopy = "prepared"
		}
	}
	if restore != nil && !exact {
		ramSrc, err := s.openRestore(restore, checkpoint.RAMFile)
		if err != nil {
			hostNet.Close()
			if opts.RAM != nil {
				opts.RAM.Close()
			}
			return nil, err
		}
		defer ramSrc.Close() // the copy ends before Start returns
		copyFn, into := checkpoint.CopySparse, "new"
		if opts.RAM != nil {
			copyFn, into = checkpoint.CopyOver, "ready"
		}
		opts.PrepareRAM = func(ram *os.File) error {
			// Copied into shared memory rather than mapped copy-on-write:
			// the next checkpoint can then skip RAM in the migration
			// stream again (x-ignore-shared).
			t := time.Now()
			n, err := copyFn(ram, ramSrc)
			v.ramCopy = fmt.Sprintf("%d MiB into %s pages in %.0f ms", n>>20, into, msBetween(t, time.Now()))
			return err
		}
	}
	v.t0 = time.Now()
	v.m, err = s.drv.Start(ctx, &spec, opts)
	v.tRun = time.Now()
	if err != nil {
		hostNet.Close()
		return nil, err
	}
	// "qemu started" is what the e2e tests look for; confined says how
	// the VMM is confined, where its driver can tell.
	var confined string
	if c, ok := v.m.(interface{ Confined() string }); ok {
		confined = c.Confined()
	}
	s.log.Info("qemu started", "pid", v.m.Pid(), "confined", confined)
	return v, nil
}

// bringUp makes a started QEMU the sandbox's machine: its network link is
// served, a restore's device state loaded and its guest resumed, and the
// agent connected (after a restore, the RNG reseeded and the clock stepped
// before the workloads run). A machine that does not come up is killed.
func (s *supervisor) bringUp(ctx context.Context, v *startedVMM, restore *checkpoint.Meta) (err error) {
	m := v.m
	if err := s.net.attachLink(v.netHost); err != nil {
		_ = m.Kill()
		return err
	}
	s.clientMu.Lock()
	s.machine = m
	s.privateRAM = v.private
	s.clientMu.Unlock()
	defer func() {
		// All or nothing: a QEMU whose guest never came up is not left
		// running beside a supervisor that gave up on it.
		if err != nil {
			if kerr := m.Kill(); kerr != nil {
				s.log.Error("kill the QEMU of a failed start", "err", kerr)
			}
		}
	}()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.Done():
			cancel() // QEMU died: stop waiting for it
		case <-lctx.Done():
		}
	}()
	tUp := time.Now()
	if restore != nil {
		dev, err := s.openRestore(restore, checkpoint.DevicesFile)
		if err != nil {
			return err
		}
		snap, err := snapshotter(m)
		if err == nil {
			if restore.RAMInStream {
				err = loadAll(lctx, m, dev)
			} else {
				err = snap.LoadDevices(lctx, dev)
			}
		}
		dev.Close()
		if err != nil {
			return fmt.Errorf("load the checkpoint's device state: %w", err)
		}
		if ram := snap.RAM(); restore.RAMInStream && ram != nil {
			// The stream touched every page of the RAM file: give the
			// zero ones back before the guest runs.
			t := time.Now()
			freed, err := checkpoint.FreeZeroRuns(ram)
			v.ramCopy += fmt.Sprintf(", %d MiB of zeros freed in %.0f ms", freed>>20, msSince(t))
			if err != nil {
				s.log.Warn("free the zero pages of a RAM file loaded from a stream", "err", err)
			}
		}
		if err := snap.Resume(lctx); err != nil {
			return err
		}
	}
	tLoaded := time.Now()
	client, err := guest.Connect(lctx, m.Agent())
	if err != nil {
		// A QEMU that dies resets the agent's socket a moment before its
		// exit is reaped: give the exit a moment to arrive, as QEMU's own
		// words say more than the reset.
		wait := vmExitGrace
		if ctx.Err() != nil {
			wait = 0
		}
		if gone := s.vmStopped(m, wait, "booting", nil); gone != nil {
			return gone
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return fmt.Errorf("the guest agent did not answer%s", consoleTail(s.sb.Path(sandbox.ConsoleLog)))
		}
		return err
	}
	if restore != nil {
		entropy := make([]byte, 64)
		_, _ = rand.Read(entropy)
		tConnected := time.Now()
		// A machine saved elsewhere (a boot template, the checkpoint a
		// fork starts from) becomes another machine here: one of many
		// copies, each with a boot id of its own.
		id := s.identity()
		id.NewBootID = restore.Root != nil
		if err := client.Restored(lctx, entropy, time.Now(), id); err != nil {
			return fmt.Errorf("restored guest: %w", err)
		}
		// qemu_and_ram_ms: QEMU's start with the RAM copy; a QEMU
		// started ahead (a rewind) waited waiting_ms beside it for the
		// old machine to go.
		s.log.Info("restored", "checkpoint", restore.ID, "qemu_and_ram_ms", msBetween(v.t0, v.tRun), "waiting_ms", msBetween(v.tRun, tUp),
			"ram_copy", v.ramCopy, "devices_ms", msBetween(tUp, tLoaded), "agent_ms", msBetween(tLoaded, tConnected), "reseed_ms", msSince(tConnected))
	} else if err := client.SetTime(lctx, time.Now(), s.bootIdentity()); err != nil {
		s.log.Warn("set guest clock and hostname", "err", err)
	}
	s.setClient(client)
	s.setStatus(func(st *api.Status) { st.RAMShared = v.private })
	return nil
}

// vmExitGrace is how long a guest connection that broke waits for QEMU's
// exit: a QEMU that dies resets the agent's socket a moment before its
// exit is reaped. A var: tests shorten it.
var vmExitGrace = 2 * time.Second

// vmStopped returns the error that says m's QEMU exited while the sandbox
// was doing what (its exit status, or the guest's kernel stopping, with
// the console's last lines), after cause if any, if it has or does
// within wait; else nil.
func (s *supervisor) vmStopped(m vmm.Machine, wait time.Duration, what string, cause error) error {
	if m == nil {
		return nil
	}
	grace := time.NewTimer(wait)
	defer grace.Stop()
	select {
	case <-m.Done():
	case <-grace.C:
		return nil
	}
	why := "QEMU exited: the guest's kernel stopped (a panic, or a power-off)"
	if werr := m.Wait(context.Background()); werr != nil {
		why = werr.Error()
	}
	return errVMStopped{what: what, why: why, console: consoleTail(s.sb.Path(sandbox.ConsoleLog)), cause: cause}
}

// errVMStopped says QEMU exited under a start, why, and what the step it
// stopped under saw (cause: "agent: EOF", say).
type errVMStopped struct {
	what, why, console string
	cause              error
}

func (e errVMStopped) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("the VM stopped while %s (%v): %s%s", e.what, e.cause, e.why, e.console)
	}
	return fmt.Sprintf("the VM stopped while %s: %s%s", e.what, e.why, e.console)
}

func (e errVMStopped) Unwrap() error { return e.cause }

// loadAll loads a device state that carries the RAM too.
func loadAll(ctx context.Context, m vmm.Machine, dev *os.File) error {
	l, ok := m.(vmm.FullLoader)
	if !ok {
		return fmt.Errorf("a checkpoint with its RAM in the device state: %w", vmm.ErrNotSupported)
	}
	return l.LoadAll(ctx, dev)
}

// EnvForkRAM, set to copy, has forks copy their checkpoint's RAM into
// memory of their own instead of mapping it copy-on-write: more memory,
// but their checkpoints copy RAM files again instead of streaming it.
const EnvForkRAM = "KOSA8_FORK_RAM"

// canMapRAM tells whether a restore may map its RAM copy-on-write: the
// driver can, and the user did not say otherwise.
func (s *supervisor) canMapRAM() bool {
	t, ok := s.drv.(vmm.RAMTemplater)
	return ok && t.CanMapRAMTemplate() && os.Getenv(EnvForkRAM) != "copy"
}

// openRestore opens a restore's RAM or device state: in the checkpoint's
// directory, or in a template's, through the directory held since the
// template was found (all of one template, whatever its path holds
// meanwhile), and only a regular file.
func (s *supervisor) openRestore(m *checkpoint.Meta, name string) (*os.File, error) {
	if m.Root != nil {
		return openRegularIn(m.Root, name)
	}
	return os.Open(filepath.Join(s.sb.Checkpoints().Path(m.ID), name))
}

// identity is the sandbox's in its guest: hostname and machine-id.
func (s *supervisor) identity() guest.Identity {
	return guest.Identity{Hostname: sandbox.Hostname(s.sb.Config.Name), MachineID: s.sb.MachineID()}
}

// bootIdentity is the identity a booted guest is given at once: none (the
// agent's own hostname, "kosa8", and the image's machine-id) for a boot a
// template is made of, named after the copy (nameGuest), so no template
// holds a sandbox's name or machine-id.
func (s *supervisor) bootIdentity() guest.Identity {
	if s.unnamed {
		return guest.Identity{}
	}
	return s.identity()
}

// nameGuest gives the guest the sandbox's identity (after a template's
// copy of an unnamed boot).
func (s *supervisor) nameGuest(ctx context.Context) error {
	s.unnamed = false
	cctx, cancel := withTimeout(ctx, guestCallTimeout)
	defer cancel()
	return s.currentClient().SetTime(cctx, time.Now(), s.bootIdentity())
}

// disks are the sandbox's active disk layers, as QEMU takes them.
func (s *supervisor) disks() []vmspec.Disk { return specDisks(s.sb, s.sb.ActiveDisks()) }

// specDisks are layers (disk id to layer) as QEMU takes them, root first.
func specDisks(sb *sandbox.Sandbox, layers map[string]checkpoint.Disk) []vmspec.Disk {
	var out []vmspec.Disk
	for _, id := range []string{"root", "ws", "docker"} {
		if d, ok := layers[id]; ok {
			out = append(out, vmspec.Disk{ID: id, Path: sb.Path(d.Path), Format: d.Format})
		}
	}
	return out
}
