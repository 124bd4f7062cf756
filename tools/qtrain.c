// qtrain: the command-line tool. `qtrain run RECIPE` trains, `qtrain infer RECIPE` writes the
// model's outputs for a file of inputs, `qtrain plan RECIPE` prints what a run would do and the
// memory it plans, `qtrain info` reports the driver, the GPU and the loaded kernels (or says that
// the reference backend will be used), `qtrain diff A B` compares traces, `qtrain plot` draws
// them, `qtrain export CKPT OUT` writes a checkpoint's weights as safetensors.
//
// The first client of the C API: it reaches the library through runtime/qtrain.h alone (the
// benchmarks and the plot, tools of their own, are entered through their tools/ headers), and
// keeps its argument parsing, printing and memory (allocated at start-up) to itself.
#include <errno.h>
#include <inttypes.h>
#include <math.h>     // NAN, INFINITY: --inject-nonfinite's values
#include <pthread.h>  // the GPU opens while the datasets load
#include <signal.h>   // sigaction: Ctrl-C ends a run at a step boundary
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>  // aligned_alloc, strtoull
#include <string.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG: a data-parallel worker ends with its launcher
#include <sys/stat.h>  // stat: is --save the file --resume names?
#include <time.h>    // clock_gettime
#include <unistd.h>  // isatty, write, _exit

#include "bench_main.h"  // bench_main
#include "launch.h"      // launch_wait, launch_report_failure: the workers of --gpus N
#include "plot.h"        // plot_main
#include "qtrain.h"

// Propagates a failed call's status; its message is the library's, or cli_message.
#define CLI_TRY(call)                     \
    do {                                  \
        qt_status cli_status_ = (call);   \
        if (cli_status_ != QT_OK) return cli_status_; \
    } while (0)

// A failure of the tool's own (memory it could not allocate, a recipe it cannot run): its
// message, printed in place of the library's.
static char cli_message[512];

__attribute__((format(printf, 2, 3))) static qt_status cli_fail(qt_status status,
                                                                const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(cli_message, sizeof cli_message, fmt, args);
    va_end(args);
    return status;
}

static const char *error_text(void) { return cli_message[0] ? cli_message : qt_error_message(); }

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: qtrain COMMAND\n"
            "  run RECIPE [--trace F] [--eager] [--ref] [--steps N] [--seed S]\n"
            "             [--checksum-every K] [--profile] [--emulated-gemm auto|kernel|copies]\n"
            "             [--save CKPT [--save-every N]] [--resume CKPT] [--force]\n"
            "             [--check GOLDEN] [--inject-nonfinite STEP[:LAYER][=nan|inf|-inf]]\n"
            "             [--metrics FILE [--metrics-every N]] [--gpus N [--profile-rank R]]\n"
            "          train through the recipe's schedule table: every step a replayed CUDA\n"
            "          graph (--eager: launched op by op; --ref or no GPU: the reference backend;\n"
            "          --profile: afterwards, time every op of each mode and the graph replay;\n"
            "          --gpus: on N GPUs of this host, one process each; --profile-rank: the\n"
            "          rank whose profile is printed, default 0;\n"
            "          --save: a checkpoint at the end, at Ctrl-C and every N train steps;\n"
            "          --resume: continue, bit for bit, from a checkpoint;\n"
            "          --force: output files (infer rows, --save, --metrics) may replace\n"
            "          existing files, and --trace a file that is not a trace;\n"
            "          --check: stop at the first record that differs from a golden trace;\n"
            "          --inject-nonfinite: a NaN or infinity in a weight gradient at a train\n"
            "          step, which the optimizer must skip;\n"
            "          --metrics: a JSON line per eval pass and per N train steps, default 100)\n"
            "  infer RECIPE --input FILE --output FILE.npy [--argmax] [--from CKPT] [--seed S]\n"
            "             [--eager] [--ref] [--force] [--emulated-gemm auto|kernel|copies]\n"
            "          the recipe's model on every sample of FILE (IDX images or .npy features):\n"
            "          float32 logits, or int32 classes with --argmax, into an .npy file\n"
            "          (--from: with a checkpoint's weights)\n"
            "  plan RECIPE [--summary] [--steps N] [--seed S]\n"
            "             [--emulated-gemm auto|kernel|copies] [--gpus N [--rank R]]\n"
            "          the layers and their quantizers, padding and GEMM decisions, the schedule,\n"
            "          the program of each mode and the memory map (--summary: in brief;\n"
            "          --gpus: rank R's, default 0, and every rank's device arena)\n"
            "  info    driver, GPU and kernel report (registers, shared memory, local memory)\n"
            "  bench [quant|copy|gemm|quant_FAMILY] [--quick]\n"
            "          benchmarks on the GPU: medians of graph replays, next to a device copy\n"
            "          (gemm: next to cuBLASLt; --quick: the 4096^3 and 8192^3 GEMMs only)\n"
            "  diff A B\n"
            "          compare two trace files: the first differing step and field; exit 0 when\n"
            "          identical, 1 when they differ, 2 on error\n"
            "  export CKPT OUT.safetensors [--quantized] [--force]\n"
            "          a checkpoint's FP32 master weights (--quantized: also the codes and\n"
            "          scales of every usage) as safetensors; --force replaces OUT\n"
            "  plot A.trace [B.trace ...] -o curves.svg [--force]\n"
            "          loss, eval accuracy, gradient norm and learning rate against the step,\n"
            "          every run overlaid, as one SVG file (--force: replace an existing file)\n"
            "  --version\n"
            "          the release, and the versions of the trace and checkpoint formats\n");
}

// Memory of the tool's own for the library's blocks: QT_MEMORY_ALIGN aligned, never empty.
static void *cli_alloc(uint64_t bytes) {
    uint64_t rounded = (bytes / QT_MEMORY_ALIGN + 1) * QT_MEMORY_ALIGN;
    return aligned_alloc(QT_MEMORY_ALIGN, rounded);
}

