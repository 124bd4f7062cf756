# What the benchmark drivers (tools/bench_step.sh, tools/bench_dp.sh) share, sourced from the
# repository root: the logs folder ($OUT when set, else a new temporary folder; exit 2 when it
# cannot be made), the failures they list after their table, and the number of qtrain runs per
# configuration (QT_BENCH_RUNS, default 1; exit 2 when it is no whole number from 1), taken in
# rounds so that a slow stretch of the machine falls on every configuration alike, with the
# median the tables report.
runs=${QT_BENCH_RUNS:-1}
case $runs in
'' | *[!0-9]* | 0*)
    echo "$(basename "$0" .sh): QT_BENCH_RUNS must be a whole number from 1 (got '$runs')" >&2
    exit 2
    ;;
esac
if [ -n "${OUT:-}" ]; then
    logs=$OUT
    mkdir -p "$logs" || exit 2
else
    logs=$(mktemp -d) || exit 2
fi
failures=""

# Records a failed run: a FAILED line now, and again after the table.
fail() {
    echo "FAILED: $1" >&2
    failures="$failures
FAILED: $1"
}

# The median of the numbers on standard input, one per line ("-" lines skipped; "-" when none is
# left; the mean of the middle two, to 3 decimals, for an even count).
median() {
    grep -v '^-$' | sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
              else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
