// Package unpack applies an OCI image's layers, untrusted tar archives, to
// a root directory. It runs inside the converter VM (kosa8-agent unpack),
// never on the host: the host only decompresses the layers (checking each
// against its diff id) onto a raw disk the VM reads.
//
// Each layer is applied in order, as a container runtime does:
//   - a whiteout (.wh.NAME) removes NAME of the layers below; an opaque
//     marker (.wh..wh..opq) removes everything below in its directory that
//     this layer does not itself write;
//   - every path is resolved as if the root were /: a symlink in a layer,
//     absolute or relative, chained or not, resolves inside the root
//     (openat2 RESOLVE_IN_ROOT), and a name with a ".." component is
//     refused, so nothing is ever written outside the root;
//   - the final component is never followed: an existing entry is removed
//     (a directory with all it holds) and the new one made in its place;
//   - regular files, directories, symlinks and hard links (to a file
//     already in the root) are made with the member's uid, gid, mode
//     (set-id and sticky bits included, after the chown that clears them),
//     extended attributes (security.capability, user.*, trusted.* and the
//     POSIX ACLs) and modification time; device nodes and FIFOs are
//     skipped and counted;
//   - bounds: at most MaxFiles members in all layers, files adding up to at
//     most MaxBytes (a sparse member claims its full size: 10 GiB of holes
//     in a layer of kilobytes is refused), names of at most 4096 bytes.
//
// Errors name the layer and the member.
package unpack

// Layer is one uncompressed layer at an offset of the source.
type Layer struct {
	Off  int64 `json:"off"`
	Size int64 `json:"size"`
}

// Options bound an unpack.
type Options struct {
	// MaxFiles bounds the members of all layers together.
	MaxFiles int
	// MaxBytes bounds the sizes of all regular files together (0: the
	// layers' own sizes).
	MaxBytes int64
}

// Stats count what Apply did.
type Stats struct {
	Members   int   `json:"members"`
	Files     int   `json:"files"`
	Dirs      int   `json:"dirs"`
	Symlinks  int   `json:"symlinks"`
	HardLinks int   `json:"hard_links"`
	Whiteouts int   `json:"whiteouts"`
	Opaque    int   `json:"opaque"`
	Devices   int   `json:"devices_skipped"`
	Xattrs    int   `json:"xattrs"`
	Skipped   int   `json:"xattrs_skipped"`
	Bytes     int64 `json:"bytes"`
}

// Report says what an unpacked image holds of what kosa8 needs inside,
// and what Fixup added.
type Report struct {
	// Shell is /bin/bash, else /bin/sh, else "" (the image has none).
	Shell string `json:"shell"`
	Sudo  bool   `json:"sudo"`
	// Added lists what kosa8 added: "/etc/passwd", "/etc/group", the CA
	// bundle, directories.
	Added []string `json:"added,omitempty"`
	// User is the image's User resolved in its /etc/passwd (empty or
	// root: none).
	User *User `json:"user,omitempty"`
	// OS is /etc/os-release's ID (debian, ubuntu, alpine...), and
	// Packages the package manager found: apt, apk or "".
	OS       string `json:"os,omitempty"`
	Packages string `json:"packages,omitempty"`
}

// User is an account of the image.
type User struct {
	Name string `json:"name"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
}
