package wsync

import (
	"os/exec"
	"strings"
	"testing"
)

// The guest may change .git/config harmlessly (GitConfigHarmless), and the
// finder then reads the host's new config: a harmless change must never
// hide from the finder what git still reads. Two ways it did: a comment
// line ending in a backslash (git ends a comment at the newline; the
// finder joined the next line, core.hooksPath, into the comment), and a
// comment that pads the config past the finder's read cap (256 KiB; a
// harmless config may have 1 MiB) or makes a line longer than its scanner's.
func TestHarmlessConfigChangeHidesHooksPath(t *testing.T) {
	base := "[core]\n\tbare = false\n\thooksPath = tools/hooks\n[remote \"origin\"]\n\turl = https://example.com/r\n"
	base += "[difftool \"x\"]\n\tpath = bin/diff.sh\n"
	tools := "[difftool \"x\"]\n\tpath = bin/diff.sh\n"
	for name, cfg := range map[string]string{
		"a tab before a subsection":     strings.Replace(base, tools, strings.Replace(tools, " ", "\t", 1), 1),
		"comment ending in a backslash": strings.Replace(base, "\thooksPath", "#\\\n\thooksPath", 1),
		"padded past the read cap":      "# " + strings.Repeat("x", 300<<10) + "\n" + base,
		"many short comment lines":      strings.Repeat("# pad pad pad pad pad pad pad pad\n", 9000) + base,
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("HOME", t.TempDir())
			if !GitConfigHarmless([]byte(base), []byte(cfg)) {
				t.Skip("not harmless: the guest cannot land it")
			}
			if _, err := exec.LookPath("git"); err == nil {
				d := t.TempDir()
				write(t, d, "c", cfg)
				for k, want := range map[string]string{"core.hooksPath": "tools/hooks", "difftool.x.path": "bin/diff.sh"} {
					out, err := exec.Command("git", "config", "--file", d+"/c", k).Output()
					if err != nil || strings.TrimSpace(string(out)) != want {
						t.Fatalf("git reads %s as %q (%v)", k, out, err)
					}
				}
			}
			p := newPair(t, Options{})
			p.both(t, map[string]string{
				".git/HEAD":   "ref: refs/heads/main\n",
				".git/config": base,
			})
			p.sync(t)
			write(t, p.guest, ".git/config", cfg)
			p.sync(t)
			if read(p.host, ".git/config") != cfg {
				t.Fatalf("the harmless change did not land: %+v", p.e.Status().Held)
			}
			for _, f := range []string{"tools/hooks/pre-commit", "bin/diff.sh"} {
				write(t, p.guest, f, "#!/bin/sh\ntouch /tmp/pwned\n")
			}
			p.sync(t)
			for _, f := range []string{"tools/hooks/pre-commit", "bin/diff.sh"} {
				if exists(p.host, f) {
					t.Errorf("%s, which the host's git runs, reached the host after a harmless config change", f)
				}
			}
		})
	}
}

// A host config longer than the finder reads holds every guest change:
// what lies past the cut is unknown.
func TestHostGitConfigTooLongHoldsAll(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	p := newPair(t, Options{})
	cfg := "# " + strings.Repeat("x", maxHostGitConfig) + "\n[core]\n\thooksPath = tools/hooks\n"
	p.both(t, map[string]string{
		".git/HEAD":   "ref: refs/heads/main\n",
		".git/config": cfg,
	})
	p.sync(t)
	write(t, p.guest, "tools/hooks/pre-commit", "evil")
	p.sync(t)
	if exists(p.host, "tools/hooks/pre-commit") {
		t.Error("a hook named past the read cap of a long config reached the host")
	}
}

// The finder's lenient reader (gitConfigEntries) must see, in any config
// the strict one (parseGitConfig, which decides what the guest may write)
// accepts, the same keys: else a harmless change hides a key from it.
func FuzzGitConfigReadersAgree(f *testing.F) {
	for _, s := range []string{"[core]\n\thooksPath = x\n", "[a \"b\"]\n#\\\nk = v\n", "[a\t\"b\"]\nk=v\n", "[a \"]\"]\nk\n", "[a]\r\nk = \"x;\" ; y\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		strict, ok := parseGitConfig([]byte(s))
		if !ok {
			return
		}
		lenient := map[string]int{}
		for _, e := range gitConfigEntries([]byte(s)) {
			lenient[e.key]++
		}
		for k, vs := range strict {
			if lenient[k] != len(vs) {
				t.Fatalf("%q: key %q: strict reader has %d, lenient %d (%v)", s, k, len(vs), lenient[k], lenient)
			}
		}
	})
}

// Keys whose values git runs or copies hooks from, beyond those
// TestHostGitConfigNamesHeld covers: init.templateDir (clone copies its
// hooks and runs post-checkout at once), send-email's sendmailCmd and a
// smtpServer that is a path.
func TestHostGitConfigMoreRunKeys(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	p := newPair(t, Options{})
	cfg := "[init]\n\ttemplateDir = tmpl\n[sendemail]\n\tsendmailCmd = tools/sm.sh -i\n\tsmtpServer = tools/smtp.sh\n"
	p.both(t, map[string]string{
		".git/HEAD":   "ref: refs/heads/main\n",
		".git/config": cfg,
	})
	p.sync(t)
	evil := []string{"tmpl/hooks/post-checkout", "tools/sm.sh", "tools/smtp.sh"}
	for _, f := range evil {
		write(t, p.guest, f, "#!/bin/sh\ntouch /tmp/pwned\n")
	}
	p.sync(t)
	for _, f := range evil {
		if exists(p.host, f) {
			t.Errorf("%s reached the host", f)
		}
	}
}
