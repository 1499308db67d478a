#!/usr/bin/env bash
# Runs every fuzzer in the repository for a bounded time each (FUZZTIME,
# default 10s): the parsers of hostile input (DNS, ClientHello, policy,
# sync frames, git config, the held-path and link rules, checkpoint
# metadata, terminal text) are fuzzed on every CI run. A failure leaves its
# input under the package's testdata/fuzz, as go test does.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-10s}
n=0
while IFS= read -r line; do
	file=${line%%:*}
	name=$(sed -E 's/^.*func (Fuzz[A-Za-z0-9_]+)\(.*$/\1/' <<<"$line")
	pkg=./$(dirname "${file#./}")
	echo "== $pkg $name ($t)"
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "$t" "$pkg"
	n=$((n + 1))
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(' . | grep -v '/vendor/' | sort)
echo "fuzzed $n targets for $t each"
