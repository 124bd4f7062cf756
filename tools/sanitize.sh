#!/bin/sh
# compute-sanitizer over the kernel tests, on a GPU machine:
#
#   sh tools/sanitize.sh [TEST...]      default: every test program that launches kernels
#
# Builds the tests (ninja), then runs each test program under each of compute-sanitizer's tools
# (memcheck with leak checking, racecheck, initcheck, synccheck; TOOLS overrides the list) and
# prints a summary: per test and tool the sanitizer's error count, the longest run's seconds and
# the test's own result (its PASS/FAIL/SKIP lines), the slowest cases, then one CLEAN or DIRTY
# line. A tool's run is DIRTY when the sanitizer reports an error or the run does not finish
# (TIMEOUT seconds, default 3600, per run; none runs past DEADLINE, seconds since the epoch, when
# given); a test that fails only under the sanitizer (a timing budget) is reported, not counted
# as dirty. The logs go to $OUT (default: a new temporary folder).
#
# The runs are independent processes, and the sanitizers' cost is mostly on the host, so JOBS of
# them run at once (default: half the cores). On a machine of several GPUs they are spread over
# the GPUs of GPUS (CUDA device ordinals in PCI bus order, default every GPU nvidia-smi lists):
# the run in xargs' process slot s gets the (s mod n)-th of the n, as its only visible device, so
# the GPUs share the load evenly. The longest programs (SHARDED, default test_gemm test_moe
# test_train test_checkpoint test_act test_optim) run as SHARDS processes each (default: JOBS),
# each process an interleaved share of the program's units (QT_TEST_SHARD, tests/test.h); their
# row sums the shares' counts.
#
# Environment: CUDA_HOME (default /usr/local/cuda), TOOLS, TIMEOUT, DEADLINE, OUT, JOBS, SHARDS,
# SHARDED, GPUS.
# Exit status: 0 when every run is clean, 1 when one is not, 2 when the build fails, there is no
# compute-sanitizer or no GPU.
set -u

cuda=${CUDA_HOME:-/usr/local/cuda}
sanitizer=$cuda/bin/compute-sanitizer

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

# One run (called back through xargs): TEST TOOL SHARD (SHARD "-" for an unsharded test), the
# GPU list in QT_SANITIZE_GPUS. Writes the log, and a line "rc seconds" beside it.
if [ "${1:-}" = "--run" ]; then
    t=$2 tool=$3 shard=$4 out=$5 limit=$6
    if [ "$shard" = "-" ]; then
        base=$out/$t.$tool
        shard_env=""
    else
        base=$out/$t.$tool.shard$(echo "$shard" | sed "s,/,of,")
        shard_env="QT_TEST_SHARD=$shard"
    fi
    # This run's GPU: its process slot's share of GPUS (the slot is 0 when xargs has no slots).
    gpu=$(echo "$QT_SANITIZE_GPUS" | awk -v s="${QT_SANITIZE_SLOT:-0}" '{ print $(s % NF + 1) }')
    start=$(date +%s)
    # A run that DEADLINE leaves no time for is not started: it counts as timed out.
    if [ -n "${DEADLINE:-}" ] && [ $((DEADLINE - start)) -lt "$limit" ]; then
        limit=$((DEADLINE - start))
    fi
    if [ "$limit" -le 0 ]; then
        echo "not started: DEADLINE passed" > "$base.log"
        echo "124 0" > "$base.rc"
        exit 0
    fi
    # The log as the program wrote it; beside it (.times) each case line with the seconds since
    # the one before (or the start), for the summary's slowest cases. A shell loop reads the
    # lines as they come (awk may read its input in blocks).
    # shellcheck disable=SC2046,SC2086
    {
        env $shard_env QT_TEST_SANITIZER="$tool" CUDA_DEVICE_ORDER=PCI_BUS_ID \
            CUDA_VISIBLE_DEVICES="$gpu" \
            timeout "$limit" "$sanitizer" $(tool_options "$tool") --target-processes all \
            --print-limit 0 --error-exitcode 99 "build/tests/$t" 2>&1
        echo $? > "$base.status"
    } | {
        last=$start
        while IFS= read -r line; do
            printf '%s\n' "$line"
            case $line in
            "PASS "* | "FAIL "* | "SKIP "*)
                now=$(date +%s)
                printf '%s %s\n' $((now - last)) "$line" >> "$base.times"
                last=$now
                ;;
            esac
        done
    } > "$base.log"
    rc=$(cat "$base.status")
    rm -f "$base.status"
    echo "$rc $(( $(date +%s) - start ))" > "$base.rc"
    exit 0
fi

tools=${TOOLS:-memcheck racecheck initcheck synccheck}
limit=${TIMEOUT:-3600}
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
jobs=${JOBS:-$(( cores / 2 > 0 ? cores / 2 : 1 ))}
shards=${SHARDS:-$jobs}
sharded=${SHARDED:-test_gemm test_moe test_train test_checkpoint test_act test_optim}
tests=${*:-test_core test_act test_optim test_quant_fp8 test_quant_mxfp8 test_quant_block \
test_quant_nvfp4 test_gemm test_moe test_train test_faults test_infer test_checkpoint test_replay \
test_api test_parallel}
if [ -n "${OUT:-}" ]; then
    out=$OUT
    mkdir -p "$out" || exit 2
