#!/bin/sh
# Tidy: every C, CUDA and header source keeps lines within 100 columns, has no trailing
# whitespace and no tabs. Prints one PASS/FAIL line per rule.
cd "$(dirname "$0")/.." || exit 1
files=$(git ls-files '*.c' '*.h' '*.cu' 2>/dev/null)
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
exit $status
