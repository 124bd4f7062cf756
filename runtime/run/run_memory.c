// The run's memory against what there is (run_check_memory, runtime/run/run.h): a run that cannot
// get its memory is refused before anything is allocated, with the numbers and what to change,
// instead of failing inside an allocation or being killed by the kernel halfway through start-up.
#include <inttypes.h>
#include <stdio.h>   // snprintf
#include <string.h>

#include "runtime/run/host_memory.h"  // host_memory_read
#include "runtime/run/run.h"

#define RUN_MEMORY_TOP_REGIONS 3

// "12.5 GiB", "3.0 MiB": a size people read beside its exact bytes.
static void run_size_text(uint64_t bytes, char *out, size_t out_bytes) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024.0 && unit < 5) {
        value /= 1024.0;
        unit++;
    }
    snprintf(out, out_bytes, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
}

// "name (category, 1.0 GiB), ..." for the largest regions of the arena.
static void run_largest_regions(const arena *a, char *out, size_t out_bytes) {
    size_t used = 0;
    out[0] = '\0';
    arena_handle h = ARENA_HANDLE_NONE;
    for (int k = 0; k < RUN_MEMORY_TOP_REGIONS && (h = arena_next_largest(a, -1, h)) !=
                                                       ARENA_HANDLE_NONE; k++) {
        const arena_region *region = arena_region_get(a, h);
        char size[32];
        run_size_text(region->bytes, size, sizeof size);
        int n = snprintf(out + used, out_bytes - used, "%s%s (%s, %s)", k ? ", " : "",
                         region->name, arena_category_name(region->category), size);
        if (n < 0 || (size_t)n >= out_bytes - used) break;
        used += (size_t)n;
    }
}

// "; or `recompute` on the activations at lines 7, 13, 19 (...)" where the device arena could
// shrink so (model_recompute_would_help), else nothing; at most RUN_MEMORY_RECOMPUTE_LINES
// lines named, and how many more.
#define RUN_MEMORY_RECOMPUTE_LINES 6
static void run_recompute_hint(const run *r, char *out, size_t out_bytes) {
    const recipe_model *rm = &r->recipe->model;
    uint32_t count = 0;
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < rm->layers_count; i++) {
        if (!model_recompute_would_help(&r->model, i)) continue;
        if (count < RUN_MEMORY_RECOMPUTE_LINES) {
            int n = snprintf(out + used, out_bytes - used, "%s%u",
                             count == 0 ? "; or `recompute` on the activations at lines "
                                        : ", ",
                             rm->layers[i].line);
            if (n < 0 || (size_t)n >= out_bytes - used) return;
            used += (size_t)n;
        }
        count++;
    }
    if (count > RUN_MEMORY_RECOMPUTE_LINES) {
        int n = snprintf(out + used, out_bytes - used, " and %u more",
                         count - RUN_MEMORY_RECOMPUTE_LINES);
        if (n < 0 || (size_t)n >= out_bytes - used) return;
        used += (size_t)n;
    }
    if (count > 0) {
        snprintf(out + used, out_bytes - used, " (backward keeps their outputs; it would make "
                 "them again, a pass each)");
    }
}

// What to change in the recipe, by what the memory goes to. device: the device arena is short
// (the activations' outputs live there).
static void run_fit_hint(const run *r, bool datasets, bool device, char *out, size_t out_bytes) {
    char recompute[256] = "";
    if (device) run_recompute_hint(r, recompute, sizeof recompute);
    // Resident datasets sit in the device arena too (data.train, data.eval).
    bool resident = device && r->model.io.slot.resident;
    snprintf(out, out_bytes, "to fit, change the recipe: a smaller `batch` in [data] (now %u: "
             "activations, gradients and the batch slots grow with it), narrower linear layers "
             "(weights, masters and Adam moments grow with inputs x outputs), or smaller formats "
             "in [quant] (a weight's copy takes 2 bytes in bf16, about 1 in fp8 or mxfp8, about "
             "0.6 in nvfp4, beside 12 bytes of FP32 master and moments)%s%s%s",
             r->recipe->data.batch, recompute, datasets ? "; or fewer samples (the datasets "
                                                          "are read into host memory whole)" : "",
             resident ? "; or `resident = off` in [data] (the datasets then stay in host "
                        "memory, each step copying its rows)" : "");
}

static qt_status run_check_device(const run *r, backend *b) {
    uint64_t free_bytes = 0, total = 0;
    QT_TRY(backend_memory_free(b, &free_bytes, &total));
    uint64_t need = r->dev.bytes_total;
    if (need <= free_bytes) return QT_OK;
    char need_text[32], free_text[32], total_text[32], regions[512], hint[1024];
    run_size_text(need, need_text, sizeof need_text);
    run_size_text(free_bytes, free_text, sizeof free_text);
    run_size_text(total, total_text, sizeof total_text);
    run_largest_regions(&r->dev, regions, sizeof regions);
    run_fit_hint(r, false, true, hint, sizeof hint);
    return qt_fail(QT_ERR_MEMORY, "not enough GPU memory: the device arena needs %" PRIu64
                   " bytes (%s), and %s has %" PRIu64 " bytes (%s) free of %s (cuMemGetInfo); "
                   "its largest regions: %s; %s", need, need_text, b->info.name, free_bytes,
                   free_text, total_text, regions, hint);
}

qt_status run_check_memory(const run *r, backend *b, bool ref, uint64_t extra_host) {
    if (b != NULL && b->kind == BACKEND_GPU) QT_TRY(run_check_device(r, b));
    uint64_t dev = ref ? r->dev.bytes_total : 0, host = r->host.bytes_total;
    uint64_t need = dev + host + extra_host;
    host_memory m;
    host_memory_read(&m);
    if (need <= m.available) return QT_OK;
    char need_text[32], have_text[32], parts[256], regions[1100], hint[1024];
    run_size_text(need, need_text, sizeof need_text);
    run_size_text(m.available, have_text, sizeof have_text);
    size_t used = (size_t)snprintf(parts, sizeof parts, "the host arena %" PRIu64, host);
    if (ref) {
        used += (size_t)snprintf(parts + used, sizeof parts - used, ", the device arena %" PRIu64
                                 " (the reference backend keeps it in host memory)", dev);
    }
    if (extra_host) {
        snprintf(parts + used, sizeof parts - used, ", the datasets %" PRIu64, extra_host);
    }
    const arena *largest = ref && dev > host ? &r->dev : &r->host;
    run_largest_regions(largest, regions, sizeof regions);
    run_fit_hint(r, extra_host > 0, ref && dev > 0, hint, sizeof hint);
    return qt_fail(QT_ERR_MEMORY, "not enough host memory: the run needs %" PRIu64 " bytes (%s: "
                   "%s), and this process can get %" PRIu64 " bytes (%s; the tightest limit: "
                   "%s); the %s arena's largest regions: %s; %s", need, need_text, parts,
                   m.available, have_text, host_memory_limit_name(m.tightest), largest->name,
                   regions, hint);
}