else
    out=$(mktemp -d) || exit 2
fi

[ -x "$sanitizer" ] || { echo "sanitize: no $sanitizer" >&2; exit 2; }
gpus=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2> /dev/null | tr '\n' ' ')}
[ -n "$(echo "$gpus" | tr -d ' ')" ] || gpus=0
# GNU xargs numbers its process slots (--process-slot-var), which spreads the runs over the GPUs;
# without it every run takes the first GPU of the list.
slot_option=""
if xargs --process-slot-var=QT_SANITIZE_SLOT true < /dev/null > /dev/null 2>&1; then
    slot_option="--process-slot-var=QT_SANITIZE_SLOT"
fi
ninja all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 2; }
if ! build/qtrain info 2>&1 | grep -q '^device'; then
    echo "sanitize: no GPU; the kernel tests' GPU cases would all be skipped" >&2
    exit 2
fi

is_sharded() {
    for s in $sharded; do [ "$s" = "$1" ] && return 0; done
    return 1
}

# The list of runs, the shards first: they are the longest, and starting them first keeps the
# pool's tail short. The tools alternate within each program and share, so that a pass cut short
# by DEADLINE has checked what it reached with every tool, not with the first tools alone.
list=$out/runs.txt
: > "$list"
for t in $tests; do
    is_sharded "$t" || continue
    i=0
    while [ "$i" -lt "$shards" ]; do
        for tool in $tools; do echo "$t $tool $i/$shards" >> "$list"; done
        i=$((i + 1))
    done
done
for t in $tests; do
    is_sharded "$t" && continue
    for tool in $tools; do echo "$t $tool -" >> "$list"; done
done
# shellcheck disable=SC2016,SC2086
sed "s|\$| $out $limit|" "$list" |
    QT_SANITIZE_GPUS=$gpus xargs $slot_option -P "$jobs" -L 1 \
        sh -c 'sh "$0" --run "$1" "$2" "$3" "$4" "$5"' "$0"

dirty=0
printf '%-18s %-10s %10s %8s %s\n' test tool errors seconds "test result"
for t in $tests; do
    for tool in $tools; do
        errors=0 seconds=0 passed=0 failed=0 skipped=0 timed_out=0 missing=0 crashed=''
        for rcfile in "$out/$t.$tool.rc" "$out/$t.$tool".shard*.rc; do
            [ -e "$rcfile" ] || continue
            log=${rcfile%.rc}.log
            read -r rc secs < "$rcfile"
            # 0: passed; 1: a case failed (reported); 99: the sanitizer found errors; 124: the
            # time limit; 255 with the sanitizer's "terminated before first instrumented API
            # call": a share that ran no GPU work (the reference backend's cases); anything
            # else (a signal, a sanitizer failure) is a crash.
            case $rc in
            0 | 1 | 99) ;;
            124) timed_out=1 ;;
            255) grep -q 'terminated before first instrumented API call' "$log" ||
                     crashed="$crashed $rc" ;;
            *) crashed="$crashed $rc" ;;
            esac
            [ "$rc" = 99 ] && dirty=1
            e=$(sed -n 's/.*ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p' "$log" |
                awk '{ s += $1 } END { print s + 0 }')
            errors=$((errors + e))
            [ "$secs" -gt "$seconds" ] && seconds=$secs
            passed=$((passed + $(grep -c '^PASS ' "$log")))
            failed=$((failed + $(grep -c '^FAIL ' "$log")))
            skipped=$((skipped + $(grep -c '^SKIP ' "$log")))
        done
        [ "$seconds" = 0 ] && [ "$passed" = 0 ] && [ "$failed" = 0 ] && missing=1
        result="$passed passed, $failed failed, $skipped skipped"
        if [ "$timed_out" = 1 ]; then
            errors="timeout"
            dirty=1
        elif [ -n "$crashed" ]; then
            errors="crash:$(echo "$crashed" | sed 's/^ *//; s/ /,/g')"
            dirty=1
        elif [ "$missing" = 1 ]; then
            errors="no run"
            dirty=1
        elif [ "$errors" != 0 ]; then
            dirty=1
        fi
        printf '%-18s %-10s %10s %8s %s\n' "$t" "$tool" "$errors" "$seconds" "$result"
    done
done
# Where the time went: the slowest cases of every run (seconds, program.tool[.share], case).
echo "slowest cases:"
for f in "$out"/*.times; do
    [ -e "$f" ] || continue
    run_name=$(basename "$f" .times)
    awk -v r="$run_name" '{ print $1, r, $3 }' "$f"
done | sort -rn | head -12 | awk '{ printf "  %6d s  %-34s %s\n", $1, $2, $3 }'
if [ "$dirty" = 0 ]; then
    echo "CLEAN: no sanitizer errors (logs: $out)"
else
    echo "DIRTY: see the runs above (logs: $out)"
fi
exit $dirty
