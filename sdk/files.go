package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The file calls run small commands in the guest as the sandbox's user
// (coreutils and findutils are in every kosa8 image), so they obey the
// guest's own permissions and a file written in the workspace is the
// user's, as if the agent had written it.

// FileInfo describes an entry of a guest directory.
type FileInfo struct {
	Name    string      `json:"name"`
	Type    string      `json:"type"` // file, dir, link or other
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"` // permission bits
	ModTime time.Time   `json:"mtime"`
	Link    string      `json:"link,omitempty"` // a link's target
}

// guestPath keeps a relative path relative to the working directory and
// stops a path from being read as an option.
func guestPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("no path given")
	}
	if strings.ContainsRune(p, 0) {
		return "", errors.New("path contains NUL")
	}
	if !strings.HasPrefix(p, "/") {
		p = "./" + p
	}
	return p, nil
}

// fileCmd runs a file command and turns a failure into an error that
// quotes the guest's message.
func (s *Sandbox) fileCmd(ctx context.Context, what string, cmd Cmd, out *capBuffer) error {
	stderr := &capBuffer{max: 4 << 10, tail: true}
	cmd.Stdout, cmd.Stderr = out, stderr
	// Past its bound the output is of no use: the command is ended, not
	// read on for as long as the guest sends (a file it made endless).
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if out != nil {
		out.stop = cancel
	}
	res, err := s.Exec(cctx, cmd)
	if out != nil && out.over && ctx.Err() == nil {
		return fmt.Errorf("%s: larger than %d MiB: use Exec with a Stdout writer", what, out.max>>20)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(string(stderr.Bytes()))
		if msg == "" {
			msg = fmt.Sprintf("exit status %d", res.ExitCode)
		}
		return fmt.Errorf("%s: %s", what, msg)
	}
	if out != nil && out.over {
		return fmt.Errorf("%s: larger than %d MiB: use Exec with a Stdout writer", what, out.max>>20)
	}
	return nil
}

// ReadFile returns the content of a file in the guest (at most 64 MiB).
// A relative path is relative to the workspace folder.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	p, err := guestPath(path)
	if err != nil {
		return nil, err
	}
	out := &capBuffer{max: maxOutput}
	if err := s.fileCmd(ctx, "read "+path, Cmd{Args: []string{"cat", "--", p}}, out); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// WriteFile replaces (or creates) a file in the guest with data, with the
// permission bits perm (0 means 0644), making its parent directories as
// needed. The new content appears whole: it is written beside the file and
// renamed over it.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, perm fs.FileMode) error {
	p, err := guestPath(path)
	if err != nil {
		return err
	}
	const script = `set -e
dir=$(dirname -- "$1")
mkdir -p -- "$dir"
tmp=$(mktemp -- "$dir/.kosa8-write.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
chmod "$2" -- "$tmp"
mv -f -- "$tmp" "$1"
trap - EXIT`
	if perm.Perm() == 0 {
		perm = 0o644
	}
	mode := strconv.FormatUint(uint64(perm.Perm()), 8)
	return s.fileCmd(ctx, "write "+path, Cmd{Args: []string{"sh", "-c", script, "sh", p, mode}, Stdin: bytes.NewReader(data)}, nil)
}

// ListDir lists a directory of the guest, by name.
func (s *Sandbox) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	p, err := guestPath(path)
	if err != nil {
		return nil, err
	}
	// One entry is six NUL-terminated fields: names may hold any byte but NUL.
	out := &capBuffer{max: 16 << 20}
	cmd := Cmd{Args: []string{"sh", "-c", `cd -- "$1" && exec find . -mindepth 1 -maxdepth 1 -printf '%y\0%s\0%m\0%T@\0%f\0%l\0'`, "sh", p}}
	if err := s.fileCmd(ctx, "list "+path, cmd, out); err != nil {
		return nil, err
	}
	return parseList(out.Bytes())
}

// parseList reads find's -printf output of ListDir.
func parseList(b []byte) ([]FileInfo, error) {
	fields := bytes.Split(b, []byte{0})
	if len(fields) > 0 && len(fields[len(fields)-1]) == 0 {
		fields = fields[:len(fields)-1]
	}
	if len(fields)%6 != 0 {
		return nil, fmt.Errorf("list: malformed listing from the guest (%d fields)", len(fields))
	}
	out := make([]FileInfo, 0, len(fields)/6)
	for i := 0; i < len(fields); i += 6 {
		f := fields[i : i+6]
		fi := FileInfo{Name: string(f[4]), Link: string(f[5])}
		switch string(f[0]) {
		case "f":
			fi.Type = "file"
		case "d":
			fi.Type = "dir"
		case "l":
			fi.Type = "link"
		default:
			fi.Type = "other"
		}
		size, err1 := strconv.ParseInt(string(f[1]), 10, 64)
		mode, err2 := strconv.ParseUint(string(f[2]), 8, 32)
		secs, err3 := strconv.ParseFloat(string(f[3]), 64)
		if err := errors.Join(err1, err2, err3); err != nil || fi.Name == "" || strings.ContainsRune(fi.Name, '/') {
			return nil, fmt.Errorf("list: malformed entry %q from the guest", fi.Name)
		}
		fi.Size, fi.Mode = size, fs.FileMode(mode).Perm()
		fi.ModTime = time.Unix(0, int64(secs*1e9)).UTC()
		out = append(out, fi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
