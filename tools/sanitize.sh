#!/bin/sh
# compute-sanitizer over the kernel tests, on a GPU machine:
#
#   sh tools/sanitize.sh [TEST...]      default: every test program that launches kernels
#
# Builds the tests (ninja), then runs each test program under each of compute-sanitizer's tools
# (memcheck with leak checking, racecheck, initcheck, synccheck; TOOLS overrides the list) and
# prints a summary: per test and tool the sanitizer's error count and the test's own result
# (its PASS/FAIL/SKIP lines), then one CLEAN or DIRTY line. A tool's run is DIRTY when the
# sanitizer reports an error or the run does not finish (TIMEOUT seconds, default 3600, per
# run); a test that fails only under the sanitizer (a timing budget) is reported, not counted
# as dirty. The logs go to $OUT (default: a new temporary folder).
#
# Environment: CUDA_HOME (default /usr/local/cuda), TOOLS, TIMEOUT, OUT.
# Exit status: 0 when every run is clean, 1 when one is not, 2 when the build fails, there is no
# compute-sanitizer or no GPU.
set -u

cuda=${CUDA_HOME:-/usr/local/cuda}
sanitizer=$cuda/bin/compute-sanitizer
tools=${TOOLS:-memcheck racecheck initcheck synccheck}
limit=${TIMEOUT:-3600}
tests=${*:-test_core test_act test_optim test_quant_fp8 test_quant_mxfp8 test_quant_block \
test_quant_nvfp4 test_gemm test_train test_faults test_infer test_checkpoint test_replay}
if [ -n "${OUT:-}" ]; then
    out=$OUT
    mkdir -p "$out" || exit 2
else
    out=$(mktemp -d) || exit 2
fi

[ -x "$sanitizer" ] || { echo "sanitize: no $sanitizer" >&2; exit 2; }
ninja all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 2; }
if ! build/qtrain info 2>&1 | grep -q '^device'; then
    echo "sanitize: no GPU; the kernel tests' GPU cases would all be skipped" >&2
    exit 2
fi

# The options of each tool: every error reported (print-limit 0 prints them all), the child
# processes some tests start (build/qtrain) checked too.
tool_options() {
    case $1 in
    memcheck) echo "--tool memcheck --leak-check full" ;;
    racecheck) echo "--tool racecheck --racecheck-report all" ;;
    initcheck) echo "--tool initcheck" ;;
    synccheck) echo "--tool synccheck" ;;
    *) echo "--tool $1" ;;
    esac
}

dirty=0
printf '%-18s %-10s %10s %8s %s\n' test tool errors seconds "test result"
for t in $tests; do
    for tool in $tools; do
        log=$out/$t.$tool.log
        start=$(date +%s)
        # shellcheck disable=SC2046
        timeout "$limit" "$sanitizer" $(tool_options "$tool") --target-processes all \
            --print-limit 0 --error-exitcode 99 "build/tests/$t" > "$log" 2>&1
        rc=$?
        seconds=$(( $(date +%s) - start ))
        errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p' "$log" |
                 awk '{ s += $1 } END { print s + 0 }')
        passed=$(grep -c '^PASS ' "$log")
        failed=$(grep -c '^FAIL ' "$log")
        skipped=$(grep -c '^SKIP ' "$log")
        result="$passed passed, $failed failed, $skipped skipped"
        if [ "$rc" = 124 ]; then
            errors="timeout"
            dirty=1
        elif [ "$errors" != 0 ] || [ "$rc" = 99 ]; then
            dirty=1
        fi
        printf '%-18s %-10s %10s %8s %s\n' "$t" "$tool" "$errors" "$seconds" "$result"
    done
done
if [ "$dirty" = 0 ]; then
    echo "CLEAN: no sanitizer errors (logs: $out)"
else
    echo "DIRTY: see the runs above (logs: $out)"
fi
exit $dirty
