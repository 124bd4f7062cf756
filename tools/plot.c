#include "tools/plot.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/atomic_file.h"  // the SVG is written whole or not at all
#include "runtime/io/trace.h"        // trace_reader

// ---------------------------------------------------------------------------------------------
// Curves

enum { PANEL_LOSS, PANEL_EVAL, PANEL_GRAD_NORM, PANEL_LR, PANEL_COUNT };

typedef struct curve {
    double *x, *y;
    size_t count, capacity;
} curve;

typedef struct run_curves {
    const char *path;
    curve panels[PANEL_COUNT];
    curve eval_loss;  // drawn in the eval panel when no run has an accuracy
} run_curves;

static bool curve_add(curve *c, double x, double y) {
    if (!isfinite(y)) return true;  // a NaN or infinite value has no place on an axis
    if (c->count == c->capacity) {
        size_t capacity = c->capacity ? 2 * c->capacity : 256;
        double *nx = realloc(c->x, capacity * sizeof *nx);
        if (nx) c->x = nx;
        double *ny = nx ? realloc(c->y, capacity * sizeof *ny) : NULL;
        if (!ny) return false;
        c->y = ny;
        c->capacity = capacity;
    }
    c->x[c->count] = x;
    c->y[c->count] = y;
    c->count++;
    return true;
}

static void curve_free(curve *c) {
    free(c->x);
    free(c->y);
}

// An eval pass in progress: consecutive eval records.
typedef struct eval_pass {
    uint64_t records, first_step;
    double accuracy_sum, loss_sum;
} eval_pass;

static bool pass_close(run_curves *rc, eval_pass *p) {
    if (p->records == 0) return true;
    double n = (double)p->records, x = (double)p->first_step;
    bool ok = curve_add(&rc->panels[PANEL_EVAL], x, 100.0 * p->accuracy_sum / n) &&
              curve_add(&rc->eval_loss, x, p->loss_sum / n);
    memset(p, 0, sizeof *p);
    return ok;
}

static bool take_record(run_curves *rc, eval_pass *pass, const qt_trace_record *r) {
    double x = (double)r->step;
    if (r->mode == QT_TRACE_MODE_EVAL) {
        if (pass->records == 0) pass->first_step = r->step;
        pass->records++;
        pass->accuracy_sum += (double)r->accuracy;
        pass->loss_sum += (double)r->loss;
        return true;
    }
    if (!pass_close(rc, pass)) return false;
    if (r->mode != QT_TRACE_MODE_TRAIN) return true;
    return curve_add(&rc->panels[PANEL_LOSS], x, (double)r->loss) &&
           curve_add(&rc->panels[PANEL_GRAD_NORM], x, (double)r->grad_norm) &&
           curve_add(&rc->panels[PANEL_LR], x, (double)r->lr);
}

