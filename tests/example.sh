#!/bin/sh
# The example embedder (tools/example_push.c) builds against the public header alone (a folder
# that holds a copy of runtime/qtrain.h and nothing else) with warnings as errors, links the
# static library and then the shared one, and trains on the reference backend: the loss falls
# and the trained model classifies the last batch.
# Usage: example.sh build/libqtrain.a build/libqtrain.so
archive=${1:?usage: example.sh LIBRARY.a LIBRARY.so}
shared=${2:?usage: example.sh LIBRARY.a LIBRARY.so}
root="$(cd "$(dirname "$0")/.." && pwd)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/include"
cp "$root/runtime/qtrain.h" "$dir/include/"
flags="-std=c11 -O2 -Wall -Wextra -Werror -pedantic -Wshadow -Wstrict-prototypes"
# shellcheck disable=SC2086
if ! out=$(gcc $flags -I"$dir/include" "$root/tools/example_push.c" "$archive" \
        -ldl -lm -lpthread -lz -o "$dir/static" 2>&1) ||
   ! out=$(gcc $flags -I"$dir/include" "$root/tools/example_push.c" \
        -L"$(dirname "$shared")" -lqtrain -o "$dir/shared" 2>&1); then
    echo "FAIL example_builds_against_the_public_header_alone:"
    echo "$out" | sed 's/^/  /'
    exit 1
fi
echo "PASS example_builds_against_the_public_header_alone"
check_run() {
    name=$1
    shift
    if ! out=$("$@" --ref 2>&1); then
        echo "FAIL $name: exit $?"
        echo "$out" | sed 's/^/  /'
        return 1
    fi
    first=$(echo "$out" | sed -n 's/^step   0 loss //p')
    last=$(echo "$out" | sed -n 's/^step  99 loss //p')
    correct=$(echo "$out" | sed -n 's/^classified \([0-9]*\) of 32.*/\1/p')
    if [ -n "$first" ] && [ -n "$last" ] && [ -n "$correct" ] &&
       awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f / 4) }' && [ "$correct" -ge 30 ]
    then
        echo "PASS $name (loss $first -> $last, $correct of 32)"
    else
        echo "FAIL $name: expected the loss to fall fourfold and 30 of 32 classified"
        echo "$out" | sed 's/^/  /'
        return 1
    fi
}
status=0
check_run example_trains_pushed_batches_static "$dir/static" || status=1
LD_LIBRARY_PATH="$(cd "$(dirname "$shared")" && pwd)" \
    check_run example_trains_pushed_batches_shared "$dir/shared" || status=1
exit $status
