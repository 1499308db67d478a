package wsync

import (
	"strings"

	"golang.org/x/sys/unix"
)

func checkResolver(int) error { return nil }

// openBeneath walks rel one component at a time, each opened relative to
// the last with O_NOFOLLOW, so no symlink is ever followed. ".." cannot
// occur: paths are checked by CleanRel first.
func openBeneath(root int, rel string, flags int, mode uint32) (int, error) {
	if rel == "." {
		return unix.Openat(root, ".", flags, mode)
	}
	parts := strings.Split(rel, "/")
	dir, err := unix.Dup(root)
	if err != nil {
		return -1, err
	}
	for i, p := range parts {
		last := i == len(parts)-1
		f := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if last {
			f = flags | unix.O_NOFOLLOW
		}
		next, err := unix.Openat(dir, p, f, mode)
		unix.Close(dir)
		if err != nil {
			return -1, err
		}
		dir = next
	}
	return dir, nil
}

func keyOf(st *unix.Stat_t) cacheKey {
	return cacheKey{ino: st.Ino, dev: uint64(st.Dev), size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// openRootDir opens the absolute folder dir following no link on its way
// (the folder was resolved to a path with none).
func openRootDir(dir string) (int, error) {
	return unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW_ANY, 0)
}
