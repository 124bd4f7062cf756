#include "runtime/run/run.h"

#include <errno.h>
#include <string.h>
#include <time.h>    // clock_gettime
#include <unistd.h>  // access

#include "runtime/io/atomic_file.h"  // atomic_file_check

// The command-line flag that lets output files replace existing files (run_options).
#define RUN_REPLACE_HINT "--force"

qt_status run_backend_open(backend *b, bool ref, bool *fell_back) {
    *fell_back = false;
    if (!ref) {
        qt_status status = backend_open_gpu(b, 0);
        if (status == QT_OK) return QT_OK;
        if (status != QT_ERR_NO_DRIVER && status != QT_ERR_NO_DEVICE) return status;
        backend_close(b);
        *fell_back = true;
    }
    backend_open_ref(b);
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Planning

// A failure about a data source of the recipe (a file that cannot be read, a header that does
// not fit the model) gets the recipe line that named the source in front, `file:line:col: `, so
// that the message leads to the line to fix. `qtrain infer`'s input comes from the command line.
static qt_status run_source_status(const run *r, const recipe_source *src, qt_status status) {
    if (status == QT_OK || src == &r->infer_source) return status;
    char message[QT_ERROR_MESSAGE_MAX];
    snprintf(message, sizeof message, "%s", qt_error_message());
    return qt_fail(status, "%s:%u:%u: %s", r->recipe->file_name, src->line, src->col, message);
}

static qt_status run_probe_source(run *r, const recipe_source *src, data_info *info) {
    const recipe_model *m = &r->recipe->model;
    return run_source_status(r, src, data_probe(src, m->input_features, m->output_features,
                                                info));
}

// An .npy pair's labels or targets are known once its files are read (the recipe parser checks
// the other sources against the loss).
static qt_status run_check_targets(const run *r, const recipe_source *src, const data_info *info) {
    bool labels = info->target_type == DATA_TARGET_LABEL;
    bool classification = r->recipe->model.loss == RECIPE_LOSS_SOFTMAX_XENT;
    if (src->kind != RECIPE_SOURCE_NPY || labels == classification) return QT_OK;
    return qt_fail(QT_ERR_INPUT, "%s:%u:%u: %s holds %s, but the recipe's loss is %s; "
                   "expected %s", r->recipe->file_name, src->line, src->col, src->labels,
                   labels ? "class labels (1-D)" : "regression targets (2-D float32)",
                   classification ? "softmax_xent" : "mse",
                   classification ? "1-D integer class labels, or `loss = mse`"
                                  : "2-D float32 targets (samples, outputs), or "
                                    "`loss = softmax_xent`");
}

static const char *run_input_name(data_input_type type) {
    return type == DATA_INPUT_U8 ? "uint8 (IDX, npy uint8)" : "float32 (synthetic, npy float32)";
}

// `qtrain infer`: the input file alone is the dataset.
static qt_status run_probe_input(run *r) {
    const recipe *rc = r->recipe;
    QT_TRY(data_source_inputs(r->options.infer_input, &r->infer_source));
    r->train_source = &r->infer_source;
    return data_probe(&r->infer_source, rc->model.input_features, rc->model.output_features,
                      &r->train_info);
}

// A recipe without a train source: the embedder gives the batches (run_options.fill), in the
// type of the eval set's inputs if there is one, else options.inputs.
static void run_info_without_source(run *r, data_input_type inputs) {
    const recipe_model *rm = &r->recipe->model;
    data_info *info = &r->train_info;
    memset(info, 0, sizeof *info);
    info->kind = RECIPE_SOURCE_NONE;
    info->features = rm->input_features;
    info->image_rows = 1;
    info->image_cols = rm->input_features;
    info->outputs = rm->output_features;
    info->input_type = inputs;
    info->target_type = rm->loss == RECIPE_LOSS_SOFTMAX_XENT ? DATA_TARGET_LABEL
                                                             : DATA_TARGET_VALUES;
}

static qt_status run_probe(run *r) {
    const recipe *rc = r->recipe;
    r->has_train = true;
    if (r->options.infer_input) return run_probe_input(r);
    r->train_source = &rc->data.train;
    r->has_train = rc->data.train.kind != RECIPE_SOURCE_NONE;
    if (r->has_train) {
        QT_TRY(run_probe_source(r, &rc->data.train, &r->train_info));
        QT_TRY(run_check_targets(r, &rc->data.train, &r->train_info));
    }
    r->has_eval = rc->data.eval.kind != RECIPE_SOURCE_NONE;
    if (!r->has_eval) {
        if (!r->has_train) run_info_without_source(r, r->options.inputs);
        return QT_OK;
    }
    QT_TRY(run_probe_source(r, &rc->data.eval, &r->eval_info));
    QT_TRY(run_check_targets(r, &rc->data.eval, &r->eval_info));
    if (!r->has_train) run_info_without_source(r, r->eval_info.input_type);
    // One staging layout serves both feeds, and it keeps the inputs in the dataset's type.
    if (r->eval_info.input_type != r->train_info.input_type) {
        return qt_fail(QT_ERR_INPUT, "%s: the train data has %s inputs but the eval data %s; "
                       "expected inputs of one type in [data]", rc->file_name,
                       run_input_name(r->train_info.input_type),
                       run_input_name(r->eval_info.input_type));
    }
    return QT_OK;
}

// The schedule table: counting (storage NULL) at run_measure, into its memory at run_plan.
static qt_status run_table(run *r, void *storage) {
    const run_options *o = &r->options;
    run_tables *t = &r->tables;
    if (storage) {
        sched_table_init(&r->table, storage, t->sched_rows, t->sched_lr_rows);
    } else {
        sched_table_init(&r->table, NULL, 0, 0);
    }
    if (o->infer_input) {
        sched_table_infer(r->train_info.samples, r->recipe->data.batch, &r->table);
    } else {
        if (o->eval_every > 0 && !r->has_eval) {
            return qt_fail(QT_ERR_INPUT, "%s: interleaved eval rows need an eval dataset; "
                           "expected 'eval = SOURCE' in [data]", r->recipe->file_name);
        }
        sched_build b = {r->train_info.samples, r->has_eval ? r->eval_info.samples : 0,
                         r->recipe->data.batch, o->steps_limit, o->eval_every,
                         o->eval_steps ? o->eval_steps : 1, o->drop_eval};
        QT_TRY(sched_table_build(r->recipe, &b, &r->table));
    }
    // A train program the schedule has no row for (run_options.modes) still needs a
    // learning-rate row: the optimizer's constant rate.
    if (o->modes[MODEL_MODE_TRAIN] && r->table.lr_count == 0) {
        sched_add_constant_lr(&r->table, r->recipe->optim.lr);
    }
    if (!storage) {
        t->sched_rows = r->table.row_count;
        t->sched_lr_rows = r->table.lr_count;
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Output files of infer rows

// The file and kind of outputs[index]: the recipe row's, or `qtrain infer`'s.
static void run_output_spec(const run *r, uint32_t index, const char **path, bool *argmax) {
    if (r->options.infer_input) {
        QT_ASSERT(index == 0);
        *path = r->options.infer_output;
        *argmax = r->options.infer_argmax;
        return;
    }
    QT_ASSERT(index < r->recipe->rows_count);
    *path = r->recipe->rows[index].output;
    *argmax = r->recipe->rows[index].argmax;
}

// One step's rows, converted for the file, in host memory planned with the rest (any row that
// writes a file uses it; only one row runs at a time). Rank 0 writes a data-parallel run's files
// (every rank's infer program gathers the whole batch's outputs).
static qt_status run_plan_outputs(run *r) {
    r->has_outputs = r->table.outputs && r->dp.rank == 0;
    if (!r->has_outputs) return QT_OK;
    uint64_t bytes = infer_out_scratch_bytes(r->recipe->data.batch, r->model.outputs);
    return arena_reserve(&r->host, "infer.file_rows", bytes, 64, ARENA_CAT_STAGING,
                         ARENA_LIFETIME_PERSISTENT, 0, &r->outputs_scratch);
}

// The first table row whose file a loop starting at the run's position writes: rows run whole
// (a stop inside an infer row that writes a file waits for its end, runtime/schedule/schedule.h),
// so a loop writes the files of the rows from its position on, and a resumed run none of the rows
// before its checkpoint.
static uint32_t run_outputs_from(const run *r) {
    const sched_state *s = &r->state;
    return s->row_step == 0 ? s->row : s->row + 1;
}

// An output file that exists stops the run before its steps (atomic_file_create checks again
// when the file is made): at run_load, before the slow part of start-up, or once a resumed
// run's position is known.
static qt_status run_check_outputs(const run *r) {
    if (!r->has_outputs) return QT_OK;  // no files, or another rank's to write
    for (uint32_t i = run_outputs_from(r); i < r->table.row_count; i++) {
        const sched_row *row = &r->table.rows[i];
        const char *path;
        bool argmax;
        if (!row->output) continue;
        run_output_spec(r, row->output - 1, &path, &argmax);
        QT_TRY(atomic_file_check(path, r->options.replace_outputs, RUN_REPLACE_HINT));
    }
    return QT_OK;
}

// The metrics file, like the outputs: refused before the slow part of start-up when it exists.
static qt_status run_check_metrics(const run *r) {
    const char *path = r->options.metrics_path;
    if (!path || r->options.replace_outputs || !atomic_file_exists(path)) return QT_OK;
    return qt_fail(QT_ERR_INPUT, "%s exists; qtrain does not replace files: remove it, choose "
                   "another name, or pass %s to replace it", path, RUN_REPLACE_HINT);
}

static void run_outputs_abandon(run *r) {
    for (uint32_t i = 0; i < RECIPE_SCHEDULE_ROWS_MAX; i++) infer_out_abandon(&r->outputs[i]);
}

// Creates the temporary file of every infer row in [from, to) that writes one.
static qt_status run_outputs_open(run *r, uint32_t from, uint32_t to) {
    const sched_state *s = &r->state;
    if (s->row < r->table.row_count && s->row_step > 0 && r->table.rows[s->row].output) {
        return qt_fail(QT_ERR_INPUT, "the run stands at step %llu of row %u, an infer row that "
                       "writes a file, which runs whole; the checkpoint was not written by "
                       "qtrain", (unsigned long long)s->row_step, s->row);
    }
    for (uint32_t i = from; i < to && i < r->table.row_count; i++) {
        const sched_row *row = &r->table.rows[i];
        if (!row->output) continue;
        const char *path;
        bool argmax;
        run_output_spec(r, row->output - 1, &path, &argmax);
        uint64_t samples = row->dataset == RECIPE_DATASET_EVAL ? r->eval_info.samples
                                                                 : r->train_info.samples;
        uint64_t rows = infer_out_rows(samples, r->recipe->data.batch, row->steps);
        qt_status status = infer_out_open(&r->outputs[row->output - 1], path, argmax, rows,
                                          r->recipe->data.batch, r->model.outputs,
                                          arena_host_pointer(&r->host, r->outputs_scratch),
                                          r->options.replace_outputs, RUN_REPLACE_HINT);
        if (status != QT_OK) {
            run_outputs_abandon(r);
            return status;
        }
    }
    return QT_OK;
}

// Commits the files of the rows from `from` that the loop finished (all of them, unless it
// stopped); the others are removed, to be written whole by the run that continues.
static qt_status run_outputs_commit(run *r, uint32_t from) {
    qt_status status = QT_OK;
    for (uint32_t i = from; i < r->state.row && status == QT_OK; i++) {
        const sched_row *row = &r->table.rows[i];
        if (row->output) status = infer_out_commit(&r->outputs[row->output - 1]);
    }
    run_outputs_abandon(r);  // what was not committed: rows after a stop, or after a failure
    return status;
}

// The datasets and the shuffle order live in caller memory, not in an arena: only the host reads
// them (the device sees batches through the pinned staging slots), so they need not be pinned,
// and they can be loaded before the GPU is up (run_load), while another thread starts it.
static uint64_t run_align(uint64_t bytes) {
    return (bytes + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
}

static void run_layout_data(run *r) {
    r->data_train_offset = 0;
    r->data_order_offset = run_align(r->train_info.bytes);
    r->data_eval_offset = r->data_order_offset +
                          run_align(data_order_bytes(r->train_info.samples));
    r->data_golden_offset = r->data_eval_offset +
                            (r->has_eval ? run_align(r->eval_info.bytes) : 0);
    r->data_bytes = r->data_golden_offset + run_align(r->golden_bytes);
}

// `--inject-nonfinite`: the step must be a train step of this run's table (the fault goes into
// the train program); the layer is checked by model_plan.
static qt_status run_inject_plan(const run *r, model_inject *out) {
    const run_inject *in = &r->options.inject;
    memset(out, 0, sizeof *out);
    if (!in->on) return QT_OK;
    if (!r->table.rows) {  // counting: the step is checked when the rows exist
        *out = (model_inject){true, in->step, in->layer, in->bits};
        return QT_OK;
    }
    uint64_t first = 0;
    for (uint32_t i = 0; i < r->table.row_count; i++) {
        const sched_row *row = &r->table.rows[i];
        if (in->step < first + row->steps) {
            if (row->mode != MODEL_MODE_TRAIN) {
                return qt_fail(QT_ERR_INPUT, "--inject-nonfinite %llu: step %llu is an %s step "
                               "(row %u of the schedule); expected a train step",
                               (unsigned long long)in->step, (unsigned long long)in->step,
                               model_mode_name(row->mode), i);
            }
            *out = (model_inject){true, in->step, in->layer, in->bits};
            return QT_OK;
        }
        first += row->steps;
    }
    return qt_fail(QT_ERR_INPUT, "--inject-nonfinite %llu: the schedule has %llu steps (0 to "
                   "%llu); expected one of its train steps", (unsigned long long)in->step,
                   (unsigned long long)first, (unsigned long long)(first ? first - 1 : 0));
}

// Table memory: run_measure's pass carves from no memory (counting: every table NULL, only the
// sizes add up), run_plan's from the caller's.
#define RUN_TABLE_ALIGN 64

typedef struct run_carver {
    uint8_t *base;  // NULL: counting
    uint64_t used;
} run_carver;

static void *run_carve(run_carver *c, uint64_t bytes) {
    uint8_t *at = c->base ? c->base + c->used : NULL;
    c->used += (bytes + RUN_TABLE_ALIGN - 1) / RUN_TABLE_ALIGN * RUN_TABLE_ALIGN;
    return at;
}

typedef qt_status (*run_build_fn)(model *m, program *p);

static program *run_program_of(run *r, run_program which) {
    switch (which) {
    case RUN_PROGRAM_INIT: return &r->init;
    case RUN_PROGRAM_TRAIN: return &r->programs[MODEL_MODE_TRAIN];
    case RUN_PROGRAM_EVAL: return &r->programs[MODEL_MODE_EVAL];
    case RUN_PROGRAM_INFER: return &r->programs[MODEL_MODE_INFER];
    case RUN_PROGRAM_CHECKSUM: return &r->checksum;
    case RUN_PROGRAM_COUNT: break;
    }
    QT_ASSERT(false);
    return NULL;
}

static qt_status run_build(run *r, run_carver *c, run_program which, const char *name,
                           int32_t *base, run_build_fn build) {
    program *p = run_program_of(r, which);
    uint32_t ops = c->base ? r->tables.ops[which] : 0;
    prog_init(p, name, *base, run_carve(c, prog_storage_bytes(ops)), ops);
    QT_TRY(build(&r->model, p));
    if (!c->base) r->tables.ops[which] = p->op_count;
    *base += (int32_t)p->op_count;
    return QT_OK;
}

static qt_status run_build_programs(run *r, run_carver *c) {
    static const run_build_fn builders[MODEL_MODE_COUNT] = {
        model_build_train, model_build_eval, model_build_infer};
    static const run_program which[MODEL_MODE_COUNT] = {RUN_PROGRAM_TRAIN, RUN_PROGRAM_EVAL,
                                                        RUN_PROGRAM_INFER};
    int32_t base = 0;
    QT_TRY(run_build(r, c, RUN_PROGRAM_INIT, "init", &base, model_build_init));
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (!r->model.modes[mode]) continue;
        QT_TRY(run_build(r, c, which[mode], model_mode_name((model_mode)mode), &base,
                         builders[mode]));
    }
    if (r->model.modes[MODEL_MODE_TRAIN]) {
        QT_TRY(run_build(r, c, RUN_PROGRAM_CHECKSUM, "checksum", &base, model_build_checksum));
    }
    model_keep_expert_loads(&r->model, base - 1);
    return QT_OK;
}

// Whether the run's first save may replace a file at save_path: the checkpoint it resumes from
// is expected to be replaced, any other file only with --force. Its later saves replace its own.
static bool run_save_replaces(const run_options *o) {
    return o->save_replaces || o->replace_outputs;
}

// A fresh checkpoint path must not replace a file by surprise, must be a regular file if it
// exists, and its folder must take files before the run starts.
static qt_status run_check_save_path(const run_options *o) {
    const char *path = o->save_path;
    if (!path) return QT_OK;
    if (access(path, F_OK) == 0 && !run_save_replaces(o)) {
        return qt_fail(QT_ERR_INPUT, "%s exists; a run saves over a checkpoint only when it "
                       "resumes from it (--resume %s) or with %s, so remove it, name another "
                       "file, or pass %s", path, path, RUN_REPLACE_HINT, RUN_REPLACE_HINT);
    }
    QT_TRY(atomic_file_check(path, true, RUN_REPLACE_HINT));
    char folder[CKPT_PATH_MAX];
    ckpt_folder(path, folder, sizeof folder);
    if (access(folder, W_OK) != 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot write checkpoints into this folder: %s", folder,
                       strerror(errno));
    }
    return QT_OK;
}

// The modes whose programs are built: the table's and the ones asked for (run_options.modes).
static void run_modes(const run *r, bool modes[MODEL_MODE_COUNT]) {
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        modes[mode] = r->table.modes[mode] || r->options.modes[mode];
    }
}

static bool run_has_checkpoints(const run_options *o) {
    return o->save_path || o->checkpoints || o->from_path;
}

// The checkpoint layout and reader: counted from the model's persistent regions and
// parameters (the reader's: a resumed run's own layout, or --from's file, whichever is larger).
static qt_status run_plan_checkpoints(run *r, run_carver *c) {
    run_tables *t = &r->tables;
    if (!c->base) {
        t->ckpt_regions = 0;
        for (int k = 0; k < ARENA_CAT_COUNT; k++) {
            t->ckpt_regions += arena_persistent_regions(&r->dev, (arena_category)k);
        }
        t->ckpt_regions += ckpt_remote_regions(&r->model);  // other ranks' masters, moments
        t->ckpt_params = r->model.param_count;
        t->reader_regions = t->ckpt_regions;
        t->reader_params = t->ckpt_params;
        if (r->options.from_path) {
            uint32_t regions = 0, params = 0;
            QT_TRY(ckpt_peek(r->options.from_path, &regions, &params));
            if (regions > t->reader_regions) t->reader_regions = regions;
            if (params > t->reader_params) t->reader_params = params;
        }
    }
    void *layout = run_carve(c, ckpt_layout_bytes(t->ckpt_regions, t->ckpt_params,
                                                  r->dev.region_count));
    void *reader = run_carve(c, ckpt_reader_bytes(t->reader_regions, t->reader_params));
    QT_TRY(ckpt_plan(&r->ckpt, &r->model, r->recipe_hash, r->seed, r->recipe->file_name,
                     r->options.ckpt_chunk_bytes, layout, t->ckpt_regions, t->ckpt_params));
    if (reader) ckpt_reader_init(&r->reader, reader, t->reader_regions, t->reader_params);
    r->ckpt_planned = true;
    return QT_OK;
}

// One planning pass: counting (c->base NULL: arenas and programs keep no tables, r->tables
// gets the counts) or for real into the caller's memory, sized by the counting pass.
static qt_status run_plan_pass(run *r, run_carver *c) {
    const recipe *rc = r->recipe;
    run_tables *t = &r->tables;
    bool counting = c->base == NULL;
    QT_TRY(run_table(r, run_carve(c, sched_table_bytes(t->sched_rows, t->sched_lr_rows))));
    uint32_t dev = counting ? 0 : t->dev_regions, host = counting ? 0 : t->host_regions;
    arena_init(&r->dev, ARENA_KIND_DEVICE, "device", run_carve(c, arena_storage_bytes(dev)), dev);
    arena_init(&r->host, ARENA_KIND_HOST, "host", run_carve(c, arena_storage_bytes(host)), host);
    model_options mo = {0};
    mo.batch = rc->data.batch / r->dp.world;  // this rank's share
    mo.comm = r->dp.world > 1 ? &r->dp : NULL;
    mo.emulated_gemm = r->options.emulated_gemm;
    mo.amax_passes = r->options.amax_passes;
    mo.norm_group_elems = r->options.norm_group_elems;
    mo.norm_elements = r->options.norm_elements;
    mo.moe_own_align = r->options.moe_own_align;
    mo.act_cast_elems = r->options.act_cast_elems;
    bool largest_first = r->options.update_order == RUN_UPDATE_ORDER_LARGEST_FIRST;
    if (r->options.update_order == RUN_UPDATE_ORDER_SETTING) {
        QT_TRY(run_largest_first(&largest_first));
    }
    mo.largest_first = largest_first;
    mo.seed = r->seed;
    run_modes(r, mo.modes);
    mo.lr_row_count = r->table.lr_count;
    mo.data = &r->train_info;
    mo.eval_data = r->has_eval ? &r->eval_info : NULL;
    mo.resident = rc->data.resident;  // the parser refuses it without a train source
    QT_TRY(run_inject_plan(r, &mo.inject));
    QT_TRY(model_plan(&r->model, rc, &r->dev, &r->host, &mo));
    QT_TRY(run_plan_outputs(r));
    QT_TRY(run_build_programs(r, c));
    if (run_has_checkpoints(&r->options)) QT_TRY(run_plan_checkpoints(r, c));
    if (counting) {
        t->dev_regions = r->dev.region_count;
        t->host_regions = r->host.region_count;
    }
    return QT_OK;
}

// The bytes the real pass carves from the counts (run_plan asserts that it used exactly these).
static void run_tables_size(run *r) {
    run_tables *t = &r->tables;
    run_carver c = {NULL, 0};
    run_carve(&c, sched_table_bytes(t->sched_rows, t->sched_lr_rows));
    t->schedule_bytes = c.used;
    run_carve(&c, arena_storage_bytes(t->dev_regions));
    run_carve(&c, arena_storage_bytes(t->host_regions));
    t->arena_bytes = c.used - t->schedule_bytes;
    for (int i = 0; i < RUN_PROGRAM_COUNT; i++) run_carve(&c, prog_storage_bytes(t->ops[i]));
    t->program_bytes = c.used - t->schedule_bytes - t->arena_bytes;
    if (run_has_checkpoints(&r->options)) {
        run_carve(&c, ckpt_layout_bytes(t->ckpt_regions, t->ckpt_params, t->dev_regions));
        run_carve(&c, ckpt_reader_bytes(t->reader_regions, t->reader_params));
    }
    t->ckpt_bytes = c.used - t->schedule_bytes - t->arena_bytes - t->program_bytes;
    t->bytes = c.used;
}

// Data parallelism: what a run on several ranks can do, and the rank's communicator (opened
// by run_bind).
static qt_status run_check_parallel(run *r) {
    const run_options *o = &r->options;
    const recipe *rc = r->recipe;
    dp_comm_single(&r->dp);
    if (o->world <= 1) return QT_OK;
    if (o->world > DP_RANKS_MAX || o->rank >= o->world) {
        return qt_fail(QT_ERR_INPUT, "rank %u of %u: expected 2 to %u ranks and a rank below "
                       "them", o->rank, o->world, DP_RANKS_MAX);
    }
    if (rc->data.batch % o->world != 0) {
        return qt_fail(QT_ERR_INPUT, "%s: batch %u is the global batch of %u GPUs, which take "
                       "equal shares of it; expected a batch divisible by %u (e.g. %u)",
                       rc->file_name, rc->data.batch, o->world, o->world,
                       (rc->data.batch / o->world + 1) * o->world);
    }
    // `qtrain infer` (an input file, --from's checkpoint) is one process's: its CLI starts no
    // ranks, and a recipe's infer rows are what runs on several.
    const char *refused = o->infer_input ? "qtrain infer" : o->from_path ? "--from" : NULL;
    if (refused) {
        return qt_fail(QT_ERR_INPUT, "%s: a run on %u GPUs does not take %s; run it on one GPU",
                       rc->file_name, o->world, refused);
    }
    r->dp.rank = o->rank;
    r->dp.world = o->world;
    return QT_OK;
}

qt_status run_measure(run *r, const recipe *rc, const char *text, size_t text_bytes,
                      const run_options *options, uint64_t *table_bytes) {
    return run_measure_hashed(r, rc, trace_hash(text, text_bytes), options, table_bytes);
}

qt_status run_measure_hashed(run *r, const recipe *rc, uint64_t recipe_hash,
                             const run_options *options, uint64_t *table_bytes) {
    memset(r, 0, sizeof *r);
    r->recipe = rc;
    r->options = *options;
    r->recipe_hash = recipe_hash;
    r->seed = options->seed_given ? options->seed : rc->data.seed;
    QT_ASSERT(!options->infer_input || options->infer_output);
    QT_TRY(run_check_parallel(r));
    QT_TRY(run_probe(r));
    if (options->golden_path) QT_TRY(trace_check_bytes(options->golden_path, &r->golden_bytes));
    run_layout_data(r);
    if (run_has_checkpoints(options)) QT_TRY(run_check_save_path(options));
    run_carver counter = {NULL, 0};
    QT_TRY(run_plan_pass(r, &counter));
    run_tables_size(r);
    r->measured = true;
    *table_bytes = r->tables.bytes;
    return QT_OK;
}

qt_status run_pack_gap(uint32_t *gap) {
    return qt_env_u32("QTRAIN_PACK_GAP", "the ops by which the device arena keeps transient "
                      "buffers apart", 0, RUN_PACK_GAP_MAX, gap);
}

qt_status run_largest_first(bool *on) {
    return qt_env_switch("QTRAIN_UPDATE_ORDER", "1 (each rank's updates largest first, the "
                         "broadcasts in the order the updates end) or 0 (parameter order)",
                         true, on);
}

qt_status run_plan(run *r, void *tables, uint64_t table_bytes) {
    QT_ASSERT(r->measured && !r->planned);
    QT_ASSERT(tables != NULL && (uintptr_t)tables % 16 == 0);
    if (table_bytes < r->tables.bytes) {
        return qt_fail(QT_ERR_CAPACITY, "%s: the run's tables need %llu bytes (run_measure), "
                       "%llu were given", r->recipe->file_name,
                       (unsigned long long)r->tables.bytes, (unsigned long long)table_bytes);
    }
    run_carver carver = {tables, 0};
    r->table_memory = tables;
    QT_TRY(run_plan_pass(r, &carver));
    QT_ASSERT(carver.used == r->tables.bytes);
    QT_TRY(run_pack_gap(&r->dev.pack_gap));
    arena_pack(&r->dev);
    arena_pack(&r->host);
    r->planned = true;
    return QT_OK;
}

void run_memory_bytes(const run *r, uint64_t *dev_bytes, uint64_t *host_bytes) {
    *dev_bytes = r->dev.bytes_total;
    *host_bytes = r->host.bytes_total;
}

// ---------------------------------------------------------------------------------------------
// Start-up

static void run_resolve(run *r) {
    prog_resolve(&r->init);
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (r->model.modes[mode]) prog_resolve(&r->programs[mode]);
    }
    if (r->model.modes[MODEL_MODE_TRAIN]) prog_resolve(&r->checksum);
}

