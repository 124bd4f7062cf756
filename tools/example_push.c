// example_push: an embedder of qtrain, which needs runtime/qtrain.h alone. It trains a recipe
// that names no data source, pushing every batch from C (two noisy classes), on the GPU when
// there is one (--ref: the reference backend), then classifies one batch with qt_infer.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtrain.h"

static const char recipe[] =
    "[model]\ninput = 4\nlayer = linear fc1 16 bias\nlayer = gelu\nlayer = linear head 2\n"
    "loss = softmax_xent\n[quant]\nrecipe = bf16\n[optim]\nadamw lr=1e-2\n"
    "[data]\nbatch = 32\n[schedule]\ntrain 100\n";

static void *blocks[5];  // every block of memory qtrain takes: the caller's, aligned
static void *block(int i, size_t bytes) {
    size_t rounded = (bytes / QT_MEMORY_ALIGN + 1) * QT_MEMORY_ALIGN;
    return blocks[i] = aligned_alloc(QT_MEMORY_ALIGN, rounded);
}

static int fail(const char *what) {
    fprintf(stderr, "example_push: %s: %s\n", what, qt_error_message());
    return 1;
}

int main(int argc, char **argv) {
    float x[32 * 4];
    int32_t y[32], classes[32];
    qt_device *dev;
    qt_runtime *rt;
    qt_device_info info;
    qt_plan_info plan;
    qt_step_stats st;
    qt_options options = {.modes[QT_MODE_INFER] = true};  // qt_infer needs the infer program
    uint64_t tables = 0;
    bool ref = argc > 1 && strcmp(argv[1], "--ref") == 0;
    if (qt_device_open(block(0, qt_device_bytes()), qt_device_bytes(),
                       ref ? QT_DEVICE_REFERENCE : QT_DEVICE_AUTO, 0, &dev) != QT_OK ||
        qt_open_text(block(1, qt_runtime_bytes()), qt_runtime_bytes(), recipe, strlen(recipe),
                     "example", &rt) != QT_OK ||
        qt_measure(rt, &options, &tables) != QT_OK ||
        qt_plan(rt, block(4, tables), tables) != QT_OK || qt_plan_info_get(rt, &plan) != QT_OK ||
        qt_load(rt, NULL, 0) != QT_OK) {
        return fail("start");
    }
    qt_device_describe(dev, &info);  // a GPU's arenas come from the driver, the CPU's from here
    qt_arenas arenas = {block(2, plan.device_bytes), plan.device_bytes,
                        block(3, plan.host_bytes), plan.host_bytes};
    if (qt_bind(rt, dev, info.gpu ? NULL : &arenas) != QT_OK) return fail("bind");
    srand(1);
    for (int step = 0; step < 100; step++) {
        for (int r = 0; r < 32; r++) {  // class c: every feature near +1 or -1
            y[r] = rand() % 2;
            for (int j = 0; j < 4; j++) x[r * 4 + j] = (y[r] ? 1 : -1) + rand() % 100 / 50.0f - 1;
        }
        qt_batch batch = {32, x, NULL, y, NULL};
        if (qt_push_batch(rt, &batch) != QT_OK || qt_step(rt, &st) != QT_OK) return fail("step");
        if (step % 25 == 0 || step == 99) printf("step %3d loss %.4f\n", step, st.loss);
    }
    qt_batch last = {32, x, NULL, NULL, NULL};  // the last batch's inputs, without labels
    if (qt_infer(rt, &last, NULL, classes) != QT_OK) return fail("infer");
    int correct = 0;
    for (int r = 0; r < 32; r++) correct += classes[r] == y[r];
    printf("classified %d of 32 on %s\n", correct, info.name);
    if (qt_close(rt) != QT_OK || qt_device_close(dev) != QT_OK) return fail("close");
    for (int i = 0; i < 5; i++) free(blocks[i]);
    return 0;
}
