#!/bin/sh
# Docs: the documents and comments point at things that exist. Prints one PASS/FAIL line per rule.
#
#   docs_paths_exist        every path under arena/ ptx/ recipes/ runtime/ tests/ tools/ .ci/ that
#                           a document or a comment names is in the tree (globs and {a,b} lists
#                           must match something, and so must a <placeholder>; a name without
#                           extension may stand for the file with one: tools/qtrain for
#                           tools/qtrain.c)
#   docs_no_outside_documents  every *.md a document or comment names is in the repository, and
#                           none cites a section sign or a path of another machine
#   docs_sections_exist     every citation of a section by its title, such as
#                           `recipes/NUMERICS.md "NaN"`, `runtime/DESIGN.md "Backends"` or
#                           `README, "How it runs"`, names a heading of that document
#
# What counts as a comment: the text after `//` in C, CUDA and header files, after `#` in shell,
# Python, recipe and ninja files; documents (*.md) count whole. String literals in code are not
# read, so test inputs may name files that do not exist.
cd "$(dirname "$0")/.." || exit 1
files=$(git ls-files --cached --others --exclude-standard 2>/dev/null)
[ -n "$files" ] || files=$(find arena ptx recipes runtime tests tools .ci build.ninja README.md \
    BENCHMARKS.md -type f 2>/dev/null)
status=0

# Documentation text of every file, as "file:line: text".
doc_text() {
    for f in $files; do
        case $f in
        *.c | *.h | *.cu) awk -v f="$f" 'index($0, "//") { print f ":" FNR ": " \
            substr($0, index($0, "//") + 2) }' "$f" ;;
        *.sh | *.py | *.recipe | build.ninja | .ci/*) awk -v f="$f" 'index($0, "#") { print f ":" \
            FNR ": " substr($0, index($0, "#") + 1) }' "$f" ;;
        *.md) awk -v f="$f" '{ print f ":" FNR ": " $0 }' "$f" ;;
        esac
    done
}
text=$(doc_text)

report_prefix=docs_
. tests/report.sh

# A path exists: a file or folder, a glob or {a,b} list that matches, or a name whose
# extension was left out.
path_exists() {
    p=$1
    case $p in
    *\{*\}*)
        head=${p%%\{*}
        rest=${p#*\{}
        list=${rest%%\}*}
        tail=${rest#*\}}
        old_ifs=$IFS
        IFS=,
        for item in $list; do
            IFS=$old_ifs
            path_exists "$head$item$tail" || return 1
        done
        IFS=$old_ifs
        return 0 ;;
    *\{*) return 0 ;;  # a {list} cut by a line break: its first half says too little to check
    esac
    for match in $p; do
        [ -e "$match" ] && return 0
    done
    case ${p##*/} in
    *.*) return 1 ;;
    esac
    for match in "$p".*; do
        [ -e "$match" ] && return 0
    done
    return 1
}

missing=""
folders='arena|ptx|recipes|runtime|tests|tools|\.ci'
paths=$(echo "$text" | sed 's/^[^:]*:[0-9]*: //' |
    grep -aoE "(^|[^A-Za-z0-9_./\$-])($folders)/[A-Za-z0-9_.*{},/<>-]*" |
    sed -E 's/^[^a-z.]//; s/[.,]+$//; s/<[^>]*>/*/g' | sort -u)
for p in $paths; do
    path_exists "$p" || missing="$missing$(echo "$text" | grep -aF -- "$p" | head -1 |
        cut -d' ' -f1) $p
"
done
report paths_exist "$(printf '%s' "$missing" | sed '/^$/d')"

# Names of documents that tools write (not documents cited): bench_step.md and bench_dp.md are
# the tables tools/bench_step.sh and tools/bench_dp.sh produce.
generated_md="bench_step.md bench_dp.md"
outside=""
mds=$(echo "$text" | sed 's/^[^:]*:[0-9]*: //' | grep -aoE '[A-Za-z0-9_./-]*\.md\b' |
    sed 's/^[./]*//' | sort -u)
for m in $mds; do
    case ${m##*/} in md | .md) continue ;; esac  # "*.md", a kind of file, not a document
    case " $generated_md " in *" ${m##*/} "*) continue ;; esac
    [ -f "$m" ] && continue
    count=$(echo "$files" | grep -c "\(^\|/\)${m##*/}\$")
    [ "$count" -eq 1 ] && continue
    outside="$outside$(echo "$text" | grep -aF -- "$m" | head -1 | cut -d' ' -f1) $m
"
done
outside="$outside$(echo "$text" | grep -aE '§|/home/|/work/' | head -5)"
report no_outside_documents "$(printf '%s' "$outside" | sed '/^$/d')"

# Section titles cited by name.
unknown=""
cites=$(echo "$text" | grep -aoE '(NUMERICS\.md|DESIGN\.md|README),? "[^"]+"' | sort -u)
old_ifs=$IFS
IFS='
'
for c in $cites; do
    title=${c#*\"}
    title=${title%\"}
    case $c in
    NUMERICS*) doc=recipes/NUMERICS.md ;;
    DESIGN*) doc=runtime/DESIGN.md ;;
    *) doc=README.md ;;
    esac
    if ! grep -aE '^#+ ' "$doc" | sed -E 's/^#+ ([0-9]+(\.[0-9]+)*\.? )?//' |
        grep -qxF -- "$title"; then
        unknown="$unknown$(echo "$text" | grep -aF -- "$c" | head -1 | cut -d' ' -f1) $c
"
    fi
done
IFS=$old_ifs
report sections_exist "$(printf '%s' "$unknown" | sed '/^$/d')"
exit $status
