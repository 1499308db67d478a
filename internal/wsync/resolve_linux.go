package wsync

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// resolveFlags forbid symlinks anywhere and escaping the root.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

func checkResolver(root int) error {
	fd, err := unix.Openat2(root, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveFlags})
	if err != nil {
		return fmt.Errorf("openat2 is not available (Linux 5.6 or newer is needed for safe workspace sync): %w", err)
	}
	unix.Close(fd)
	return nil
}

func openBeneath(root int, rel string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: uint64(flags), Mode: uint64(mode), Resolve: resolveFlags})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

func keyOf(st *unix.Stat_t) cacheKey {
	return cacheKey{ino: st.Ino, dev: st.Dev, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// openRootDir opens the absolute folder dir following no link on its way
// (the folder was resolved to a path with none).
func openRootDir(dir string) (int, error) {
	for {
		fd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}