static double run_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t run_data_bytes(const run *r) { return r->data_bytes; }

qt_status run_load(run *r, void *memory, uint64_t bytes) {
    const recipe *rc = r->recipe;
    uint32_t batch = rc->data.batch;
    QT_ASSERT(((uintptr_t)memory % DATA_ALIGN) == 0 && bytes >= r->data_bytes);
    if (!r->options.checkpoints) QT_TRY(run_check_outputs(r));  // else once resumed (or not)
    // A resumed run continues its trace (trace_continue checks the file then).
    if (r->options.trace_path && !r->options.checkpoints) {
        QT_TRY(trace_check_output(r->options.trace_path, r->options.replace_outputs));
    }
    QT_TRY(run_check_metrics(r));
    double t0 = run_clock();
    uint8_t *base = memory;
    if (r->has_train) {
        QT_TRY(run_source_status(r, r->train_source,
                                 data_load(r->train_source, &r->train_info,
                                           base + r->data_train_offset, r->train_info.bytes,
                                           &r->train_set)));
        data_feed_init(&r->train_feed, &r->train_set, batch, true, r->seed,
                       (uint32_t *)(void *)(base + r->data_order_offset));
        data_feed_init(&r->train_plain, &r->train_set, batch, false, 0, NULL);
        data_feed_share(&r->train_feed, r->dp.rank, r->dp.world);
        data_feed_share(&r->train_plain, r->dp.rank, r->dp.world);
        if (r->model.io.datasets[DATA_DATASET_TRAIN].present) {
            data_feed_resident(&r->train_feed, DATA_DATASET_TRAIN);
            data_feed_resident(&r->train_plain, DATA_DATASET_TRAIN);
        }
    }
    if (r->has_eval) {
        QT_TRY(run_source_status(r, &rc->data.eval,
                                 data_load(&rc->data.eval, &r->eval_info,
                                           base + r->data_eval_offset, r->eval_info.bytes,
                                           &r->eval_set)));
        data_feed_init(&r->eval_feed, &r->eval_set, batch, false, 0, NULL);
        data_feed_share(&r->eval_feed, r->dp.rank, r->dp.world);
        if (r->model.io.datasets[DATA_DATASET_EVAL].present) {
            data_feed_resident(&r->eval_feed, DATA_DATASET_EVAL);
        }
    }
    if (r->options.golden_path) {
        QT_TRY(trace_check_load(&r->check, r->options.golden_path,
                                (char *)(base + r->data_golden_offset), r->golden_bytes));
    }
    r->data_loaded = true;
    r->timings.data_s = run_clock() - t0;
    return QT_OK;
}