static int command_info(void) {
    void *memory = cli_alloc(qt_device_bytes());
    qt_device *gpu = NULL;
    qt_status status = memory ? qt_device_open(memory, qt_device_bytes(), QT_DEVICE_GPU, 0, &gpu)
                              : QT_ERR_MEMORY;
    if (status == QT_ERR_NO_DRIVER || status == QT_ERR_NO_DEVICE) {
        printf("no CUDA driver / no GPU: the reference backend will be used\n  (%s)\n",
               qt_error_message());
        free(memory);
        return 0;
    }
    if (status != QT_OK) {
        fprintf(stderr, "qtrain info: %s: %s\n", qt_status_name(status), qt_error_message());
        free(memory);
        return 1;
    }
    qt_device_info info;
    qt_device_describe(gpu, &info);
    printf("driver      CUDA %d.%d\n", info.driver_version / 1000,
           info.driver_version % 1000 / 10);
    printf("device      %s\n", info.name);
    printf("compute     %d.%d, %d SMs\n", info.cc_major, info.cc_minor, info.sm_count);
    printf("memory      %.1f GiB total, %.1f GiB free\n",
           (double)info.memory_bytes / (1 << 30), (double)info.free_bytes / (1 << 30));
    printf("gemm tier   %s\n", info.gemm_tier);
    printf("launches    %s\n", info.overlapping_launches
                                   ? "overlapping: each kernel is launched while the one ahead "
                                     "runs (QTRAIN_SERIAL_LAUNCH=1: in plain stream order)"
                                   : "in plain stream order");
    printf("kernels     %u of %u loaded from %u modules\n", info.kernels_loaded, info.kernels,
           info.modules);
    printf("  %-32s %-12s %5s %10s %8s\n", "kernel", "module", "regs", "smem", "local");
    for (uint32_t k = 0; k < info.kernels; k++) {
        qt_kernel_info kernel;
        if (qt_device_kernel(gpu, k, &kernel) != QT_OK) break;
        if (!kernel.loaded) {
            printf("  %-32s %-12s not loaded: this device cannot run the image\n",
                   kernel.symbol, kernel.module);
            continue;
        }
        printf("  %-32s %-12s %5d %10d %8d\n", kernel.symbol, kernel.module, kernel.registers,
               kernel.static_smem_bytes, kernel.local_bytes);
    }
    qt_device_close(gpu);
    free(memory);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// run and plan

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct cli_args {
    const char *command;     // "run", "infer", "plan": for messages
    const char *recipe_path;
    qt_options options;
    bool ref;
    uint32_t profile_reps;  // --profile: launches per op when timing the programs after the run
    const char *resume_path;
    bool summary;           // plan --summary
    // --gpus N: the ranks of a data-parallel run. The launcher (no --rank) starts N workers, this
    // program again with the hidden --rank R --world N --parallel-id HEX; a worker runs rank R on
    // GPU R.
    uint32_t gpus;
    bool worker;
    bool plan_rank_given;  // plan --rank R: rank R's plan of --gpus N
    bool profile_rank_given;  // run --profile-rank R: rank R prints --profile's report
    uint32_t profile_rank;
    uint8_t parallel_id[QT_PARALLEL_ID_BYTES];
} cli_args;

// A decimal integer in [min, max]: digits only (no sign, blank, or other base), so that ' -1'
// or '1e3' is refused instead of read as something else.
static bool parse_count_arg(const char *command, const char *flag, const char *text,
                            uint64_t min, uint64_t max, uint64_t *out) {
    bool digits = text[0] != '\0' && strspn(text, "0123456789") == strlen(text);
    char *end = NULL;
    errno = 0;
    unsigned long long v = digits ? strtoull(text, &end, 10) : 0;
    if (!digits || errno != 0 || v < min || v > max) {
        fprintf(stderr, "qtrain %s: %s takes a whole number from %" PRIu64 " to %" PRIu64
                ", not '%s'%s\n", command, flag, min, max, qt_shown(text),
                digits && v < min && min == 1 ? " (leave the flag out for the recipe's default)"
                                              : "");
        return false;
    }
    *out = v;
    return true;
}

// `--inject-nonfinite STEP[:LAYER][=nan|inf|-inf]`: the trace's step index, a linear layer
// (default: the first), the value (default: nan). '=' and ':' never occur in layer names.
static bool parse_inject(const char *text, qt_options *o) {
    static char layer[64];  // the command's: the options point to it until the run ends
    const char *value = strchr(text, '=');
    size_t head = value ? (size_t)(value - text) : strlen(text);
    const char *colon = memchr(text, ':', head);
    size_t digits = colon ? (size_t)(colon - text) : head;
    char step[32];
    uint64_t v = 0;
    bool ok = digits > 0 && digits < sizeof step;
    if (ok) {
        memcpy(step, text, digits);
        step[digits] = '\0';
        ok = parse_count_arg("run", "--inject-nonfinite", step, 0, UINT64_MAX, &v);
        if (!ok) return false;
    }
    size_t name = colon ? head - digits - 1 : 0;
    ok = ok && (!colon || (name > 0 && name < sizeof layer));
    float bad = NAN;
    if (ok && value) {
        if (strcmp(value, "=inf") == 0) {
            bad = INFINITY;
        } else if (strcmp(value, "=-inf") == 0) {
            bad = -INFINITY;
        } else {
            ok = strcmp(value, "=nan") == 0;
        }
    }
    if (!ok) {
        fprintf(stderr, "qtrain run: --inject-nonfinite takes STEP[:LAYER][=nan|inf|-inf] (a "
                "train step of the trace, a linear layer, the value), not '%s'\n", text);
        return false;
    }
    if (colon) {
        memcpy(layer, colon + 1, name);
        layer[name] = '\0';
    }
    o->inject = true;
    o->inject_step = v;
    o->inject_layer = colon ? layer : NULL;
    o->inject_value = bad;
    return true;
}

static bool parse_emulated_gemm(const char *command, const char *how, qt_emulated_gemm *out) {
    if (strcmp(how, "auto") == 0) {
        *out = QT_EMULATED_GEMM_AUTO;
    } else if (strcmp(how, "kernel") == 0) {
        *out = QT_EMULATED_GEMM_KERNEL;
    } else if (strcmp(how, "copies") == 0) {
        *out = QT_EMULATED_GEMM_COPIES;
    } else {
        fprintf(stderr, "qtrain %s: --emulated-gemm takes auto, kernel or copies, not '%s'\n",
                command, qt_shown(how));
        return false;
    }
    return true;
}

typedef enum cli_command { CLI_PLAN, CLI_RUN, CLI_INFER } cli_command;

// The most GPUs of one host that --gpus takes (the runtime's rank limit).
#define QT_GPUS_MAX 16
_Static_assert(QT_GPUS_MAX <= LAUNCH_WORKERS_MAX, "launch_wait takes every worker");

// --parallel-id: QT_PARALLEL_ID_BYTES as lower-case hex, as the launcher writes it.
static bool parse_parallel_id(const char *hex, uint8_t *out) {
    if (strlen(hex) != 2 * QT_PARALLEL_ID_BYTES ||
        strspn(hex, "0123456789abcdef") != 2 * QT_PARALLEL_ID_BYTES) {
        fprintf(stderr, "qtrain run: --parallel-id: expected %d hex digits (qtrain run --gpus "
                "starts its workers with it)\n", 2 * QT_PARALLEL_ID_BYTES);
        return false;
    }
    for (int i = 0; i < QT_PARALLEL_ID_BYTES; i++) {
        unsigned byte = 0;
        sscanf(hex + 2 * i, "%2x", &byte);
        out[i] = (uint8_t)byte;
    }
    return true;
}

// The data-parallel flags with their values: --gpus, and the workers' own (hidden) --rank,
// --world and --parallel-id. 1 when taken, 0 when arg is none of them, -1 when its value is bad.
static int parse_parallel_flag(cli_command command, const char *arg, const char *value,
                               cli_args *a) {
    bool train = command == CLI_RUN;
    qt_options *o = &a->options;
    uint64_t v = 0;
    if (command == CLI_INFER && strcmp(arg, "--gpus") == 0) {
        // Its input file and --from's checkpoint are read by one process; infer rows are not.
        fprintf(stderr, "qtrain infer: --gpus: qtrain infer runs on one GPU; a recipe's infer "
                "rows run on several (qtrain run RECIPE --gpus N)\n");
        return -1;
    } else if (strcmp(arg, "--gpus") == 0) {
        if (!parse_count_arg(a->command, arg, value, 1, QT_GPUS_MAX, &v)) return -1;
        a->gpus = (uint32_t)v;
    } else if (command == CLI_PLAN && strcmp(arg, "--rank") == 0) {
        // The rank whose plan to print (qtrain plan --gpus N --rank R); no worker.
        if (!parse_count_arg(a->command, arg, value, 0, QT_GPUS_MAX - 1, &v)) return -1;
        o->rank = (uint32_t)v;
        a->plan_rank_given = true;
    } else if (train && strcmp(arg, "--rank") == 0) {
        if (!parse_count_arg(a->command, arg, value, 0, QT_GPUS_MAX - 1, &v)) return -1;
        o->rank = (uint32_t)v;
        a->worker = true;
    } else if (train && strcmp(arg, "--profile-rank") == 0) {
        if (!parse_count_arg(a->command, arg, value, 0, QT_GPUS_MAX - 1, &v)) return -1;
        a->profile_rank = (uint32_t)v;
        a->profile_rank_given = true;
    } else if (train && strcmp(arg, "--world") == 0) {
        if (!parse_count_arg(a->command, arg, value, 2, QT_GPUS_MAX, &v)) return -1;
        o->world = (uint32_t)v;
    } else if (train && strcmp(arg, "--parallel-id") == 0) {
        if (!parse_parallel_id(value, a->parallel_id)) return -1;
        o->parallel_id = a->parallel_id;
    } else {
        return 0;
    }
    return 1;
}

// One flag at argv[*i] (its value at argv[*i + 1]): 1 when it is one of the command's flags and
// was taken (*i moved past its value), 0 when it is not, -1 when its value is bad.
static int parse_flag(cli_command command, int argc, char **argv, int *i, cli_args *a) {
    const char *arg = argv[*i];
    const char *value = *i + 1 < argc ? argv[*i + 1] : NULL;
    bool launch = command != CLI_PLAN, train = command == CLI_RUN, infer = command == CLI_INFER;
    qt_options *o = &a->options;
    uint64_t v = 0;
    bool takes_value = true;
    if (launch && strcmp(arg, "--eager") == 0) {
        o->eager = true;
        takes_value = false;
    } else if (launch && strcmp(arg, "--ref") == 0) {
        a->ref = true;
        takes_value = false;
    } else if (launch && strcmp(arg, "--force") == 0) {
        o->replace_outputs = true;
        takes_value = false;
    } else if (train && strcmp(arg, "--profile") == 0) {
        a->profile_reps = 100;
        takes_value = false;
    } else if (infer && strcmp(arg, "--argmax") == 0) {
        o->infer_argmax = true;
        takes_value = false;
    } else if (command == CLI_PLAN && strcmp(arg, "--summary") == 0) {
        a->summary = true;
        takes_value = false;
    } else if (!value) {
        return 0;
    } else if (train && strcmp(arg, "--trace") == 0) {
        o->trace_path = value;
    } else if (train && strcmp(arg, "--metrics") == 0) {
        o->metrics_path = value;
    } else if (train && strcmp(arg, "--metrics-every") == 0) {
        if (!parse_count_arg(a->command, arg, value, 1, UINT64_MAX, &o->metrics_every)) {
            return -1;
        }
    } else if (train && strcmp(arg, "--check") == 0) {
        o->golden_path = value;
    } else if (!infer && strcmp(arg, "--steps") == 0) {
        // 0 would mean "no cut" to the planner: a run of 0 steps is not what was asked for.
        if (!parse_count_arg(a->command, arg, value, 1, UINT64_MAX, &o->steps)) return -1;
    } else if (strcmp(arg, "--seed") == 0) {
        if (!parse_count_arg(a->command, arg, value, 0, UINT64_MAX, &o->seed)) return -1;
        o->seed_given = true;
    } else if (train && strcmp(arg, "--checksum-every") == 0) {
        if (!parse_count_arg(a->command, arg, value, 0, UINT32_MAX, &v)) return -1;
        o->checksum_every = (uint32_t)v;
    } else if (infer && strcmp(arg, "--input") == 0) {
        o->infer_input = value;
    } else if (infer && strcmp(arg, "--output") == 0) {
        o->infer_output = value;
    } else if (infer && strcmp(arg, "--from") == 0) {
        o->from_path = value;
    } else if (train && strcmp(arg, "--save") == 0) {
        o->save_path = value;
    } else if (train && strcmp(arg, "--save-every") == 0) {
        if (!parse_count_arg(a->command, arg, value, 1, UINT64_MAX, &o->save_every)) return -1;
    } else if (train && strcmp(arg, "--resume") == 0) {
        a->resume_path = value;
    } else if (train && strcmp(arg, "--inject-nonfinite") == 0) {
        if (!parse_inject(value, o)) return -1;
    } else if (strcmp(arg, "--emulated-gemm") == 0) {
        if (!parse_emulated_gemm(a->command, value, &o->emulated_gemm)) return -1;
    } else {
        int taken = parse_parallel_flag(command, arg, value, a);
        if (taken <= 0) return taken;
    }
    *i += takes_value ? 1 : 0;
    return 1;
}

static bool parse_run_args(int argc, char **argv, cli_command command, cli_args *a) {
    memset(a, 0, sizeof *a);
    a->command = argv[1];
    a->options.checksum_every = 100;
    for (int i = 2; i < argc; i++) {
        int taken = parse_flag(command, argc, argv, &i, a);
        if (taken < 0) return false;
        if (taken > 0) continue;
        if (argv[i][0] != '-' && !a->recipe_path) {
            a->recipe_path = argv[i];
        } else {
            fprintf(stderr, "qtrain %s: unexpected argument '%s'\n", argv[1], qt_shown(argv[i]));
            return false;
        }
    }
    if (!a->recipe_path) {
        fprintf(stderr, "qtrain %s: expected a recipe file\n", argv[1]);
        return false;
    }
    if (command == CLI_INFER && (!a->options.infer_input || !a->options.infer_output)) {
        fprintf(stderr, "qtrain infer: expected --input FILE and --output FILE.npy\n");
        return false;
    }
    if (a->options.save_every && !a->options.save_path) {
        fprintf(stderr, "qtrain run: --save-every needs --save CKPT (the file to write)\n");
        return false;
    }
    if (a->options.metrics_every && !a->options.metrics_path) {
        fprintf(stderr, "qtrain run: --metrics-every needs --metrics FILE (the file to write)\n");
        return false;
    }
    if (a->worker && (!a->options.world || !a->options.parallel_id)) {
        fprintf(stderr, "qtrain run: --rank needs --world and --parallel-id (qtrain run --gpus N "
                "starts its workers with them)\n");
        return false;
    }
    if (a->gpus > 1 && a->ref) {
        fprintf(stderr, "qtrain %s: --gpus %u runs one process per GPU; --ref runs on the CPU: "
                "drop one of them\n", argv[1], a->gpus);
        return false;
    }
    // A worker gets --world N in place of the launcher's --gpus N, and the same --profile-rank.
    uint32_t ranks = a->worker ? a->options.world : a->gpus;
    if (a->profile_rank_given && (!a->profile_reps || a->profile_rank >= ranks)) {
        fprintf(stderr, "qtrain run: --profile-rank %u needs --profile and --gpus above it (the "
                "rank whose profile --profile prints; the ranks of --gpus N are 0 to N-1)\n",
                a->profile_rank);
        return false;
    }
    if (a->plan_rank_given && a->options.rank >= a->gpus) {
        fprintf(stderr, "qtrain plan: --rank %u needs --gpus above it (the ranks of --gpus N are "
                "0 to N-1)\n", a->options.rank);
        return false;
    }
    if (command == CLI_PLAN && a->gpus > 1) {  // a rank's plan (qtrain plan --gpus)
        a->options.world = a->gpus;
    }
    a->options.checkpoints = a->resume_path != NULL;
    struct stat save, resume;
    a->options.save_replaces = a->resume_path && a->options.save_path &&
                               stat(a->resume_path, &resume) == 0 &&
                               stat(a->options.save_path, &save) == 0 &&
                               save.st_dev == resume.st_dev && save.st_ino == resume.st_ino;
    return true;
}

static int fail_status(const char *command, qt_status status) {
    fprintf(stderr, "qtrain %s: %s: %s\n", command, qt_status_name(status), error_text());
    return 1;
}

// The memory of one command's runtime and device, and what their handles name in it.
typedef struct cli_run {
    void *runtime_memory, *device_memory, *tables, *data, *arena_device, *arena_host;
    qt_runtime *rt;
    qt_device *device;
} cli_run;

static void cli_run_close(cli_run *c) {
    qt_close(c->rt);  // before the arenas' memory goes
    if (c->device) qt_device_close(c->device);
    free(c->runtime_memory);
    free(c->device_memory);
    free(c->tables);
    free(c->data);
    free(c->arena_device);
    free(c->arena_host);
    memset(c, 0, sizeof *c);
}

// Reads the recipe and plans the run (no device, no data loaded). The text is read once: the
// bytes parsed are the bytes hashed for the trace and the checkpoints.
static qt_status load_and_plan(const cli_args *a, cli_run *c) {
    c->runtime_memory = cli_alloc(qt_runtime_bytes());
    if (!c->runtime_memory) {
        return cli_fail(QT_ERR_MEMORY, "cannot allocate %zu bytes for the runtime",
                        qt_runtime_bytes());
    }
    CLI_TRY(qt_open_file(c->runtime_memory, qt_runtime_bytes(), a->recipe_path, &c->rt));
    uint64_t table_bytes = 0;
    CLI_TRY(qt_measure(c->rt, &a->options, &table_bytes));
    // The run's tables, sized from the model; they live as long as the command.
    if (!(c->tables = cli_alloc(table_bytes))) {
        return cli_fail(QT_ERR_MEMORY, "cannot allocate %" PRIu64 " bytes for the run's tables",
                        table_bytes);
    }
    return qt_plan(c->rt, c->tables, table_bytes);
}

// One rank's device arena (world 1: the run on one GPU) by category, for `qtrain plan --gpus`.
static qt_status plan_rank_line(const cli_args *a, uint32_t rank, uint32_t world) {
    cli_args ranked = *a;
    ranked.options.rank = rank;
    ranked.options.world = world;
    cli_run c;
    memset(&c, 0, sizeof c);
    qt_status status = load_and_plan(&ranked, &c);
    if (status != QT_OK) {
        cli_run_close(&c);
        return status;
    }
    static const char *const shown[] = {"weights", "master", "optim", "grads", "activations",
                                        "workspace", "staging"};
    uint64_t bytes[7] = {0};
    qt_plan_info info;
    qt_plan_info_get(c.rt, &info);
    for (uint32_t i = 0; i < info.device_regions; i++) {
        qt_region region;
        if (qt_plan_region(c.rt, QT_ARENA_DEVICE, i, &region) != QT_OK) continue;
        for (int k = 0; k < 7; k++) {
            if (strcmp(region.category, shown[k]) == 0) bytes[k] += region.bytes;
        }
    }
    if (world == 1) {
        printf("  one GPU    device %10.2f MiB (batch %u)", (double)info.device_bytes / 1048576.0,
               info.batch);
    } else {
        printf("  rank %-5u device %10.2f MiB (batch %u)", rank,
               (double)info.device_bytes / 1048576.0, info.batch);
    }
    for (int k = 0; k < 7; k++) printf(" %s %.2f", shown[k], (double)bytes[k] / 1048576.0);
    printf(" MiB\n");
    cli_run_close(&c);
    return QT_OK;
}

static int command_plan(int argc, char **argv) {
    cli_args a;
    if (!parse_run_args(argc, argv, CLI_PLAN, &a)) return 2;
    cli_run c;
    memset(&c, 0, sizeof c);
    qt_status status = load_and_plan(&a, &c);
    qt_plan_info info;
    memset(&info, 0, sizeof info);
    if (status == QT_OK) {
        if (a.gpus > 1) printf("rank %u of %u GPUs:\n", a.options.rank, a.gpus);
        qt_plan_info_get(c.rt, &info);
        status = a.summary ? qt_plan_print_summary(c.rt, stdout) : qt_plan_print(c.rt, stdout);
    }
    cli_run_close(&c);
    if (status == QT_OK && a.gpus > 1) {
        // Every rank's arena: the masters and moments of the parameters it owns, the rest alike;
        // a run without train steps has no moments and keeps every master on every rank.
        printf("data parallel: %u GPUs, each rank's device arena by category (%s), next to one "
               "GPU's\n", a.gpus, info.modes[QT_MODE_TRAIN]
                                  ? "ZeRO-1: masters and Adam moments of its own parameters only"
                                  : "no train steps: every master on every rank");
        for (uint32_t r = 0; r < a.gpus && status == QT_OK; r++) {
            status = plan_rank_line(&a, r, a.gpus);
        }
        if (status == QT_OK) status = plan_rank_line(&a, 0, 1);
    }
    return status == QT_OK ? 0 : fail_status("plan", status);
}

// The progress line: one per row kept on screen (on a terminal it is redrawn in place while the
// row runs; elsewhere a line every 5 s), so each eval pass leaves its result. Train lines show
// the mean loss and accuracy of the current epoch's steps so far, eval lines the pass's so far
// (the whole pass on its last line), both over real rows as the summary counts them.
typedef struct progress_state {
    bool tty;
    bool classification;
    bool input_file;                         // `qtrain infer`: the rows read --input
    double last_print;
    double last_elapsed;
    double mode_seconds[QT_MODE_COUNT];     // the loop's time, by the mode of each step
    uint64_t mode_steps[QT_MODE_COUNT];
    uint64_t epoch;                          // the epoch the train sums are of
    double loss_sum;
    uint64_t rows, correct;
} progress_state;

// h:mm:ss, or -:--:-- when unknown.
static void format_eta(double seconds, char *buf, size_t bytes) {
    if (!(seconds >= 0) || seconds > 1e9) {
        snprintf(buf, bytes, "-:--:--");
        return;
    }
    uint64_t s = (uint64_t)(seconds + 0.5);
    snprintf(buf, bytes, "%" PRIu64 ":%02u:%02u", s / 3600, (unsigned)(s / 60 % 60),
             (unsigned)(s % 60));
}

// Three significant digits or so: "1234 steps/s", "56.7 steps/s", "8.90 steps/s", and below one
// step a second the time of a step, "12.3 s/step".
static void format_rate(double steps_per_s, char *buf, size_t bytes) {
    if (!(steps_per_s > 0)) {
        snprintf(buf, bytes, "- steps/s");
    } else if (steps_per_s >= 100) {
        snprintf(buf, bytes, "%.0f steps/s", steps_per_s);
    } else if (steps_per_s >= 10) {
        snprintf(buf, bytes, "%.1f steps/s", steps_per_s);
    } else if (steps_per_s >= 1) {
        snprintf(buf, bytes, "%.2f steps/s", steps_per_s);
    } else {
        snprintf(buf, bytes, "%.1f s/step", 1.0 / steps_per_s);
    }
}

// The time left: each mode's steps left at that mode's pace so far (a mode not seen yet at the
// pace of all steps so far).
static double progress_eta(const progress_state *st, const qt_step_stats *p) {
    double all_s = 0;
    uint64_t all_steps = 0;
    for (int m = 0; m < QT_MODE_COUNT; m++) {
        all_s += st->mode_seconds[m];
        all_steps += st->mode_steps[m];
    }
    if (all_steps == 0) return -1;
    double eta = 0;
    for (int m = 0; m < QT_MODE_COUNT; m++) {
        double per_step = st->mode_steps[m] ? st->mode_seconds[m] / (double)st->mode_steps[m]
                                            : all_s / (double)all_steps;
        eta += per_step * (double)p->steps_left[m];
    }
    return eta;
}

// " loss 0.41232  acc 85.12%" (no accuracy for a regression).
static void format_loss(const progress_state *st, double loss, double accuracy, char *buf,
                        size_t bytes) {
    if (st->classification) {
        snprintf(buf, bytes, "loss %-8.5g acc %6.2f%%", loss, 100.0 * accuracy);
    } else {
        snprintf(buf, bytes, "loss %-8.5g", loss);
    }
}

// The train sums of the current epoch, this step's rows added.
static void progress_train(progress_state *st, const qt_step_stats *p, uint64_t epoch_steps) {
    uint64_t epoch = (p->train_steps - 1) / epoch_steps;
    if (epoch != st->epoch || st->rows == 0) {
        st->epoch = epoch;
        st->loss_sum = 0;
        st->rows = st->correct = 0;
    }
    st->loss_sum += (double)p->loss * p->rows_valid;
    st->rows += p->rows_valid;
    st->correct += (uint64_t)((double)p->accuracy * p->rows_valid + 0.5);
}

static void print_progress(void *ctx, const qt_step_stats *p) {
    progress_state *st = ctx;
    st->mode_seconds[p->mode] += p->elapsed_s - st->last_elapsed;
    st->mode_steps[p->mode]++;
    st->last_elapsed = p->elapsed_s;
    uint64_t epoch_steps = p->epoch_steps ? p->epoch_steps : 1;
    if (p->mode == QT_MODE_TRAIN) progress_train(st, p, epoch_steps);
    bool row_end = p->row_step == p->row_steps;
    bool due = p->elapsed_s - st->last_print >= (st->tty ? 0.1 : 5.0);
    if (!row_end && !due) return;
    st->last_print = p->elapsed_s;
    char rate[32], eta[32], where[64], loss[64];
    double seconds = st->mode_seconds[p->mode];
    format_rate(seconds > 0 ? (double)st->mode_steps[p->mode] / seconds : 0.0, rate,
                sizeof rate);
    format_eta(progress_eta(st, p), eta, sizeof eta);
    uint64_t train_total = p->train_steps + p->steps_left[QT_MODE_TRAIN];
    if (p->mode == QT_MODE_TRAIN) {
        snprintf(where, sizeof where, "step %6" PRIu64 "/%-6" PRIu64 " epoch %5.2f/%-5.4g",
                 p->train_steps, train_total, (double)p->train_steps / (double)epoch_steps,
                 (double)train_total / (double)epoch_steps);
        format_loss(st, st->rows ? st->loss_sum / (double)st->rows : 0.0,
                    st->rows ? (double)st->correct / (double)st->rows : 0.0, loss, sizeof loss);
    } else {
        const char *set = st->input_file ? "input file" : p->eval_set ? "eval set" : "train set";
        loss[0] = '\0';
        if (p->mode == QT_MODE_EVAL) {
            snprintf(where, sizeof where, "pass %5" PRIu64 "/%-5" PRIu64 " %-9s %7" PRIu64
                     " samples", p->row_step, p->row_steps, set, p->pass_samples);
            format_loss(st, p->pass_loss, p->pass_accuracy, loss, sizeof loss);
        } else {
            snprintf(where, sizeof where, "step %5" PRIu64 "/%-5" PRIu64 " %s", p->row_step,
                     p->row_steps, set);
        }
    }
    fprintf(stderr, "%s%-5s %s  %-26s %14s  ETA %s%s", st->tty ? "\r" : "",
            qt_mode_name(p->mode), where, loss, rate, eta,
            (row_end || !st->tty) ? "\n" : "");
    fflush(stderr);
}

// The lines about where the run started and stopped, and its checkpoints.
static void print_position(const cli_args *a, const qt_runtime *rt, const qt_summary *s,
                           int signal_number) {
    uint64_t step = 0, train_steps = 0;
    qt_timings t;
    qt_timings_get(rt, &t);
    if (qt_resumed(rt, &step, &train_steps)) {
        printf("resumed      from %s at step %" PRIu64 " (train step %" PRIu64 "), loaded in "
               "%.3f s\n", a->resume_path, step, train_steps, t.resume_s);
    }
    if (signal_number) {
        qt_position at;
        qt_position_get(rt, &at);
        printf("interrupted  by %s at step %" PRIu64 " (train step %" PRIu64 ")\n",
               signal_number == SIGTERM ? "SIGTERM" : "SIGINT", at.step, at.train_steps);
    }
    if (s->saves) {
        printf("checkpoint   %s at step %" PRIu64 " (train step %" PRIu64 "); %u saves, %.3f s "
               "in all\n", a->options.save_path, s->last_save_step, s->last_save_train_steps,
               s->saves, s->save_seconds);
    }
}

// The summary's rates keep a decimal (benchmarks read them); below a step a second they give
// the time of a step, as the progress line does.
static void summary_rate(double steps_per_s, char *buf, size_t bytes) {
    if (steps_per_s >= 1 || steps_per_s <= 0) {
        snprintf(buf, bytes, "%.1f steps/s", steps_per_s);
    } else {
        format_rate(steps_per_s, buf, bytes);
    }
}

static void print_outputs(const qt_runtime *rt, const qt_summary *s) {
    for (uint32_t i = 0; i < s->output_files; i++) {
        qt_output_file o;
        if (qt_output_file_get(rt, i, &o) != QT_OK) break;
        if (o.argmax) {
            printf("output       %s: %" PRIu64 " int32 classes (argmax)\n", o.path, o.rows);
        } else {
            printf("output       %s: %" PRIu64 " x %u float32 logits\n", o.path, o.rows,
                   o.outputs);
        }
    }
}

static void print_summary(const qt_summary *s, const qt_runtime *rt, double wall_s,
                          double open_s) {
    qt_position at;
    qt_plan_info plan;
    qt_timings t;
    qt_position_get(rt, &at);
    qt_plan_info_get(rt, &plan);
    qt_timings_get(rt, &t);
    printf("steps        %" PRIu64 " train (%" PRIu64 " skipped), %" PRIu64 " eval, %" PRIu64
           " infer\n", s->steps[QT_MODE_TRAIN], s->skipped, s->steps[QT_MODE_EVAL],
           s->steps[QT_MODE_INFER]);
    if (s->steps[QT_MODE_TRAIN]) {
        printf("train loss   %.6g (last step)\n", (double)at.last_train_loss);
        double rate = s->train_seconds > 0 ? (double)s->steps[QT_MODE_TRAIN] /
                                                 s->train_seconds : 0.0;
        char text[32];
        summary_rate(rate, text, sizeof text);
        printf("train rate   %s\n", text);
        if (s->step_times) {
            printf("step time    median %.3f ms over %" PRIu64 " train steps (host clock "
                   "between their records)\n", s->step_median_ms, s->step_times);
        }
    }
    if (at.has_eval && plan.classification) {
        printf("eval         accuracy %.2f%%, loss %.6g over %" PRIu64 " samples (last eval "
               "row)\n", 100.0 * at.eval_accuracy, at.eval_loss, at.eval_samples);
    } else if (at.has_eval) {
        printf("eval         loss %.6g over %" PRIu64 " samples (last eval row)\n",
               at.eval_loss, at.eval_samples);
    }
    uint64_t steps = s->steps[QT_MODE_TRAIN] + s->steps[QT_MODE_EVAL] + s->steps[QT_MODE_INFER];
    char loop_rate[32];
    summary_rate(s->seconds > 0 ? (double)steps / s->seconds : 0.0, loop_rate, sizeof loop_rate);
    printf("wall time    %.3f s (loop %.3f s, %s)\n", wall_s, s->seconds, loop_rate);
    printf("start-up     %.3f s backend open, %.3f s arenas, %.3f s data, %.3f s init program, "
           "%.3f s graph capture\n", open_s, t.bind_s, t.load_s, t.init_s, t.capture_s);
    printf("arena bytes  device %" PRIu64 ", host %" PRIu64 "\n", plan.device_bytes,
           plan.host_bytes);
    print_outputs(rt, s);
}

// How each moe layer spread the last train step's tokens over its experts: the busiest
// expert's count against the mean, then every expert's count, 16 a line. Read from the device
// once, after the loop.
static qt_status print_expert_loads(qt_runtime *rt, const qt_summary *s) {
    qt_plan_info plan;
    CLI_TRY(qt_plan_info_get(rt, &plan));
    if (s->steps[QT_MODE_TRAIN] == 0) return QT_OK;
    for (uint32_t i = 0; i < plan.moe_layers; i++) {
        uint32_t counts[QT_EXPERTS_MAX];
        qt_expert_loads l;
        CLI_TRY(qt_expert_loads_get(rt, i, counts, QT_EXPERTS_MAX, &l));
        printf("experts      %s: max %u = %.2f x mean %.1f (%u tokens x top-%u over %u experts, "
               "last train step)\n", l.layer, l.max, l.mean > 0 ? l.max / l.mean : 0.0, l.mean,
               l.tokens, l.topk, l.experts);
        for (uint32_t e = 0; e < l.experts; e++) {
            const char *lead = e == 0 ? "             tokens " : "                    ";
            printf("%s%u", e % 16 == 0 ? lead : " ", counts[e]);
            if (e % 16 == 15 || e + 1 == l.experts) putchar('\n');
        }
    }
    return QT_OK;
}

// Ctrl-C (SIGINT) or SIGTERM: the first asks the loop to stop at the next step boundary (it
// drains, flushes the trace, saves with --save, and the summary follows); a second one exits at
// once. Handlers are installed for the loop only: before it nothing is lost by dying.
static volatile sig_atomic_t stop_signal;
static qt_runtime *stop_target;  // the runtime the handler stops

static void on_stop_signal(int signal_number) {
    if (stop_signal) {
        static const char message[] = "\nqtrain run: second interrupt: exiting at once\n";
        ssize_t ignored = write(2, message, sizeof message - 1);
        (void)ignored;
        _exit(128 + signal_number);
    }
    stop_signal = signal_number;
    qt_request_stop(stop_target);
}

static void catch_stop_signals(qt_runtime *rt) {
    stop_target = rt;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = rt ? on_stop_signal : SIG_DFL;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static qt_status resume_run(const cli_args *a, qt_runtime *rt) {
    CLI_TRY(qt_resume(rt, a->resume_path));
    qt_position at;
    qt_position_get(rt, &at);
    if (a->worker && a->options.rank > 0) return QT_OK;  // rank 0 says it
    fprintf(stderr, "qtrain run: resumed from %s at step %" PRIu64 " (train step %" PRIu64
            ")%s\n", a->resume_path, at.step, at.train_steps,
            at.row == at.rows ? "; the schedule is complete, nothing is left to run" : "");
    return QT_OK;
}

// h:mm:ss of a duration, to the second (the hours grow as needed).
static void format_hms(double seconds, char *out, size_t size) {
    uint64_t s = seconds > 0 ? (uint64_t)(seconds + 0.5) : 0;
    snprintf(out, size, "%" PRIu64 ":%02u:%02u", s / 3600, (unsigned)(s / 60 % 60),
             (unsigned)(s % 60));
}

// Without a GPU a run can take long, so it says how long before it starts: one step of each mode
// is timed on the bound run (qt_time_steps, which leaves its state as it was) and multiplied by
// the steps of that mode left. Staging batches, the trace and checkpoints are not in it; on the
// reference backend they are a small part of a step.
static void print_estimate(const cli_args *a, qt_runtime *rt, const qt_device_info *device) {
    qt_position at;
    qt_plan_info plan;
    qt_position_get(rt, &at);
    qt_plan_info_get(rt, &plan);
    const uint64_t *steps = at.steps_left;
    if (steps[0] + steps[1] + steps[2] == 0) return;
    uint64_t bytes = plan.device_bytes + plan.host_bytes;
    void *scratch = cli_alloc(bytes);
    if (!scratch) {
        fprintf(stderr, "qtrain %s: no time estimate: cannot allocate %" PRIu64 " bytes to time "
                "a step\n", a->command, bytes);
        return;
    }
    double ms[QT_MODE_COUNT], total_s = 0.0;
    qt_status timed = qt_time_steps(rt, scratch, bytes, ms);
    free(scratch);
    if (timed != QT_OK) return;  // a recipe whose steps it cannot time: no estimate
    char parts[256] = "", hms[32];
    size_t used = 0;
    for (int mode = 0; mode < QT_MODE_COUNT; mode++) {
        if (steps[mode] == 0) continue;
        total_s += (double)steps[mode] * ms[mode] / 1e3;
        used += (size_t)snprintf(parts + used, sizeof parts - used, "%s%" PRIu64 " %s steps at "
                                 "%.3g ms", used ? ", " : "", steps[mode],
                                 qt_mode_name((qt_mode)mode), ms[mode]);
    }
    format_hms(total_s, hms, sizeof hms);
    fprintf(stderr, "qtrain %s: about %s on the reference backend (%s, timed before the start "
            "on %u thread%s)\n", a->command, hms, parts, device->threads,
            device->threads == 1 ? "" : "s");
}

// The arenas: the driver's on a GPU, the tool's own on the reference backend. Before they are
// allocated: the device arena against the GPU's free memory, and what lives in host memory
// against what this process can get (the datasets are in already).
static qt_status bind_run(cli_run *c, const qt_device_info *device) {
    CLI_TRY(qt_check_memory(c->rt, c->device, !device->gpu, 0));
    if (device->gpu) return qt_bind(c->rt, c->device, NULL);
    qt_plan_info plan;
    qt_plan_info_get(c->rt, &plan);
    c->arena_device = cli_alloc(plan.device_bytes);
    c->arena_host = cli_alloc(plan.host_bytes);
    if (!c->arena_device || !c->arena_host) {
        return cli_fail(QT_ERR_MEMORY, "cannot allocate the reference backend's arenas, %" PRIu64
                        " + %" PRIu64 " bytes, although the limits allowed them when checked: "
                        "other processes took memory meanwhile; try again, or make the run "
                        "smaller (`qtrain plan` shows its memory map)", plan.device_bytes,
                        plan.host_bytes);
    }
    qt_arenas arenas = {c->arena_device, plan.device_bytes, c->arena_host, plan.host_bytes};
    return qt_bind(c->rt, c->device, &arenas);
}

// --profile after the run. Every rank profiles (the collective ops meet the other ranks'); one
// reports, rank 0 unless --profile-rank names another. Rank 0's summary is out before any
// profile: the reporting rank's first op waits in a collective for rank 0's.
static qt_status print_profile(const cli_args *a, qt_runtime *rt, bool quiet) {
    bool reports = !a->worker || a->options.rank == a->profile_rank;
    FILE *out = reports ? stdout : fopen("/dev/null", "w");
    if (quiet && reports) {
        // Its stdout untouched so far: held until the profile ends, so that even on a terminal
        // no line of it lands inside rank 0's summary.
        static char held[1 << 20];
        setvbuf(stdout, held, _IOFBF, sizeof held);
        printf("profile of rank %u of %u GPUs (--profile-rank)\n", a->options.rank,
               a->options.world);
    } else {
        fflush(stdout);
    }
    qt_status status = out ? qt_profile(rt, a->profile_reps, out)
                           : cli_fail(QT_ERR_IO, "cannot open /dev/null for a rank's profile");
    if (out && out != stdout) fclose(out);
    fflush(stdout);
    return status;
}

static int run_on_device(const cli_args *a, cli_run *c, double start, double open_s) {
    qt_device_info device;
    qt_device_describe(c->device, &device);
    qt_plan_info plan;
    qt_plan_info_get(c->rt, &plan);
    if (a->profile_reps && !device.gpu) {
        // Said before the run, not after it: the profile times GPU kernels and graph replays.
        fprintf(stderr, "qtrain %s: --profile times GPU kernels, and this run is on the reference "
                "backend (%s); run without --profile, or on a GPU\n", a->command,
                a->ref ? "--ref" : "no GPU");
        return 2;
    }
    // A data-parallel run reports through rank 0 alone (its records are the global batch's).
    bool quiet = a->worker && a->options.rank > 0;
    if (!quiet) {
        fprintf(stderr, "qtrain %s: %s on %s (%s)", a->command, a->recipe_path, device.name,
                !device.gpu        ? "reference backend"
                : a->options.eager ? "eager launches"
                                   : "CUDA graphs");
        if (a->worker) fprintf(stderr, ", rank 0 of %u GPUs", a->options.world);
        fputc('\n', stderr);
    }
    qt_status status = bind_run(c, &device);
    if (status == QT_OK && a->resume_path) status = resume_run(a, c->rt);
    bool is_run = strcmp(a->command, "run") == 0;  // a training run is what can take long
    if (status == QT_OK && !device.gpu && is_run) print_estimate(a, c->rt, &device);
    qt_summary summary;
    progress_state progress;
    memset(&progress, 0, sizeof progress);
    progress.tty = isatty(2) != 0;
    progress.classification = plan.classification;
    progress.input_file = a->options.infer_input != NULL;
    progress.last_print = -1.0;
    if (!quiet) qt_on_step(c->rt, print_progress, &progress);
    if (status == QT_OK) {
        // `qtrain infer` has nothing to save: a signal ends it as usual (no file is written).
        // A data-parallel worker is ended by its signal: ranks that stopped at different steps
        // would wait for each other's next collective.
        bool stoppable = strcmp(a->command, "run") == 0 && !a->worker;
        if (stoppable) catch_stop_signals(c->rt);
        status = qt_run(c->rt, &summary);
        if (stoppable) catch_stop_signals(NULL);
    }
    if (stop_signal && progress.tty) fputc('\n', stderr);  // after a progress line's \r
    if (status == QT_OK && !quiet) {
        print_position(a, c->rt, &summary, stop_signal);
        print_summary(&summary, c->rt, now_seconds() - start, open_s);
        status = print_expert_loads(c->rt, &summary);
    }
    if (status == QT_OK && a->profile_reps && !stop_signal) {
        status = print_profile(a, c->rt, quiet);
    }
    if (status != QT_OK) return fail_status(a->command, status);
    return stop_signal ? 128 + stop_signal : 0;
}

// Opening the GPU (driver, context, kernel modules) and reading the datasets take about as long
// each, and neither needs the other: the device opens on a second thread meanwhile.
typedef struct open_job {
    cli_run *run;
    bool ref;
    int ordinal;  // a data-parallel worker's GPU (its rank), which it needs: no fallback
    bool gpu_only;
    qt_status status;
    double seconds;
    char message[1024];  // the opening thread's error text (per thread in the library)
} open_job;

static void *open_device(void *ctx) {
    open_job *job = ctx;
    double start = now_seconds();
    cli_run *c = job->run;
    qt_device_kind kind = job->ref        ? QT_DEVICE_REFERENCE
                          : job->gpu_only ? QT_DEVICE_GPU
                                          : QT_DEVICE_AUTO;
    job->status = c->device_memory ? qt_device_open(c->device_memory, qt_device_bytes(), kind,
                                                    job->ordinal, &c->device)
                                   : QT_ERR_MEMORY;
    snprintf(job->message, sizeof job->message, "%s", c->device_memory ? qt_error_message()
                                                      : "cannot allocate the device's tables");
    job->seconds = now_seconds() - start;
    return NULL;
}

// The plan, then the datasets into memory of this tool's own (only the host reads it).
static qt_status plan_and_load(const cli_args *a, cli_run *c) {
    CLI_TRY(load_and_plan(a, c));
    qt_plan_info plan;
    qt_plan_info_get(c->rt, &plan);
    if (!plan.train_source) {
        return cli_fail(QT_ERR_INPUT, "%s names no 'train = SOURCE' in [data]; qtrain %s trains "
                        "on the recipe's data (an embedder gives its batches through the C "
                        "API)", a->recipe_path, a->command);
    }
    // Before the datasets are read: they, the host arena and (with --ref) the device arena must
    // fit in what this process can get (the GPU's memory is checked once it is open).
    CLI_TRY(qt_check_memory(c->rt, NULL, a->ref, plan.data_bytes));
    if (plan.data_bytes > 0 && !(c->data = cli_alloc(plan.data_bytes))) {
        return cli_fail(QT_ERR_MEMORY, "cannot allocate %" PRIu64 " bytes for the datasets",
                        plan.data_bytes);
    }
    return qt_load(c->rt, c->data, plan.data_bytes);
}

// `qtrain run --gpus N`: N workers, this program again on the same arguments with --rank R
// --world N --parallel-id HEX, worker R on GPU R, all in NCCL's environment for a run that
// repeats itself: NVLink multicast off (NCCL_NVLS_ENABLE=0, always), one algorithm and protocol
// (NCCL_ALGO=Ring, NCCL_PROTO=Simple) and every connection made when the communicator is
// (NCCL_RUNTIME_CONNECT=0), not in the first collective, which a graph capture may hold (each
// unless set already); and the driver's hardware queues for a context's work raised from 8 to 32
// (CUDA_DEVICE_MAX_CONNECTIONS, unless set), since the step's graph spreads over the capture's
// six streams and NCCL's, and a node queued behind an unrelated one waits for it: on 2 x H200 a
// broadcast's start waited for another branch's cast, and the step took 0.2 ms less with 32
// (BENCHMARKS.md, "Data parallelism"). Waits for them all (launch_wait): when one fails, it
// says so at once, and the others are ended (they would wait for it in their next collective);
// the one that failed gets LAUNCH_GRACE_SECONDS to close and exit. Ctrl-C ends every worker at
// once (no summary or save: a stop needs every rank at the same step).
static int launch_ranks(int argc, char **argv, const cli_args *a) {
    // What every rank would refuse (a batch the GPUs cannot share, too few parameter tensors) is
    // said once, before any worker starts: rank 0's plan.
    cli_run plan;
    memset(&plan, 0, sizeof plan);
    cli_args planned = *a;
    planned.options.world = a->gpus;
    qt_status status = load_and_plan(&planned, &plan);
    cli_run_close(&plan);
    if (status != QT_OK) return fail_status(a->command, status);
    uint8_t id[QT_PARALLEL_ID_BYTES];
    status = qt_parallel_id(id, sizeof id);
    if (status != QT_OK) return fail_status(a->command, status);
    char hex[2 * QT_PARALLEL_ID_BYTES + 1], world[16], ranks[QT_GPUS_MAX][16];
    for (int i = 0; i < QT_PARALLEL_ID_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", id[i]);
    snprintf(world, sizeof world, "%u", a->gpus);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setenv("NCCL_ALGO", "Ring", 0);
    setenv("NCCL_PROTO", "Simple", 0);
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);  // connections at start-up, not inside a capture
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);  // read when a worker's context is made
    if (launch_prepare() != 0) {
        return fail_status(a->command, cli_fail(QT_ERR_STATE, "cannot take the workers' "
                                                "reports: %s", strerror(errno)));
    }
    char **args = calloc((size_t)argc + 8, sizeof *args);
    pid_t *pids = calloc(a->gpus, sizeof *pids);
    if (!args || !pids) {
        free(args);
        free(pids);
        return fail_status(a->command, cli_fail(QT_ERR_MEMORY, "cannot start the workers"));
    }
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--gpus") == 0) {
            i++;  // its value
            continue;
        }
        args[n++] = argv[i];
    }
    args[n++] = "--world";
    args[n++] = world;
    args[n++] = "--parallel-id";
    args[n++] = hex;
    args[n++] = "--rank";
    fflush(NULL);
    for (uint32_t r = 0; r < a->gpus; r++) {
        snprintf(ranks[r], sizeof ranks[r], "%u", r);
        args[n] = ranks[r];
        args[n + 1] = NULL;
        pids[r] = fork();
        if (pids[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);  // a worker does not outlive its launcher
            execv("/proc/self/exe", args);
            fprintf(stderr, "qtrain run: cannot start worker %u: %s\n", r, strerror(errno));
            _exit(127);
        }
        if (pids[r] < 0) {
            fprintf(stderr, "qtrain run: cannot start worker %u: %s\n", r, strerror(errno));
        }
    }
    int rc = launch_wait(pids, a->gpus, LAUNCH_GRACE_SECONDS);
    free(args);
    free(pids);
    return rc;
}

