#!/bin/sh
# Dependencies: the rules that keep the layout one way. Prints one PASS/FAIL line per rule.
#
#   deps_includes_qualified  every #include "..." names a file by its path from the repository
#                            root ("runtime/base/status.h", "ptx/core.h"); the public API's
#                            clients (the sources build.ninja compiles with cc_client, whose only
#                            include folders are runtime/ and tools/) include "qtrain.h" and
#                            their own folder's headers by name instead.
#   deps_groups_known        every file of the library and ptx/ is in a group of the table below
#                            (runtime/ holds only qtrain.h, api.c and the group folders).
#   deps_one_way             a file includes only its own group and the groups the table lets it.
#   deps_no_cycles           no cycle between units: a unit is a .c and the .h of the same name
#                            (X_impl.h, a header private to X's files, belongs to X).
#   deps_function_length     no function body longer than the limit of its folder (below).
cd "$(dirname "$0")/.." || exit 1
# Tracked and untracked (not ignored) sources that exist: a copy of the tree whose index lags
# its files (a synced copy, files moved since) must check the files that are there.
files=$(git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' 2>/dev/null |
    while read -r f; do [ -f "$f" ] && echo "$f"; done)
[ -n "$files" ] || files=$(find runtime arena recipes ptx tests tools -name '*.[ch]' -o -name '*.cu')
status=0
report_prefix=deps_
. tests/report.sh

# The groups, lowest first, and the groups each may include besides its own. ptx/ is device code
# and the headers it shares with the host; runtime/qtrain.h the public header (it includes none).
groups='
public   -
ptx      -
base     public
arena    base public
recipes  base public ptx
io       recipes base public ptx
driver   base public ptx
program  driver arena base public ptx
parallel program driver arena base public ptx
ops      program driver arena recipes base public ptx
ref      parallel driver base public ptx
backend  ref parallel program driver arena base public ptx
model    ops parallel program driver io recipes arena base public ptx
schedule backend model ops parallel program driver io recipes arena base public ptx
run      schedule backend model ops parallel program driver io recipes arena base public ptx
api      run schedule backend model ops parallel program driver io recipes arena base public ptx
'
# The group of a path: runtime/<group>/..., arena/, recipes/, ptx/; tests/ and tools/ have none
# (they may include anything their build gives them).
group_of() {
    case $1 in
    runtime/qtrain.h) echo public ;;
    runtime/api.c) echo api ;;
    runtime/*/*) p=${1#*/}; echo "${p%%/*}" ;;
    runtime/*) echo "?" ;;
    arena/* | recipes/* | ptx/*) echo "${1%%/*}" ;;
    *) echo "" ;;
    esac
}

clients=$(sed -n 's/^build [^:]*: cc_client \([^ ]*\).*/\1/p' build.ninja)
# "file included" pairs, one a line.
pairs=$(for f in $files; do
    sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" |
        sed "s|^|$f |"
done)

unqualified=""
edges=""
old_ifs=$IFS
IFS='
'
for pair in $pairs; do
    f=${pair%% *}
    inc=${pair#* }
    if echo "$files" | grep -qxF -- "$inc"; then
        edges="$edges$f $inc
"
        continue
    fi
    if echo "$clients" | grep -qxF -- "$f"; then
        dir=$(dirname "$f")
        [ "$inc" = qtrain.h ] && continue
        case $inc in */*) ;; *) [ -f "$dir/$inc" ] && continue ;; esac
    fi
    unqualified="$unqualified$f: #include \"$inc\"
"
done
IFS=$old_ifs
report includes_qualified "$(printf '%s' "$unqualified" | sed '/^$/d')"

unknown=""
for f in $files; do
    g=$(group_of "$f")
    [ -z "$g" ] && continue
    echo "$groups" | grep -q "^$g " || unknown="$unknown$f (group '$g' is not in the table)
"
done
report groups_known "$(printf '%s' "$unknown" | sed '/^$/d')"

wrong=""
IFS='
'
for e in $edges; do
    f=${e%% *}
    inc=${e#* }
    gf=$(group_of "$f")
    gi=$(group_of "$inc")
    [ -z "$gf" ] || [ "$gf" = "$gi" ] && continue
    allowed=$(echo "$groups" | sed -n "s/^$gf  *//p")
    case " $allowed " in *" $gi "*) continue ;; esac
    wrong="$wrong$f ($gf) includes $inc ($gi)
"
done
IFS=$old_ifs
report one_way "$(printf '%s' "$wrong" | sed '/^$/d')"

# Units: the path without its extension, X_impl folded into X. tsort names every cycle it meets.
unit_edges=$(printf '%s' "$edges" | sed -E 's/\.(c|h|cu)( |$)/\2/g; s/_impl( |$)/\1/g' |
    awk '$1 != $2')
cycles=$(printf '%s\n' "$unit_edges" | tsort 2>&1 >/dev/null | sed -n 's/^tsort: \([^ ]*\)$/\1/p' |
    tr '\n' ' ')
if [ -z "$(echo $cycles)" ]; then
    echo "PASS deps_no_cycles"
else
    report no_cycles "units in a cycle: $(echo $cycles | tr ' ' '\n' | sort -u | tr '\n' ' ')"
fi

# Function length: the lines between a definition's opening line (one that ends in "{" after a
# ")", outside any function) and its closing "}" in column 0. The limit is 70 lines in the
# library and tools/; ptx/ and tests/ are held at their longest function now (a device GEMM
# stage of 116 lines, a test of 136), so that none grows longer.
long=$(echo "$files" | xargs awk '
    FNR == 1 { infn = 0
        limit = FILENAME ~ /^tests\// ? 136 : FILENAME ~ /^ptx\// ? 116 : 70 }
    !infn && !/^#/ && !/=/ && /\)[^;]*\{ *(\/\/.*)?$/ && !/^ *(if|for|while|switch|else|do)[ (]/ {
        infn = 1; start = FNR; next }
    infn && /^\}/ { infn = 0
        if (FNR - start - 1 > limit)
            print FILENAME ":" start ": " FNR - start - 1 " lines (limit " limit ")" }')
report function_length "$long"
exit $status
