package checkpoint

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Tracker tells which pages of a guest's RAM file may have changed since
// its last Reset.
type Tracker interface {
	// Dirty returns the pages that may differ from their content at the
	// last Reset; every page it cannot vouch for is in the set. It may be
	// called once per Reset.
	Dirty() (*Pages, error)
	// Reset starts a new window. changed tells that the file was modified
	// behind the tracker's back since the last Reset (then what Dirty
	// returned is not to be trusted).
	Reset() (changed bool, err error)
	Close() error
}

// ErrNoSoftDirty: the kernel does not track soft-dirty pages
// (CONFIG_MEM_SOFT_DIRTY unset), so every checkpoint copies all the RAM.
var ErrNoSoftDirty = errors.New("this kernel does not track soft-dirty pages (CONFIG_MEM_SOFT_DIRTY)")

// errNotArmed: Dirty without a Reset before it.
var errNotArmed = errors.New("dirty tracking was not started (no reset since the machine started or since the last look)")

// mapping is one line of /proc/PID/maps.
type mapping struct {
	start, end uint64 // virtual addresses
	off        uint64 // file offset of start
	major      uint32
	minor      uint32
	ino        uint64
	shared     bool
}

// maxMaps bounds what is read of /proc/PID/maps (QEMU has a few hundred
// mappings; this is thousands of times that).
const maxMaps = 16 << 20

// parseMaps parses /proc/PID/maps text. Lines it cannot parse are an
// error: the tracker then gives up rather than miss a mapping.
func parseMaps(b []byte) ([]mapping, error) {
	if len(b) > maxMaps {
		return nil, fmt.Errorf("maps: %d bytes is more than %d", len(b), maxMaps)
	}
	var out []mapping
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 5 {
			return nil, fmt.Errorf("maps: short line %q", line)
		}
		addr := strings.SplitN(f[0], "-", 2)
		dev := strings.SplitN(f[3], ":", 2)
		if len(addr) != 2 || len(dev) != 2 || len(f[1]) != 4 {
			return nil, fmt.Errorf("maps: bad line %q", line)
		}
		var m mapping
		var err error
		var e [6]error
		m.start, e[0] = strconv.ParseUint(addr[0], 16, 64)
		m.end, e[1] = strconv.ParseUint(addr[1], 16, 64)
		m.off, e[2] = strconv.ParseUint(f[2], 16, 64)
		maj, e3 := strconv.ParseUint(dev[0], 16, 32)
		min, e4 := strconv.ParseUint(dev[1], 16, 32)
		e[3], e[4] = e3, e4
		m.ino, e[5] = strconv.ParseUint(f[4], 10, 64)
		if err = errors.Join(e[:]...); err != nil || m.end < m.start {
			return nil, fmt.Errorf("maps: bad line %q", line)
		}
		m.major, m.minor = uint32(maj), uint32(min)
		m.shared = f[1][3] == 's'
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("maps: %w", err)
	}
	return out, nil
}

// Bits of a /proc/PID/pagemap entry (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent   = 1 << 63
	pmSwapped   = 1 << 62
	pmSoftDirty = 1 << 55
)