// `qtrain run` and `qtrain infer`.
static int command_run(int argc, char **argv, cli_command command) {
    double start = now_seconds();
    cli_args a;
    if (!parse_run_args(argc, argv, command, &a)) return 2;
    cli_run c;
    memset(&c, 0, sizeof c);
    if (command == CLI_RUN && a.gpus > 1 && !a.worker) return launch_ranks(argc, argv, &a);
    if (a.worker && a.options.rank > 0) {
        // Rank 0 reports and writes the run's files; the others train beside it in silence.
        a.options.trace_path = NULL;
        a.options.metrics_path = NULL;
        a.options.golden_path = NULL;
    }
    c.device_memory = cli_alloc(qt_device_bytes());
    open_job job = {&c, a.ref, (int)a.options.rank, a.worker, QT_OK, 0.0, ""};
    pthread_t opener;
    bool threaded = pthread_create(&opener, NULL, open_device, &job) == 0;
    if (!threaded) open_device(&job);
    qt_status status = plan_and_load(&a, &c);
    if (threaded) pthread_join(opener, NULL);
    int rc = 0;
    qt_device_info device;
    if (job.status != QT_OK) {
        fprintf(stderr, "qtrain %s: %s: %s\n", a.command, qt_status_name(job.status),
                job.message);
        rc = 1;
    } else if (status != QT_OK) {
        rc = fail_status(a.command, status);
    } else {
        qt_device_describe(c.device, &device);
        if (device.fell_back) {
            fprintf(stderr, "qtrain %s: no usable GPU (%s); running on the reference backend\n",
                    a.command, device.reason);
        }
        rc = run_on_device(&a, &c, start, job.seconds);
    }
    // A worker that failed tells its launcher before its close, which may wait on the GPU for a
    // collective that the other ranks will never join.
    if (a.worker && rc != 0) launch_report_failure(rc);
    cli_run_close(&c);
    return rc;
}

