package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DevContainer is what kosa8 reads of a project's dev container
// definition (.devcontainer/devcontainer.json or .devcontainer.json):
// its image, or the Dockerfile that builds it, honoured when kosa8.toml
// names none.
type DevContainer struct {
	Path  string // the file it came from
	Image string
	// Dockerfile is build.dockerfile, relative to the file's folder.
	Dockerfile string
	// Context is build.context, relative to the file's folder ("" for
	// that folder).
	Context string
	// Args are build.args; Target is build.target.
	Args   map[string]string
	Target string
}

// maxDevContainer bounds the file read.
const maxDevContainer = 1 << 20

// LoadDevContainer reads dir's dev container definition, or returns nil
// when there is none. The file is the repository's (an agent may have
// written it): it is opened through dir's root (a link out of dir is
// refused), only as a regular file, and read up to maxDevContainer.
func LoadDevContainer(dir string) (*DevContainer, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	for _, rel := range []string{filepath.Join(".devcontainer", "devcontainer.json"), ".devcontainer.json"} {
		p := filepath.Join(dir, rel)
		fi, err := root.Stat(rel)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w (a dev container file must lie inside the project folder)", p, err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%s is not a regular file (%s)", p, fi.Mode().Type())
		}
		f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, err
		}
		b, err := readBounded(f, maxDevContainer)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		d, err := ParseDevContainer(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		d.Path = p
		return d, nil
	}
	return nil, nil
}

// readBounded reads f, a regular file of at most max bytes.
func readBounded(f *os.File, max int64) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("larger than %d KiB", max>>10)
	}
	return b, nil
}

// ParseDevContainer reads a devcontainer.json: JSON with comments and
// trailing commas (JSONC).
func ParseDevContainer(b []byte) (*DevContainer, error) {
	var raw struct {
		Image string `json:"image"`
		Build struct {
			Dockerfile string            `json:"dockerfile"`
			Context    string            `json:"context"`
			Args       map[string]string `json:"args"`
			Target     string            `json:"target"`
		} `json:"build"`
		DockerFile string `json:"dockerFile"` // the older spelling
	}
	if err := json.Unmarshal(stripJSONC(b), &raw); err != nil {
		return nil, err
	}
	d := &DevContainer{Image: strings.TrimSpace(raw.Image), Dockerfile: raw.Build.Dockerfile,
		Context: raw.Build.Context, Args: raw.Build.Args, Target: raw.Build.Target}
	if d.Dockerfile == "" {
		d.Dockerfile = raw.DockerFile
	}
	return d, nil
}

// stripJSONC removes // and /* */ comments (outside strings) and commas
// before a closing bracket, leaving JSON.
func stripJSONC(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '"':
			j := i + 1
			for j < len(b) && b[j] != '"' {
				if b[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(b) {
				j = len(b) - 1
			}
			out = append(out, b[i:j+1]...)
			i = j
		case c == '/' && i+1 < len(b) && b[i+1] == '/':
			for i < len(b) && b[i] != '\n' {
				i++
			}
			if i < len(b) {
				out = append(out, '\n')
			}
		case c == '/' && i+1 < len(b) && b[i+1] == '*':
			i += 2
			for i+1 < len(b) && !(b[i] == '*' && b[i+1] == '/') {
				i++
			}
			i++
		case c == ']' || c == '}':
			// A trailing comma: drop it (and the blanks after it).
			k := len(out) - 1
			for k >= 0 && (out[k] == ' ' || out[k] == '\t' || out[k] == '\n' || out[k] == '\r') {
				k--
			}
			if k >= 0 && out[k] == ',' {
				out = append(out[:k], out[k+1:]...)
			}
			out = append(out, c)
		default:
			out = append(out, c)
		}
	}
	return out
}
