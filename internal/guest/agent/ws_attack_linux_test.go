package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/wsync"
)

// REDTEAM 2: handleWriteFile's workspace test takes any rel starting
// with ".." as outside the workspace: "..notes" (a legal name, CleanRel
// takes it) can never be written with a Was, so its conflict copies
// (guestCopy) and type changes (putGuest) fail on every pass.
func TestRedteamDotDotNameWrite(t *testing.T) {
	c, _ := pair(t)
	ctx := context.Background()
	dir := t.TempDir()
	g := &wsync.GuestSide{C: c, Root: dir}
	content := "notes"
	sum := sha256.Sum256([]byte(content))
	for _, p := range []string{"..notes", "..notes.sandbox-conflict-20260102-030405", "sub/..x"} {
		_, err := g.Write(ctx, p, 0o644, strings.NewReader(content), hex.EncodeToString(sum[:]), nil)
		if err != nil {
			t.Errorf("write %s (was: nothing): %v", p, err)
		}
		if _, serr := os.Lstat(filepath.Join(dir, p)); serr != nil {
			t.Errorf("%s not written", p)
		}
	}
}

// REDTEAM 5 (pre-existing, not from this change): the agent's full scan
// leaves out a top-level lost+found, so a host project's lost+found is
// copied in, then seen as deleted by the agent on the next full pass, and
// deleted on the host.
func TestRedteamHostLostFound(t *testing.T) {
	c, _ := pair(t)
	ctx := context.Background()
	gdir, hdir := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(hdir, "lost+found"), 0o755)
	os.WriteFile(filepath.Join(hdir, "lost+found", "x"), []byte("user data"), 0o644)
	hr, err := wsync.OpenRoot(hdir)
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Close()
	e := wsync.NewEngine(&wsync.HostSide{Root: hr}, &wsync.GuestSide{C: c, Root: gdir}, nil, wsync.Options{}, nil)
	for i := 0; i < 3; i++ {
		if err := e.Sync(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(hdir, "lost+found", "x")); err != nil {
		t.Fatalf("the host's lost+found/x is gone: %v (status %+v)", err, e.Status().Errors)
	}
}

// REDTEAM 6: wsStill hashes the agent's current file with no size bound
// (math.MaxInt64) before it compares sizes: a file that became huge
// (here 4 GiB, sparse) since the host's scan is read whole just to say
// "stale", the host's pass (and the engine's lock) waiting on it.
func TestRedteamWsStillHashesHugeFile(t *testing.T) {
	c, _ := pair(t)
	ctx := context.Background()
	dir := t.TempDir()
	g := &wsync.GuestSide{C: c, Root: dir}
	os.WriteFile(filepath.Join(dir, "f"), []byte("small"), 0o644)
	scan, err := g.Scan(ctx, []string{"f"})
	if err != nil || scan["f"] == nil {
		t.Fatal(scan, err)
	}
	os.Truncate(filepath.Join(dir, "f"), 4<<30) // the agent's new, huge version
	start := time.Now()
	sum := sha256.Sum256([]byte("host"))
	_, err = g.Write(ctx, "f", 0o644, strings.NewReader("host"), hex.EncodeToString(sum[:]), scan["f"])
	took := time.Since(start)
	t.Logf("stale answer after %v: %v", took, err)
	if took > 2*time.Second {
		t.Fatalf("%v to find a 5-byte file became 4 GiB", took)
	}
}
