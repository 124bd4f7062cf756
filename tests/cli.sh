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
out=$("$qtrain" --version 2>&1)
rc=$?
version='^qtrain [0-9]*\.[0-9]*\.[0-9]* (trace format 2, checkpoint format 1)$'
if [ $rc -eq 0 ] && echo "$out" | grep -q "$version"; then
    echo "PASS cli_version"
else
    echo "FAIL cli_version: $out"
    exit 1
fi
# The plan's quantizer column starts at one column in every role line, a MoE layer's long
# grouped_linear roles included.
starts=$("$qtrain" plan recipes/bench/moe8_current.recipe 2>&1 | grep '^      [a-z_.]*@' |
         awk '{ print index($0, " " $2 " ") }' | sort -u | wc -l)
if [ "$starts" = 1 ]; then
    echo "PASS cli_plan_role_column_aligned"
else
    echo "FAIL cli_plan_role_column_aligned: the quantizer column starts at $starts columns"
    exit 1
fi
# qtrain bench's counts from the environment: anything but 1 ... 1000000 is refused (exit 2,
# the variable named) before a GPU is looked for, so this holds on any machine.
bench_bad=""
for value in abc 0 -5 12x 1e3 99999999999; do
    out=$(QT_BENCH_REPEATS=$value "$qtrain" bench copy 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || ! echo "$out" | grep -q "QT_BENCH_REPEATS='$value' is not a count"; then
        bench_bad="$bench_bad [$value: exit $rc: $out]"
    fi
done
out=$(QT_BENCH_ROUNDS=two "$qtrain" bench copy 2>&1)
[ $? -eq 2 ] && echo "$out" | grep -q "QT_BENCH_ROUNDS='two'" || bench_bad="$bench_bad [ROUNDS]"
if [ -z "$bench_bad" ]; then
    echo "PASS cli_bench_env_counts_checked"
else
    echo "FAIL cli_bench_env_counts_checked:$bench_bad"
    exit 1
fi
# The verdict of a loop over recipes: PASS when it found no problem ($bad) in at least $2 of
# them ($count).
recipes_verdict() {
    if [ -z "$bad" ] && [ "$count" -ge "$2" ]; then
        echo "PASS $1 ($count recipes)"
    else
        echo "FAIL $1 ($count recipes):$bad"
        exit 1
    fi
}
# plan --summary: the model, its quantizers, parameters, the schedule and both arenas in under 40
# lines, for every recipe that plans without data files (and the shipped ones when the data is
# there).
bad=""
count=0
fashion=.data/usr/share/datasets/fashion-mnist
for recipe in tests/recipes/synthetic_*.recipe recipes/bench/*.recipe \
              recipes/fashion_mnist_*.recipe; do
    case $recipe in recipes/fashion_mnist_*) [ -d $fashion ] || continue ;; esac
    count=$((count + 1))
    if ! out=$("$qtrain" plan "$recipe" --summary 2>&1); then
        bad="$bad $recipe: $(echo "$out" | tail -1);"
        continue
    fi
    lines=$(echo "$out" | wc -l)
    [ "$lines" -lt 40 ] || bad="$bad $recipe: $lines lines;"
    for key in recipe model quantizers parameters schedule data programs device host; do
        echo "$out" | grep -q "^$key " || bad="$bad $recipe: no '$key' line;"
    done
    # Where the device arena peaks: an op of a named program, and what is live there.
    echo "$out" | grep -q '^  *peak at op [0-9]* ([a-z]*: [^)]*), [0-9.]* [KMG]*i*B live: ' ||
        bad="$bad $recipe: no device peak line;"
done
recipes_verdict cli_plan_summary 12
# A rule that matches no role of the model is refused, naming the rule and the model's roles.
dir=$(mktemp -d)
sed 's/^recipe = bf16$/recipe = bf16\nrule = linear.*@fc2 -> nvfp4/' \
    tests/recipes/synthetic_tiny.recipe > "$dir/r.recipe"
out=$("$qtrain" plan "$dir/r.recipe" 2>&1)
rc=$?
rm -rf "$dir"
if [ $rc -eq 1 ] && echo "$out" | grep -q "r.recipe:13:8: rule linear.\*@fc2 -> nvfp4 matches no \
role of the model; expected a pattern that matches one of its roles (linear.\*@fc1, \
linear.\*@head), or no such rule"; then
    echo "PASS cli_rule_matching_no_role_refused"
else
    echo "FAIL cli_rule_matching_no_role_refused: exit $rc"
    echo "$out" | sed 's/^/  /'
    exit 1
fi
# A data file that cannot be read: the message names the recipe line that named it, and for the
# shipped recipes' Fashion-MNIST the commands that put it where they look.
dir=$(mktemp -d)
sed 's|^train = synthetic .*|train = idx absent/images.gz absent/labels.gz|' \
    tests/recipes/synthetic_tiny.recipe > "$dir/r.recipe"
case $qtrain in /*) abs=$qtrain ;; *) abs=$PWD/$qtrain ;; esac
out=$(cd "$dir" && "$abs" plan r.recipe 2>&1)
rc=$?
rm -rf "$dir"
if [ $rc -eq 1 ] && echo "$out" | grep -q "r.recipe:18:9: absent/images.gz: cannot open" &&
   echo "$out" | grep -q 'apt-get download dataset-fashion-mnist && dpkg -x'; then
    echo "PASS cli_data_error_names_the_recipe_line"
else
    echo "FAIL cli_data_error_names_the_recipe_line: exit $rc"
    echo "$out" | sed 's/^/  /'
    exit 1
fi
# Schedule units and clauses: rows rewritten with them train to the same records as the old rows
# when they give the same learning-rate rows (the header differs: it hashes the recipe's text),
# and `qtrain plan` prints the table they expand to (an epoch here is 512 / 16 = 32 steps).
dir=$(mktemp -d)
sed '/^\[schedule\]/,$d' tests/recipes/synthetic_tiny.recipe > "$dir/base"
{ cat "$dir/base"; printf '[schedule]\ntrain 8 warmup 0 -> 1e-2\ntrain 56 cosine 1e-2 -> 1e-3\n'
  printf 'eval all\ntrain 32 constant 1e-3\neval all\ntrain 32 decay 1e-3 -> 1e-4\neval all\n'
} > "$dir/old.recipe"
{ cat "$dir/base"; printf '[schedule]\ntrain 2 epochs cosine 1e-2 -> 1e-3 warmup 8 steps\n'
  printf 'eval all\ntrain 1 epoch constant 1e-3 eval every epoch\n'
  printf 'train 32 steps decay 1e-3 -> 1e-4 eval all every 1 epoch\n'
} > "$dir/new.recipe"
"$qtrain" run "$dir/old.recipe" --ref --trace "$dir/old.trace" > "$dir/out" 2>&1 &&
    "$qtrain" run "$dir/new.recipe" --ref --trace "$dir/new.trace" >> "$dir/out" 2>&1 &&
    "$qtrain" plan "$dir/new.recipe" > "$dir/plan" 2>> "$dir/out"
rc=$?
tail -n +2 "$dir/old.trace" > "$dir/old.records"
tail -n +2 "$dir/new.trace" > "$dir/new.records"
if [ $rc -eq 0 ] && [ "$(wc -l < "$dir/new.records")" -eq 141 ] &&
   grep -q checksum=0x "$dir/new.records" && cmp -s "$dir/old.records" "$dir/new.records" &&
   grep -q '^schedule: 6 rows, 128 train, 12 eval, 0 infer steps; an epoch is 32 train steps$' \
       "$dir/plan" &&
   grep -q '^ *4 train *32 steps at 104 *train steps 96\.\.127  *line 27$' "$dir/plan" &&
   grep -q '^  lr row 1: from train step 8, 56 steps, cosine 0.01 -> 0.001$' "$dir/plan"; then
    echo "PASS cli_schedule_epochs_and_clauses_same_records"
else
    echo "FAIL cli_schedule_epochs_and_clauses_same_records: exit $rc"
    cat "$dir/out" "$dir/plan" | sed 's/^/  /' | tail -30
    rm -rf "$dir"
    exit 1
fi
rm -rf "$dir"
# Progress and metrics: each eval pass leaves one line with the whole pass's loss and accuracy
# (the summary's), ETAs are h:mm:ss; --metrics writes a JSON line per eval pass and per N train
# steps, and refuses an existing file unless --force.
dir=$(mktemp -d)
{ sed '/^\[schedule\]/,$d' tests/recipes/synthetic_tiny.recipe
  printf '[schedule]\ntrain 2 epochs cosine 1e-2 -> 1e-3 eval every epoch\n'; } > "$dir/r.recipe"
fail_metrics() {
    echo "FAIL cli_progress_and_metrics: $1"
    cat "$dir/err" "$dir/out" "$dir/m.jsonl" 2>/dev/null | sed 's/^/  /' | tail -20
    rm -rf "$dir"
    exit 1
}
"$qtrain" run "$dir/r.recipe" --ref --metrics "$dir/m.jsonl" --metrics-every 16 \
    > "$dir/out" 2> "$dir/err" || fail_metrics "the run failed"
acc=$(sed -n 's/^eval         accuracy \([0-9.]*\)%.*/\1/p' "$dir/out")
[ "$(grep -c '^eval  pass     4/4  *eval set  *64 samples  loss ' "$dir/err")" -eq 2 ] &&
    [ "$(grep '^eval  pass' "$dir/err" | tail -1 | sed 's/.* acc *\([0-9.]*\)%.*/\1/')" = \
      "$acc" ] ||
    fail_metrics "the eval pass lines"
grep '^train \|^eval ' "$dir/err" | grep -qv ' ETA [0-9]*:[0-5][0-9]:[0-5][0-9]$' &&
    fail_metrics "an ETA not as h:mm:ss"
# Three significant digits or so: 1234 steps/s, 56.7 steps/s, 8.90 steps/s, 12.3 s/step.
rate=' \([1-9][0-9][0-9][0-9]*\|[1-9][0-9]\.[0-9]\|[1-9]\.[0-9][0-9]\) steps/s  ETA'
grep '^train \|^eval ' "$dir/err" | grep -v "$rate" | grep -qv ' [0-9]*\.[0-9] s/step  ETA' &&
    fail_metrics "a rate not in its format"
kinds=$(sed 's/^{"kind":"\([a-z]*\)","step":\([0-9]*\),.*/\1 \2/' "$dir/m.jsonl" | tr '\n' ,)
[ "$kinds" = "train 16,train 32,eval 32,train 48,train 64,eval 64," ] ||
    fail_metrics "metrics lines: $kinds"
tail -1 "$dir/m.jsonl" | grep -q '"samples":64,"dataset":"eval"}$' &&
    [ "$(tail -1 "$dir/m.jsonl" | sed 's/.*"accuracy":\([0-9.e-]*\),.*/\1/' |
         awk '{ printf "%.2f", 100 * $1 }')" = "$acc" ] || fail_metrics "the last eval line"
"$qtrain" run "$dir/r.recipe" --ref --metrics "$dir/m.jsonl" > "$dir/out" 2> "$dir/err"
[ $? -eq 1 ] && grep -q 'm.jsonl exists; qtrain does not replace files: .* pass --force' \
    "$dir/err" && ! grep -q '^steps ' "$dir/out" || fail_metrics "an existing file was not refused"
"$qtrain" run "$dir/r.recipe" --ref --metrics "$dir/m.jsonl" --force > "$dir/out" 2> "$dir/err" &&
    [ "$(wc -l < "$dir/m.jsonl")" -eq 4 ] || fail_metrics "--force did not replace the file"
"$qtrain" run "$dir/r.recipe" --ref --metrics-every 5 > "$dir/out" 2> "$dir/err"
[ $? -eq 2 ] && grep -q -- '--metrics-every needs --metrics FILE' "$dir/err" ||
    fail_metrics "--metrics-every alone"
rm -rf "$dir"
echo "PASS cli_progress_and_metrics"
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
# On the reference backend a run says how long it will take before its first step: the steps of
# each mode it will run and an h:mm:ss total.
out=$("$qtrain" run tests/recipes/synthetic_tiny.recipe --ref --steps 30 2>&1)
rc=$?
estimate=$(echo "$out" | grep 'about [0-9]*:[0-5][0-9]:[0-5][0-9] on the reference backend')
if [ $rc -eq 0 ] && echo "$estimate" | grep -q '(30 train steps at [0-9.]* ms, 4 eval steps at' &&
   [ "$(echo "$out" | grep -n 'about ' | cut -d: -f1)" -lt \
     "$(echo "$out" | grep -n '^train step' | head -1 | cut -d: -f1)" ]; then
    echo "PASS cli_run_reference_estimate ($(echo "$estimate" | sed 's/.*about \([^ ]*\).*/\1/'))"
else
    echo "FAIL cli_run_reference_estimate: exit $rc"
    echo "$out" | sed 's/^/  /'
    exit 1
fi
# `qtrain diff`: exit 0 for identical traces, 1 with the first difference, 2 for a bad file.
dir=$(mktemp -d)
header='qtrain-trace 2 recipe=0000000000000001 quantizers=0 checksum_every=0'
rec='mode=train flags=0x0:none loss=0x3f800000:1 accuracy=0x00000000:0'
rest='grad_norm=0x00000000:0 lr=0x3a83126f:0.00100000005 checksum=-'
printf '%s\nstep=0 %s %s\nstep=1 %s %s\nend status=complete records=2\n' "$header" "$rec" \
    "$rest" "$rec" "$rest" > "$dir/a"
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
recipes_verdict cli_plan_bench_recipes 8
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
# The interrupted run must stop before step $cap, which the resumed and the uninterrupted runs
# reach: the reference backend runs some 20000 of these small steps a second, so 0.1 s after the
# loop starts leaves a wide margin.
cap=20000
start_long_run() {  # waits until the loop runs (its trace file exists) and a little more
    rm -f "$dir/t"
    "$qtrain" run "$dir/long.recipe" --ref --trace "$dir/t" --save "$dir/$1" > "$dir/out" 2>&1 &
    pid=$!
    i=0
    while [ ! -e "$dir/t" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
    sleep 0.1
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
[ "$step" -lt $cap ] ||
    fail "cli_run_sigint_stops_saves_and_resumes: interrupted at step $step, after $cap"
"$qtrain" run "$dir/long.recipe" --ref --trace "$dir/t" --resume "$dir/ck" --steps $cap \
    > "$dir/out" 2>&1 ||
    fail "cli_run_sigint_stops_saves_and_resumes: the resumed run failed"
"$qtrain" run "$dir/long.recipe" --ref --trace "$dir/full" --steps $cap > "$dir/out" 2>&1 ||
    fail "cli_run_sigint_stops_saves_and_resumes: the uninterrupted run failed"
"$qtrain" diff "$dir/full" "$dir/t" > "$dir/out" 2>&1 ||
    fail "cli_run_sigint_stops_saves_and_resumes: resumed trace differs"
echo "PASS cli_run_sigint_stops_saves_and_resumes (interrupted at step $step)"
# Resumed into a new trace file: its records start at the checkpoint's step, and diff compares
# them with the whole trace from there.
"$qtrain" run "$dir/long.recipe" --ref --trace "$dir/new" --resume "$dir/ck" --steps $cap \
    > "$dir/out" 2>&1 || fail "cli_diff_resumed_trace_from_its_first_step: the resumed run failed"
"$qtrain" diff "$dir/full" "$dir/new" > "$dir/out" 2>&1 &&
    grep -q "^identical: $((cap + 4 - step)) records from step $step " "$dir/out" ||
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
[ $? -eq 1 ] && grep -q 'exists; qtrain does not replace files' "$dir/out" ||
    fail "cli_export: overwrite refused"
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
# ---------------------------------------------------------------------------------------------
# Nothing is lost, nothing blocks, every number and write is checked.
dir=$(mktemp -d)
tiny=tests/recipes/synthetic_tiny.recipe
# Numeric arguments: digits only, in range, each refusal naming the flag and the value.
bad=""
for args in "--steps 0" "--steps -1" "--steps 1e3" "--steps 0x10" "--checksum-every 4294967296" \
            "--save-every 0" "--seed 18446744073709551616"; do
    flag=${args%% *}
    value=${args#* }
    "$qtrain" run "$tiny" --ref --save "$dir/n.ckpt" "$flag" "$value" > "$dir/out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "$flag takes a whole number from .*, not '$value'" "$dir/out" &&
        ! grep -q '^steps ' "$dir/out" || bad="$bad [$args: exit $rc]"
done
"$qtrain" run "$tiny" --ref --steps ' -1' > "$dir/out" 2>&1
[ $? -eq 2 ] && grep -q -- "--steps takes a whole number from 1 to .*, not ' -1'" "$dir/out" ||
    bad="$bad [--steps ' -1']"
"$qtrain" plan "$tiny" --steps 0 > "$dir/out" 2>&1
[ $? -eq 2 ] && grep -q -- "leave the flag out" "$dir/out" || bad="$bad [plan --steps 0]"
if [ -z "$bad" ] && [ ! -e "$dir/n.ckpt" ]; then
    echo "PASS cli_numeric_arguments_range_checked"
else
    echo "FAIL cli_numeric_arguments_range_checked:$bad"
    exit 1
fi
# Output that cannot be written fails the command, stdout included.
bad=""
"$qtrain" plan "$tiny" > /dev/full 2> "$dir/out"
[ $? -eq 1 ] && grep -q 'qtrain plan: cannot write its output to standard output: No space' \
    "$dir/out" || bad="$bad plan;"
"$qtrain" run "$tiny" --ref --steps 2 > /dev/full 2> "$dir/out"
[ $? -eq 1 ] && grep -q 'qtrain run: cannot write its output' "$dir/out" || bad="$bad run;"
"$qtrain" info > /dev/full 2> "$dir/out"
[ $? -eq 1 ] && grep -q 'cannot write its output' "$dir/out" || bad="$bad info;"
if [ -z "$bad" ]; then
    echo "PASS cli_write_errors_fail_the_command"
else
    echo "FAIL cli_write_errors_fail_the_command:$bad"
    exit 1
fi
# FIFOs, directories and devices as inputs or outputs are refused at once, never waited on.
mkfifo "$dir/fifo"
sed "s|^train = .*|train = idx $dir/fifo $dir/fifo|" tests/recipes/mlp_fashion.recipe \
    > "$dir/fifo_data.recipe"
bad=""
check_refused() {  # WHAT ARGS...: exit 1 or 2 before the timeout, the message naming the kind
    what=$1
    shift
    timeout 20 "$qtrain" "$@" > "$dir/out" 2>&1
    rc=$?
    { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && grep -q "$what, not a regular file" "$dir/out" ||
        bad="$bad [$*: exit $rc: $(tail -1 "$dir/out")]"
}
check_refused 'fifo is a FIFO (named pipe)' plan "$dir/fifo"
check_refused 'fifo is a FIFO (named pipe)' run "$dir/fifo" --ref
check_refused 'fifo is a FIFO (named pipe)' plan "$dir/fifo_data.recipe"
check_refused 'fifo is a FIFO (named pipe)' diff "$dir/fifo" tests/cli.sh
check_refused 'fifo is a FIFO (named pipe)' diff tests/cli.sh "$dir/fifo"
check_refused 'fifo is a FIFO (named pipe)' plot "$dir/fifo" -o "$dir/p.svg"
check_refused 'fifo is a FIFO (named pipe)' run "$tiny" --ref --check "$dir/fifo"
check_refused 'fifo is a FIFO (named pipe)' run "$tiny" --ref --resume "$dir/fifo"
check_refused 'fifo is a FIFO (named pipe)' infer "$tiny" --ref --input "$dir/fifo" \
    --output "$dir/o.npy"
check_refused 'fifo is a FIFO (named pipe)' export "$dir/fifo" "$dir/w.safetensors"
check_refused 'tests is a directory' plan tests
check_refused '/dev/null is a character device' plan /dev/null
check_refused 'fifo is a FIFO (named pipe)' run "$tiny" --ref --trace "$dir/fifo" --force
check_refused 'fifo is a FIFO (named pipe)' run "$tiny" --ref --save "$dir/fifo" --force
check_refused '/dev/null is a character device' plot tests/cli.sh -o /dev/null --force
if [ -z "$bad" ]; then
    echo "PASS cli_inputs_and_outputs_of_the_wrong_kind_refused"
else
    echo "FAIL cli_inputs_and_outputs_of_the_wrong_kind_refused:$bad"
    exit 1
fi
# --trace replaces a trace, never another file without --force (the recipe itself included);
# --save replaces a file only with --force (or the checkpoint it resumes from).
cp "$tiny" "$dir/r.recipe"
cp "$tiny" "$dir/keep.txt"
cp "$tiny" "$dir/keep.ckpt"
bad=""
"$qtrain" run "$dir/r.recipe" --ref --steps 3 --trace "$dir/r.recipe" > "$dir/out" 2>&1
[ $? -eq 1 ] && grep -q 'r.recipe exists and is not a qtrain trace' "$dir/out" &&
    grep -q -- '--force' "$dir/out" && cmp -s "$tiny" "$dir/r.recipe" &&
    ! grep -q '^steps ' "$dir/out" || bad="$bad the recipe was not kept;"
"$qtrain" run "$tiny" --ref --steps 3 --trace "$dir/t1" > "$dir/out" 2>&1 &&
    "$qtrain" run "$tiny" --ref --steps 5 --trace "$dir/t1" > "$dir/out" 2>&1 &&
    grep -q '^end status=complete records=9$' "$dir/t1" || bad="$bad a trace was not replaced;"
"$qtrain" run "$tiny" --ref --steps 3 --trace "$dir/keep.txt" --force > "$dir/out" 2>&1 &&
    head -1 "$dir/keep.txt" | grep -q '^qtrain-trace 2 ' || bad="$bad --trace --force;"
"$qtrain" run "$tiny" --ref --steps 3 --save "$dir/keep.ckpt" > "$dir/out" 2>&1
[ $? -eq 1 ] && cmp -s "$tiny" "$dir/keep.ckpt" || bad="$bad --save replaced a file;"
"$qtrain" run "$tiny" --ref --steps 3 --save "$dir/keep.ckpt" --force > "$dir/out" 2>&1 &&
    head -c 8 "$dir/keep.ckpt" | grep -q QTRAINCK || bad="$bad --save --force;"
ls "$dir" | grep -q '\.tmp' && bad="$bad a temporary file was left;"
if [ -z "$bad" ]; then
    echo "PASS cli_outputs_replace_only_their_own_kind"
else
    echo "FAIL cli_outputs_replace_only_their_own_kind:$bad"
    sed 's/^/  /' "$dir/out" | tail -5
    exit 1
fi
# A killed run's trace has no completion record: diff tells it from a complete shorter run.
grep -v '^eval' "$tiny" | sed 's/^train 200 cosine/train 100000 cosine/' > "$dir/noeval.recipe"
"$qtrain" run "$dir/noeval.recipe" --ref --trace "$dir/killed.trace" > "$dir/killed.out" 2>&1 &
pid=$!
# The count is read once per turn and a missing file counts 0: testing the file's existence
# apart from the count would let a file created between the two tests end the wait at once.
i=0
records=0
while [ "$records" -lt 100 ] && [ $i -lt 600 ]; do
    sleep 0.05
    i=$((i + 1))
    records=$(grep -c '^step=' "$dir/killed.trace" 2>/dev/null)
    records=${records:-0}
done
kill -KILL $pid
wait $pid 2>/dev/null
records=$(grep -c '^step=' "$dir/killed.trace")
"$qtrain" run "$dir/noeval.recipe" --ref --steps 20 --trace "$dir/short.trace" > "$dir/out" 2>&1
"$qtrain" diff "$dir/short.trace" "$dir/killed.trace" > "$dir/out" 2>&1
rc=$?
if [ $rc -eq 1 ] && [ "$records" -ge 100 ] && tail -1 "$dir/short.trace" |
       grep -q '^end status=complete records=20$' &&
   grep -q '^A ends after 20 records (its run completed); B goes on with step=20$' "$dir/out" &&
   grep -q "^B is cut short: $records records.* and no completion record" "$dir/out"; then
    echo "PASS cli_diff_tells_a_killed_run_from_a_shorter_one ($records records)"
else
    echo "FAIL cli_diff_tells_a_killed_run_from_a_shorter_one: exit $rc, $records records"
    sed 's/^/  /' "$dir/out"
    echo "  the killed run printed:"
    sed 's/^/    /' "$dir/killed.out"
    exit 1
fi
# Memory: a run that cannot get its memory is refused before anything is allocated or written,
# with both numbers, the tightest limit, the largest regions and what to change.
printf '%s\n' '[model]' 'input = 262144' 'layer = linear fc1 262144' 'layer = relu' \
    'layer = linear head 4' 'loss = softmax_xent' '[quant]' 'recipe = bf16' '[optim]' 'adamw' \
    '[data]' 'train = synthetic classes inputs=262144 classes=4 samples=64 seed=3' \
    'batch = 16' '[schedule]' 'train 2' > "$dir/huge.recipe"
bad=""
"$qtrain" run "$dir/huge.recipe" --trace "$dir/huge.trace" > "$dir/out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q 'QT_ERR_MEMORY: not enough \(host\|GPU\) memory: .* needs [0-9]* bytes' \
    "$dir/out" && grep -q 'largest regions: fc1.weight' "$dir/out" &&
    grep -q 'to fit, change the recipe: a smaller `batch`' "$dir/out" &&
    grep -q '; or `recompute` on the activations at lines 4 (backward keeps their outputs' \
        "$dir/out" && [ ! -e "$dir/huge.trace" ] ||
    bad="$bad [huge: exit $rc: $(tail -1 "$dir/out")]"
# No `recompute` hint where it is set already, or where the next linear's input is quantized.
for change in 's/^layer = relu$/layer = relu recompute/' 's/^recipe = bf16$/recipe = current/'; do
    sed "$change" "$dir/huge.recipe" > "$dir/huge2.recipe"
    "$qtrain" run "$dir/huge2.recipe" > "$dir/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q 'to fit, change the recipe' "$dir/out" &&
        ! grep -q 'or `recompute`' "$dir/out" ||
        bad="$bad [$change: exit $rc: $(tail -1 "$dir/out")]"
done
sed 's/262144/8192/g' "$dir/huge.recipe" > "$dir/mid.recipe"
(ulimit -v 1000000 && "$qtrain" run "$dir/mid.recipe" --ref) > "$dir/out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q 'can get [0-9]* bytes (.*; the tightest limit: RLIMIT_AS (ulimit -v)' \
    "$dir/out" || bad="$bad [ulimit -v: exit $rc: $(tail -1 "$dir/out")]"
# Two 16-byte IDX files that claim 2^31 samples: truncated files, not a memory shortage.
printf '\000\000\010\003\200\000\000\000\000\000\000\034\000\000\000\034' > "$dir/im16"
printf '\000\000\010\001\200\000\000\000\001\002\003\004\005\006\007\010' > "$dir/lb16"
sed "s|^train = .*|train = idx $dir/im16 $dir/lb16|; /^eval = /d; /^eval /d" \
    tests/recipes/mlp_fashion.recipe > "$dir/claims.recipe"
"$qtrain" run "$dir/claims.recipe" --ref > "$dir/out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q 'im16: truncated: its header announces 2147483648 images of 28 x 28' \
    "$dir/out" && ! grep -q 'QT_ERR_MEMORY' "$dir/out" ||
    bad="$bad [2^31 samples: exit $rc: $(tail -1 "$dir/out")]"
if [ -z "$bad" ]; then
    echo "PASS cli_memory_checked_before_allocation"
else
    echo "FAIL cli_memory_checked_before_allocation:$bad"
    exit 1
fi
# --gpus: what every rank would refuse is said once by the launcher, before any worker starts
# (no GPU needed); plan --gpus prints every rank's arena, each holding part of the masters and
# moments; the workers' own flags need each other.
bad=""
"$qtrain" run "$tiny" --gpus 3 > "$dir/out" 2>&1
[ $? -eq 1 ] && grep -q 'batch 16 is the global batch of 3 GPUs.*divisible by 3 (e.g. 18)' \
    "$dir/out" || bad="$bad [batch: $(tail -1 "$dir/out")]"
"$qtrain" run "$tiny" --gpus 2 --ref > "$dir/out" 2>&1
[ $? -eq 2 ] && grep -q 'drop one of them' "$dir/out" || bad="$bad [--ref: $(tail -1 "$dir/out")]"
"$qtrain" run "$tiny" --gpus 0 > "$dir/out" 2>&1
[ $? -eq 2 ] || bad="$bad [--gpus 0 taken]"
"$qtrain" run "$tiny" --rank 1 > "$dir/out" 2>&1
[ $? -eq 2 ] && grep -q 'needs --world and --parallel-id' "$dir/out" ||
    bad="$bad [--rank alone: $(tail -1 "$dir/out")]"
"$qtrain" plan "$tiny" --gpus 2 --summary > "$dir/out" 2>&1
rc=$?
mib() { sed -n "s/^  $1 .* $2 \([0-9.]*\) .*/\1/p" "$dir/out"; }
[ $rc -eq 0 ] && grep -q '^rank 0 of 2 GPUs:' "$dir/out" && grep -q '^  rank 1 ' "$dir/out" &&
    grep -q '(batch 8)' "$dir/out" && grep -q '^  one GPU .*(batch 16)' "$dir/out" ||
    bad="$bad [plan --gpus: exit $rc]"
"$qtrain" plan recipes/bench/resmlp_current_b16k.recipe --gpus 2 --summary > "$dir/out" 2>&1
r0=$(mib 'rank 0' optim) r1=$(mib 'rank 1' optim) one=$(mib 'one GPU' optim)
awk "BEGIN { exit !($r0 < $one && $r1 < $one && $r0 + $r1 >= $one * 0.999) }" 2>/dev/null ||
    bad="$bad [moments per rank: $r0 + $r1 of $one MiB]"
# plan --rank R: rank R's own plan (its updates and sends differ from rank 0's); a rank of no
# such run is refused.
"$qtrain" plan "$tiny" --gpus 2 > "$dir/plan0" 2>&1
"$qtrain" plan "$tiny" --gpus 2 --rank 1 > "$dir/out" 2>&1
rc=$?
train_ops() { sed -n 's/^program train: \([0-9]*\) ops.*/\1/p' "$1"; }
[ $rc -eq 0 ] && grep -q '^rank 1 of 2 GPUs:' "$dir/out" &&
    [ "$(train_ops "$dir/out")" != "$(train_ops "$dir/plan0")" ] ||
    bad="$bad [plan --rank 1: exit $rc, train ops $(train_ops "$dir/out") and rank 0's $(train_ops "$dir/plan0")]"
"$qtrain" plan "$tiny" --gpus 2 --rank 2 > "$dir/out" 2>&1
[ $? -eq 2 ] && grep -q -- '--rank 2 needs --gpus above it' "$dir/out" ||
    bad="$bad [plan --rank 2 of 2: $(tail -1 "$dir/out")]"
"$qtrain" plan "$tiny" --rank 1 > "$dir/out" 2>&1
[ $? -eq 2 ] || bad="$bad [plan --rank without --gpus taken]"
# The capture lines of the b16k recipe's plan on 2 GPUs, with the defaults and with
# QTRAIN_MARGIN_BESIDE=0 QTRAIN_COMM_WIDE=0: the wide GEMMs between the collectives that leave
# SMs to NCCL, fewer than all of them by default (the wgrads whose gradients the next collective
# reduces run alone) and all at 0; and the collectives after the last wide GEMM (the last
# reductions, the norm's gather, the broadcasts), counted, on the uncapped communicator by
# default and capped at 0.
margins() { sed -n 's/^graph capture: wide GEMMs .* train \([0-9]*\) (\([0-9]*\) leave.*/\1 \2/p' "$dir/out"; }
alone() { sed -n 's/^graph capture: collectives after the last wide GEMM: train \([0-9]*\) (\(.\).*/\1 \2/p' "$dir/out"; }
"$qtrain" plan recipes/bench/resmlp_current_b16k.recipe --gpus 2 > "$dir/out" 2>&1
some=$(margins)
uncapped=$(alone)
QTRAIN_MARGIN_BESIDE=0 QTRAIN_COMM_WIDE=0 "$qtrain" plan recipes/bench/resmlp_current_b16k.recipe \
    --gpus 2 > "$dir/out" 2>&1
all=$(margins)
capped=$(alone)
# "window margin" pairs: the window the same, the margin lower by default and whole at 0.
[ -n "$all" ] && [ -n "$some" ] && [ "${all% *}" = "${all#* }" ] &&
    [ "${some% *}" = "${all% *}" ] && [ "${some#* }" -lt "${all#* }" ] ||
    bad="$bad [wide GEMMs and those leaving the margin: '$some', with QTRAIN_MARGIN_BESIDE=0 '$all']"
[ -n "$capped" ] && [ "${capped% *}" -gt 0 ] && [ "${capped#* }" = c ] &&
    [ "$uncapped" = "${capped% *} o" ] ||
    bad="$bad [collectives after the last wide GEMM: '$uncapped', with QTRAIN_COMM_WIDE=0 '$capped']"
# Eval and infer rows alone are planned on several GPUs (no moments: every master on every rank);
# qtrain infer runs on one GPU and says where infer rows run on several.
sed 's/^train 200 .*$/infer all output=never.npy/' "$tiny" > "$dir/rows.recipe"
"$qtrain" plan "$dir/rows.recipe" --gpus 2 --summary > "$dir/out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q 'no train steps: every master on every rank' "$dir/out" &&
    grep -q '0 train, 4 eval, 4 infer steps' "$dir/out" ||
    bad="$bad [plan --gpus of eval and infer rows: exit $rc: $(tail -1 "$dir/out")]"
"$qtrain" infer "$tiny" --input "$dir/none.npy" --output "$dir/none_out.npy" --gpus 2 \
    > "$dir/out" 2>&1
[ $? -eq 2 ] && grep -q 'qtrain infer runs on one GPU.*qtrain run RECIPE --gpus N' "$dir/out" ||
    bad="$bad [infer --gpus: $(tail -1 "$dir/out")]"
if [ -z "$bad" ]; then
    echo "PASS cli_gpus_refusals_and_plan"
else
    echo "FAIL cli_gpus_refusals_and_plan:$bad"
    exit 1
fi
# --profile-rank R: rank R prints --profile's report, after rank 0's summary. Its refusals need no
# GPU; the report needs two.
bad=""
"$qtrain" run "$tiny" --gpus 2 --profile-rank 1 > "$dir/out" 2>&1
[ $? -eq 2 ] && grep -q -- '--profile-rank 1 needs --profile and --gpus above it' "$dir/out" ||
    bad="$bad [without --profile: $(tail -1 "$dir/out")]"
"$qtrain" run "$tiny" --gpus 2 --profile --profile-rank 2 > "$dir/out" 2>&1
[ $? -eq 2 ] || bad="$bad [--profile-rank 2 of 2 taken]"
"$qtrain" run "$tiny" --profile --profile-rank 0 > "$dir/out" 2>&1
[ $? -eq 2 ] || bad="$bad [--profile-rank without --gpus taken]"
# A worker gets the launcher's arguments with --world N in place of --gpus N: rank 1 of 2 is
# within them (on the CPU it stops later, at the driver or NCCL).
hex=$(printf '%0256d' 0)
"$qtrain" run "$tiny" --profile --profile-rank 1 --world 2 --parallel-id "$hex" --rank 1 \
    > "$dir/out" 2>&1
! grep -q -- '--profile-rank 1 needs' "$dir/out" || bad="$bad [a worker refused --profile-rank 1]"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
skip=""
if [ "${gpus:-0}" -lt 2 ]; then
    skip="rank 1's report needs two GPUs"
else
    "$qtrain" run "$tiny" --gpus 2 --steps 20 --profile --profile-rank 1 > "$dir/out" 2>&1
    rc=$?
    if grep -q 'no NCCL: cannot load' "$dir/out"; then
        skip="no NCCL library (set QTRAIN_NCCL)"
    else
        # The summary's step time, then rank 1's header, then one timeline of the train program.
        order=$(grep -n -e '^step time ' -e '^profile of rank 1 of 2 GPUs' -e '^timeline train' \
            "$dir/out" | cut -d: -f2 | cut -c1-10 | tr '\n' '|')
        [ $rc -eq 0 ] && [ "$order" = "step time |profile of|timeline t|" ] ||
            bad="$bad [--gpus 2 --profile --profile-rank 1: exit $rc, lines '$order']"
    fi
fi
if [ -n "$bad" ]; then
    echo "FAIL cli_profile_rank:$bad"
    exit 1
elif [ -n "$skip" ]; then
    echo "SKIP cli_profile_rank: $skip (its refusals passed)"
else
    echo "PASS cli_profile_rank"
fi
# A rank that fails after the others started ends the run within seconds: rank 0 cannot open its
# trace (a folder that is not there), tells the launcher and aborts its communicators; the launcher
# ends rank 1, which would wait for rank 0 in its next collective, and exits with rank 0's status.
bad=""
skip=""
if [ "${gpus:-0}" -lt 2 ]; then
    skip="needs two GPUs"
else
    start=$(date +%s)
    timeout 120 "$qtrain" run "$tiny" --gpus 2 --trace "$dir/not/there/run.trace" \
        > "$dir/out" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    if grep -q 'no NCCL: cannot load' "$dir/out"; then
        skip="no NCCL library (set QTRAIN_NCCL)"
    elif [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $took -gt 60 ] ||
        ! grep -q 'not/there/run.trace' "$dir/out"; then
        bad=" exit $rc after $took s: $(tail -1 "$dir/out")"
    fi
fi
if [ -n "$bad" ]; then
    echo "FAIL cli_gpus_failed_rank_ends_the_run:$bad"
    exit 1
elif [ -n "$skip" ]; then
    echo "SKIP cli_gpus_failed_rank_ends_the_run: $skip"
else
    echo "PASS cli_gpus_failed_rank_ends_the_run (exit $rc after $took s)"
fi
# Invisible characters in quoted text are shown escaped.
printf '\357\273\277[model]\ninput = 4\n' > "$dir/bom.recipe"
printf '[model]\ninput\302\240= 4\n' > "$dir/nbsp.recipe"
printf '[model]\rinput = 4\r' > "$dir/cr.recipe"
bad=""
"$qtrain" plan "$dir/bom.recipe" 2>&1 | grep -q "found '<U+FEFF>\[model\]'" || bad="$bad BOM;"
"$qtrain" plan "$dir/nbsp.recipe" 2>&1 | grep -q "unknown key 'input<U+00A0>'" || bad="$bad NBSP;"
"$qtrain" plan "$dir/cr.recipe" 2>&1 | grep -q 'cr.recipe:1:8: .*0x0D' || bad="$bad CR;"
"$qtrain" plan "$tiny" "$(printf 'x\302\240\r')" 2>&1 |
    grep -q "unexpected argument 'x<U+00A0>\\\\r'" || bad="$bad argument;"
if [ -z "$bad" ]; then
    echo "PASS cli_invisible_characters_escaped"
else
    echo "FAIL cli_invisible_characters_escaped:$bad"
    exit 1
fi
rm -rf "$dir"
# The summary's expert loads: each moe layer's tokens per expert in the last train step, read
# after the loop; they sum to batch x topk. Labels skewed by zipf= (class centers far apart, so
# each class's tokens go to the same experts) load the busiest expert clearly more than the
# balanced labels of the same recipe do; a model without moe layers prints no such line.
dir=$(mktemp -d)
loads_recipe() {  # ZIPF_OPTION: a small moe block on 16 classes, one train step
    printf '[model]\ninput = 32\nlayer = residual begin\nlayer = rmsnorm\nlayer = moe moe '
    printf 'experts=8 topk=2 hidden=16 act=swiglu aux=0.01\nlayer = residual end\n'
    printf 'layer = linear head 16\nloss = softmax_xent\n[quant]\nrecipe = bf16\n[optim]\n'
    printf 'adamw lr=1e-3\n[data]\ntrain = synthetic classes inputs=32 classes=16 '
    printf 'samples=2048 spread=20%s\nbatch = 512\nseed = 1\n[schedule]\ntrain 1\n' "$1"
}
loads_recipe '' > "$dir/balanced.recipe"
loads_recipe ' zipf=2' > "$dir/skewed.recipe"
bad=""
for which in balanced skewed; do
    "$qtrain" run "$dir/$which.recipe" --ref > "$dir/$which.out" 2>&1 || bad="$bad [$which: exit $?]"
    # The ratio, and the counts' sum and number.
    lead='^experts      moe: max [0-9]* = \([0-9.]*\) x mean 128.0'
    rest='(512 tokens x top-2 over 8 experts, last train step)$'
    ratio=$(sed -n "s/$lead $rest/\\1/p" "$dir/$which.out")
    sum=$(sed -n 's/^ *tokens //p' "$dir/$which.out" |
          awk '{ for (i = 1; i <= NF; i++) s += $i; n += NF } END { print s "/" n }')
    [ -n "$ratio" ] && [ "$sum" = "1024/8" ] || bad="$bad [$which: ratio '$ratio', sum/count $sum]"
    eval "ratio_$which=\${ratio:-0}"
done
awk "BEGIN { exit !($ratio_skewed >= 2 && $ratio_skewed > $ratio_balanced + 0.5) }" ||
    bad="$bad [max/mean skewed $ratio_skewed, balanced $ratio_balanced]"
"$qtrain" run tests/recipes/synthetic_tiny.recipe --ref --steps 2 > "$dir/mlp.out" 2>&1 &&
    grep -q '^arena bytes' "$dir/mlp.out" && ! grep -q '^experts' "$dir/mlp.out" ||
    bad="$bad [a model without moe layers: an experts line, or no summary]"
if [ -z "$bad" ]; then
    echo "PASS cli_expert_loads (max/mean $ratio_balanced balanced, $ratio_skewed with zipf=2)"
else
    echo "FAIL cli_expert_loads:$bad"
    cat "$dir/balanced.out" "$dir/skewed.out" | sed 's/^/  /' | tail -20
    rm -rf "$dir"
    exit 1
fi
rm -rf "$dir"
