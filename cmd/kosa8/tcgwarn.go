package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
)

// warnTCG says that the sandbox runs without hardware isolation: in full
// the first time in this boot of the host (for a fallback from KVM, and
// for TCG without one), then in one short line ('kosa8 doctor' keeps the
// whole story).
func warnTCG(st *api.Status) {
	home := ""
	if m, err := manager(); err == nil {
		home = m.Paths.Home
	}
	for _, l := range tcgWarning(home, st) {
		fmt.Fprintln(os.Stderr, "kosa8: warning: "+l)
	}
}

// tcgNoticeFile, in KOSA8_HOME, remembers the TCG warning last shown in
// full: a hash of the host's boot and its kind.
const tcgNoticeFile = "tcg-warned"

// tcgWarning is the lines warnTCG prints for st, and notes in home that
// the full ones were shown.
func tcgWarning(home string, st *api.Status) []string {
	if st == nil || st.Accel != string(vmm.TCG) {
		return nil
	}
	// Once per boot of the host and kind: the first start that fell back
	// says why (its words differ from a later start's, which read the
	// record: both are the same failure, recorded once per boot).
	kind := "tcg"
	if st.AccelFallback != "" {
		kind = "fallback"
	}
	sum := sha256.Sum256([]byte(qemu.BootID() + "\n" + kind))
	key := hex.EncodeToString(sum[:16])
	path := ""
	if home != "" {
		path = filepath.Join(home, tcgNoticeFile)
		b, _ := os.ReadFile(path)
		if seen := strings.Fields(string(b)); slices.Contains(seen, key) {
			short := "tcg: slow, and QEMU's emulator is not a security boundary like KVM or HVF ('kosa8 doctor' says why)"
			if st.AccelFallback != "" {
				short = "tcg (kvm failed to boot a sandbox here earlier): slow, and QEMU's emulator is not a security boundary like KVM or HVF ('kosa8 doctor' says why)"
			}
			return []string{short}
		}
	}
	var out []string
	if st.AccelFallback != "" {
		out = append(out, strings.TrimRight(oneLine(st.AccelFallback, 400), ". ")+"; fell back to tcg, and later sandboxes start under tcg until the host reboots (see 'kosa8 doctor'; KOSA8_ACCEL=tcg skips the attempt)")
	}
	out = append(out, vmm.IsolationWarning+" (said in full once; 'kosa8 doctor' repeats it)")
	if path != "" {
		b, _ := os.ReadFile(path)
		seen := append(strings.Fields(string(b)), key)
		if len(seen) > 8 { // older boots
			seen = seen[len(seen)-8:]
		}
		_ = os.WriteFile(path, []byte(strings.Join(seen, "\n")+"\n"), 0o600)
	}
	return out
}
