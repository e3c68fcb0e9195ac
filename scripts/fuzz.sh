#!/usr/bin/env bash
# Runs every Fuzz* target for FUZZTIME (default 10s) each.
#
# Go's fuzz coordinator can fail a duration-bounded run at the very end
# with a bare "context deadline exceeded" and no failing input
# (go.dev/issue/75804, fixed in Go 1.27; we build with 1.26). A real
# failure always writes its input to testdata/fuzz/<target>/, so a run that
# failed with that message and wrote nothing is run once more; a second
# failure fails the suite like any other.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-10s}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

fuzz_once() { # pkg target
	go test -run '^$' -fuzz "^${2}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 2s "$1" 2>&1 | tee "$log"
	return "${PIPESTATUS[0]}"
}

for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "fuzz: $pkg $target ($FUZZTIME)"
		corpus="$dir/testdata/fuzz/$target"
		before=$(ls "$corpus" 2>/dev/null | sort || true)
		if fuzz_once "$pkg" "$target"; then
			continue
		fi
		after=$(ls "$corpus" 2>/dev/null | sort || true)
		if [ "$before" = "$after" ] && grep -q '^    context deadline exceeded$' "$log"; then
			echo "fuzz: $target stopped with Go's coordinator race (go.dev/issue/75804) and wrote no input; running it once more"
			fuzz_once "$pkg" "$target" || exit 1
			continue
		fi
		exit 1
	done
done
