#!/usr/bin/env bash
# Runs every Go native fuzz target (func FuzzXxx(*testing.F)) of the module
# for FUZZTIME each (default 20s: CI; longer by hand, e.g. FUZZTIME=30m),
# one at a time as go requires, and prints a table of the results. Exits
# non-zero when any target fails; its failing input is then in the
# package's testdata/fuzz/<FuzzName>/ (keep it there once fixed: it runs as
# a seed with every go test). FUZZ=<regexp> runs only the targets it
# matches.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${FUZZTIME:-20s}
FUZZ=${FUZZ:-.}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# Packages with a test file declaring a fuzz target; go test -list then
# names the targets as go sees them (the grep only saves compiling the
# test binary of every other package).
listing=$(go list -f '{{.ImportPath}} {{.Dir}} {{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' ./...)
mapfile -t pkgs < <(echo "$listing" |
	while read -r pkg dir files; do
		for f in $files; do
			if grep -q '^func Fuzz[A-Z0-9_][A-Za-z0-9_]*(f \*testing\.F)' "$dir/$f"; then
				echo "$pkg"
				break
			fi
		done
	done)

targets=()
for pkg in "${pkgs[@]}"; do
	names=$(go test -list '^Fuzz' "$pkg")
	for name in $names; do
		if [[ $name =~ ^Fuzz ]] && [[ $name =~ $FUZZ ]]; then
			targets+=("$name $pkg")
		fi
	done
done
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets found (FUZZ=$FUZZ)" >&2
	exit 1
fi
echo "fuzz: ${#targets[@]} targets, $FUZZTIME each"

results=()
failed=0
for t in "${targets[@]}"; do
	read -r name pkg <<<"$t"
	log="$logs/$name.log"
	start=$SECONDS
	echo "--- $name ($pkg)"
	if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -timeout 0 "$pkg" >"$log" 2>&1; then
		result=ok
	else
		result=FAIL
		failed=1
		tail -n 40 "$log"
	fi
	results+=("$(printf '%-24s %-60s %-6s %4ds' "$name" "$pkg" "$result" $((SECONDS - start)))")
done

echo
printf '%-24s %-60s %-6s %5s\n' TARGET PACKAGE RESULT TIME
printf '%s\n' "${results[@]}"
if [ "$failed" -ne 0 ]; then
	echo "fuzz: failures above; each failing input is under the package's testdata/fuzz/<target>/" >&2
fi
exit "$failed"
