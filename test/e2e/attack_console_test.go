package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Root in the guest writes to its serial console without end: the host
// keeps at most two logs of the bound (1 MiB each, internal/vmm/qemu's
// consoleMax), holding the newest lines, and the sandbox goes on
// answering. Before, QEMU appended to console.log itself, as much as the
// guest printed.
func TestAttackConsoleFlood(t *testing.T) {
	name := sandbox(t, "flood", "--no-workspace")
	const bound = 1 << 20
	// 2.5 MiB: at least two renames. Under TCG the emulated serial port
	// takes about 75 KB/s here.
	r := invocation{timeout: 8 * time.Minute}.run(t, "exec", name, "--", "sudo", "sh", "-c",
		"head -c 2600000 /dev/zero | tr '\\0' x | fold -w 100 > /dev/console; echo flood-ends-here > /dev/console")
	if r.code != 0 {
		t.Fatalf("flood:\n%s", r)
	}
	dir := ls(t)[name].Dir
	var total int64
	for _, f := range []string{"console.log", "console.log.1"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if fi.Size() > bound {
			t.Errorf("%s holds %d bytes, more than the bound %d", f, fi.Size(), bound)
		}
		total += fi.Size()
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "console.log*"))
	if len(matches) != 2 {
		t.Errorf("console logs on the host: %q, want console.log and console.log.1", matches)
	}
	// The newest lines are kept, in order (an echo reaches the log after
	// the exec returns only by the time the next exec has run).
	must(t, "exec", name, "--", "true")
	b, err := os.ReadFile(filepath.Join(dir, "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "flood-ends-here") {
		t.Errorf("the newest console lines are not in console.log (last bytes %q)", b[max(0, len(b)-200):])
	}
	t.Logf("2.6 MB printed, %d bytes kept", total)
}
