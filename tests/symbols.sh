#!/bin/sh
# The library's interface and its state: the shared library exports exactly the functions that
# runtime/qtrain.h declares with QT_API (each starts with qt_), no object of the archive holds
# writable static data but the process's two shared services, so that runtimes share nothing
# else, and the CLI includes no internal header. The two: the driver's entry-point table, filled
# once per process (runtime/driver/driver.c), and the reference backend's thread pool with its
# per-thread GEMM scratch (runtime/base/pool.c, runtime/ref/ref_gemm.c), whose callers take turns and
# whose results do not depend on the thread that computes them.
# Usage: symbols.sh build/libqtrain.so build/libqtrain.a
so=${1:?usage: symbols.sh LIBRARY.so LIBRARY.a}
archive=${2:?usage: symbols.sh LIBRARY.so LIBRARY.a}
header="$(dirname "$0")/../runtime/qtrain.h"
status=0
for f in "$so" "$archive" "$header"; do
    if [ ! -f "$f" ]; then
        echo "FAIL library_exports_only_the_public_api: $f not found"
        exit 1
    fi
done

declared=$(grep '^QT_API' "$header" | grep -o 'qt_[a-z0-9_]*(' | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$so" | awk '{print $3}' | sort -u)
not_qt=$(echo "$exported" | grep -v '^qt_')
undeclared=$(echo "$exported" | grep '^qt_' | while read -r s; do
    echo "$declared" | grep -qx "$s" || echo "$s"
done)
missing=$(echo "$declared" | while read -r s; do
    echo "$exported" | grep -qx "$s" || echo "$s"
done)
count=$(echo "$declared" | grep -c .)
if [ -n "$not_qt" ] || [ -n "$undeclared" ] || [ -n "$missing" ] || [ "$count" -lt 20 ]; then
    echo "FAIL library_exports_only_the_public_api:"
    [ -n "$not_qt" ] && echo "$not_qt" | sed 's/^/  exported without the qt_ prefix: /'
    [ -n "$undeclared" ] && echo "$undeclared" | sed 's/^/  exported but not in qtrain.h: /'
    [ -n "$missing" ] && echo "$missing" | sed 's/^/  declared in qtrain.h but not exported: /'
    [ "$count" -lt 20 ] && echo "  only $count QT_API functions read from $header"
    status=1
else
    echo "PASS library_exports_only_the_public_api ($count functions)"
fi

# Writable data with static storage (.data and .bss; read-only tables live in .rodata and
# .data.rel.ro, the per-thread error message in .tbss).
writable=$(objdump -t "$archive" | awk '
    /^[^ ]+\.o:/ { object = $1 }
    $3 == "O" && ($4 ~ /^\.(data|bss)(\.|$)/) && $4 !~ /rel\.ro/ { print object " " $NF }')
allowed='^(driver\.o: (drv|driver_once|driver_status|driver_message)|pool\.o: pool|'
allowed="${allowed}nccl_lib\.o: (nccl|nccl_once|nccl_status|nccl_message|nccl_found)|"
allowed="${allowed}ref_gemm\.o: ref_gemm_scratch_of)\$"
unexpected=$(echo "$writable" | grep . | grep -Ev "$allowed")
seen=$(echo "$writable" | grep -Ec "$allowed")
if [ -n "$unexpected" ] || [ "$seen" -ne 11 ]; then
    echo "FAIL library_has_no_shared_mutable_state:"
    [ -n "$unexpected" ] && echo "$unexpected" | sed 's/^/  writable static: /'
    [ "$seen" -ne 11 ] &&
        echo "  expected the driver's 4 and NCCL's 5 once-written statics and the pool's 2," \
            "read $seen"
    status=1
else
    echo "PASS library_has_no_shared_mutable_state (the driver's and NCCL's tables and the thread pool alone)"
fi
# The CLI is the API's first client: of the library's headers it includes runtime/qtrain.h alone
# (plot.h and bench_main.h are tools/ headers that name those commands' entry points; launch.h
# the launcher's process handling, which uses no library header).
cli="$(dirname "$0")/../tools/qtrain.c"
included=$(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$cli")
internal=$(echo "$included" | grep -vx 'qtrain.h\|plot.h\|bench_main.h\|launch.h')
if [ -n "$internal" ] || ! echo "$included" | grep -qx 'qtrain.h'; then
    echo "FAIL cli_includes_only_the_public_header:"
    echo "$internal" | sed 's/^/  tools\/qtrain.c includes /'
    status=1
else
    echo "PASS cli_includes_only_the_public_header"
fi
exit $status
