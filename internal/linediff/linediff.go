// Package linediff counts the lines a change adds and removes, as a
// unified diff would show them, without making the diff: Myers' greedy
// algorithm finds the length D of the shortest edit script (insertions
// and deletions of lines) in O((N+M)·D) time and O(N+M) space, and from
// it and the two lengths follow both counts. Its input is a sandbox's
// file (the guest's to write): the work is bounded (MaxEdits), past which
// the counts are those of the lines the two sides do not share, a lower
// bound said as such.
package linediff

import (
	"bytes"
	"hash/maphash"
)

// MaxEdits bounds the edit script searched for: past it Count falls back
// to comparing the sides' lines as sets.
const MaxEdits = 4000

// Count returns the lines b adds to a and removes from it. exact is false
// when the change was too large to search (see MaxEdits): then the counts
// are those of lines each side has that the other lacks.
func Count(a, b []byte) (added, removed int, exact bool) {
	x, y := lines(a), lines(b)
	// Lines alike at both ends cost nothing to search.
	for len(x) > 0 && len(y) > 0 && x[0] == y[0] {
		x, y = x[1:], y[1:]
	}
	for len(x) > 0 && len(y) > 0 && x[len(x)-1] == y[len(y)-1] {
		x, y = x[:len(x)-1], y[:len(y)-1]
	}
	n, m := len(x), len(y)
	if n == 0 || m == 0 {
		return m, n, true
	}
	d, ok := editLength(x, y, MaxEdits)
	if !ok {
		add, rm := setDifference(x, y)
		return add, rm, false
	}
	// Every edit inserts a line of y or deletes one of x: d = add + rm and
	// add - rm = m - n.
	return (d + m - n) / 2, (d - m + n) / 2, true
}

var seed = maphash.MakeSeed()

// lines splits s into lines (a last one without a newline counts, as
// diff counts it) and names each by its hash.
func lines(s []byte) []uint64 {
	var out []uint64
	for len(s) > 0 {
		i := bytes.IndexByte(s, '\n')
		var l []byte
		if i < 0 {
			l, s = s, nil
			l = append(l[:len(l):len(l)], 0) // "no newline at end" differs from a line with one
		} else {
			l, s = s[:i+1], s[i+1:]
		}
		out = append(out, maphash.Bytes(seed, l))
	}
	return out
}

// editLength is the length of the shortest edit script turning x into y,
// if it is at most max.
func editLength(x, y []uint64, max int) (int, bool) {
	n, m := len(x), len(y)
	if limit := n + m; max > limit {
		max = limit
	}
	off := max + 1
	v := make([]int, 2*max+3)
	for d := 0; d <= max; d++ {
		for k := -d; k <= d; k += 2 {
			var i int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				i = v[off+k+1] // down: an insertion
			} else {
				i = v[off+k-1] + 1 // right: a deletion
			}
			j := i - k
			for i < n && j < m && x[i] == y[j] {
				i, j = i+1, j+1
			}
			v[off+k] = i
			if i >= n && j >= m {
				return d, true
			}
		}
	}
	return 0, false
}

// setDifference counts the lines of y without a like line in x (added)
// and those of x without one in y (removed), each line used once.
func setDifference(x, y []uint64) (added, removed int) {
	count := map[uint64]int{}
	for _, h := range x {
		count[h]++
	}
	for _, h := range y {
		if count[h] > 0 {
			count[h]--
		} else {
			added++
		}
	}
	for _, c := range count {
		removed += c
	}
	return added, removed
}
