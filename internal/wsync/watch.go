package wsync

import (
	"context"
	"errors"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
)

// WatchHost reports changed paths under the host folder until ctx ends.
// Directories are watched as they appear; skip leaves trees unwatched.
// Events only say where to look: what changed is decided by comparing
// states, so a missed or duplicate event costs a rescan, never a wrong sync.
func WatchHost(ctx context.Context, r *Root, skip func(string) bool, fn func(paths []string, all bool)) error {
	w, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return err
	}
	defer w.Close()
	var addTree func(rel string)
	addTree = func(rel string) {
		dir := r.Dir()
		if rel != "." {
			dir = filepath.Join(dir, rel)
			// Only real directories: a link to elsewhere is never watched.
			if e, err := r.Stat(rel); err != nil || e == nil || e.Type != 'd' {
				return
			}
		}
		_ = w.Add(dir)
		names, err := r.List(rel)
		if err != nil {
			return
		}
		for _, n := range names {
			p := n
			if rel != "." {
				p = rel + "/" + n
			}
			if skip != nil && skip(p) {
				continue
			}
			if e, err := r.Stat(p); err == nil && e != nil && e.Type == 'd' {
				addTree(p)
			}
		}
	}
	addTree(".")
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			rel, err := filepath.Rel(r.Dir(), ev.Name)
			if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
				continue
			}
			rel = filepath.ToSlash(rel)
			if skip != nil && skip(rel) {
				continue
			}
			if ev.Has(fsnotify.Create) {
				addTree(rel)
			}
			fn([]string{rel}, false)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				fn(nil, true)
			}
		}
	}
}
