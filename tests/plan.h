// plan: a run planned as tools/qtrain plans one (runtime/run/run.h: run_measure, then run_plan into
// table memory of the measured size), the table memory from malloc. Test code only.
#ifndef QT_TEST_PLAN_H
#define QT_TEST_PLAN_H

#include <stdlib.h>

#include "runtime/run/run.h"

// The tables stay until the next plan: one run of a test program at a time.
static inline qt_status test_run_plan(run *r, const recipe *rc, const char *text, size_t bytes,
                                      const run_options *o) {
    static void *tables;
    uint64_t need = 0;
    QT_TRY(run_measure(r, rc, text, bytes, o, &need));
    free(tables);
    tables = aligned_alloc(64, (need + 63) / 64 * 64);
    if (tables == NULL) abort();
    return run_plan(r, tables, need);
}

#endif  // QT_TEST_PLAN_H
