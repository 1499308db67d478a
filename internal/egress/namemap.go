package egress

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/kosa8/kosa8/internal/netpolicy"
)

// SyntheticNet is where DNS answers point: 198.18.0.0/15, reserved for
// benchmarking (RFC 2544), so it never collides with a real destination.
var SyntheticNet = netip.MustParsePrefix("198.18.0.0/15")

// DefaultMaxNames caps the names one sandbox may have bound.
const DefaultMaxNames = 65536

// ErrMapFull: the sandbox has bound as many names as it may.
var ErrMapFull = errors.New("name map full")

// NameMap binds host names to synthetic addresses for one sandbox. An
// address is never reused for another name in the sandbox's life, and the
// map persists (one "ADDR NAME" line per binding, appended) so that a
// resumed or rewound guest, whose resolver caches old answers, still
// reaches the same names.
type NameMap struct {
	mu     sync.Mutex
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
	next   netip.Addr
	max    int
	file   *os.File // nil: in memory only
}

// OpenNameMap loads (or creates) the map persisted at path; "" keeps it in
// memory.
func OpenNameMap(path string, max int) (*NameMap, error) {
	if max <= 0 {
		max = DefaultMaxNames
	}
	m := &NameMap{byName: map[string]netip.Addr{}, byAddr: map[netip.Addr]string{}, next: SyntheticNet.Addr().Next(), max: max}
	if path == "" {
		return m, nil
	}
	if f, err := os.Open(path); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			addrText, name, ok := strings.Cut(sc.Text(), " ")
			addr, err := netip.ParseAddr(addrText)
			if !ok || err != nil || !SyntheticNet.Contains(addr) || addr == RefusedAddr {
				continue // a torn last line after a crash
			}
			if n, err := netpolicy.NormalizeHost(name); err != nil || n != name {
				continue
			}
			m.bind(name, addr)
		}
		f.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	m.file = f
	return m, nil
}

func (m *NameMap) bind(name string, addr netip.Addr) {
	m.byName[name] = addr
	m.byAddr[addr] = name
	if !addr.Less(m.next) {
		m.next = addr.Next()
	}
}

// Assign returns the address bound to name (normalised), binding a new one
// if needed.
func (m *NameMap) Assign(name string) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a, ok := m.byName[name]; ok {
		return a, nil
	}
	if len(m.byName) >= m.max || !SyntheticNet.Contains(m.next) || m.next == RefusedAddr {
		return netip.Addr{}, fmt.Errorf("%w (%d names)", ErrMapFull, len(m.byName))
	}
	a := m.next
	if m.file != nil {
		if _, err := fmt.Fprintf(m.file, "%s %s\n", a, name); err != nil {
			return netip.Addr{}, fmt.Errorf("persist name map: %w", err)
		}
	}
	m.bind(name, a)
	return a, nil
}

// Lookup returns the name bound to addr.
func (m *NameMap) Lookup(addr netip.Addr) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.byAddr[addr.Unmap()]
	return n, ok
}

// Len is the number of names bound.
func (m *NameMap) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.byName)
}

// Close closes the file.
func (m *NameMap) Close() error {
	if m.file == nil {
		return nil
	}
	return m.file.Close()
}
