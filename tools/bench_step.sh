#!/bin/sh
# Whole training steps, qtrain next to its PyTorch peer, in one call on a GPU machine:
#
#   sh tools/bench_step.sh [RECIPE...]          default: every recipes/bench/*.recipe
#
# Builds (ninja), runs `build/qtrain run` on each bench recipe (its summary's median step time,
# training rate and arena bytes), runs tools/peer_torch.py once per model shape (the shape's
# `current` recipe, whose BF16 head rule the peer's FP8 mode follows), and prints one markdown
# table (BENCHMARKS.md, "Training steps", explains its columns). With Fashion-MNIST unpacked
# under .data/ it also trains every recipes/fashion_mnist_*.recipe and the peer's whole-step
# CUDA graph of the same model (steps/s, accuracy). Logs (every run's output, the peer's JSON
# lines) and the table (bench_step.md) go to $OUT when it is set, else to a new temporary folder.
#
# Environment: PYTHON (default python3) runs the peer; QT_BENCH_PEER_MODES its --modes (default
# eager,compile,fp8,graph); QT_BENCH_FASHION=0 skips Fashion-MNIST; QT_BENCH_MODELS=0 skips the
# bench recipes, given or not (Fashion-MNIST alone); QT_BENCH_RUNS=N (default 1) runs qtrain N
# times per recipe, in rounds (every recipe once, then again), so that a slow stretch of the
# machine falls on every recipe alike: the tables then show the median of the N runs (ms/step,
# steps/s; arena and accuracy from the first), and a list after them every run's figure.
# Exit status: 0 when every run succeeded; 1 (after the table, with a FAILED line per run) when
# any qtrain run or peer mode failed or printed no timing; 2 when the build fails, there is no
# GPU (the reference backend would take hours at this size), QT_BENCH_RUNS is no whole number
# from 1, or nothing is left to run.
set -u

python=${PYTHON:-python3}
peer_modes=${QT_BENCH_PEER_MODES:-eager,compile,fp8,graph}
fashion_dir=.data/usr/share/datasets/fashion-mnist
. tools/bench_lib.sh  # logs, failures, fail, runs, median

# The value of "key" in a flat JSON line (numbers, strings without commas, true/false/null).
json_field() {
    printf '%s\n' "$1" | sed -n "s/.*\"$2\": \"*\([^,\"}]*\)\"*[,}].*/\1/p"
}

# The peer's JSON line for a recipe and mode ("" when there is none).
peer_line() {
    grep -F "\"recipe\": \"$1\", \"mode\": \"$2\"," "$logs/peer.jsonl" 2>/dev/null | tail -1
}

# ms/step of a peer mode, or "-" when it failed or did not run.
peer_ms() {
    line=$(peer_line "$1" "$2")
    if [ -n "$line" ] && [ "$(json_field "$line" ok)" = true ]; then
        json_field "$line" ms_median
    else
        echo -
    fi
}

# The recipe the peer runs for a bench recipe: its shape's `current` one (same model).
peer_of() {
    shape=$(basename "$1" .recipe)
    peer=$(dirname "$1")/${shape%_*}_current.recipe
    if [ -f "$peer" ]; then echo "$peer"; else echo "$1"; fi
}

# The log of run $2 (1 ... runs) of recipe $1.
qtrain_log() {
    echo "$logs/qtrain_$(basename "$1" .recipe).$2.log"
}

# Runs qtrain on a recipe (run $3) into its log; a failure, or a summary without the line that
# starts with $2, is recorded.
run_qtrain() {
    log=$(qtrain_log "$1" "$3")
    echo "qtrain run $1 (run $3 of $runs)" >&2
    if ! build/qtrain run "$1" > "$log" 2>&1; then
        tail -5 "$log" >&2
        fail "qtrain run $1 (log: $log)"
    elif ! grep -q "^$2" "$log"; then
        fail "qtrain run $1 printed no '$2' line (log: $log)"
    fi
}

# The figure that sed expression $2 takes from each run's log of recipe $1, one per line ("-"
# where a run printed none).
run_figures() {
    for r in $(seq "$runs"); do
        v=$(sed -n "$2" "$(qtrain_log "$1" "$r")" 2>/dev/null | head -n 1)
        echo "${v:--}"
    done
}

