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
