package vmspec

import (
	"os"
	"strings"

	"github.com/kosa8/kosa8/internal/termsafe"
)

// consoleTailBytes bounds how much of a console log ConsoleTail reads:
// the guest decides how much it writes to its console.
const consoleTailBytes = 64 << 10

// MaxConsoleLine bounds each line ConsoleTail returns (ClipLine).
const MaxConsoleLine = 512

// ConsoleTail returns the last n lines of the console log at path (a
// Spec's ConsoleLog), and of the older half a driver keeps beside a long
// one (path + ".1") when the log has fewer, for an error that explains a
// failed boot. Each file is read from its last 64 KiB only, and each line
// is clipped to MaxConsoleLine bytes and cleaned of control sequences:
// the lines are the guest's words, and errors reach terminals. It returns
// nil when there is nothing to show.
func ConsoleTail(path string, n int) []string {
	lines := tailLines(path, n)
	if len(lines) < n {
		lines = append(tailLines(path+".1", n-len(lines)), lines...)
	}
	for i, l := range lines {
		lines[i] = ClipLine(termsafe.Clean(strings.TrimRight(l, "\r"), false))
	}
	return lines
}

// ClipLine bounds a line of guest output quoted in an error or a log to
// MaxConsoleLine bytes.
func ClipLine(s string) string {
	if len(s) > MaxConsoleLine {
		return s[:MaxConsoleLine] + "..."
	}
	return s
}

// tailLines returns the last n lines of the file at path, read from its
// last consoleTailBytes.
func tailLines(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 || n <= 0 {
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
	return lines
}