// Exit codes follow diff(1): 0 identical, 1 different, 2 trouble.
static int command_diff(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: qtrain diff A.trace B.trace\n");
        return 2;
    }
    bool identical = false;
    qt_status status = qt_trace_diff(argv[2], argv[3], stdout, &identical);
    if (status != QT_OK) {
        fprintf(stderr, "qtrain diff: %s: %s\n", qt_status_name(status), qt_error_message());
        return 2;
    }
    return identical ? 0 : 1;
}

// `qtrain export CKPT OUT [--quantized] [--force]`.
static int command_export(int argc, char **argv) {
    const char *paths[2] = {NULL, NULL};
    bool quantized = false, force = false;
    int count = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--quantized") == 0) {
            quantized = true;
        } else if (strcmp(argv[i], "--force") == 0) {
            force = true;
        } else if (argv[i][0] != '-' && count < 2) {
            paths[count++] = argv[i];
        } else {
            fprintf(stderr, "qtrain export: unexpected argument '%s'\n", qt_shown(argv[i]));
            return 2;
        }
    }
    if (count != 2) {
        fprintf(stderr, "usage: qtrain export CKPT OUT.safetensors [--quantized] [--force]\n");
        return 2;
    }
    uint64_t bytes = 0;  // sized from the checkpoint's table
    qt_status status = qt_export_bytes(paths[0], &bytes);
    if (status != QT_OK) return fail_status("export", status);
    void *memory = cli_alloc(bytes);
    if (!memory) {
        fprintf(stderr, "qtrain export: cannot allocate %" PRIu64 " bytes\n", bytes);
        return 1;
    }
    qt_export_info info;
    status = qt_export(memory, bytes, paths[0], paths[1], quantized, force, &info);
    free(memory);
    if (status != QT_OK) return fail_status("export", status);
    printf("exported %s (%s, step %" PRIu64 ", train step %" PRIu64 ", %" PRIu32
           " parameters%s) to %s\n", paths[0], info.recipe_name, info.step, info.train_steps,
           info.params, quantized ? " with their quantized copies" : "", paths[1]);
    return 0;
}

