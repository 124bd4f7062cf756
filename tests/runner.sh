#!/bin/sh
# The runner counts every PASS, FAIL and SKIP line exactly, and shows a program's skipped cases
# one line per reason with their count. Usage: runner.sh [build/tests/runner]
runner=${1:-build/tests/runner}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/cases.sh" <<'CASES'
echo "PASS a"
echo "SKIP b 1: no GPU"
echo "PASS c"
echo "SKIP b 2: no GPU"
echo "SKIP d: a shape for the GPU"
echo "SKIP b 3: no GPU"
CASES
printf 'echo "SKIP e: only one"\necho "FAIL f: broken"\nexit 1\n' > "$dir/failing.sh"
"$runner" "sh $dir/cases.sh" "sh $dir/failing.sh" "sh $dir/cases.sh" > "$dir/out"
rc=$?
expected="PASS a
PASS c
SKIP 3 cases of sh $dir/cases.sh (b 1, ...): no GPU
SKIP d: a shape for the GPU
FAIL f: broken
SKIP e: only one
PASS a
PASS c
SKIP 3 cases of sh $dir/cases.sh (b 1, ...): no GPU
SKIP d: a shape for the GPU
4 passed, 1 failed, 9 skipped"
if [ $rc -eq 1 ] && [ "$(cat "$dir/out")" = "$expected" ]; then
    echo "PASS runner_groups_skips_and_counts_every_case"
else
    echo "FAIL runner_groups_skips_and_counts_every_case: exit $rc, output:"
    sed 's/^/  /' "$dir/out"
    exit 1
fi
