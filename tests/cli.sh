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
