#!/bin/sh
# Data-parallel scaling on one host, qtrain next to PyTorch DDP, in one call on a 2-GPU machine:
#
#   sh tools/bench_dp.sh [GPUS]          default GPUS=2
#
# Builds (ninja), runs `build/qtrain run RECIPE --gpus GPUS` and `--gpus 1` on the residual MLP
# at a global batch of 16384 (recipes/bench/resmlp_{current,bf16}_b16k.recipe: FP8 current
# scaling and BF16; GPUS ranks share each batch), takes each summary's median step time, then
# runs tools/ddp_torch.py on the same model in BF16 on GPUS GPUs and on 1 (DDP, NCCL), and prints
# one markdown table: ms/step, samples/s, the scaling of GPUS GPUs over one, and qtrain's speed-up
# over DDP at each GPU count. `qtrain plan RECIPE --gpus GPUS` (each rank's arena) goes to the
# logs too. Logs and the table (bench_dp.md) go to $OUT when it is set, else to a new temporary
# folder.
#
# Environment: PYTHON (default python3) runs the DDP peer; QTRAIN_NCCL as for qtrain (where
# libnccl.so.2 is; PyTorch's wheel is found without it); QT_BENCH_RUNS=N (default 1) runs each
# qtrain configuration N times, in rounds (every configuration once, then again): the table then
# shows the median of the N runs, and a list after it every run's figure. NCCL_NVLS_ENABLE=0 is
# set for every run.
# Exit status: 0 when every run succeeded; 1 (after the table, with a FAILED line per run) when a
# run failed or printed no timing; 2 when the build fails or QT_BENCH_RUNS is no whole number
# from 1.
set -u

python=${PYTHON:-python3}
gpus=${1:-2}
export NCCL_NVLS_ENABLE=0
. tools/bench_lib.sh  # logs, failures, fail, runs, median

ninja > "$logs/build.log" 2>&1 || { tail -20 "$logs/build.log" >&2; exit 2; }

# The median step time (ms) of a qtrain run's summary, or "-".
qtrain_ms() {
    ms=$(sed -n 's/^step time    median \([0-9.]*\) ms.*/\1/p' "$1" 2>/dev/null | tail -1)
    echo "${ms:--}"
}

# The log of run $3 (1 ... runs) of qtrain on format $1's recipe with --gpus $2.
qtrain_log() {
    echo "$logs/qtrain_resmlp_$1_b16k_gpus$2.$3.log"
}

# Every run's median step time (ms, or "-") of format $1 with --gpus $2, one per line.
qtrain_figures() {
    for r in $(seq "$runs"); do qtrain_ms "$(qtrain_log "$1" "$2" "$r")"; done
}

# Run $3 of qtrain on format $1's recipe with --gpus $2, into its log.
run_qtrain() {
    recipe=recipes/bench/resmlp_$1_b16k.recipe
    log=$(qtrain_log "$1" "$2" "$3")
    echo "qtrain run $recipe --gpus $2 (run $3 of $runs)" >&2
    if ! build/qtrain run "$recipe" --gpus "$2" > "$log" 2>&1; then
        tail -5 "$log" >&2
        fail "qtrain run $recipe --gpus $2 (log: $log)"
    elif [ "$(qtrain_ms "$log")" = - ]; then
        fail "qtrain run $recipe --gpus $2 printed no step time (log: $log)"
    fi
}

for fmt in current bf16; do
    recipe=recipes/bench/resmlp_${fmt}_b16k.recipe
    build/qtrain plan "$recipe" --gpus "$gpus" --summary > "$logs/plan_${fmt}.log" 2>&1 ||
        fail "qtrain plan $recipe --gpus $gpus (log: $logs/plan_${fmt}.log)"
done
for round in $(seq "$runs"); do
    for fmt in current bf16; do
        run_qtrain "$fmt" "$gpus" "$round"
        run_qtrain "$fmt" 1 "$round"
    done
done

echo "torch DDP on $gpus and 1 GPUs" >&2
if ! "$python" tools/ddp_torch.py recipes/bench/resmlp_bf16_b16k.recipe --gpus "$gpus,1" \
        --json "$logs/ddp.jsonl" > "$logs/ddp.log" 2>&1; then
    tail -5 "$logs/ddp.log" >&2
    fail "tools/ddp_torch.py (log: $logs/ddp.log)"
fi

# ms/step of DDP on N GPUs, or "-".
ddp_ms() {
    line=$(grep -F "\"gpus\": $1," "$logs/ddp.jsonl" 2>/dev/null | grep -F '"ok": true' | tail -1)
    ms=$(printf '%s\n' "$line" | sed -n 's/.*"ms_median": \([0-9.e+-]*\).*/\1/p')
    echo "${ms:--}"
}

# a / b with 2 decimals, or "-" when either is missing.
ratio() {
    if [ "$1" = - ] || [ "$2" = - ]; then echo -; else awk "BEGIN { printf \"%.2f\", $1 / $2 }"; fi
}

# samples/s of the global batch 16384 at ms/step, or "-".
rate() {
    if [ "$1" = - ]; then echo -; else awk "BEGIN { printf \"%.0f\", 16384 / ($1 / 1000) }"; fi
}

table=$logs/bench_dp.md
{
    echo "Residual MLP (553.7 M weights), global batch 16384; $gpus GPUs vs 1"
    echo
    echo "| run | GPUs | ms/step | samples/s | scaling ($gpus vs 1) | DDP BF16 ms/step | vs DDP |"
    echo "|---|---|---|---|---|---|---|"
    for fmt in current bf16; do
        one=$(qtrain_figures "$fmt" 1 | median)
        many=$(qtrain_figures "$fmt" "$gpus" | median)
        for n in "$gpus" 1; do
            ms=$many
            scale=$(ratio "$one" "$many")
            if [ "$n" = 1 ]; then ms=$one; scale=1.00; fi
            ddp=$(ddp_ms "$n")
            vs=$(ratio "$ddp" "$ms")
            echo "| qtrain $fmt | $n | $ms | $(rate "$ms") | $scale | $ddp | $vs |"
        done
    done
    d1=$(ddp_ms 1)
    dn=$(ddp_ms "$gpus")
    echo "| torch DDP bf16 | $gpus | $dn | $(rate "$dn") | $(ratio "$d1" "$dn") | $dn | 1.00 |"
    echo "| torch DDP bf16 | 1 | $d1 | $(rate "$d1") | 1.00 | $d1 | 1.00 |"
    if [ "$runs" -gt 1 ]; then
        echo
        echo "Every run ($runs per configuration, in rounds; the table shows their median):"
        echo
        for fmt in current bf16; do
            for n in "$gpus" 1; do
                echo "- qtrain $fmt on $n GPUs, ms/step:" \
                     "$(qtrain_figures "$fmt" "$n" | paste -sd ' ' -)"
            done
        done
    fi
    echo
    echo "Each rank's device arena (qtrain plan --gpus $gpus):"
    grep -h '^  rank \|^  one GPU' "$logs/plan_current.log" 2>/dev/null | sed 's/^/    /'
} > "$table"
cat "$table"
echo "logs: $logs" >&2
if [ -n "$failures" ]; then
    printf '%s\n' "$failures" >&2
    exit 1
fi
exit 0
