#!/bin/sh
# The soak, on a GPU machine: recipes/soak.recipe (100000 steps: five training steps, two eval
# steps and one infer step, 12500 times) with each built-in recipe, twice:
#
#   sh tools/soak.sh [BUILTIN...]       default: bf16 delayed current mxfp8 block nvfp4
#
# Builds build/qtrain, then for each built-in recipe (`recipe = BUILTIN` in the recipe's [quant])
# runs the recipe twice with a trace (a checksum of the persistent state every 1000 training
# steps) while sampling the driver's free device memory (nvidia-smi, every half second) and the
# process's own device memory. A built-in recipe passes when both runs end well, each trace holds
# all 100000 records and no skipped step, the two traces are identical (qtrain diff), and the free
# memory of the steady state (the samples after the first fifth of the run) does not move. One
# line per built-in recipe, then PASS or FAIL; logs, memory samples and the recipes go to $OUT
# (default: a new temporary folder), the traces too with KEEP=1.
#
# Environment: GPU (default 0) is the device nvidia-smi samples (the one CUDA_VISIBLE_DEVICES
# gives qtrain); RECIPE (default recipes/soak.recipe) and STEPS_CHECK (default 100000, the
# records a trace must hold) soak another recipe; SOAK_REF=1 runs it on the reference backend
# without sampling memory (a check of the script itself on a machine without a GPU, with a
# small RECIPE).
# Exit status: 0 when every built-in recipe passed, 1 when one failed, 2 when the build fails or
# there is no GPU.
set -u

builtins=${*:-bf16 delayed current mxfp8 block nvfp4}
gpu=${GPU:-0}
source_recipe=${RECIPE:-recipes/soak.recipe}
records=${STEPS_CHECK:-100000}
ref=${SOAK_REF:-}
if [ -n "${OUT:-}" ]; then
    out=$OUT
    mkdir -p "$out" || exit 2
else
    out=$(mktemp -d) || exit 2
fi

ninja build/qtrain > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 2; }
if [ -z "$ref" ]; then
    if ! build/qtrain info > "$out/info.log" 2>&1 || ! grep -q '^device' "$out/info.log"; then
        cat "$out/info.log"
        echo "soak: no GPU; the soak runs on the GPU (SOAK_REF=1 checks the script)" >&2
        exit 2
    fi
    if ! command -v nvidia-smi > /dev/null; then
        echo "soak: nvidia-smi is needed to sample the device memory" >&2
        exit 2
    fi
fi

# Samples the GPU's free memory and the process's own (MiB) every half second while pid lives.
sample_memory() {
    pid=$1
    file=$2
    : > "$file"
    [ -z "$ref" ] || return 0
    while kill -0 "$pid" 2> /dev/null; do
        free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i "$gpu")
        own=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
              awk -F', *' -v p="$pid" '$1 == p { print $2 }')
        echo "$free ${own:--}" >> "$file"
        sleep 0.5
    done
}

# "first last steady_min steady_max own_min own_max" of a samples file (the steady state: the
# samples after the first fifth). Where nvidia-smi reports the process's own memory, the steady
# state counts only the samples that show it: the last sample can fall while the exiting process
# has already given its memory back but not yet ended, and its free memory is then higher.
memory_summary() {
    # n starts as the number 0: an unset awk variable used as an index is the string "", so the
    # first sample would land under free[""] instead of free[0].
    awk 'BEGIN { n = 0; owned = 0 }
         NF { free[n] = $1; own[n] = $2; if ($2 != "-") owned = 1; n++ }
         END {
             if (n == 0) { print "- - - - - -"; exit }
             start = int(n / 5); lo = hi = olo = ohi = "-"
             for (i = start; i < n; i++) {
                 if (owned && own[i] == "-") continue
                 if (lo == "-" || free[i] < lo) lo = free[i]
                 if (hi == "-" || free[i] > hi) hi = free[i]
                 if (own[i] != "-") {
                     if (olo == "-" || own[i] < olo) olo = own[i]
                     if (ohi == "-" || own[i] > ohi) ohi = own[i]
                 }
             }
             print free[0], free[n - 1], lo, hi, olo, ohi
         }' "$1"
}

failed=0
printf '%-8s %8s %9s %9s %10s %10s %12s %10s %8s %s\n' recipe records wall_s steps/s \
    free_first free_last free_steady own_MiB skipped traces
for f in $builtins; do
    recipe=$out/soak_$f.recipe
    sed "s/^recipe = .*/recipe = $f/" "$source_recipe" > "$recipe"
    verdict=PASS
    for n in 1 2; do
        trace=$out/$f.$n.trace
        rm -f "$trace"
        build/qtrain run "$recipe" --trace "$trace" --checksum-every 1000 ${ref:+--ref} \
            > "$out/$f.$n.log" 2>&1 &
        pid=$!
        sample_memory "$pid" "$out/$f.$n.memory"
        wait "$pid"
        rc=$?
        [ "$rc" = 0 ] || verdict="FAIL (run $n exited $rc: $out/$f.$n.log)"
    done
    got=$(grep -c '^step=' "$out/$f.1.trace" 2> /dev/null || echo 0)
    skipped=$(grep -c '^step=.* flags=0x[0-9a-f]*:[a-z,]*skipped' "$out/$f.1.trace" 2> /dev/null)
    if build/qtrain diff "$out/$f.1.trace" "$out/$f.2.trace" > "$out/$f.diff" 2>&1; then
        same=identical
    else
        same="differ ($out/$f.diff)"
    fi
    set -- $(memory_summary "$out/$f.1.memory")
    first=$1 last=$2 lo=$3 hi=$4 own_lo=$5 own_hi=$6
    wall=$(sed -n 's/^wall time *\([0-9.]*\) s.*/\1/p' "$out/$f.1.log")
    rate=$(sed -n 's/^train rate *\([0-9.]*\) steps.*/\1/p' "$out/$f.1.log")
    [ "$got" = "$records" ] || verdict="FAIL ($got records, expected $records)"
    [ "${skipped:-0}" = 0 ] || verdict="FAIL ($skipped skipped steps)"
    [ "$same" = identical ] || verdict="FAIL (traces $same)"
    [ "$lo" = "$hi" ] || verdict="FAIL (free memory moved: $lo to $hi MiB)"
    [ "$verdict" = PASS ] || failed=1
    printf '%-8s %8s %9s %9s %10s %10s %12s %10s %8s %s\n' "$f" "$got" "${wall:--}" \
        "${rate:--}" "$first" "$last" "$lo..$hi" "$own_lo..$own_hi" "${skipped:-0}" "$same"
    echo "$verdict $f"
    [ -n "${KEEP:-}" ] || rm -f "$out/$f.1.trace" "$out/$f.2.trace"
done
echo "logs and samples: $out"
exit $failed
