// test_replay: golden-trace replay (`qtrain run --check`), through the tool.
//
// A run checked against its own golden trace passes (exit 0); the same recipe with another seed
// stops at its first step with the step, the field and both values (exit 1); a golden trace cut
// in a line is refused before training, one cut after a record stops the run where it ends.
// Run from the repository root.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/wait.h>  // WEXITSTATUS
#include <unistd.h>

#include "backend.h"  // backend_open_gpu: GPU cases are skipped without one
#include "test.h"
#include "trace.h"

static char tmp_dir[64];

static const char *tmp_path(const char *name) {
    static char paths[16][160];
    static int next;
    char *p = paths[next++ % 16];
    snprintf(p, 160, "%s/%s", tmp_dir, name);
    return p;
}

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)n + 1);
    *size = fread(data, 1, (size_t)n, f);
    data[*size] = '\0';
    fclose(f);
    return data;
}

static void write_bytes(const char *path, const char *data, size_t size) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, size, f);
    fclose(f);
}

static char output[1 << 16];

// Runs `build/qtrain ARGS` and returns its exit status; its output is in `output`.
static int qtrain(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int qtrain(const char *fmt, ...) {
    char args[2048], cmd[2200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "build/qtrain %s 2>&1", args);
    FILE *pipe = popen(cmd, "r");
    if (!pipe) return -1;
    size_t used = fread(output, 1, sizeof output - 1, pipe);
    output[used] = '\0';
    int status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The tiny recipe of tests/recipes with the given built-in recipe.
static const char *tiny_recipe(const char *scheme) {
    size_t size = 0;
    char *text = slurp("tests/recipes/synthetic_tiny.recipe", &size);
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
    char *text = slurp(golden, &size);
    const char *cut = tmp_path("cut.trace");
    write_bytes(cut, text, size / 2);
    rc = qtrain("run %s --ref --checksum-every 20 --check %s", recipe, cut);
    CHECK(rc == 1 && strstr(output, "the golden trace is cut short") &&
              !strstr(output, "step      "), "cut golden: exit %d: %s", rc, output);
    // Cut after the record of step 49: the run stops where the golden trace ends.
    char *line = text;
    for (int i = 0; i < 1 + 6 + 50 && line; i++) line = strchr(line, '\n') + 1;  // 6 quantizers
    write_bytes(cut, text, (size_t)(line - text));
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

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qt_test_replay_XXXXXX");
    if (mkdtemp(tmp_dir) == NULL) {
        printf("FAIL test_replay: cannot create a temporary folder\n");
        return 1;
    }
    test_check_cli();
    test_check_gpu();
    char command[128];
    snprintf(command, sizeof command, "rm -rf '%s'", tmp_dir);
    if (system(command) != 0) printf("  could not remove %s\n", tmp_dir);
    return test_exit_code();
}
