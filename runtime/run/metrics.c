#include "runtime/run/metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

qt_status metrics_open(metrics_writer *m, const char *path, bool replace, const char *replace_hint,
                       uint64_t every, bool classification) {
    QT_ASSERT(every >= 1);
    memset(m, 0, sizeof *m);
    m->every = every;
    m->classification = classification;
    return atomic_file_create(&m->file, path, replace, replace_hint);
}

// "0.8125", or "null" for a regression: accuracy means nothing there.
static void metrics_accuracy(const metrics_writer *m, double accuracy, char *buf, size_t bytes) {
    if (m->classification) {
        snprintf(buf, bytes, "%.9g", accuracy);
    } else {
        snprintf(buf, bytes, "null");
    }
}

static double metrics_epoch(uint64_t step, uint64_t epoch_steps) {
    return epoch_steps ? (double)step / (double)epoch_steps : 0.0;
}

static double metrics_rate(uint64_t steps, double seconds) {
    return seconds > 0 ? (double)steps / seconds : 0.0;
}

static qt_status metrics_write(metrics_writer *m, int length) {
    QT_ASSERT(length > 0 && (size_t)length < sizeof m->line);
    m->lines++;
    qt_status status = atomic_file_write(&m->file, m->line, (size_t)length);
    m->failed = status != QT_OK;
    return status;
}

// The line of the train interval, which then starts over.
static qt_status metrics_train_line(metrics_writer *m, uint64_t step, uint64_t epoch_steps) {
    if (m->steps == 0) return QT_OK;
    char accuracy[32];
    metrics_accuracy(m, m->rows ? (double)m->correct / (double)m->rows : 0.0, accuracy,
                     sizeof accuracy);
    int n = snprintf(m->line, sizeof m->line, "{\"kind\":\"train\",\"step\":%" PRIu64 ","
                     "\"epoch\":%.4f,\"loss\":%.9g,\"accuracy\":%s,\"lr\":%.9g,"
                     "\"steps_per_s\":%.4g,\"steps\":%" PRIu64 ",\"skipped\":%" PRIu64 "}\n",
                     step, metrics_epoch(step, epoch_steps),
                     m->rows ? m->loss_sum / (double)m->rows : 0.0, accuracy, (double)m->lr,
                     metrics_rate(m->steps, m->seconds), m->steps, m->skipped);
    m->steps = m->skipped = m->rows = m->correct = 0;
    m->loss_sum = m->seconds = 0.0;
    return metrics_write(m, n);
}

static qt_status metrics_eval_line(metrics_writer *m, const sched_progress *p) {
    char accuracy[32];
    metrics_accuracy(m, p->pass_accuracy, accuracy, sizeof accuracy);
    int n = snprintf(m->line, sizeof m->line, "{\"kind\":\"eval\",\"step\":%" PRIu64 ","
                     "\"epoch\":%.4f,\"loss\":%.9g,\"accuracy\":%s,\"lr\":%.9g,"
                     "\"steps_per_s\":%.4g,\"steps\":%" PRIu64 ",\"samples\":%" PRIu64 ","
                     "\"dataset\":\"%s\"}\n", p->train_steps,
                     metrics_epoch(p->train_steps, p->epoch_steps), p->pass_loss, accuracy,
                     (double)m->lr, metrics_rate(p->row_steps, m->eval_seconds), p->row_steps,
                     p->pass_samples, p->dataset == RECIPE_DATASET_EVAL ? "eval" : "train");
    return metrics_write(m, n);
}

qt_status metrics_record(void *writer, const sched_progress *p) {
    metrics_writer *m = writer;
    double seconds = p->elapsed_s - m->last_elapsed;
    m->last_elapsed = p->elapsed_s;
    m->epoch_steps = p->epoch_steps;
    m->last_train_steps = p->train_steps;
    const qt_trace_record *rec = p->record;
    if (p->mode == MODEL_MODE_TRAIN) {
        // accuracy = RN(correct / rows) with rows < 2^24 (schedule.c counts eval passes so).
        m->steps++;
        m->skipped += (rec->flags & QT_TRACE_FLAG_SKIPPED) ? 1 : 0;
        m->rows += p->rows_valid;
        m->correct += (uint64_t)((double)rec->accuracy * p->rows_valid + 0.5);
        m->loss_sum += (double)rec->loss * p->rows_valid;
        m->seconds += seconds;
        m->lr = rec->lr;
        if (p->train_steps % m->every == 0 || p->row_step == p->row_steps) {
            return metrics_train_line(m, p->train_steps, p->epoch_steps);
        }
        return QT_OK;
    }
    if (p->mode != MODEL_MODE_EVAL) return QT_OK;
    if (p->row_step == 1) m->eval_seconds = 0.0;
    m->eval_seconds += seconds;
    return p->row_step == p->row_steps ? metrics_eval_line(m, p) : QT_OK;
}

qt_status metrics_commit(metrics_writer *m) {
    if (m->failed) {
        atomic_file_abandon(&m->file);
        return QT_OK;
    }
    qt_status status = metrics_train_line(m, m->last_train_steps, m->epoch_steps);
    if (status != QT_OK) {
        atomic_file_abandon(&m->file);
        return status;
    }
    return atomic_file_commit(&m->file);
}

void metrics_abandon(metrics_writer *m) { atomic_file_abandon(&m->file); }
