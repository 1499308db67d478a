package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A new sandbox of a shape already booted once starts from that boot's
// template (its machine restored, not booted) and is still a machine of
// its own: its own hostname, its own workspace, its own root disk, and
// random numbers no other sandbox from the template reads: a guest
// restored twice from one RAM image holds one RNG state, which the
// agent's reseed with the host's entropy makes two. (With the reseed
// taken out this test still passed, 2 Dec 2026: the 6.12 guest kernel,
// seconds into its uptime, reseeds its CRNG from interrupt timings of
// its own within a second; the reseed is what makes it certain.)
func TestNewSandboxesStartFromATemplate(t *testing.T) {
	env := []string{"KOSA8_CACHE=" + privateCache(t)} // no template of any shape yet
	k := func(args ...string) result {
		t.Helper()
		r := runEnv(t, env, 3*time.Minute, args...)
		if r.code != 0 {
			t.Fatalf("kosa8 %v:\n%s", args, r)
		}
		return r
	}
	names := []string{"tpl-first", "tpl-b", "tpl-c"}
	wss := map[string]string{}
	fromTemplate := 0
	for i, n := range names {
		ws := t.TempDir()
		wss[n] = ws
		if err := os.WriteFile(filepath.Join(ws, "mine"), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
		k("create", "--workspace", ws, n)
		t.Cleanup(func() { runEnv(t, env, time.Minute, "rm", "-f", n) })
		k("start", n)
		tpl := ls(t)[n].Status.Template
		switch {
		case i == 0 && tpl != "":
			t.Fatalf("%s, the first boot of its shape in a new cache, started from template %s", n, tpl)
		case i > 0 && tpl == "":
			// A restore that fails boots instead (and a new template is
			// made): the sandbox is sound either way, and the supervisor
			// says why. One such in about forty restores here (2 Dec
			// 2026: the restored guest's kernel panicked, PID 1 killed;
			// not understood yet): its logs go to the test's output.
			t.Logf("%s booted instead of starting from the template:", n)
			printLogs(ls(t)[n].Dir)
		default:
			fromTemplate += min(i, 1)
		}
		if got := strings.TrimSpace(k("exec", n, "--", "hostname").stdout); got != n {
			t.Errorf("hostname in %s: %q", n, got)
		}
		if got := k("exec", n, "--", "cat", "/proc/cmdline").stdout; strings.Contains(got, "tpl-") {
			t.Errorf("the kernel command line in %s names a sandbox: %q", n, got)
		}
		if got := k("exec", n, "--", "cat", filepath.Join(ws, "mine")).stdout; got != n {
			t.Errorf("the workspace file in %s reads %q", n, got)
		}
		if i == 1 {
			k("exec", n, "--", "sh", "-c", "echo only-in-b | sudo tee /etc/tpl-marker >/dev/null && sync")
		}
	}
	if fromTemplate == 0 {
		t.Fatal("neither tpl-b nor tpl-c started from the template the first boot made")
	}
	random := func(n string) string {
		return k("exec", n, "--", "sh", "-c", "head -c 32 /dev/urandom | od -An -tx1").stdout
	}
	if b, c := random("tpl-b"), random("tpl-c"); b == c || len(b) < 64 {
		t.Fatalf("two sandboxes from one template read the same random bytes: %q", b)
	}
	// What is reseeded or renamed per sandbox (issue 28): the kernel's
	// boot_id, /etc/machine-id and the UUIDs of the root and workspace
	// filesystems differ in each (the template's are the image's, and the
	// first boot's workspace disk's, in every copy until renamed). What
	// a copy keeps of its template (KASLR base, stack canaries) is in
	// docs/templates.md.
	idOf := func(n string) string {
		return strings.Join(strings.Fields(k("exec", n, "--", "sh", "-c", identityScript, "sh", wss[n]).stdout), " ")
	}
	ids := map[string]string{}
	for _, n := range names {
		id := idOf(n)
		f := strings.Fields(id)
		if len(f) != 4 || len(f[0]) != 36 || len(f[1]) != 32 {
			t.Fatalf("identity of %s: %q", n, id)
		}
		for m, other := range ids {
			of := strings.Fields(other)
			for i, what := range []string{"boot_id", "machine-id", "root filesystem UUID", "workspace filesystem UUID"} {
				if f[i] == of[i] {
					t.Errorf("%s and %s have one %s: %s", n, m, what, f[i])
				}
			}
		}
		ids[n] = id
	}
	if r := runEnv(t, env, time.Minute, "exec", "tpl-c", "--", "cat", "/etc/tpl-marker"); r.code == 0 {
		t.Errorf("a file tpl-b wrote to its root is in tpl-c (from the same template): %q", r.stdout)
	}
	// The root disk tpl-b got is a disk of its own that boots: stopped,
	// started again (a boot, from its disks), its file still there.
	k("stop", "tpl-b")
	k("start", "tpl-b")
	if got := k("exec", "tpl-b", "--", "cat", "/etc/tpl-marker").stdout; got != "only-in-b\n" {
		t.Errorf("tpl-b's root after a stop and start: %q", got)
	}
	// The machine-id and the filesystems' UUIDs are the sandbox's, kept
	// across a stop and a start; boot_id is the boot's.
	before, after := strings.Fields(ids["tpl-b"]), strings.Fields(idOf("tpl-b"))
	if before[0] == after[0] || !slices.Equal(before[1:], after[1:]) {
		t.Errorf("tpl-b's boot_id, machine-id, root and workspace UUIDs before a stop and start: %v, after: %v", before, after)
	}
	k("stop", "tpl-b")
	if out, err := exec.Command("qemu-img", "check", "-q", filepath.Join(ls(t)["tpl-b"].Dir, "root.qcow2")).CombinedOutput(); err != nil {
		t.Errorf("qemu-img check of tpl-b's root disk: %v\n%s", err, out)
	}
}

// identityScript prints the guest's boot_id, its machine-id and the
// filesystem ids of / and of the folder $1: for ext4 the id statfs
// reports is made from the filesystem's UUID (ext4_statfs: its two
// halves xored), so it changes when the UUID does.
const identityScript = `cat /proc/sys/kernel/random/boot_id /etc/machine-id && stat -f -c %i / "$1"`
