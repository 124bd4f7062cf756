#!/bin/sh
# Tidy: every C, CUDA and header source keeps lines within 100 columns, has no trailing
# whitespace and no tabs. Prints one PASS/FAIL line per rule.
cd "$(dirname "$0")/.." || exit 1
# Tracked and untracked (not ignored) sources that exist: a copy of the tree whose index lags
# its files (a synced copy, files moved since) must check the files that are there.
files=$(git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' 2>/dev/null |
    while read -r f; do [ -f "$f" ] && echo "$f"; done)
[ -n "$files" ] || files=$(find runtime arena recipes ptx tests tools -name '*.[ch]' -o -name '*.cu')
status=0
check() {
    name=$1
    shift
    hits=$("$@" $files | head -5)
    if [ -n "$hits" ]; then
        echo "FAIL tidy_$name:"
        echo "$hits" | sed 's/^/  /'
        status=1
    else
        echo "PASS tidy_$name"
    fi
}
check line_length awk 'length($0) > 100 { print FILENAME ":" FNR ": " length($0) " columns" }'
check trailing_whitespace grep -n '[[:space:]]$'
check no_tabs grep -n "$(printf '\t')"
# The API's clients build with -Iruntime -Itools (build.ninja's cc_client), so a header there
# named like a system header (sched.h, time.h) would silently replace it for them; the rest of
# the tree is reached by paths from the repository root (tests/deps.sh).
shadow=""
for h in $(echo "$files" | grep '\.h$'); do
    base=$(basename "$h")
    for dir in /usr/include /usr/include/x86_64-linux-gnu /usr/local/cuda/include; do
        [ -e "$dir/$base" ] && shadow="$shadow $h (shadows $dir/$base)"
    done
done
if [ -n "$shadow" ]; then
    echo "FAIL tidy_no_system_header_names:$shadow"
    status=1
else
    echo "PASS tidy_no_system_header_names"
fi
exit $status
