package vmspec

import (
	"os"
	"strings"
)

// consoleTailBytes bounds how much of a console log ConsoleTail reads:
// the guest decides how much it writes to its console.
const consoleTailBytes = 64 << 10

// MaxConsoleLine bounds each line ConsoleTail returns.
const MaxConsoleLine = 512

// ConsoleTail returns the last n lines of the console log at path (a
// Spec's ConsoleLog), read from its last 64 KiB only, each clipped to
// MaxConsoleLine bytes, for an error that explains a failed boot. It
// returns nil when there is no log or it is empty. The lines are the
// guest's words: clean them before a terminal sees them.
func ConsoleTail(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return nil
	}
	b := make([]byte, min(fi.Size(), consoleTailBytes))
	if _, err := f.ReadAt(b, fi.Size()-int64(len(b))); err != nil {
		return nil
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return nil
	}
	lines := strings.Split(text, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		l = strings.TrimRight(l, "\r")
		if len(l) > MaxConsoleLine {
			l = l[:MaxConsoleLine] + "..."
		}
		lines[i] = l
	}
	return lines
}