static qt_status run_capture(run *r) {
    backend *b = r->backend;
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (!r->model.modes[mode]) continue;
        QT_TRY(backend_capture(b, &r->programs[mode], &r->graphs[mode]));
    }
    if (r->model.modes[MODEL_MODE_TRAIN]) {
        QT_TRY(backend_capture(b, &r->checksum, &r->checksum_graph));
    }
    return QT_OK;
}

// `--from`: the model's regions of a checkpoint over the ones the init program wrote.
static qt_status run_load_weights(run *r, const char *path) {
    QT_ASSERT(r->ckpt_planned);
    QT_TRY(ckpt_open(&r->reader, path));
    qt_status status = ckpt_load_model(&r->reader, &r->ckpt, r->backend, &r->dev, &r->host);
    ckpt_close(&r->reader);
    return status;
}

qt_status run_bind(run *r, backend *b, void *ref_dev, void *ref_host) {
    return run_bind_given(r, b, ref_dev, r->dev.bytes_total, ref_host, r->host.bytes_total);
}

// The rank's communicator, before the init program's first collective.
static qt_status run_open_parallel(run *r, backend *b) {
    const run_options *o = &r->options;
    if (b->kind == BACKEND_GPU) {
        if (!o->nccl_id) {
            return qt_fail(QT_ERR_INPUT, "rank %u of %u on a GPU needs the NCCL id of the "
                           "run (qtrain run --gpus starts the ranks with it)", o->rank, o->world);
        }
        ncclUniqueId id;
        memcpy(&id, o->nccl_id, sizeof id);
        // NCCL's CTAs fit the SMs that the step's GEMMs leave to them (backend_capture). Read
        // here, so that a bad value fails the runs it concerns, not every GPU open.
        QT_TRY(backend_comm_sms(&b->comm_sms));
        dp_wide wide = DP_WIDE_OFF;
        QT_TRY(backend_comm_wide(&wide));
        QT_TRY(dp_comm_open_gpu(&r->dp, &id, o->rank, o->world, b->comm_sms, wide));
    } else {
        if (!o->ref_group || o->ref_group->world != o->world) {
            return qt_fail(QT_ERR_INPUT, "rank %u of %u on the reference backend needs the "
                           "ranks' group of %u threads", o->rank, o->world, o->world);
        }
        dp_comm_open_ref(&r->dp, o->ref_group, o->rank);
    }
    r->dp_open = true;
    return QT_OK;
}

