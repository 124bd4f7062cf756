#!/bin/sh
# The command-line tool starts with or without a GPU and says which backend it will use.
qtrain=${1:-build/qtrain}
out=$("$qtrain" info 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    echo "FAIL cli_info: exit $rc"
    echo "$out" | sed 's/^/  /'
    exit 1
fi
if echo "$out" | grep -q '^device '; then
    if echo "$out" | grep -q 'qt_fill_random'; then
        echo "PASS cli_info (GPU: $(echo "$out" | sed -n 's/^device *//p'))"
    else
        echo "FAIL cli_info: GPU found but no kernel table printed"
        exit 1
    fi
elif echo "$out" | grep -q 'reference backend will be used'; then
    echo "PASS cli_info (no GPU: reference backend)"
else
    echo "FAIL cli_info: unexpected output"
    echo "$out" | sed 's/^/  /'
    exit 1
fi
out=$("$qtrain" frobnicate 2>&1)
if [ $? -eq 2 ] && echo "$out" | grep -q "unknown command 'frobnicate'"; then
    echo "PASS cli_unknown_command"
else
    echo "FAIL cli_unknown_command: $out"
    exit 1
fi
# --help and -h after any command print the usage and succeed; --profile on the reference backend
# is refused before the run, not after it.
help_ok=1
for args in "--help" "run --help" "plan -h" "export --help" "run recipes/none.recipe -h"; do
    # shellcheck disable=SC2086
    out=$("$qtrain" $args 2>&1) && echo "$out" | grep -q '^usage: qtrain COMMAND' || help_ok=0
done
if [ $help_ok -eq 1 ]; then
    echo "PASS cli_help"
else
    echo "FAIL cli_help: a --help or -h did not print the usage with exit 0"
    exit 1
fi
out=$("$qtrain" run tests/recipes/synthetic_tiny.recipe --ref --profile 2>&1)
rc=$?
if [ $rc -eq 2 ] && echo "$out" | grep -q -- '--profile times GPU kernels' &&
   ! echo "$out" | grep -q '^steps '; then
    echo "PASS cli_profile_refused_on_reference_backend"
else
    echo "FAIL cli_profile_refused_on_reference_backend: exit $rc"
    echo "$out" | sed 's/^/  /'
    exit 1
fi
# `qtrain diff`: exit 0 for identical traces, 1 with the first difference, 2 for a bad file.
dir=$(mktemp -d)
header='qtrain-trace 1 recipe=0000000000000001 quantizers=0 checksum_every=0'
rec='mode=train flags=0x0:none loss=0x3f800000:1 accuracy=0x00000000:0'
rest='grad_norm=0x00000000:0 lr=0x3a83126f:0.00100000005 checksum=-'
printf '%s\nstep=0 %s %s\nstep=1 %s %s\n' "$header" "$rec" "$rest" "$rec" "$rest" > "$dir/a"
cp "$dir/a" "$dir/b"
sed 's/^step=1 \(.*\)loss=0x3f800000:1/step=1 \1loss=0x3f800001:1.00000012/' "$dir/a" > "$dir/c"
echo 'not a trace' > "$dir/d"
"$qtrain" diff "$dir/a" "$dir/b" > "$dir/ab" 2>&1; rc_ab=$?
"$qtrain" diff "$dir/a" "$dir/c" > "$dir/ac" 2>&1; rc_ac=$?
"$qtrain" diff "$dir/a" "$dir/d" > "$dir/ad" 2>&1; rc_ad=$?
if [ $rc_ab -eq 0 ] && grep -q '^identical: 2 records$' "$dir/ab" &&
   [ $rc_ac -eq 1 ] && grep -q '^first difference at step 1 .*field loss:$' "$dir/ac" &&
   [ $rc_ad -eq 2 ] && grep -q 'not a qtrain trace' "$dir/ad"; then
    echo "PASS cli_diff"
else
    echo "FAIL cli_diff: exit codes $rc_ab $rc_ac $rc_ad (expected 0 1 2)"
    cat "$dir/ab" "$dir/ac" "$dir/ad" | sed 's/^/  /'
    rm -rf "$dir"
    exit 1
fi
rm -rf "$dir"
# Every bench recipe plans: the residual MLP in every format and the other shape, each with a
# BF16 head (tools/bench_step.sh runs them on a GPU).
bad=""
count=0
for fmt in bf16 current delayed block mxfp8 nvfp4; do
    [ -f "recipes/bench/resmlp_$fmt.recipe" ] || bad="$bad resmlp_$fmt.recipe is missing;"
done
for recipe in recipes/bench/*.recipe; do
    [ -f "$recipe" ] || continue
    count=$((count + 1))
    out=$("$qtrain" plan "$recipe" 2>&1)
    if [ $? -ne 0 ]; then
        bad="$bad $recipe: $(echo "$out" | tail -1);"
    elif ! echo "$out" | grep -q '^ *linear\.weight@head  *bf16 '; then
        bad="$bad $recipe: the head is not BF16;"
    fi
done
if [ -z "$bad" ] && [ "$count" -ge 8 ]; then
    echo "PASS cli_plan_bench_recipes ($count recipes)"
else
    echo "FAIL cli_plan_bench_recipes ($count recipes):$bad"
    exit 1
fi
# Ctrl-C: the run stops at a step boundary with its summary, a complete trace and, with --save, a
# checkpoint (exit 130); resuming it into the same trace file gives the uninterrupted run's trace.
dir=$(mktemp -d)
fail() {
    echo "FAIL $1"
    sed 's/^/  /' "$dir/out" 2>/dev/null | tail -20
    rm -rf "$dir"
    exit 1
}
sed 's/^train 200 cosine/train 100000 cosine/' tests/recipes/synthetic_tiny.recipe \
    > "$dir/long.recipe"
start_long_run() {  # waits until the loop runs (its trace file exists) and a little more
    rm -f "$dir/t"
    "$qtrain" run "$dir/long.recipe" --ref --trace "$dir/t" --save "$dir/$1" > "$dir/out" 2>&1 &
    pid=$!
    i=0
    while [ ! -e "$dir/t" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
    sleep 0.3
}
start_long_run ck
kill -INT $pid
wait $pid
rc=$?
step=$(sed -n 's/^interrupted  by SIGINT at step \([0-9]*\) .*/\1/p' "$dir/out")
[ $rc -eq 130 ] || fail "cli_run_sigint_stops_saves_and_resumes: exit $rc, expected 130"
[ -n "$step" ] && grep -q '^train loss' "$dir/out" &&
    grep -q "^checkpoint   $dir/ck at step $step " "$dir/out" ||
    fail "cli_run_sigint_stops_saves_and_resumes: no interruption, summary or checkpoint line"
last=$(tail -c 1 "$dir/t" | od -An -c | tr -d ' ')
[ "$(grep -c '^step=' "$dir/t")" -eq "$step" ] && [ "$last" = '\n' ] ||
    fail "cli_run_sigint_stops_saves_and_resumes: the trace does not hold the $step steps"
[ "$step" -lt 4000 ] ||
    fail "cli_run_sigint_stops_saves_and_resumes: interrupted at step $step, after 4000"
"$qtrain" run "$dir/long.recipe" --ref --trace "$dir/t" --resume "$dir/ck" --steps 4000 \
    > "$dir/out" 2>&1 ||
    fail "cli_run_sigint_stops_saves_and_resumes: the resumed run failed"
"$qtrain" run "$dir/long.recipe" --ref --trace "$dir/full" --steps 4000 > "$dir/out" 2>&1 ||
    fail "cli_run_sigint_stops_saves_and_resumes: the uninterrupted run failed"
"$qtrain" diff "$dir/full" "$dir/t" > "$dir/out" 2>&1 ||
    fail "cli_run_sigint_stops_saves_and_resumes: resumed trace differs"
echo "PASS cli_run_sigint_stops_saves_and_resumes (interrupted at step $step)"
# Resumed into a new trace file: its records start at the checkpoint's step, and diff compares
# them with the whole trace from there.
"$qtrain" run "$dir/long.recipe" --ref --trace "$dir/new" --resume "$dir/ck" --steps 4000 \
    > "$dir/out" 2>&1 || fail "cli_diff_resumed_trace_from_its_first_step: the resumed run failed"
"$qtrain" diff "$dir/full" "$dir/new" > "$dir/out" 2>&1 &&
    grep -q "^identical: $((4004 - step)) records from step $step " "$dir/out" ||
    fail "cli_diff_resumed_trace_from_its_first_step"
echo "PASS cli_diff_resumed_trace_from_its_first_step"
# A second signal while the first is handled exits at once.
start_long_run ck2
kill -INT $pid
kill -TERM $pid
wait $pid
rc=$?
{ [ $rc -eq 130 ] || [ $rc -eq 143 ]; } && grep -q 'second interrupt: exiting at once' "$dir/out" &&
    ! grep -q '^train loss' "$dir/out" ||
    fail "cli_run_second_signal_exits_at_once: exit $rc"
echo "PASS cli_run_second_signal_exits_at_once"
# Refusals: --save over an existing file, --save-every alone, a checkpoint of another recipe.
"$qtrain" run tests/recipes/synthetic_tiny.recipe --ref --save "$dir/ck" > "$dir/out" 2>&1
grep -q "ck exists; a run saves over a checkpoint only when it resumes from it" "$dir/out" ||
    fail "cli_checkpoint_refusals: --save over an existing file"
"$qtrain" run tests/recipes/synthetic_tiny.recipe --ref --save-every 5 > "$dir/out" 2>&1
[ $? -eq 2 ] && grep -q -- '--save-every needs --save' "$dir/out" ||
    fail "cli_checkpoint_refusals: --save-every without --save"
"$qtrain" run tests/recipes/synthetic_bf16.recipe --ref --resume "$dir/ck" > "$dir/out" 2>&1
[ $? -eq 1 ] && grep -q "saved from another recipe: 'long.recipe'" "$dir/out" ||
    fail "cli_checkpoint_refusals: another recipe's checkpoint"
echo "PASS cli_checkpoint_refusals"
# Export: a safetensors file, never over an existing one without --force.
"$qtrain" export "$dir/ck" "$dir/w.safetensors" > "$dir/out" 2>&1 &&
    grep -q "^exported $dir/ck (long.recipe, step $step, " "$dir/out" ||
    fail "cli_export: first export"
"$qtrain" export "$dir/ck" "$dir/w.safetensors" --quantized > "$dir/out" 2>&1
[ $? -eq 1 ] && grep -q 'exists; pass --force' "$dir/out" || fail "cli_export: overwrite refused"
"$qtrain" export "$dir/ck" "$dir/w.safetensors" --quantized --force > "$dir/out" 2>&1 ||
    fail "cli_export: --force"
echo "PASS cli_export"
# A recipe that names no train source is an embedder's: `qtrain plan` shows it, `qtrain run`
# refuses it by name before any data is read.
sed '/^train = /d' tests/recipes/synthetic_tiny.recipe | sed 's/^eval all$/eval 4/' \
    > "$dir/embedded.recipe"
"$qtrain" plan "$dir/embedded.recipe" > "$dir/out" 2>&1 ||
    fail "cli_recipe_without_train_source: plan"
"$qtrain" run "$dir/embedded.recipe" --ref > "$dir/out" 2>&1
[ $? -eq 1 ] && grep -q "embedded.recipe names no 'train = SOURCE' in \[data\]" "$dir/out" &&
    ! grep -q '^steps ' "$dir/out" || fail "cli_recipe_without_train_source: run"
echo "PASS cli_recipe_without_train_source"
rm -rf "$dir"
