// test_replay: golden-trace replay (`qtrain run --check`) and `qtrain plot`, through the tool.
//
// A run checked against its own golden trace passes (exit 0); the same recipe with another seed
// stops at its first step with the step, the field and both values (exit 1); a golden trace cut
// in a line is refused before training, one cut after a record stops the run where it ends.
// `qtrain plot` writes a well-formed SVG (checked here, and by xmllint when it is installed) with
// one polyline per run and panel whose first and last points are the traces' own, a log scale
// for a loss that spans decades, NaN losses left out, long curves thinned, the eval loss for
// runs without accuracy, file names escaped, and refuses to replace a file without --force.
// Run from the repository root.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/wait.h>  // WEXITSTATUS
#include <unistd.h>

#include "runtime/backend/backend.h"  // backend_open_gpu: GPU cases are skipped without one
#include "tools/plot.h"               // PLOT_POINTS_MAX
#include "tests/files.h"              // tmp_path, file_read, file_write, command_output
#include "tests/test.h"
#include "runtime/io/trace.h"


static char output[1 << 16];

// Runs `build/qtrain ARGS` and returns its exit status; its output is in `output`.
static int qtrain(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int qtrain(const char *fmt, ...) {
    char args[2048], cmd[2200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "build/qtrain %s", args);
    return command_output(cmd, output, sizeof output);
}

// The tiny recipe of tests/recipes with the given built-in recipe.
static const char *tiny_recipe(const char *scheme) {
    size_t size = 0;
    char *text = file_read("tests/recipes/synthetic_tiny.recipe", &size);
    const char *path = tmp_path("tiny.recipe");
    char *at = text ? strstr(text, "\nrecipe = bf16\n") : NULL;
    if (!at) {
        printf("  cannot read tests/recipes/synthetic_tiny.recipe\n");
        exit(1);
    }
    FILE *f = fopen(path, "wb");
    fprintf(f, "%.*s\nrecipe = %s\n%s", (int)(at - text), text, scheme,
            at + strlen("\nrecipe = bf16\n"));
    fclose(f);
    free(text);
    return path;
}

// ---------------------------------------------------------------------------------------------
// Golden-trace replay

static void test_check_cli(void) {
    test_begin("run_check_against_golden_trace");
    const char *recipe = tiny_recipe("delayed");  // delayed scaling: amax and scale fields too
    const char *golden = tmp_path("golden.trace");
    int rc = qtrain("run %s --ref --checksum-every 20 --trace %s", recipe, golden);
    CHECK(rc == 0, "golden run: exit %d: %s", rc, output);
    rc = qtrain("run %s --ref --checksum-every 20 --check %s", recipe, golden);
    CHECK(rc == 0 && strstr(output, "eval         accuracy"), "same run: exit %d: %s", rc,
          output);
    rc = qtrain("run %s --ref --checksum-every 20 --check %s --seed 12345", recipe, golden);
    bool step01 = strstr(output, "diverges from the golden trace at step 0 ") ||
                  strstr(output, "diverges from the golden trace at step 1 ");
    CHECK(rc == 1 && step01 && strstr(output, ", field ") && strstr(output, "\n  golden: 0x") &&
              strstr(output, "\n  run:    0x") && strstr(output, golden) &&
              !strstr(output, "train loss"), "other seed: exit %d: %s", rc, output);
    // Cut inside a line: refused before the first step.
    size_t size = 0;
    char *text = file_read(golden, &size);
    const char *cut = tmp_path("cut.trace");
    file_write(cut, text, size / 2);
    rc = qtrain("run %s --ref --checksum-every 20 --check %s", recipe, cut);
    CHECK(rc == 1 && strstr(output, "the golden trace is cut short") &&
              !strstr(output, "step      "), "cut golden: exit %d: %s", rc, output);
    // Cut after the record of step 49 (a killed run's trace): no completion record, refused.
    char *line = text;
    for (int i = 0; i < 1 + 6 + 50 && line; i++) line = strchr(line, '\n') + 1;  // 6 quantizers
    file_write(cut, text, (size_t)(line - text));
    rc = qtrain("run %s --ref --checksum-every 20 --check %s", recipe, cut);
    CHECK(rc == 1 && strstr(output, "no completion record at its end: the golden trace is cut "
          "short") && !strstr(output, "step      "), "killed golden: exit %d: %s", rc, output);
    // The trace of a run that ended after step 49: the run stops where the golden trace ends.
    FILE *f = fopen(cut, "ab");
    fputs("end status=complete records=50\n", f);
    fclose(f);
    rc = qtrain("run %s --ref --checksum-every 20 --check %s", recipe, cut);
    CHECK(rc == 1 && strstr(output, "the golden trace ends after 50 records; the run goes on "
          "with step=50"), "short golden: exit %d: %s", rc, output);
    rc = qtrain("run %s --ref --check %s", recipe, golden);
    CHECK(rc == 1 && strstr(output, "before its first step: header: golden has 6 quantizers, "
          "checksum every 20 steps; run has 6, every 100"), "other header: exit %d: %s", rc,
          output);
    rc = qtrain("run %s --ref --check %s", recipe, tmp_path("missing.trace"));
    CHECK(rc == 1 && strstr(output, "missing.trace: cannot open the golden trace"),
          "missing golden: exit %d: %s", rc, output);
    free(text);
    test_end();
}

// A golden trace from CUDA graphs checks an eager run on the GPU.
static void test_check_gpu(void) {
    const char *name = "gpu_run_check_eager_against_graph_golden";
    static backend b;
    if (backend_open_gpu(&b, 0) != QT_OK) {
        test_skip(name, qt_error_message());
        backend_close(&b);
        return;
    }
    backend_close(&b);
    test_begin(name);
    const char *recipe = tiny_recipe("nvfp4");
    const char *golden = tmp_path("gpu.trace");
    int rc = qtrain("run %s --checksum-every 20 --trace %s", recipe, golden);
    CHECK(rc == 0 && strstr(output, "CUDA graphs"), "graph run: exit %d: %s", rc, output);
    rc = qtrain("run %s --eager --checksum-every 20 --check %s", recipe, golden);
    CHECK(rc == 0 && strstr(output, "eager launches"), "eager check: exit %d: %s", rc, output);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// plot

#define XML_NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-:"

// Well-formed XML: one root, every tag closed in order, attributes quoted, entities known, no
// stray '<' or '&'. Returns NULL or what is wrong.
static const char *xml_problem(const char *p) {
    static char why[160];
    const char *stack[64];
    size_t lengths[64];
    int depth = 0, roots = 0;
    while (*p) {
        if (*p == '&') {
            const char *e[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
            bool known = false;
            for (int i = 0; i < 5; i++) known = known || strncmp(p, e[i], strlen(e[i])) == 0;
            if (!known) return "an '&' that starts no entity";
            p++;
            continue;
        }
        if (*p != '<') {
            p++;
            continue;
        }
        if (strncmp(p, "<?", 2) == 0 || strncmp(p, "<!--", 4) == 0) {
            const char *end = strstr(p, p[1] == '?' ? "?>" : "-->");
            if (!end) return "an unterminated declaration or comment";
            p = end + 2;
            continue;
        }
        bool closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t n = strspn(name, "abcdefghijklmnopqrstuvwxyz");
        if (n == 0) return "a '<' that starts no tag";
        const char *q = name + n;
        for (;;) {  // attributes
            q += strspn(q, " \n");
            if (*q == '>' || (*q == '/' && q[1] == '>')) break;
            size_t k = strspn(q, XML_NAME_CHARS);
            if (k == 0 || q[k] != '=' || q[k + 1] != '"') return "a malformed attribute";
            const char *close = strchr(q + k + 2, '"');
            if (!close || memchr(q + k + 2, '<', (size_t)(close - q - k - 2))) {
                return "an attribute value with '<' or no end";
            }
            q = close + 1;
        }
        bool empty = *q == '/';
        if (closing) {
            if (depth == 0 || lengths[depth - 1] != n || strncmp(stack[depth - 1], name, n)) {
                snprintf(why, sizeof why, "</%.*s> closes no open tag", (int)n, name);
                return why;
            }
            depth--;
        } else if (!empty) {
            if (depth == 64) return "tags nested too deep";
            if (depth == 0) roots++;
            stack[depth] = name;
            lengths[depth++] = n;
        }
        p = q + (empty ? 2 : 1);
    }
    if (depth != 0) return "a tag left open";
    return roots == 1 ? NULL : "not exactly one root element";
}

static size_t count_of(const char *text, const char *needle) {
    size_t n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

// The attribute `name` of the index-th polyline (in file order: panel by panel, run by run).
static bool polyline_attr(const char *svg, int index, const char *name, char *out, size_t bytes) {
    const char *p = svg;
    for (int i = 0; i <= index; i++) {
        p = strstr(p, "<polyline");
        if (!p) return false;
        p++;
    }
    const char *end = strchr(p, '>');
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *at = strstr(p, key);
    if (!at || at > end) return false;
    at += strlen(key);
    snprintf(out, bytes, "%.*s", (int)(strchr(at, '"') - at), at);
    return true;
}

static void check_attr(const char *svg, int index, const char *name, const char *expected) {
    char got[128] = "";
    CHECK(polyline_attr(svg, index, name, got, sizeof got) && strcmp(got, expected) == 0,
          "polyline %d %s: '%s', expected '%s'", index, name, got, expected);
}

static qt_trace_record record(uint64_t step, uint32_t mode, float loss, float accuracy) {
    qt_trace_record r;
    memset(&r, 0, sizeof r);
    r.step = step;
    r.mode = mode;
    r.loss = loss;
    r.accuracy = accuracy;
    r.grad_norm = 1.0f + (float)step / 8.0f;
    r.lr = 1e-3f / (float)(step + 1);
    return r;
}

// A made-up run: `train` train steps with loss 2 / (step + 1) (NaN at step 7), an eval pass of
// three records, ten more train steps, another eval pass. Regression runs record no accuracy.
static void write_made_up(const char *path, uint64_t train, bool regression) {
    static trace_writer w;
    trace_header h;
    memset(&h, 0, sizeof h);
    h.recipe_hash = 1;
    CHECK(trace_open(&w, path, &h, false) == QT_OK, "%s", qt_error_message());
    static const float accuracy[3] = {0.5f, 0.6f, 0.75f}, loss[3] = {1.0f, 1.5f, 2.0f};
    uint64_t step = 0;
    for (int part = 0; part < 2; part++) {
        for (uint64_t t = 0; t < (part == 0 ? train : 10); t++, step++) {
            float value = step == 7 ? NAN : 2.0f / (float)(step + 1);
            qt_trace_record r = record(step, QT_TRACE_MODE_TRAIN, value, 0.0f);
            trace_write(&w, &r);
        }
        for (int e = 0; e < 3; e++, step++) {
            qt_trace_record r = record(step, QT_TRACE_MODE_EVAL, loss[e] + (float)part,
                                       regression ? 0.0f : accuracy[e] + 0.1f * (float)part);
            trace_write(&w, &r);
        }
    }
    CHECK(trace_close(&w, TRACE_END_COMPLETE) == QT_OK, "%s", qt_error_message());
}

// "STEP VALUE" as the plot writes a point.
static const char *point(double x, double y) {
    static char out[4][64];
    static int next;
    char *p = out[next++ % 4];
    snprintf(p, 64, "%.9g %.9g", x, y);
    return p;
}

// The mean of the pass as the plot takes it: accuracies in percent, summed in double.
static double pass_mean(const float *v, float add, double scale) {
    double sum = 0.0;
    for (int i = 0; i < 3; i++) sum += (double)(v[i] + add);
    return scale * sum / 3.0;
}

static void check_svg(const char *path, size_t polylines) {
    size_t size = 0;
    char *svg = file_read(path, &size);
    const char *problem = svg ? xml_problem(svg) : "no file";
    CHECK(problem == NULL, "%s: %s", path, problem);
    CHECK(svg && count_of(svg, "<polyline") == polylines && count_of(svg, "<g class=\"panel\"")
          == 4, "%zu polylines, expected %zu", svg ? count_of(svg, "<polyline") : 0, polylines);
    if (access("/usr/bin/xmllint", X_OK) == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "/usr/bin/xmllint --noout '%s' 2>&1", path);
        CHECK(system(cmd) == 0, "xmllint rejects %s", path);
    }
    free(svg);
}

// The first and last train record of a real trace.
static void train_ends(const char *path, qt_trace_record *first, qt_trace_record *last) {
    static trace_reader r;
    bool have = trace_reader_open(&r, path) == QT_OK, seen = false;
    while (have) {
        qt_trace_record rec;
        if (trace_reader_next(&r, &rec, &have) != QT_OK || !have) break;
        if (rec.mode != QT_TRACE_MODE_TRAIN) continue;
        if (!seen) *first = rec;
        *last = rec;
        seen = true;
    }
    trace_reader_close(&r);
    CHECK(seen, "%s has no train records", path);
}

static void test_plot_cli(void) {
    test_begin("plot_svg_well_formed_with_the_traces_points");
    const char *made = tmp_path("a&b <run>.trace"), *golden = tmp_path("golden.trace");
    write_made_up(made, 20, false);
    const char *svg = tmp_path("curves.svg");
    int rc = qtrain("plot '%s' '%s' -o %s", made, golden, svg);
    CHECK(rc == 0 && strstr(output, "2 runs, 4 panels"), "exit %d: %s", rc, output);
    check_svg(svg, 8);
    size_t size = 0;
    char *text = file_read(svg, &size);
    if (text) {
        // Polylines in file order: loss, eval, gradient norm, learning rate; runs in order.
        check_attr(text, 0, "data-points", "29");  // 30 train steps, one NaN left out
        check_attr(text, 0, "data-first", point(0, 2.0f));
        check_attr(text, 0, "data-last", point(32, 2.0f / 33.0f));
        static const float acc[3] = {0.5f, 0.6f, 0.75f};
        check_attr(text, 2, "data-points", "2");
        check_attr(text, 2, "data-first", point(20, pass_mean(acc, 0.0f, 100.0)));
        check_attr(text, 2, "data-last", point(33, pass_mean(acc, 0.1f, 100.0)));
        check_attr(text, 4, "data-last", point(32, 1.0f + 32.0f / 8.0f));
        check_attr(text, 6, "data-first", point(0, 1e-3f));
        qt_trace_record first = {0}, last = {0};
        train_ends(golden, &first, &last);
        check_attr(text, 1, "data-first", point((double)first.step, first.loss));
        check_attr(text, 1, "data-last", point((double)last.step, last.loss));
        check_attr(text, 5, "data-last", point((double)last.step, last.grad_norm));
        check_attr(text, 7, "data-last", point((double)last.step, last.lr));
        CHECK(strstr(text, "training loss (log scale)") && strstr(text, "eval accuracy (%)"),
              "panel titles");
        CHECK(strstr(text, "a&amp;b &lt;run&gt;.trace"), "the file name is not escaped");
    }
    free(text);
    // An existing file is not replaced without --force.
    file_write(svg, "keep", 4);
    rc = qtrain("plot '%s' -o %s", made, svg);
    text = file_read(svg, &size);
    CHECK(rc == 1 && strstr(output, "exists; qtrain does not replace files") && size == 4,
          "exit %d: %s", rc, output);
    free(text);
    rc = qtrain("plot '%s' -o %s --force", made, svg);
    CHECK(rc == 0, "--force: exit %d: %s", rc, output);
    check_svg(svg, 4);
    test_end();
}

static void test_plot_edges(void) {
    test_begin("plot_regression_thinning_and_refusals");
    const char *reg = tmp_path("regression.trace"), *svg = tmp_path("reg.svg");
    write_made_up(reg, 20, true);
    int rc = qtrain("plot %s -o %s", reg, svg);
    CHECK(rc == 0, "exit %d: %s", rc, output);
    check_svg(svg, 4);
    size_t size = 0;
    char *text = file_read(svg, &size);
    static const float loss[3] = {1.0f, 1.5f, 2.0f};
    if (text) {
        CHECK(strstr(text, "data-panel=\"eval loss\""), "no eval loss panel");
        check_attr(text, 1, "data-first", point(20, pass_mean(loss, 0.0f, 1.0)));
    }
    free(text);
    // A long run is thinned; its first and last points stay.
    const char *longer = tmp_path("long.trace");
    write_made_up(longer, 20000, false);
    rc = qtrain("plot %s -o %s --force", longer, svg);
    text = file_read(svg, &size);
    char points[32] = "";
    CHECK(rc == 0 && text && polyline_attr(text, 0, "data-points", points, sizeof points) &&
              atoi(points) <= PLOT_POINTS_MAX && atoi(points) > PLOT_POINTS_MAX / 2,
          "exit %d, %s points", rc, points);
    if (text) check_attr(text, 0, "data-last", point(20012, 2.0f / 20013.0f));
    free(text);
    rc = qtrain("plot %s -o %s", tmp_path("missing.trace"), tmp_path("x.svg"));
    CHECK(rc == 1 && strstr(output, "missing.trace: cannot open"), "exit %d: %s", rc, output);
    file_write(tmp_path("bad.trace"), "hello\n", 6);
    rc = qtrain("plot %s -o %s", tmp_path("bad.trace"), tmp_path("x.svg"));
    CHECK(rc == 1 && strstr(output, "not a qtrain trace"), "exit %d: %s", rc, output);
    CHECK(access(tmp_path("x.svg"), F_OK) != 0, "a failed plot left its file");
    rc = qtrain("plot %s", reg);
    CHECK(rc == 2 && strstr(output, "expected -o FILE.svg"), "exit %d: %s", rc, output);
    rc = qtrain("plot -o %s", tmp_path("x.svg"));
    CHECK(rc == 2 && strstr(output, "expected at least one trace file"), "exit %d: %s", rc,
          output);
    test_end();
}

// ---------------------------------------------------------------------------------------------

int main(void) {
    if (!tmp_dir_make("replay")) {
        printf("FAIL test_replay: cannot create a temporary folder\n");
        return 1;
    }
    test_check_cli();
    test_check_gpu();
    test_plot_cli();
    test_plot_edges();
    tmp_dir_remove();
    return test_exit_code();
}