// `status` of a call since run_bind, with its failure kept in r->apart (run.h).
static qt_status run_mark(run *r, qt_status status) {
    r->apart = r->apart || status != QT_OK;
    return status;
}

static qt_status run_bind_steps(run *r, backend *b, void *dev, uint64_t dev_bytes, void *host,
                                uint64_t host_bytes) {
    r->backend = b;
    double t0 = run_clock();
    QT_TRY(backend_bind(b, &r->dev, dev, dev_bytes));
    qt_status status = backend_bind(b, &r->host, host, host_bytes);
    if (status != QT_OK) {
        backend_release(b, &r->dev);
        return status;
    }
    r->bound = true;
    run_resolve(r);
    if (r->dp.world > 1) QT_TRY(run_open_parallel(r, b));
    const data_set *sets[DATA_DATASETS] = {&r->train_set, &r->eval_set};
    for (uint32_t k = 0; k < DATA_DATASETS; k++) {  // resident datasets' inputs and targets, once
        const model_dataset *d = &r->model.io.datasets[k];
        if (!d->present) continue;
        const data_set *set = sets[k];
        const uint8_t *inputs = set->inputs_u8 != NULL ? set->inputs_u8
                                                       : (const uint8_t *)set->inputs_f32;
        QT_TRY(backend_write(b, (prog_ref){&r->dev, d->region, 0},
                             inputs - set->info.inputs_offset, d->bytes));
    }
    double t2 = run_clock();  // the upload counts with the arenas it fills (bind_s)
    if (r->model.modes[MODEL_MODE_TRAIN]) {
        prog_ref lr = {&r->dev, r->model.io.lr_rows, 0};
        QT_TRY(backend_write(b, lr, r->table.lr, r->table.lr_count * sizeof(optim_lr_row)));
    }
    QT_TRY(backend_run(b, &r->init));
    QT_TRY(backend_finish(b));
    if (r->options.from_path) QT_TRY(run_load_weights(r, r->options.from_path));
    double t3 = run_clock();
    if (!r->options.eager) QT_TRY(run_capture(r));
    double t4 = run_clock();
    r->timings.bind_s = t2 - t0;
    r->timings.init_s = t3 - t2;
    r->timings.capture_s = t4 - t3;
    return QT_OK;
}

qt_status run_bind_given(run *r, backend *b, void *dev, uint64_t dev_bytes, void *host,
                         uint64_t host_bytes) {
    QT_ASSERT(r->data_loaded);
    return run_mark(r, run_bind_steps(r, b, dev, dev_bytes, host, host_bytes));
}

