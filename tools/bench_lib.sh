# What the benchmark drivers (tools/bench_step.sh, tools/bench_dp.sh) share, sourced from the
# repository root: the logs folder ($OUT when set, else a new temporary folder; exit 2 when it
# cannot be made) and the failures they list after their table.
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
