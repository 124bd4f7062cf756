#!/bin/sh
# Every kernel waits for the kernel ahead of it before it touches memory. The runtime launches
# kernels with programmatic stream serialization on compute capability 9.0 (ptx/grid_order.h), so
# a kernel whose first global access comes before griddepcontrol.wait would read its inputs while
# they are still being written. This reads the sm_90a PTX that the build keeps beside the
# fatbins and checks, entry by entry, that griddepcontrol.wait is there and comes before the first
# global load, store, atomic, asynchronous copy or tensor-map access in the entry's text.
# Usage: grid_order.sh build/ptx
dir=${1:?usage: grid_order.sh PTX_FOLDER}
set -- "$dir"/*.ptx
if [ ! -f "$1" ]; then
    echo "FAIL kernels_wait_for_their_predecessor: no PTX under $dir"
    exit 1
fi
report=$(awk '
    /^\.(visible )?\.entry / || /^\.entry / {
        if (name != "") finish()
        name = $0; sub(/.*\.entry /, "", name); sub(/\(.*/, "", name)
        waited = 0; early = ""; entries++
        next
    }
    name != "" && /griddepcontrol\.wait/ { waited = 1 }
    name != "" && !waited && early == "" &&
        /(ld|st|atom|red)(\.[a-z0-9]+)*\.global|cp\.async|cp\.reduce\.async|tensormap/ {
        early = $0; sub(/^[ \t]+/, "", early)
    }
    function finish() {
        if (!waited) print "  " name ": no griddepcontrol.wait"
        else if (early != "") print "  " name ": touches memory first: " early
        name = ""
    }
    END { if (name != "") finish(); print "entries " entries }
' "$@")
entries=$(echo "$report" | sed -n 's/^entries //p')
bad=$(echo "$report" | grep -v '^entries ')
if [ -n "$bad" ] || [ "${entries:-0}" -lt 60 ]; then
    echo "FAIL kernels_wait_for_their_predecessor ($entries entries):"
    echo "$bad"
    exit 1
fi
echo "PASS kernels_wait_for_their_predecessor ($entries entries in $# PTX files)"
