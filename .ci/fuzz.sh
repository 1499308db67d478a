#!/usr/bin/env bash
# Runs every fuzzer in the repository for a bounded time each (FUZZTIME,
# default 10s): the parsers of hostile input (DNS, ClientHello, policy,
# sync frames, git config, the held-path and link rules, checkpoint
# metadata, terminal text, Debian's deb822 stanzas, dependency fields,
# version ordering and .deb archives) are fuzzed on every CI run. Fuzzers
# are found by grepping for "func Fuzz", so a new one needs no entry here.
# A failure leaves its
# input under the package's testdata/fuzz, as go test does.
#
# Go's fuzz coordinator up to 1.26 can report a bare "context deadline
# exceeded" when -fuzztime runs out while a worker is mid-input
# (golang/go#75804, fixed in 1.27). Such a run wrote no failing input, so
# it is run once more; a failure that wrote an input, or a second failure,
# fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-10s}
n=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# inputs lists the failing inputs go test has written for one target.
inputs() { find "$1/testdata/fuzz/$2" -type f 2>/dev/null | sort || true; }

fuzz() { # pkg name
	go test -run '^$' -fuzz "^$2\$" -fuzztime "$t" "$1" 2>&1 | tee "$out"
	return "${PIPESTATUS[0]}"
}

while IFS= read -r line; do
	file=${line%%:*}
	name=$(sed -E 's/^.*func (Fuzz[A-Za-z0-9_]+)\(.*$/\1/' <<<"$line")
	pkg=./$(dirname "${file#./}")
	echo "== $pkg $name ($t)"
	before=$(inputs "$pkg" "$name")
	if ! fuzz "$pkg" "$name"; then
		after=$(inputs "$pkg" "$name")
		if [[ "$before" == "$after" ]] && grep -q '^    context deadline exceeded$' "$out" &&
			! grep -q 'Failing input written' "$out"; then
			echo "== $name: Go's fuzz coordinator race (golang/go#75804), no input written; once more"
			fuzz "$pkg" "$name"
		else
			exit 1
		fi
	fi
	n=$((n + 1))
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(' . | grep -v '/vendor/' | sort)
echo "fuzzed $n targets for $t each"
