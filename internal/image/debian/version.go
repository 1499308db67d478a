package debian

import "strings"

// CompareVersions implements dpkg's version ordering: -1 if a sorts before
// b, 0 if they are equal, 1 if after. It is defined for every pair of
// strings, valid versions or not, so that a hostile index cannot make the
// ordering inconsistent: an epoch that is not all digits counts as part of
// the upstream version, and epochs are compared as numbers of any length.
func CompareVersions(a, b string) int {
	ae, au, ar := splitVersion(a)
	be, bu, brv := splitVersion(b)
	if c := compareNumeric(ae, be); c != 0 {
		return c
	}
	if c := verrevcmp(au, bu); c != 0 {
		return sign(c)
	}
	return sign(verrevcmp(ar, brv))
}

func splitVersion(v string) (epoch, upstream, revision string) {
	if i := strings.IndexByte(v, ':'); i >= 0 && allDigits(v[:i]) {
		epoch, v = v[:i], v[i+1:]
	}
	if i := strings.LastIndexByte(v, '-'); i >= 0 {
		return epoch, v[:i], v[i+1:]
	}
	return epoch, v, ""
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// compareNumeric compares two decimal strings ("" is 0) without converting
// them, so no epoch overflows.
func compareNumeric(a, b string) int {
	a = strings.TrimLeft(a, "0")
	b = strings.TrimLeft(b, "0")
	if len(a) != len(b) {
		return sign(len(a) - len(b))
	}
	return strings.Compare(a, b)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isAlpha(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// order is dpkg's weight of a non-digit character: "~" before the end of
// the string, the end before letters, letters before everything else.
func order(c int) int {
	switch {
	case c < 0: // end of string
		return 0
	case isDigit(byte(c)):
		return 0
	case isAlpha(byte(c)):
		return c
	case c == '~':
		return -1
	default:
		return c + 256
	}
}

// verrevcmp is dpkg's comparison of an upstream version or a revision:
// alternating runs of non-digits (compared by order) and digits (compared
// as numbers).
func verrevcmp(a, b string) int {
	i, j := 0, 0
	at := func(s string, k int) int {
		if k < len(s) {
			return int(s[k])
		}
		return -1
	}
	digit := func(c int) bool { return c >= 0 && isDigit(byte(c)) }
	for i < len(a) || j < len(b) {
		firstDiff := 0
		for (i < len(a) && !isDigit(a[i])) || (j < len(b) && !isDigit(b[j])) {
			ac, bc := order(at(a, i)), order(at(b, j))
			if ac != bc {
				return ac - bc
			}
			i++
			j++
		}
		for i < len(a) && a[i] == '0' {
			i++
		}
		for j < len(b) && b[j] == '0' {
			j++
		}
		for digit(at(a, i)) && digit(at(b, j)) {
			if firstDiff == 0 {
				firstDiff = int(a[i]) - int(b[j])
			}
			i++
			j++
		}
		if digit(at(a, i)) {
			return 1
		}
		if digit(at(b, j)) {
			return -1
		}
		if firstDiff != 0 {
			return firstDiff
		}
	}
	return 0
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

// validVersion accepts what dpkg accepts in a version: an optional numeric
// epoch, an upstream part starting with a digit made of alphanumerics and
// ".+~-" (a hyphen only when there is a revision), and a revision of
// alphanumerics and ".+~". Anything else in a Packages file is refused
// before it can reach a path, a log line or a comparison.
func validVersion(v string) bool {
	if v == "" || len(v) > 256 {
		return false
	}
	epoch, up, rev := splitVersion(v)
	if strings.Contains(v, ":") && epoch == "" {
		return false
	}
	if len(epoch) > 9 || up == "" || !isDigit(up[0]) {
		return false
	}
	for i := 0; i < len(up); i++ {
		c := up[i]
		if !isDigit(c) && !isAlpha(c) && !strings.ContainsRune(".+~-", rune(c)) {
			return false
		}
	}
	if strings.Contains(v[len(epoch):], "-") && rev == "" {
		return false
	}
	for i := 0; i < len(rev); i++ {
		c := rev[i]
		if !isDigit(c) && !isAlpha(c) && !strings.ContainsRune(".+~", rune(c)) {
			return false
		}
	}
	return true
}

// validName follows Debian policy for package names: lowercase
// alphanumerics and "+-.", at least two characters, starting with an
// alphanumeric.
func validName(n string) bool {
	if len(n) < 2 || len(n) > 128 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		switch {
		case isDigit(c), 'a' <= c && c <= 'z':
		case i > 0 && (c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return true
}
