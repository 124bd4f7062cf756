#include "runtime/io/infer_out.h"

#include <string.h>

// qt_xent_best_combine, QT_XENT_NONE, QT_ACT_NEG_INF: the device's argmax rule
#include "ptx/act.h"

uint64_t infer_out_rows(uint64_t samples, uint32_t batch, uint64_t steps) {
    QT_ASSERT(samples > 0 && batch > 0);
    uint64_t per_pass = (samples + batch - 1) / batch;
    uint64_t passes = steps / per_pass, rest = steps % per_pass;
    // rest < per_pass, so rest full batches stay inside one pass: rest * batch < samples.
    return passes * samples + rest * batch;
}

uint64_t infer_out_scratch_bytes(uint32_t batch, uint32_t outputs) {
    return (uint64_t)batch * outputs * sizeof(float);
}

qt_status infer_out_open(infer_out *o, const char *path, bool argmax, uint64_t rows_expected,
                         uint32_t batch, uint32_t outputs, void *scratch, bool replace,
                         const char *replace_hint) {
    QT_ASSERT(batch > 0 && outputs > 0 && scratch != NULL && (uintptr_t)scratch % 4 == 0);
    memset(o, 0, sizeof *o);
    o->argmax = argmax;
    o->outputs = outputs;
    o->batch = batch;
    o->rows_expected = rows_expected;
    o->scratch = scratch;
    uint64_t shape[2] = {rows_expected, argmax ? 1 : outputs};
    return npy_create(&o->file, path, argmax ? NPY_DTYPE_I32 : NPY_DTYPE_F32, argmax ? 1 : 2,
                      shape, replace, replace_hint);
}

// The class of one row of logits, as the device's accuracy picks it: folding in index order
// from the identity gives the same pair as the device's tree (the combination is associative and
// commutative).
static int32_t row_argmax(const uint16_t *row, uint32_t outputs) {
    qt_xent_best best = {QT_ACT_NEG_INF, QT_XENT_NONE};
    for (uint32_t j = 0; j < outputs; j++) {
        qt_xent_best e = {qt_bf16_to_f32(row[j]), j};
        best = qt_xent_best_combine(best, e);
    }
    return best.index == QT_XENT_NONE ? -1 : (int32_t)best.index;
}

void infer_out_logits(const uint16_t *bf16, uint32_t rows, uint32_t outputs, float *logits) {
    uint64_t values = (uint64_t)rows * outputs;
    for (uint64_t i = 0; i < values; i++) logits[i] = qt_bf16_to_f32(bf16[i]);
}

void infer_out_classes(const uint16_t *bf16, uint32_t rows, uint32_t outputs, int32_t *classes) {
    for (uint32_t r = 0; r < rows; r++) {
        classes[r] = row_argmax(bf16 + (uint64_t)r * outputs, outputs);
    }
}

qt_status infer_out_write(infer_out *o, const uint16_t *bf16, uint32_t rows_valid) {
    QT_ASSERT(rows_valid <= o->batch && o->rows_written + rows_valid <= o->rows_expected);
    if (o->argmax) {
        infer_out_classes(bf16, rows_valid, o->outputs, o->scratch);
        QT_TRY(npy_write(&o->file, o->scratch, (uint64_t)rows_valid * sizeof(int32_t)));
    } else {
        infer_out_logits(bf16, rows_valid, o->outputs, o->scratch);
        QT_TRY(npy_write(&o->file, o->scratch,
                         (uint64_t)rows_valid * o->outputs * sizeof(float)));
    }
    o->rows_written += rows_valid;
    return QT_OK;
}

qt_status infer_out_commit(infer_out *o) {
    QT_ASSERT(o->rows_written == o->rows_expected);
    return npy_commit(&o->file);
}

void infer_out_abandon(infer_out *o) { npy_abandon(&o->file); }