// `qtrain COMMAND ... --help` (or -h) anywhere on the line asks for the usage, not a run.
static bool asks_for_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return true;
    }
    return false;
}

static int run_command(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "help") == 0 || asks_for_help(argc, argv)) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("qtrain %s (trace format %d, checkpoint format %d)\n", QTRAIN_VERSION,
               QT_TRACE_FORMAT, QT_CHECKPOINT_FORMAT);
        return 0;
    }
    if (strcmp(argv[1], "info") == 0) return command_info();
    if (strcmp(argv[1], "bench") == 0) return bench_main(argc, argv);
    if (strcmp(argv[1], "diff") == 0) return command_diff(argc, argv);
    if (strcmp(argv[1], "plot") == 0) return plot_main(argc, argv);
    if (strcmp(argv[1], "run") == 0) return command_run(argc, argv, CLI_RUN);
    if (strcmp(argv[1], "infer") == 0) return command_run(argc, argv, CLI_INFER);
    if (strcmp(argv[1], "plan") == 0) return command_plan(argc, argv);
    if (strcmp(argv[1], "export") == 0) return command_export(argc, argv);
    fprintf(stderr, "qtrain: unknown command '%s'\n", qt_shown(argv[1]));
    print_usage(stderr);
    return 2;
}

// Every command's report goes to stdout: output that could not be written (a full disk, a
// closed pipe, /dev/full) fails the command, as any other lost output would.
int main(int argc, char **argv) {
    int rc = run_command(argc, argv);
    errno = 0;
    bool flushed = fflush(stdout) == 0;
    int error = errno;
    if (!flushed || ferror(stdout)) {
        const char *command = argc >= 2 ? argv[1] : "";
        fprintf(stderr, "qtrain%s%s: cannot write its output to standard output: %s\n",
                command[0] ? " " : "", qt_shown(command),
                error ? strerror(error) : "a write failed");
        // diff(1)'s trouble is 2; the other commands fail with 1 (or what they failed with).
        if (rc == 0 || (rc == 1 && strcmp(command, "diff") == 0)) {
            rc = strcmp(command, "diff") == 0 ? 2 : 1;
        }
    }
    return rc;
}
