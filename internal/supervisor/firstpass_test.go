package supervisor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// Only a record known to describe the guest exactly is continued; every
// other start merges without inferring deletions (issue 27). And the
// record a restore starts from is the checkpoint's, not the last run's.
func TestFirstPassTrustsOnlyACleanRecord(t *testing.T) {
	for _, c := range []struct {
		name    string
		clean   sandbox.CleanStop
		restore string
		rewind  bool
		cold    bool
		want    firstPass
		fromCP  bool // the record is the checkpoint's
		journal bool // the journal is passed on
	}{
		{name: "clean stop", clean: sandbox.CleanStop{Stopped: true}, want: continuePass, journal: true},
		{name: "after a crash", want: recoverPass, journal: true},
		{name: "paused, resumed", clean: sandbox.CleanStop{Paused: "cp1"}, restore: "cp1", want: continuePass, fromCP: true, journal: true},
		{name: "paused, resumed cold", clean: sandbox.CleanStop{Paused: "cp1"}, restore: "cp1", cold: true, want: recoverPass, fromCP: true, journal: true},
		{name: "paused, booted cold from disks", clean: sandbox.CleanStop{Paused: "cp1"}, want: recoverPass, journal: true},
		{name: "a pause that crashed", restore: "cp1", want: recoverPass, fromCP: true, journal: true},
		{name: "paused at another checkpoint", clean: sandbox.CleanStop{Paused: "cp0"}, restore: "cp1", want: recoverPass, fromCP: true, journal: true},
		{name: "start --from", clean: sandbox.CleanStop{Stopped: true}, restore: "cp1", rewind: true, want: rewindPass},
	} {
		t.Run(c.name, func(t *testing.T) {
			sb := &sandbox.Sandbox{Dir: t.TempDir(), Config: validConfig("fp")}
			run := map[string]*wsync.Entry{"run": {Path: "run", Type: 'f', Hash: "1"}}
			if err := sb.SaveManifest(run); err != nil {
				t.Fatal(err)
			}
			if err := sb.SaveJournal(map[string]*wsync.Entry{"gone": {Path: "gone", Type: 'f'}}); err != nil {
				t.Fatal(err)
			}
			cpDir := sb.Checkpoints().Path("cp1")
			os.MkdirAll(cpDir, 0o700)
			if err := sandbox.WriteManifest(filepath.Join(cpDir, checkpoint.ManifestFile), map[string]*wsync.Entry{"cp": {Path: "cp", Type: 'f', Hash: "2"}}); err != nil {
				t.Fatal(err)
			}
			s := &supervisor{sb: sb, cleanStop: c.clean}
			j := &startJob{s: s, o: Options{Restore: c.restore, Rewind: c.rewind}, cold: c.cold}
			st, first := j.firstPass()
			if first != c.want {
				t.Fatalf("first pass %v, want %v", first, c.want)
			}
			wantKey := "run"
			if c.fromCP {
				wantKey = "cp"
			}
			if st.manifest[wantKey] == nil || len(st.manifest) != 1 {
				t.Fatalf("the record: %v, want the %s one", st.manifest, map[bool]string{true: "checkpoint's", false: "last run's"}[c.fromCP])
			}
			if (st.journal != nil) != c.journal {
				t.Fatalf("journal passed: %v, want %v", st.journal != nil, c.journal)
			}
		})
	}
}

// The mark of a clean stop is read once: a start removes it before it
// runs anything, so a crash of that run finds none.
func TestCleanStopMarkIsTakenOnce(t *testing.T) {
	sb := &sandbox.Sandbox{Dir: t.TempDir()}
	for _, c := range []sandbox.CleanStop{{Stopped: true}, {Paused: "20261203-101010-abcd"}} {
		if err := sb.MarkCleanStop(c); err != nil {
			t.Fatal(err)
		}
		got, err := sb.TakeCleanStop()
		if err != nil || got != c {
			t.Fatalf("took %+v, %v; want %+v", got, err, c)
		}
		if again, err := sb.TakeCleanStop(); err != nil || again != (sandbox.CleanStop{}) {
			t.Fatalf("taken twice: %+v, %v", again, err)
		}
	}
}
