package qemu

import "sync"

// twins picks the uid of each QEMU a driver starts under root: the pid's
// (slot 0) or its twin's (slot 1, see confine_linux.go). A QEMU that may
// still run keeps its slot until it has exited, and a start never gets a
// slot one holds: the QEMU a rewind starts while the old one runs must be
// out of the old one's reach, also after starts that failed or were
// discarded in between (a rewind whose save failed kills the QEMU it
// started ahead, and the old one runs on), which a mere alternation of
// starts lost track of.
type twins struct {
	mu   sync.Mutex
	live [2]int
	last int // the slot handed out last
}

// take returns a slot no QEMU that may still run holds (the one not
// handed out last where both are free) and its release, to call once that
// QEMU has exited or never started; ok false: both are held.
func (t *twins) take() (slot int, release func(), ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	slot = 1 - t.last
	if t.live[slot] > 0 {
		slot = t.last
	}
	if t.live[slot] > 0 {
		return 0, func() {}, false
	}
	t.live[slot]++
	t.last = slot
	var once sync.Once
	return slot, func() {
		once.Do(func() {
			t.mu.Lock()
			t.live[slot]--
			t.mu.Unlock()
		})
	}, true
}