// ---------------------------------------------------------------------------------------------
// The trace

// The trace's header: what the trace file starts with and what a golden trace must match.
static const trace_header *run_trace_header(run *r) {
    trace_header *h = &r->trace_head;
    memset(h, 0, sizeof *h);
    h->recipe_hash = r->recipe_hash;
    h->quantizers_count = r->model.delayed_count;
    h->checksum_every = r->options.checksum_every;
    for (uint32_t i = 0; i < h->quantizers_count; i++) {
        model_trace_name(&r->model, i, h->quantizer_names[i], TRACE_NAME_MAX);
    }
    return h;
}

static qt_status run_trace_open(run *r) {
    const trace_header *h = run_trace_header(r);
    if (r->trace_continues) {
        return trace_continue(&r->trace, r->options.trace_path, h, r->trace_bytes,
                              r->trace_hash, r->trace_records);
    }
    return trace_open(&r->trace, r->options.trace_path, h, r->options.replace_outputs);
}

// The trace file stays open from the first step that writes it to the end of run_execute or to
// run_close, so that steps run one call at a time append to one open file.
static qt_status run_trace_begin(run *r) {
    if (!r->options.trace_path || r->trace_active) return QT_OK;
    QT_TRY(run_trace_open(r));
    r->trace_active = true;
    return QT_OK;
}

// Closes the trace with its completion record (how the run ended).
static qt_status run_trace_end(run *r, trace_end end) {
    if (!r->trace_active) return QT_OK;
    qt_status closed = trace_close(&r->trace, end);
    r->trace_active = false;
    r->trace_continues = true;
    r->trace_bytes = r->trace.bytes_written;
    r->trace_records = r->trace.records;
    r->trace_hash = r->trace.hash;
    return closed;
}

// The golden trace's header checked (and its records before the run's position passed over).
static qt_status run_check_begin(run *r, const sched_env *env) {
    if (!env->check) return QT_OK;
    QT_TRY(trace_check_header(env->check, run_trace_header(r)));
    return trace_check_skip_to(env->check, r->state.step);
}

// The loop with what surrounds it: the golden trace's check begun, the output files of the
// rows this loop may run, [position, outputs_to), opened before and committed after.
static qt_status run_loop(run *r, const sched_env *env, uint32_t outputs_to,
                          sched_summary *out) {
    QT_TRY(run_check_begin(r, env));
    uint32_t outputs_from = run_outputs_from(r);
    if (r->has_outputs) QT_TRY(run_outputs_open(r, outputs_from, outputs_to));
    uint64_t train_steps = r->state.train_steps;
    qt_status status = sched_run(env, &r->table, &r->state, out);
    r->trained = r->trained || r->state.train_steps != train_steps;
    QT_TRY(status);
    // A stopped run has more records to come: the golden trace goes on.
    if (env->check && !out->stopped) QT_TRY(trace_check_end(env->check));
    return r->has_outputs ? run_outputs_commit(r, outputs_from) : QT_OK;
}

qt_status run_expert_loads(run *r, uint32_t moe, uint32_t *counts) {
    QT_ASSERT(r->bound && moe < r->model.moe_count);
    const model_moe *mo = &r->model.moes[moe];
    if (!r->trained || !mo->has_loads) {
        return qt_fail(QT_ERR_STATE, "the experts' loads are those of the last train step, and "
                       "no train step has run since the run was bound");
    }
    return backend_read(r->backend, counts, (prog_ref){&r->dev, mo->loads, 0},
                        (uint64_t)mo->experts * sizeof(uint32_t));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

static qt_status run_save_to(run *r, const char *path, bool replace) {
    QT_ASSERT(r->bound && r->ckpt_planned);
    double t0 = run_clock();
    if (r->trace_active) {
        // The trace's bytes up to this step are on disk before a checkpoint names them.
        QT_TRY(trace_flush(&r->trace, true));
        r->trace_bytes = r->trace.bytes_written;
        r->trace_records = r->trace.records;
        r->trace_hash = r->trace.hash;
    }
    ckpt_host host;
    memset(&host, 0, sizeof host);
    host.state = r->state;
    // The loop saves before it stages the next step's batch, so each feed stands after the
    // batches of the steps done (runtime/schedule/schedule.h): its cursor is the state's.
    host.state.train = r->train_feed.cursor;
    host.state.train_plain = r->train_plain.cursor;
    if (r->has_eval) host.state.eval = r->eval_feed.cursor;
    host.trace_bytes = r->trace_bytes;
    host.trace_records = r->trace_records;
    host.trace_hash = r->trace_hash;
    const sched_table *t = &r->table;
    host.rows_hash = sched_rows_hash(t, r->state.row);
    host.row_count = t->row_count;
    if (r->state.row < t->row_count) {
        const sched_row *row = &t->rows[r->state.row];
        host.row_mode = row->mode;
        host.row_dataset = row->dataset;
        host.row_steps = row->steps;
    }
    if (r->dp.world > 1 && r->dp.rank > 0) {
        // Rank 0 writes the file; this rank sends it the masters and moments it owns.
        QT_TRY(ckpt_save_share(&r->ckpt, r->backend, &r->dev));
    } else {
        QT_TRY(ckpt_save(&r->ckpt, r->backend, &r->dev, &r->host, &host, path, replace,
                         r->options.ckpt_hook, r->options.ckpt_hook_ctx));
    }
    r->saves.count++;
    r->saves.last_step = r->state.step;
    r->saves.last_train_step = r->state.train_steps;
    r->saves.seconds += run_clock() - t0;
    return QT_OK;
}

qt_status run_save(run *r, const char *path) { return run_mark(r, run_save_to(r, path, true)); }

// The schedule loop's save points (its state is r->state). The first save replaces nothing that
// appeared at the path after start-up (unless that was allowed); later ones replace their own.
static qt_status run_save_point(void *ctx, const sched_state *state) {
    run *r = ctx;
    QT_ASSERT(state == &r->state);
    bool replace = r->saved_before || run_save_replaces(&r->options);
    QT_TRY(run_save_to(r, r->options.save_path, replace));
    r->saved_before = true;
    return QT_OK;
}

// The device's step counter must be the host state's step: both come from one checkpoint.
static qt_status run_check_counter(run *r) {
    uint64_t counter = 0;
    QT_TRY(backend_read(r->backend, &counter, (prog_ref){&r->dev, r->model.io.counter, 0}, 8));
    if (counter != r->state.step) {
        return qt_fail(QT_ERR_INPUT, "%s: inconsistent: the device step counter says %llu, the "
                       "host state %llu; the file was not written by qtrain", r->reader.path,
                       (unsigned long long)counter, (unsigned long long)r->state.step);
    }
    return QT_OK;
}

static qt_status run_resume_from(run *r) {
    ckpt_reader *rd = &r->reader;
    QT_TRY(ckpt_match(rd, &r->ckpt));
    const ckpt_host *host = &rd->table.host;
    sched_row saved = {(model_mode)host->row_mode, host->row_steps,
                       (recipe_dataset)host->row_dataset, 0, 0};
    if (host->row_mode >= MODEL_MODE_COUNT) {
        return qt_fail(QT_ERR_INPUT, "%s: host state: row mode %u; the file was not written by "
                       "qtrain", rd->path, host->row_mode);
    }
    QT_TRY(sched_check_position(&r->table, &host->state, host->rows_hash, saved));
    if (r->has_train) {
        QT_TRY(data_feed_seek(&r->train_feed, host->state.train));
        QT_TRY(data_feed_seek(&r->train_plain, host->state.train_plain));
    }
    if (r->has_eval) QT_TRY(data_feed_seek(&r->eval_feed, host->state.eval));
    QT_TRY(ckpt_load(rd, &r->ckpt, r->backend, &r->dev, &r->host));
    r->state = host->state;
    QT_TRY(run_check_counter(r));
    QT_TRY(run_check_outputs(r));
    r->trace_continues = true;
    r->trace_bytes = host->trace_bytes;
    r->trace_records = host->trace_records;
    r->trace_hash = host->trace_hash;
    r->resumed = true;
    r->resumed_at = r->state;
    return QT_OK;
}

qt_status run_resume(run *r, const char *path) {
    QT_ASSERT(r->bound && r->ckpt_planned);
    double t0 = run_clock();
    qt_status status = ckpt_open(&r->reader, path);
    if (status == QT_OK) {
        status = run_resume_from(r);
        ckpt_close(&r->reader);
    }
    r->timings.resume_s = run_clock() - t0;
    return run_mark(r, status);
}

// ---------------------------------------------------------------------------------------------
// Running

// What every loop and step of the bound run shares.
static void run_env(run *r, sched_env *env, sched_progress_fn progress, void *ctx) {
    memset(env, 0, sizeof *env);
    env->backend = r->backend;
    env->model = &r->model;
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (!r->model.modes[mode]) continue;
        env->programs[mode] = &r->programs[mode];
        env->graphs[mode] = &r->graphs[mode];
    }
    env->checksum_program = &r->checksum;
    env->checksum_graph = &r->checksum_graph;
    env->eager = r->options.eager;
    env->checksum_every = r->model.modes[MODEL_MODE_TRAIN] ? r->options.checksum_every : 0;
    env->train_feed = r->has_train ? &r->train_feed : NULL;
    env->train_plain = r->has_train ? &r->train_plain : NULL;
    env->eval_feed = r->has_eval ? &r->eval_feed : NULL;
    env->progress = progress;
    env->progress_ctx = ctx;
    env->outputs = r->has_outputs ? r->outputs : NULL;
    env->check = r->options.golden_path ? &r->check : NULL;
    env->trace = r->trace_active ? &r->trace : NULL;
    env->fill = r->options.fill;
    env->fill_ctx = r->options.fill_ctx;
}