ms_sed='s/^step time    median \([0-9.]*\) ms.*/\1/p'
rate_sed='s/^train rate   \([0-9.]*\) steps\/s.*/\1/p'

# a / b to two decimals, "-" when either is missing.
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f\n", a / b }'
}

if ! ninja > "$logs/build.log" 2>&1; then
    tail -20 "$logs/build.log" >&2
    echo "bench_step: the build failed (log: $logs/build.log)" >&2
    exit 2
fi
if ! build/qtrain info > "$logs/info.log" 2>&1 || ! grep -q '^device ' "$logs/info.log"; then
    cat "$logs/info.log" >&2
    echo "bench_step: no GPU: these recipes are for a GPU machine" >&2
    exit 2
fi
device=$(sed -n 's/^device *//p' "$logs/info.log" | head -1)

if [ "${QT_BENCH_MODELS:-1}" = 0 ]; then
    recipes=""
elif [ $# -gt 0 ]; then
    recipes="$*"
else
    recipes=$(ls recipes/bench/*.recipe)
fi

# qtrain: runs rounds of one run per recipe; the peer once per model shape (resmlp_*, ...).
peers=""
for recipe in $recipes; do
    peer=$(peer_of "$recipe")
    case " $peers " in *" $peer "*) ;; *) peers="$peers $peer" ;; esac
done
fashion=""
if [ "${QT_BENCH_FASHION:-1}" != 0 ] && [ -f "$fashion_dir/train-images-idx3-ubyte.gz" ]; then
    fashion=$(ls recipes/fashion_mnist_*.recipe)
    peers="$peers recipes/fashion_mnist_bf16.recipe"
fi
if [ -z "$recipes" ] && [ -z "$fashion" ]; then
    echo "bench_step: nothing to run: QT_BENCH_MODELS=0 and no Fashion-MNIST" \
         "($fashion_dir/train-images-idx3-ubyte.gz is missing, or QT_BENCH_FASHION=0)" >&2
    exit 2
fi
for round in $(seq "$runs"); do
    for recipe in $recipes; do run_qtrain "$recipe" "step time    median " "$round"; done
    for recipe in $fashion; do run_qtrain "$recipe" "train rate " "$round"; done
done
rm -f "$logs/peer.jsonl"
echo "$python tools/peer_torch.py$peers --modes $peer_modes" >&2
# shellcheck disable=SC2086  # the recipe paths have no blanks
"$python" tools/peer_torch.py $peers --modes "$peer_modes" --json "$logs/peer.jsonl" \
    > "$logs/peer.log" 2>&1
peer_rc=$?
if [ $peer_rc -ne 0 ]; then
    grep -v '^{' "$logs/peer.log" | tail -20 >&2
    fail "tools/peer_torch.py exit $peer_rc (log: $logs/peer.log)"
fi
grep -F '"ok": false' "$logs/peer.jsonl" 2>/dev/null | while read -r line; do
    echo "FAILED: peer $(json_field "$line" recipe) $(json_field "$line" mode):" \
         "$(printf '%s\n' "$line" | sed -n 's/.*"error": "\(.*\)".*/\1/p')"
done > "$logs/peer_failures.txt"
while read -r line; do fail "${line#FAILED: }"; done < "$logs/peer_failures.txt"

# The table.
table=$logs/bench_step.md
{
    echo "Training steps on $device, qtrain $(git rev-parse --short HEAD 2>/dev/null)" \
         "$(git diff --quiet HEAD 2>/dev/null || echo '(modified)'), $(date -u +%Y-%m-%d)"
    echo
    [ -z "$recipes" ] ||
    echo "| recipe | qtrain ms/step | qtrain TFLOP/s | PyTorch eager | compile | FP8 compile" \
         "| CUDA graph | qtrain / compile | qtrain / FP8 compile | qtrain / graph" \
         "| qtrain arena MiB | PyTorch peak MiB (compile) |"
    [ -z "$recipes" ] || echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    for recipe in $recipes; do
        name=$(basename "$recipe" .recipe)
        log=$(qtrain_log "$recipe" 1)
        peer=$(peer_of "$recipe")
        ms=$(run_figures "$recipe" "$ms_sed" | median)
        arena=$(sed -n 's/^arena bytes  device \([0-9]*\),.*/\1/p' "$log" 2>/dev/null |
                head -n 1)
        flop=$("$python" tools/peer_torch.py --parse-only "$recipe" |
               sed -n 's/.* \([0-9]*\) FLOP per step.*/\1/p')
        # A resident recipe's arena holds its dataset, as PyTorch's peak does: compare whole.
        peak_field=peak_model_bytes
        grep -q '^resident = on' "$recipe" && peak_field=peak_bytes
        peak=$(json_field "$(peer_line "$peer" compile)" $peak_field)
        eager=$(peer_ms "$peer" eager)
        compiled=$(peer_ms "$peer" compile)
        fp8=$(peer_ms "$peer" fp8)
        graph=$(peer_ms "$peer" graph)
        awk -v r="$name" -v ms="$ms" -v flop="${flop:--}" -v e="$eager" -v c="$compiled" \
            -v f="$fp8" -v g="$graph" -v rc="$(ratio "$ms" "$compiled")" \
            -v rf="$(ratio "$ms" "$fp8")" -v rg="$(ratio "$ms" "$graph")" \
            -v arena="${arena:--}" -v peak="${peak:--}" 'function mib(b) {
                return b == "-" ? "-" : sprintf("%.0f", b / 1048576) }
            function ms1(v) { return v == "-" ? "-" : sprintf("%.1f", v) }
            BEGIN {
                tf = (ms == "-" || flop == "-") ? "-" : sprintf("%.0f", flop / (ms * 1e-3) / 1e12)
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                       r, ms1(ms), tf, ms1(e), ms1(c), ms1(f), ms1(g), rc, rf, rg, mib(arena),
                       mib(peak) }'
    done
    if [ -n "$fashion" ]; then
        line=$(peer_line recipes/fashion_mnist_bf16.recipe graph-train)
        peer_rate=-
        peer_acc=-
        if [ -n "$line" ] && [ "$(json_field "$line" ok)" = true ]; then
            peer_rate=$(json_field "$line" steps_per_s)
            peer_acc=$(json_field "$line" eval_accuracy)
        fi
        echo
        echo "| Fashion-MNIST recipe | qtrain steps/s | eval accuracy | PyTorch CUDA graph" \
             "steps/s | PyTorch accuracy | qtrain / PyTorch rate |"
        echo "|---|---|---|---|---|---|"
        for recipe in $fashion; do
            log=$(qtrain_log "$recipe" 1)
            rate=$(run_figures "$recipe" "$rate_sed" | median)
            acc=$(sed -n 's/^eval         accuracy \([0-9.]*%\).*/\1/p' "$log" 2>/dev/null |
                  head -n 1)
            awk -v r="$(basename "$recipe" .recipe)" -v q="${rate:--}" -v a="${acc:--}" \
                -v p="$peer_rate" -v pa="$peer_acc" -v ratio="$(ratio "${rate:--}" "$peer_rate")" \
                'BEGIN { printf "| %s | %s | %s | %s | %s | %s |\n", r, q, a,
                         p == "-" ? "-" : sprintf("%.0f", p),
                         pa == "-" ? "-" : sprintf("%.2f%%", 100 * pa), ratio }'
        done
    elif [ "${QT_BENCH_FASHION:-1}" != 0 ]; then
        echo
        echo "Fashion-MNIST: not run ($fashion_dir/train-images-idx3-ubyte.gz is missing)."
    fi
    if [ "$runs" -gt 1 ]; then
        echo
        echo "Every run ($runs per recipe, in rounds; the tables show their median):"
        echo
        for recipe in $recipes; do
            echo "- $(basename "$recipe" .recipe) ms/step:" \
                 "$(run_figures "$recipe" "$ms_sed" | paste -sd ' ' -)"
        done
        for recipe in $fashion; do
            echo "- $(basename "$recipe" .recipe) steps/s:" \
                 "$(run_figures "$recipe" "$rate_sed" | paste -sd ' ' -)"
        done
    fi
    [ -z "$failures" ] || printf '%s\n' "$failures"
} > "$table"
cat "$table"
echo "logs: $logs" >&2
[ -z "$failures" ] || exit 1
exit 0