static int read_run(run_curves *rc) {
    static trace_reader reader;  // 16 KiB of line buffer
    if (trace_reader_open(&reader, rc->path) != QT_OK) {
        fprintf(stderr, "qtrain plot: %s\n", qt_error_message());
        return 1;
    }
    eval_pass pass = {0};
    bool have = true, ok = true;
    qt_status status = QT_OK;
    while (ok && have) {
        qt_trace_record r;
        status = trace_reader_next(&reader, &r, &have);
        if (status != QT_OK) break;
        if (have) ok = take_record(rc, &pass, &r);
    }
    if (ok && status == QT_OK) ok = pass_close(rc, &pass);
    trace_reader_close(&reader);
    if (status != QT_OK) fprintf(stderr, "qtrain plot: %s\n", qt_error_message());
    if (!ok) fprintf(stderr, "qtrain plot: %s: out of memory\n", rc->path);
    return status == QT_OK && ok ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Axes

typedef struct axis {
    double lo, hi;  // the axis's range (after rounding to ticks; log10 of it on a log axis)
    bool log;
    double ticks[16];
    int tick_count;
} axis;

// 1, 2 or 5 times a power of ten, about span / 5.
static double nice_step(double span) {
    double raw = span / 5.0, power = pow(10.0, floor(log10(raw))), f = raw / power;
    return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * power;
}

static void axis_linear(axis *a, double lo, double hi) {
    if (!(hi > lo)) {  // one value: a range around it
        double pad = lo != 0.0 ? fabs(lo) * 0.1 : 1.0;
        lo -= pad;
        hi += pad;
    }
    double step = nice_step(hi - lo);
    a->log = false;
    a->lo = floor(lo / step) * step;
    a->hi = ceil(hi / step) * step;
    a->tick_count = 0;
    for (double t = a->lo; t <= a->hi + step * 1e-9 && a->tick_count < 16; t += step) {
        a->ticks[a->tick_count++] = fabs(t) < step * 1e-9 ? 0.0 : t;
    }
}

// Decades around [lo, hi] (both > 0), every one ticked (every other when there are many).
static void axis_log(axis *a, double lo, double hi) {
    a->log = true;
    a->lo = floor(log10(lo));
    a->hi = ceil(log10(hi));
    if (a->hi == a->lo) a->hi += 1.0;
    int every = (int)((a->hi - a->lo) / 8.0) + 1;
    a->tick_count = 0;
    for (double d = a->lo; d <= a->hi && a->tick_count < 16; d += every) {
        a->ticks[a->tick_count++] = pow(10.0, d);
    }
}

// Log scale where the values are positive and span a decade or more, as losses and gradient
// norms of a run that learns do; else linear.
static void axis_fit(axis *a, const run_curves *runs, int count, int panel, bool log_allowed) {
    double lo = INFINITY, hi = -INFINITY;
    for (int r = 0; r < count; r++) {
        const curve *c = &runs[r].panels[panel];
        for (size_t i = 0; i < c->count; i++) {
            lo = fmin(lo, c->y[i]);
            hi = fmax(hi, c->y[i]);
        }
    }
    if (!(lo <= hi)) {
        axis_linear(a, 0.0, 1.0);
    } else if (log_allowed && lo > 0.0 && hi / lo >= 10.0) {
        axis_log(a, lo, hi);
    } else {
        axis_linear(a, lo, hi);
    }
}

static void axis_fit_x(axis *a, const run_curves *runs, int count) {
    double lo = INFINITY, hi = -INFINITY;
    for (int r = 0; r < count; r++) {
        for (int p = 0; p < PANEL_COUNT; p++) {
            const curve *c = &runs[r].panels[p];
            if (c->count == 0) continue;
            lo = fmin(lo, c->x[0]);
            hi = fmax(hi, c->x[c->count - 1]);
        }
    }
    if (!(lo <= hi)) {  // no point at all: an empty frame
        lo = 0.0;
        hi = 1.0;
    }
    axis_linear(a, lo, hi);
}

// Where value lands between pixel p0 (axis lo) and p1 (axis hi).
static double axis_map(const axis *a, double value, double p0, double p1) {
    double v = a->log ? log10(value) : value;
    return p0 + (p1 - p0) * (v - a->lo) / (a->hi - a->lo);
}

// ---------------------------------------------------------------------------------------------
// SVG

#define SVG_WIDTH 1200
#define PANEL_W 600
#define PANEL_H 360
#define PLOT_LEFT 78   // room for the y tick labels
#define PLOT_RIGHT 24
#define PLOT_TOP 34    // the title
#define PLOT_BOTTOM 48 // x tick labels and the axis name
#define LEGEND_ROW 20

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define PALETTE_COUNT (int)(sizeof palette / sizeof palette[0])

typedef struct svg {
    char *text;
    size_t used, capacity;
    bool failed;
} svg;

__attribute__((format(printf, 2, 3))) static void out(svg *s, const char *fmt, ...) {
    for (;;) {
        va_list args;
        va_start(args, fmt);
        size_t room = s->capacity - s->used;
        int n = s->text ? vsnprintf(s->text + s->used, room, fmt, args) : 0;
        va_end(args);
        if (s->text && n >= 0 && (size_t)n < room) {
            s->used += (size_t)n;
            return;
        }
        size_t capacity = s->capacity ? 2 * s->capacity : 1 << 16;
        char *bigger = realloc(s->text, capacity);
        if (!bigger || n < 0) {
            s->failed = true;
            return;
        }
        s->text = bigger;
        s->capacity = capacity;
    }
}

// Text content and attribute values: the five XML special characters as entities.
static void out_escaped(svg *s, const char *text) {
    for (const char *p = text; *p; p++) {
        switch (*p) {
        case '&': out(s, "&amp;"); break;
        case '<': out(s, "&lt;"); break;
        case '>': out(s, "&gt;"); break;
        case '"': out(s, "&quot;"); break;
        case '\'': out(s, "&apos;"); break;
        default: out(s, "%c", *p);
        }
    }
}

typedef struct frame {
    double left, top, right, bottom;  // the plot area in pixels
} frame;

// Title, grid, ticks with their labels, the frame and the axes' names.
static void draw_axes(svg *s, const frame *f, const axis *ax, const axis *ay, const char *title,
                      const char *y_name) {
    out(s, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">%s%s</text>\n",
        f->left, f->top - 12, title, ay->log ? " (log scale)" : "");
    for (int i = 0; i < ay->tick_count; i++) {
        double y = axis_map(ay, ay->ticks[i], f->bottom, f->top);
        out(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
            f->left, y, f->right, y);
        out(s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n", f->left - 6,
            y + 4, ay->ticks[i]);
    }
    for (int i = 0; i < ax->tick_count; i++) {
        double x = axis_map(ax, ax->ticks[i], f->left, f->right);
        out(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x,
            f->top, x, f->bottom);
        out(s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.8g</text>\n", x,
            f->bottom + 16, ax->ticks[i]);
    }
    out(s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
        "stroke=\"#444\"/>\n", f->left, f->top, f->right - f->left, f->bottom - f->top);
    out(s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
        (f->left + f->right) / 2, f->bottom + 36);
    double mid = (f->top + f->bottom) / 2;
    out(s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 %.1f "
        "%.1f)\">%s</text>\n", f->left - 60, mid, f->left - 60, mid, y_name);
}

// The indices of the points drawn: all, or the first, the last, and the minimum and maximum of
// each bucket in step order.
static size_t thin(const curve *c, size_t *keep) {
    if (c->count <= PLOT_POINTS_MAX) {
        for (size_t i = 0; i < c->count; i++) keep[i] = i;
        return c->count;
    }
    size_t buckets = PLOT_POINTS_MAX / 2 - 1, n = 0;
    keep[n++] = 0;
    for (size_t b = 0; b < buckets; b++) {
        size_t start = 1 + b * (c->count - 2) / buckets, end = 1 + (b + 1) * (c->count - 2) /
                                                                       buckets;
        size_t lo = start, hi = start;
        for (size_t i = start; i < end; i++) {
            if (c->y[i] < c->y[lo]) lo = i;
            if (c->y[i] > c->y[hi]) hi = i;
        }
        if (end == start) continue;
        keep[n++] = lo < hi ? lo : hi;
        if (lo != hi) keep[n++] = lo < hi ? hi : lo;
    }
    keep[n++] = c->count - 1;
    return n;
}

static void draw_curve(svg *s, const frame *f, const axis *ax, const axis *ay, const curve *c,
                       int run, bool markers) {
    static size_t keep[PLOT_POINTS_MAX + 2];
    size_t n = thin(c, keep);
    const char *color = palette[run % PALETTE_COUNT];
    out(s, "<polyline class=\"run\" data-run=\"%d\" data-points=\"%zu\"", run, n);
    if (n > 0) {
        out(s, " data-first=\"%.9g %.9g\" data-last=\"%.9g %.9g\"", c->x[0], c->y[0],
            c->x[c->count - 1], c->y[c->count - 1]);
    }
    out(s, " fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", color,
        run >= PALETTE_COUNT ? " stroke-dasharray=\"6 3\"" : "");
    for (size_t i = 0; i < n; i++) {
        size_t k = keep[i];
        out(s, "%s%.2f,%.2f", i ? " " : "", axis_map(ax, c->x[k], f->left, f->right),
            axis_map(ay, c->y[k], f->bottom, f->top));
    }
    out(s, "\"/>\n");
    for (size_t i = 0; markers && n <= 200 && i < n; i++) {
        out(s, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n",
            axis_map(ax, c->x[keep[i]], f->left, f->right),
            axis_map(ay, c->y[keep[i]], f->bottom, f->top), color);
    }
}

static void draw_legend(svg *s, const run_curves *runs, int count) {
    for (int r = 0; r < count; r++) {
        double y = 26 + r * LEGEND_ROW;
        out(s, "<line x1=\"20\" y1=\"%.1f\" x2=\"50\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"2.5\"%s/>\n", y - 4, y - 4, palette[r % PALETTE_COUNT],
            r >= PALETTE_COUNT ? " stroke-dasharray=\"6 3\"" : "");
        out(s, "<text x=\"58\" y=\"%.1f\">", y);
        out_escaped(s, runs[r].path);
        out(s, "</text>\n");
    }
}

static void draw_panel(svg *s, int panel, run_curves *runs, int count, double top,
                       const axis *ax, bool eval_accuracy) {
    static const char *const titles[PANEL_COUNT] = {"training loss", "eval accuracy (%)",
                                                    "gradient norm", "learning rate"};
    static const char *const y_names[PANEL_COUNT] = {"loss", "accuracy (%)", "norm", "lr"};
    double left = (panel % 2) * PANEL_W;
    frame f = {left + PLOT_LEFT, top + (panel / 2) * PANEL_H + PLOT_TOP,
               left + PANEL_W - PLOT_RIGHT, top + (panel / 2 + 1) * PANEL_H - PLOT_BOTTOM};
    axis ay;
    axis_fit(&ay, runs, count, panel, panel == PANEL_LOSS || panel == PANEL_GRAD_NORM);
    const char *title = panel == PANEL_EVAL && !eval_accuracy ? "eval loss" : titles[panel];
    out(s, "<g class=\"panel\" data-panel=\"%s\">\n", title);
    draw_axes(s, &f, ax, &ay, title,
              panel == PANEL_EVAL && !eval_accuracy ? "loss" : y_names[panel]);
    for (int r = 0; r < count; r++) {
        draw_curve(s, &f, ax, &ay, &runs[r].panels[panel], r, panel == PANEL_EVAL);
    }
    out(s, "</g>\n");
}

static void render(svg *s, run_curves *runs, int count) {
    // Regression runs record no accuracy: their eval panel shows the eval loss instead.
    bool eval_accuracy = false;
    for (int r = 0; r < count; r++) {
        const curve *c = &runs[r].panels[PANEL_EVAL];
        for (size_t i = 0; i < c->count; i++) eval_accuracy = eval_accuracy || c->y[i] != 0.0;
    }
    for (int r = 0; r < count && !eval_accuracy; r++) {
        curve swap = runs[r].panels[PANEL_EVAL];
        runs[r].panels[PANEL_EVAL] = runs[r].eval_loss;
        runs[r].eval_loss = swap;
    }
    double top = 20 + count * LEGEND_ROW;
    int height = (int)top + 2 * PANEL_H;
    out(s, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
        "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
        "font-size=\"12\">\n<title>qtrain: loss, eval, gradient norm and learning rate</title>\n"
        "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_WIDTH, height, SVG_WIDTH,
        height, SVG_WIDTH, height);
    draw_legend(s, runs, count);
    axis ax;
    axis_fit_x(&ax, runs, count);
    for (int p = 0; p < PANEL_COUNT; p++) draw_panel(s, p, runs, count, top, &ax, eval_accuracy);
    out(s, "</svg>\n");
}

// ---------------------------------------------------------------------------------------------
// The command

static int write_svg(const char *path, bool force, const svg *s) {
    atomic_file f;
    qt_status status = atomic_file_create(&f, path, force, "--force");
    if (status == QT_OK) status = atomic_file_write(&f, s->text, s->used);
    if (status == QT_OK) {
        status = atomic_file_commit(&f);
    } else {
        atomic_file_abandon(&f);
    }
    if (status == QT_OK) return 0;
    fprintf(stderr, "qtrain plot: %s\n", qt_error_message());
    return 1;
}

static int usage(const char *why) {
    fprintf(stderr, "qtrain plot: %s\nusage: qtrain plot A.trace [B.trace ...] -o curves.svg "
            "[--force]\n", why);
    return 2;
}

int plot_main(int argc, char **argv) {
    const char *output = NULL;
    bool force = false;
    int count = 0;
    run_curves *runs = calloc((size_t)argc, sizeof *runs);
    if (!runs) return 1;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0 && i + 1 < argc && !output) {
            output = argv[++i];
        } else if (strcmp(argv[i], "--force") == 0) {
            force = true;
        } else if (argv[i][0] == '-') {
            free(runs);
            return usage("unexpected argument");
        } else {
            runs[count++].path = argv[i];
        }
    }
    if (!output || count == 0) {
        free(runs);
        return usage(!output ? "expected -o FILE.svg" : "expected at least one trace file");
    }
    // Refused before any trace is read: nothing is replaced by surprise.
    int rc = atomic_file_check(output, force, "--force") != QT_OK ? 1 : 0;
    if (rc) fprintf(stderr, "qtrain plot: %s\n", qt_error_message());
    for (int r = 0; r < count && rc == 0; r++) rc = read_run(&runs[r]);
    svg s = {0};
    if (rc == 0) render(&s, runs, count);
    if (rc == 0 && s.failed) {
        fprintf(stderr, "qtrain plot: out of memory\n");
        rc = 1;
    }
    if (rc == 0) rc = write_svg(output, force, &s);
    if (rc == 0) printf("%s: %d run%s, 4 panels\n", output, count, count == 1 ? "" : "s");
    for (int r = 0; r < count; r++) {
        for (int p = 0; p < PANEL_COUNT; p++) curve_free(&runs[r].panels[p]);
        curve_free(&runs[r].eval_loss);
    }
    free(runs);
    free(s.text);
    return rc;
}