static qt_status run_execute_rows(run *r, sched_progress_fn progress, void *ctx,
                                  sched_summary *out) {
    const run_options *o = &r->options;
    bool metrics = o->metrics_path && !r->metrics_written;
    if (metrics) {
        QT_TRY(metrics_open(&r->metrics, o->metrics_path, o->replace_outputs, RUN_REPLACE_HINT,
                            o->metrics_every ? o->metrics_every : 100, r->model.classification));
        r->metrics_written = true;
    }
    qt_status opened = run_trace_begin(r);
    if (opened != QT_OK) {
        if (metrics) metrics_abandon(&r->metrics);
        return opened;
    }
    sched_env env;
    run_env(r, &env, progress, ctx);
    if (metrics) {
        env.record = metrics_record;
        env.record_ctx = &r->metrics;
    }
    if (o->save_path) {
        QT_ASSERT(r->ckpt_planned);
        env.save = run_save_point;
        env.save_ctx = r;
        env.save_every = o->save_every;
    }
    env.interrupt = o->interrupt;
    env.stop_at = o->stop_at;
    memset(&r->saves, 0, sizeof r->saves);
    qt_status status = run_loop(r, &env, r->table.row_count, out);
    if (metrics) {
        qt_status committed = metrics_commit(&r->metrics);
        if (status == QT_OK) status = committed;
    }
    trace_end end = status != QT_OK ? TRACE_END_FAILED
                    : out->stopped  ? TRACE_END_STOPPED
                                    : TRACE_END_COMPLETE;
    qt_status closed = run_trace_end(r, end);
    if (status == QT_OK) status = closed;
    run_outputs_abandon(r);  // a failed run leaves no output file
    return status;
}

qt_status run_execute(run *r, sched_progress_fn progress, void *ctx, sched_summary *out) {
    QT_ASSERT(r->bound);
    return run_mark(r, run_execute_rows(r, progress, ctx, out));
}

qt_status run_step(run *r, sched_progress_fn progress, void *ctx, sched_summary *out) {
    QT_ASSERT(r->bound);
    QT_TRY(run_mark(r, run_trace_begin(r)));
    sched_env env;
    run_env(r, &env, progress, ctx);
    env.stop_at = r->state.step + 1;
    // The step's row: the position's, or the next one when the position's row is done (rows
    // have at least one step). Only its output file can be written.
    const sched_state *s = &r->state;
    uint32_t row = s->row;
    if (row < r->table.row_count && s->row_step >= r->table.rows[row].steps) row++;
    qt_status status = run_loop(r, &env, row + 1, out);
    run_outputs_abandon(r);
    // Written through after every step, so that a write error is this step's.
    if (status == QT_OK && r->trace_active) status = trace_flush(&r->trace, false);
    r->step_failed = status != QT_OK;
    return run_mark(r, status);
}

qt_status run_step_outside(run *r, model_mode mode, sched_progress_fn progress, void *ctx,
                           qt_trace_record *record, uint32_t *rows_valid) {
    QT_ASSERT(r->bound && r->model.modes[mode]);
    QT_TRY(run_mark(r, run_trace_begin(r)));
    sched_env env;
    run_env(r, &env, progress, ctx);
    qt_status status = run_check_begin(r, &env);
    if (status == QT_OK) status = sched_step_outside(&env, mode, &r->state, record, rows_valid);
    r->trained = r->trained || (status == QT_OK && mode == MODEL_MODE_TRAIN);
    if (status == QT_OK && r->trace_active) status = trace_flush(&r->trace, false);
    r->step_failed = status != QT_OK;
    return run_mark(r, status);
}

void run_steps_left(const run *r, uint64_t steps[MODEL_MODE_COUNT]) {
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) steps[mode] = 0;
    for (uint32_t i = r->state.row; i < r->table.row_count; i++) {
        const sched_row *row = &r->table.rows[i];
        steps[row->mode] += row->steps - (i == r->state.row ? r->state.row_step : 0);
    }
}

// Milliseconds of one run of a mode's program: the median of three warm runs, after a cold one,
// within about a second; a cold run of half a second or more is the measurement itself (long
// steps vary less, and timing more of them would delay the start).
static double run_time_mode(run *r, int mode) {
    double seconds[4] = {0.0, 0.0, 0.0, 0.0}, spent = 0.0;
    int runs = 0;
    while (runs < 4 && (runs == 0 || (seconds[0] < 0.5 && spent < 1.0))) {
        double t0 = run_clock();
        qt_status status = backend_run(r->backend, &r->programs[mode]);
        QT_ASSERT(status == QT_OK);  // the reference backend's launches do not fail
        seconds[runs] = run_clock() - t0;
        spent += seconds[runs++];
    }
    if (runs == 1) return 1e3 * seconds[0];
    if (runs < 4) return 1e3 * seconds[runs - 1];  // the last warm run
    double a = seconds[1], b = seconds[2], c = seconds[3];  // the median of the warm runs
    double median = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
    return 1e3 * median;
}

// Stages the next batch of the feed that the mode's first row left reads (sched_feed's choice)
// where the next step's program reads it, as the loop would, and leaves the feed where it was:
// the step is timed on the data it will run on.
static void run_stage_for_timing(run *r, int mode) {
    data_feed *feed = NULL;
    for (uint32_t i = r->state.row; i < r->table.row_count && !feed; i++) {
        const sched_row *row = &r->table.rows[i];
        if ((int)row->mode != mode) continue;
        feed = mode == MODEL_MODE_TRAIN               ? &r->train_feed
               : row->dataset == RECIPE_DATASET_EVAL ? &r->eval_feed
                                                      : &r->train_plain;
    }
    QT_ASSERT(feed != NULL);
    const model_io *io = &r->model.io;
    uint64_t bytes = io->slot.bytes, step = r->state.step;
    uint8_t *host = (uint8_t *)arena_host_pointer(&r->host, io->staging) +
                    step % MODEL_HOST_SLOTS * bytes;
    uint8_t *dev = (uint8_t *)arena_host_pointer(&r->dev, io->staged) +
                   step % MODEL_DEVICE_SLOTS * bytes;
    data_feed saved = *feed;
    data_feed_next(feed, &io->slot, host);
    memcpy(dev, host, bytes);
    *feed = saved;
}

void run_time_steps(run *r, void *scratch, uint64_t scratch_bytes, double ms[MODEL_MODE_COUNT]) {
    QT_ASSERT(r->bound && r->backend->kind == BACKEND_REF);
    uint64_t dev = r->dev.bytes_total, host = r->host.bytes_total;
    QT_ASSERT(scratch_bytes >= dev + host);
    uint8_t *copy = scratch;
    memcpy(copy, r->dev.host_base, dev);
    memcpy(copy + dev, r->host.host_base, host);
    uint64_t steps[MODEL_MODE_COUNT];
    run_steps_left(r, steps);
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        ms[mode] = 0.0;
        if (steps[mode] == 0 || !r->model.modes[mode]) continue;
        run_stage_for_timing(r, mode);
        ms[mode] = run_time_mode(r, mode);
    }
    memcpy(r->dev.host_base, copy, dev);
    memcpy(r->host.host_base, copy + dev, host);
}

