#!/bin/sh
# The command-line tool's error paths under valgrind's leak checker: every refusal and failure,
# before and after the arenas and the datasets are allocated, exits with its status and leaves
# no block allocated that nothing points to (definite or indirect leaks), and no invalid read or
# write. On the reference backend (--ref), so that no GPU driver runs under valgrind. Without
# valgrind (.ci/run installs it) the test is skipped. Run from the repository root.
qtrain=${1:-build/qtrain}
if ! command -v valgrind > /dev/null 2>&1; then
    echo "SKIP cli_error_paths_leak_nothing: valgrind is not installed (apt-get install valgrind)"
    exit 0
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tiny=tests/recipes/synthetic_tiny.recipe
cp "$tiny" "$dir/not_a_trace"
printf 'qtrain-trace 2 recipe=0000000000000001 quantizers=0 checksum_every=100\n' > "$dir/other"
echo 'end status=complete records=0' >> "$dir/other"
mkfifo "$dir/fifo"
printf '%s\n' '[model]' 'input = 262144' 'layer = linear fc1 262144' 'layer = relu' \
    'layer = linear head 4' 'loss = softmax_xent' '[quant]' 'recipe = bf16' '[optim]' 'adamw' \
    '[data]' 'train = synthetic classes inputs=262144 classes=4 samples=16 seed=3' \
    'batch = 16' '[schedule]' 'train 2' > "$dir/huge.recipe"
failures=""
count=0
# EXPECTED-EXIT ARGS...: runs qtrain ARGS under valgrind; 99 is valgrind's own (a leak or an
# invalid access).
check() {
    expected=$1
    shift
    count=$((count + 1))
    valgrind -q --leak-check=full --show-leak-kinds=definite,indirect \
        --errors-for-leak-kinds=definite,indirect --error-exitcode=99 \
        "$qtrain" "$@" > "$dir/out" 2>&1
    rc=$?
    if [ $rc -ne "$expected" ]; then
        failures="$failures
  [$*]: exit $rc, expected $expected:
$(grep -v '^==[0-9]*== *$' "$dir/out" | tail -12 | sed 's/^/    /')"
    fi
}
check 2 run
check 2 run "$tiny" --ref --steps 0
check 1 run "$dir/missing.recipe" --ref
check 1 plan "$dir/fifo"
check 1 run "$dir/huge.recipe" --ref                          # memory: before anything
check 1 run "$tiny" --ref --trace "$dir/not_a_trace"           # after the datasets
check 1 infer "$tiny" --ref --input "$dir/missing.npy" --output "$dir/o.npy"
check 1 run "$tiny" --ref --resume "$dir/not_a_trace"          # after the arenas
check 1 run "$tiny" --ref --check "$dir/other"                 # inside the loop
check 2 diff "$dir/not_a_trace" "$dir/other"
check 1 plot "$dir/not_a_trace" -o "$dir/p.svg"
check 1 export "$dir/not_a_trace" "$dir/w.safetensors"
if [ -z "$failures" ]; then
    echo "PASS cli_error_paths_leak_nothing ($count error paths under valgrind)"
else
    echo "FAIL cli_error_paths_leak_nothing:$failures"
    exit 1
fi
