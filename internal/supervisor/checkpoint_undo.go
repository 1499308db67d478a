package supervisor

import (
	"os"
	"path/filepath"

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/vmm"
)

// EnvVerifyCheckpoints, set to 1, makes every checkpoint compare its RAM
// byte for byte with the guest's during the pause (slow: a debug mode).
const EnvVerifyCheckpoints = "KOSA8_CHECKPOINT_VERIFY"

// spareSlots is how many spare RAM files wait for checkpoints: two, so
// that a checkpoint right after another finds one while the other is
// refilled.
const spareSlots = 2

// ramSaver is the supervisor's checkpoint RAM saver and its spares.
func (s *supervisor) ramSaver() *checkpoint.RAMSaver {
	s.undoOnce.Do(func() {
		dir := s.sb.Checkpoints().Dir
		// Spares a previous supervisor left: their content is not known.
		old, _ := filepath.Glob(filepath.Join(dir, checkpoint.SpareName+"*"))
		for _, p := range old {
			os.Remove(p)
		}
		size := int64(s.sb.Config.MemoryMiB) << 20
		s.undo = &checkpoint.RAMSaver{
			Size:   size,
			Verify: os.Getenv(EnvVerifyCheckpoints) == "1",
			Log:    s.log,
			Spares: &checkpoint.Spares{Dir: dir, Size: size, Slots: spareSlots, Log: s.log},
		}
	})
	return s.undo
}

// saveRAM copies the paused machine's RAM into ram for checkpoint meta:
// only what the guest wrote since the parent when that is known for
// sure, else all of it. spare and base say what ram holds already.
func (s *supervisor) saveRAM(ram *os.File, m vmm.Machine, snap vmm.Snapshotter, meta *checkpoint.Meta, spare bool, base string) (*checkpoint.SaveResult, error) {
	r := s.ramSaver()
	// A machine other than the last one (a start, a rewind) starts
	// tracking afresh: its first checkpoint copies everything.
	r.Track(m, func() (checkpoint.Tracker, error) {
		return checkpoint.NewSoftDirty(m.Pid(), snap.RAM(), r.Size)
	})
	res, err := r.Save(ram, snap.RAM(), meta.ID, meta.Parent, spare, base)
	if err != nil {
		return nil, err
	}
	meta.RAMBytes, meta.RAMCopiedBytes = res.Stored, res.Copied
	meta.Incremental, meta.FullCopyReason, meta.Verify = res.Incremental, res.FullReason, res.Verify
	return res, nil
}

// ramCommitted tells the saver that checkpoint id is on disk (saved by
// saveRAM as res, or nil for a copy made another way).
func (s *supervisor) ramCommitted(id string, res *checkpoint.SaveResult) {
	ramPath := filepath.Join(s.sb.Checkpoints().Path(id), checkpoint.RAMFile)
	s.ramSaver().Committed(id, ramPath, res)
}

// EnvRewindRAM, set to 0, turns off the RAM prepared for rewinds (it costs
// the checkpoint's RAM in use a second time in host memory).
const EnvRewindRAM = "KOSA8_REWIND_RAM"

// rewindRAM is the RAM kept ready for a rewind to the last checkpoint
// (checkpoint.RewindRAM), nil where the driver cannot make RAM files
// ahead or the user turned it off.
func (s *supervisor) rewindRAM() *checkpoint.RewindRAM {
	s.rewindOnce.Do(func() {
		mk, ok := s.drv.(vmm.RAMFileMaker)
		if !ok || os.Getenv(EnvRewindRAM) == "0" {
			return
		}
		spec := s.spec
		s.rewindMem = &checkpoint.RewindRAM{
			New:    func() (*os.File, error) { return mk.NewRAMFile(spec) },
			Size:   int64(s.sb.Config.MemoryMiB) << 20,
			Verify: os.Getenv(EnvVerifyCheckpoints) == "1",
			Log:    s.log,
		}
	})
	return s.rewindMem
}

// prepareRewind gets the RAM of checkpoint id ready for a rewind to it, in
// the background.
func (s *supervisor) prepareRewind(id string) {
	if r := s.rewindRAM(); r != nil {
		r.Prepare(id, filepath.Join(s.sb.Checkpoints().Path(id), checkpoint.RAMFile))
	}
}

// takeRewindRAM returns the RAM kept ready for rewinds, for a rewind to
// checkpoint id: exact if it holds id's RAM, else to be copied over; nil
// if there is none (see checkpoint.RewindRAM.Take).
func (s *supervisor) takeRewindRAM(id string) (f *os.File, exact bool) {
	r := s.rewindRAM()
	if r == nil {
		return nil, false
	}
	return r.Take(id, filepath.Join(s.sb.Checkpoints().Path(id), checkpoint.RAMFile))
}

// dropRewindRAM frees the RAM prepared for checkpoint id, deleted.
func (s *supervisor) dropRewindRAM(id string) {
	if r := s.rewindRAM(); r != nil {
		r.Drop(id)
	}
}