// How many capture marks each mode's graph needs at once (runtime/backend/capture.h): past
// CAPTURE_MARKS some waits fall back to a branch's last op.
static void run_print_marks(const run *r, FILE *out) {
    bool margin_beside = false;
    dp_wide wide = DP_WIDE_OFF;
    if (backend_margin_beside(&margin_beside) != QT_OK ||  // a run would refuse either
        backend_comm_wide(&wide) != QT_OK) {
        fprintf(out, "graph capture: %s\n", qt_error_message());
        qt_error_clear();
        return;
    }
    // Per mode, from one plan each: the marks, and (several ranks) the wide GEMMs between the
    // first and the last collective and those of them that leave SMs to NCCL (all of them with
    // QTRAIN_MARGIN_BESIDE=0).
    uint32_t marks[MODEL_MODE_COUNT] = {0}, window[MODEL_MODE_COUNT] = {0};
    uint32_t margin[MODEL_MODE_COUNT] = {0}, alone[MODEL_MODE_COUNT] = {0};
    bool collectives = false;
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (!r->model.modes[mode]) continue;
        const program *p = &r->programs[mode];
        capture_plan plan;
        capture_begin(&plan, p, margin_beside);
        marks[mode] = plan.marks_needed;
        collectives |= plan.first_collective != CAPTURE_NONE;
        for (uint32_t j = 0; j < p->op_count; j++) {
            alone[mode] += capture_collective_alone(&plan, j);
            if (!capture_wide_gemm(&p->ops[j])) continue;
            window[mode] += capture_between_collectives(&plan, j);
            margin[mode] += capture_leaves_margin(&plan, j);
        }
    }
    fprintf(out, "graph capture: marks needed at once (of %u):", CAPTURE_MARKS);
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (r->model.modes[mode]) fprintf(out, " %s %u", r->programs[mode].mode, marks[mode]);
    }
    fprintf(out, "\n");
    if (!collectives) return;
    fprintf(out, "graph capture: wide GEMMs between the first and the last collective:");
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (!r->model.modes[mode]) continue;
        fprintf(out, " %s %u (%u leave SMs to NCCL)", r->programs[mode].mode, window[mode],
                margin[mode]);
    }
    fprintf(out, "%s\n", margin_beside ? "" : " (QTRAIN_MARGIN_BESIDE=0)");
    fprintf(out, "graph capture: collectives after the last wide GEMM:");
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (r->model.modes[mode]) fprintf(out, " %s %u", r->programs[mode].mode, alone[mode]);
    }
    fprintf(out, " (%s)\n", wide != DP_WIDE_OFF
                                 ? "on a second NCCL communicator without the CTA cap, with NCCL "
                                   "2.18 or newer; QTRAIN_COMM_WIDE=0 caps them"
                                 : "capped like the others, QTRAIN_COMM_WIDE=0");
}

// Per-op times of one mode's program, in op order, each with the kernel and grid that ran it (the
// sm_90a tier's where it takes a GEMM) and its share of their sum, then the graph replay: the
// replay over the sum shows what launch gaps and serialization cost.
static qt_status run_profile_mode(run *r, int mode, uint32_t reps, FILE *out) {
    const program *p = &r->programs[mode];
    float *op_us = (float *)(void *)p->op_scratch;  // the program's per-op scratch
    float graph_us = 0.0f;
    QT_TRY(backend_profile(r->backend, p, &r->graphs[mode], reps, op_us, &graph_us));
    double sum = 0.0;
    for (uint32_t i = 0; i < p->op_count; i++) sum += op_us[i];
    fprintf(out, "profile %s: %u ops, %u launches each\n", p->mode, p->op_count, reps);
    fprintf(out, "  %4s  %-28s %-28s %-12s %9s %6s\n", "op", "name", "kernel", "grid",
            "us", "share");
    for (uint32_t i = 0; i < p->op_count; i++) {
        const prog_op *op = &p->ops[i];
        kernel_id kernel;
        launch_shape shape;
        backend_launched(r->backend, op, &kernel, &shape);
        char grid[32];
        snprintf(grid, sizeof grid, "%ux%ux%u", shape.grid[0], shape.grid[1], shape.grid[2]);
        fprintf(out, "  %4u  %-28s %-28s %-12s %9.2f %5.1f%%\n", i, op->name,
                kernel_table[kernel].symbol, grid, (double)op_us[i],
                sum > 0 ? 100.0 * op_us[i] / sum : 0.0);
    }
    fprintf(out, "  sum of ops %.2f us; graph replay %.2f us per step\n", sum,
            (double)graph_us);
    return QT_OK;
}

// Where each op of one mode's program ran in its graph's replay (backend_timeline, a window of
// ops at a time): its capture stream, start and end from the replay's start, and the time its
// stream waited before it (from the stream's previous op's end). The ops that end last and the
// gaps show what the step waits for: the critical path, and collectives that do not overlap.
static qt_status run_timeline_mode(run *r, int mode, FILE *out) {
    const program *p = &r->programs[mode];
    fprintf(out, "timeline %s: graph replay, median of %u (us from the replay's start)\n",
            p->mode, BACKEND_TIMELINE_REPS);
    fprintf(out, "  %4s  %-28s %6s %10s %10s %9s %9s\n", "op", "name", "stream", "start", "end",
            "us", "waited");
    float stream_end[CAPTURE_STREAMS] = {0};
    float last_end = 0.0f;
    for (uint32_t first = 0; first < p->op_count; first += BACKEND_TIMELINE_OPS) {
        backend_op_span spans[BACKEND_TIMELINE_OPS];
        uint32_t count = p->op_count - first < BACKEND_TIMELINE_OPS ? p->op_count - first
                                                                     : BACKEND_TIMELINE_OPS;
        if (first > 0) {
            // Another capture, other replays: a stream's wait is counted within the window.
            fprintf(out, "  ops %u on: another capture's replays, not comparable with the ops "
                    "above\n", first);
            for (int s = 0; s < CAPTURE_STREAMS; s++) stream_end[s] = 0.0f;
        }
        QT_TRY(backend_timeline(r->backend, p, first, count, BACKEND_TIMELINE_REPS, spans));
        for (uint32_t k = 0; k < count; k++) {
            const backend_op_span *sp = &spans[k];
            float waited = sp->start_us - stream_end[sp->stream];
            stream_end[sp->stream] = sp->end_us;
            if (sp->end_us > last_end) last_end = sp->end_us;
            fprintf(out, "  %4u  %-28s %6u %10.1f %10.1f %9.1f %9.1f\n", first + k,
                    p->ops[first + k].name, sp->stream, (double)sp->start_us,
                    (double)sp->end_us, (double)(sp->end_us - sp->start_us), (double)waited);
        }
    }
    fprintf(out, "  last op ends %.1f us after the replay's start\n", (double)last_end);
    return QT_OK;
}

static qt_status run_profile_modes(run *r, uint32_t reps, FILE *out) {
    QT_ASSERT(r->bound);
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (r->model.modes[mode]) QT_TRY(run_profile_mode(r, mode, reps, out));
    }
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (r->model.modes[mode] && r->graphs[mode].exec) QT_TRY(run_timeline_mode(r, mode, out));
    }
    return QT_OK;
}

// The profile replays the graphs, collectives included: a rank whose profile failed leaves the
// others in one, like a failed step (run_mark).
qt_status run_profile(run *r, uint32_t reps, FILE *out) {
    return run_mark(r, run_profile_modes(r, reps, out));
}

qt_status run_end_trace(run *r) {
    if (!r->planned) return QT_OK;  // no schedule and no trace yet (a failed run_measure or plan)
    uint64_t left[MODEL_MODE_COUNT];
    run_steps_left(r, left);
    bool done = left[MODEL_MODE_TRAIN] + left[MODEL_MODE_EVAL] + left[MODEL_MODE_INFER] == 0;
    trace_end end = r->step_failed ? TRACE_END_FAILED
                    : done         ? TRACE_END_COMPLETE
                                   : TRACE_END_STOPPED;
    return run_trace_end(r, end);
}

void run_close(run *r) {
    run_outputs_abandon(r);
    (void)run_end_trace(r);  // the caller that wants its status calls run_end_trace first
    metrics_abandon(&r->metrics);
    if (!r->backend) return;
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        backend_graph_destroy(r->backend, &r->graphs[mode]);
    }
    backend_graph_destroy(r->backend, &r->checksum_graph);
    if (r->dp_open) {
        // After a failure the other ranks may never reach the destroy's barrier.
        dp_comm_close(&r->dp, r->apart);
        r->dp_open = false;
    }
    if (r->bound) {
        backend_release(r->backend, &r->dev);
        backend_release(r->backend, &r->host);
        r->bound = false;
    }
    r->backend = NULL;
}

// ---------------------------------------------------------------------------------------------
// The plan report

