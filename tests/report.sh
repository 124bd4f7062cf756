# Sourced by the shell checks: `report NAME HITS` prints "PASS <prefix>NAME", or "FAIL
# <prefix>NAME:" with the first ten lines of HITS, and then sets status=1. The caller sets
# report_prefix (docs_, deps_) and status=0 first, and exits with $status.
report() {
    if [ -n "$2" ]; then
        echo "FAIL $report_prefix$1:"
        echo "$2" | head -10 | sed 's/^/  /'
        status=1
    else
        echo "PASS $report_prefix$1"
    fi
}
