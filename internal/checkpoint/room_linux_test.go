package checkpoint

import "testing"

func TestRoomFor(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		need, total, avail int64
		ok                 bool
	}{
		{1 * gib, 24 * gib, 20 * gib, true},
		{1 * gib, 24 * gib, 4 * gib, true},
		{1 * gib, 24 * gib, 3*gib + gib/2, false}, // 3 GiB must stay free
		{1 * gib, 4 * gib, 2 * gib, true},         // at least 1 GiB kept
		{1 * gib, 4 * gib, gib + gib/2, false},
	} {
		if err := roomFor(c.need, c.total, c.avail); (err == nil) != c.ok {
			t.Errorf("roomFor(%d, %d, %d) = %v, want ok %v", c.need>>20, c.total>>20, c.avail>>20, err, c.ok)
		}
	}
}