// The table as the loop runs it: every row with the global steps it covers (train, eval and
// infer steps share one count, as the trace does), train rows with their train steps, each
// with the recipe line it came from; then the learning-rate rows, by train step.
static void run_print_table(const run *r, FILE *out) {
    const sched_table *t = &r->table;
    fprintf(out, "schedule: %u rows, %llu train, %llu eval, %llu infer steps; an epoch is %llu "
            "train steps\n", t->row_count, (unsigned long long)t->steps[MODEL_MODE_TRAIN],
            (unsigned long long)t->steps[MODEL_MODE_EVAL],
            (unsigned long long)t->steps[MODEL_MODE_INFER], (unsigned long long)t->epoch_steps);
    uint64_t step = 0, train = 0;
    for (uint32_t i = 0; i < t->row_count; i++) {
        const sched_row *row = &t->rows[i];
        char what[96];
        if (row->mode == MODEL_MODE_TRAIN) {
            snprintf(what, sizeof what, "train steps %llu..%llu", (unsigned long long)train,
                     (unsigned long long)(train + row->steps - 1));
            train += row->steps;
        } else {
            snprintf(what, sizeof what, "%s set",
                     row->dataset == RECIPE_DATASET_EVAL ? "eval" : "train");
        }
        const char *path = NULL;
        bool argmax = false;
        if (row->output) run_output_spec(r, row->output - 1, &path, &argmax);
        if (path) {
            size_t used = strlen(what);
            snprintf(what + used, sizeof what - used, " -> %.60s%s", path,
                     argmax ? " (argmax)" : "");
        }
        fprintf(out, "  %4u %-5s %8llu steps at %-8llu %-26s", i, model_mode_name(row->mode),
                (unsigned long long)row->steps, (unsigned long long)step, what);
        if (row->line) fprintf(out, " line %u", row->line);
        fputc('\n', out);
        step += row->steps;
    }
    static const char *const rules[] = {"constant", "linear", "cosine"};
    for (uint32_t i = 0; i < t->lr_count; i++) {
        const optim_lr_row *lr = &t->lr[i];
        fprintf(out, "  lr row %u: from train step %llu, %llu steps, %s %g -> %g\n", i,
                (unsigned long long)lr->start, (unsigned long long)lr->steps, rules[lr->rule],
                (double)lr->a, (double)lr->b);
    }
}

// Host memory of the run besides what the arenas hold for the device.
static void run_print_host_memory(const run *r, FILE *out) {
    const run_tables *t = &r->tables;
    uint64_t total = sizeof *r + t->bytes + r->host.bytes_total + r->data_bytes;
    fprintf(out, "host memory: %llu bytes\n", (unsigned long long)total);
    fprintf(out, "  run struct  %llu bytes\n", (unsigned long long)sizeof *r);
    fprintf(out, "  tables      %llu bytes: schedule %llu (%u rows, %u learning-rate rows), "
            "arena regions %llu (%u device, %u host), programs %llu (ops: init %u, train %u, "
            "eval %u, infer %u, checksum %u), checkpoint %llu\n",
            (unsigned long long)t->bytes, (unsigned long long)t->schedule_bytes, t->sched_rows,
            t->sched_lr_rows, (unsigned long long)t->arena_bytes, t->dev_regions,
            t->host_regions, (unsigned long long)t->program_bytes, t->ops[RUN_PROGRAM_INIT],
            t->ops[RUN_PROGRAM_TRAIN], t->ops[RUN_PROGRAM_EVAL], t->ops[RUN_PROGRAM_INFER],
            t->ops[RUN_PROGRAM_CHECKSUM], (unsigned long long)t->ckpt_bytes);
    fprintf(out, "  host arena  %llu bytes (pinned on the GPU)\n",
            (unsigned long long)r->host.bytes_total);
    fprintf(out, "  datasets    %llu bytes (and shuffle order, %s)\n\n",
            (unsigned long long)r->data_bytes,
            r->model.io.slot.resident ? "uploaded once into the device arena at bind"
                                      : "read by the host only");
}

// The program holding global op index `op` and the op's entry in it, or NULL.
static const prog_op *run_op_at(const run *r, int32_t op, const char **mode) {
    const program *programs[MODEL_MODE_COUNT + 2] = {&r->init, NULL, NULL, NULL, NULL};
    uint32_t n = 1;
    for (int m = 0; m < MODEL_MODE_COUNT; m++) {
        if (r->model.modes[m]) programs[n++] = &r->programs[m];
    }
    if (r->model.modes[MODEL_MODE_TRAIN]) programs[n++] = &r->checksum;
    for (uint32_t i = 0; i < n; i++) {
        const program *p = programs[i];
        if (op < p->op_base || (int64_t)op >= (int64_t)p->op_base + p->op_count) continue;
        *mode = p->mode;
        return &p->ops[op - p->op_base];
    }
    return NULL;
}

// Where the device arena peaks: the op at which the most transient bytes are live, and every
// category's bytes live there (persistent ones included), so that a plan shows what fills the
// memory at its fullest (a large model's: the end of its backward pass, the weight gradients
// beside the saved activations). `lead` starts the line; full: also the largest regions live.
static void run_print_peak(const run *r, FILE *out, const char *lead, bool full) {
    const arena *a = &r->dev;
    int32_t op = arena_peak_op(a, NULL);
    if (op < 0) return;
    const char *mode = "";
    const prog_op *at = run_op_at(r, op, &mode);
    uint64_t bytes[ARENA_CAT_COUNT], live = 0;
    for (int c = 0; c < ARENA_CAT_COUNT; c++) {
        bytes[c] = arena_live_bytes(a, op, (arena_category)c);
        live += bytes[c];
    }
    char size[24];
    arena_format_size(live, size, sizeof size);
    fprintf(out, "%sat op %d (%s: %s), %s live:", lead, op, at ? mode : "?", at ? at->name : "?",
            size);
    for (int c = 0; c < ARENA_CAT_COUNT; c++) {
        if (bytes[c] == 0) continue;
        arena_format_size(bytes[c], size, sizeof size);
        fprintf(out, " %s %s", arena_category_name((arena_category)c), size);
    }
    fputc('\n', out);
    if (!full) return;
    fprintf(out, "  its largest transient regions:\n");
    arena_handle h = ARENA_HANDLE_NONE;
    for (int k = 0; k < 8 && (h = arena_next_largest(a, op, h)) != ARENA_HANDLE_NONE; k++) {
        const arena_region *g = arena_region_get(a, h);
        arena_format_size(g->bytes, size, sizeof size);
        fprintf(out, "    %-*s %11s  ops %d..%d\n", ARENA_NAME_MAX / 2, g->name, size,
                g->first_op, g->last_op);
    }
}

void run_print_plan(const run *r, FILE *out) {
    model_print(&r->model, out);
    run_print_table(r, out);
    fprintf(out, "data: train %llu samples of %u features%s",
            (unsigned long long)r->train_info.samples, r->train_info.features,
            r->has_eval ? "" : "\n");
    if (r->has_eval) {
        fprintf(out, ", eval %llu samples\n", (unsigned long long)r->eval_info.samples);
    }
    const model_io *io = &r->model.io;
    if (io->slot.resident) {
        uint64_t bytes = io->datasets[DATA_DATASET_TRAIN].bytes +
                         (io->datasets[DATA_DATASET_EVAL].present
                              ? io->datasets[DATA_DATASET_EVAL].bytes : 0);
        fprintf(out, "data: resident on the device (%llu bytes: data.train%s); a step's copy is "
                "its %llu bytes of header and sample indices, the step gathers the rows\n",
                (unsigned long long)bytes,
                io->datasets[DATA_DATASET_EVAL].present ? ", data.eval" : "",
                (unsigned long long)io->slot.inputs_offset);
    }
    run_print_host_memory(r, out);
    run_print_marks(r, out);
    prog_print(&r->init, out);
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (r->model.modes[mode]) prog_print(&r->programs[mode], out);
    }
    if (r->model.modes[MODEL_MODE_TRAIN]) prog_print(&r->checksum, out);
    fprintf(out, "\n");
    arena_print(&r->dev, out);
    run_print_peak(r, out, "peak of arena 'device': ", true);
    fprintf(out, "\n");
    arena_print(&r->host, out);
}

void run_print_summary(const run *r, FILE *out) {
    const sched_table *t = &r->table;
    fprintf(out, "recipe       %s (seed %llu)\n", r->recipe->file_name,
            (unsigned long long)r->seed);
    model_print_summary(&r->model, out);
    fprintf(out, "schedule     %u rows: %llu train, %llu eval, %llu infer steps; %u learning-rate "
            "rows\n", t->row_count, (unsigned long long)t->steps[MODEL_MODE_TRAIN],
            (unsigned long long)t->steps[MODEL_MODE_EVAL],
            (unsigned long long)t->steps[MODEL_MODE_INFER], t->lr_count);
    char bytes[24];
    arena_format_size(r->data_bytes, bytes, sizeof bytes);
    fprintf(out, "data         train %llu samples of %u features",
            (unsigned long long)r->train_info.samples, r->train_info.features);
    if (r->has_eval) fprintf(out, ", eval %llu samples", (unsigned long long)r->eval_info.samples);
    fprintf(out, "; %s of host memory outside the arenas\n", bytes);
    fprintf(out, "programs     init %u ops", r->init.op_count);
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        if (r->model.modes[mode]) {
            fprintf(out, ", %s %u ops", r->programs[mode].mode, r->programs[mode].op_count);
        }
    }
    if (r->model.modes[MODEL_MODE_TRAIN]) fprintf(out, ", checksum %u ops", r->checksum.op_count);
    fputc('\n', out);
    arena_print_summary(&r->dev, out);
    run_print_peak(r, out, "             peak ", false);
    arena_print_summary(&r->host, out);
}
