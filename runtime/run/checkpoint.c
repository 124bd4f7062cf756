#include "runtime/run/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>    // offsetof
#include <stdio.h>     // snprintf
#include <string.h>
#include <unistd.h>    // pread, close
#include <zlib.h>      // crc32, crc32_combine

#include "runtime/io/atomic_file.h"     // the checkpoint appears whole or not at all
#include "runtime/base/input_file.h"    // input_file_open: regular files only
#include "runtime/parallel/parallel.h"  // dp_launch, dp_ref_item: a data-parallel save's gather

QT_STATIC_ASSERT(offsetof(ckpt_header, header_crc) == CKPT_HEADER_BYTES - 4,
                 "the header's CRC is its last field");
QT_STATIC_ASSERT(sizeof(CKPT_MAGIC) == 9 && sizeof(CKPT_END_MAGIC) == 9, "8-byte magics");

static const char *const ckpt_format_names[] = {
    "bytes", "f32", "bf16", "u64", "e4m3", "e5m2", "e2m1x2", "e8m0"};
QT_STATIC_ASSERT(sizeof ckpt_format_names / sizeof ckpt_format_names[0] == CKPT_FORMAT_COUNT,
                 "a name per ckpt_format");

static const char *const ckpt_usage_names[] = {
    "other", "master", "adam_m", "adam_v", "row_data", "row_scale", "col_data", "col_scale",
    "scale_inv", "amax", "amax_col", "history", "state_scale", "optim_steps", "lr_rows",
    "counter"};
QT_STATIC_ASSERT(sizeof ckpt_usage_names / sizeof ckpt_usage_names[0] == CKPT_USAGE_COUNT,
                 "a name per ckpt_usage");

const char *ckpt_format_name(ckpt_format f) {
    return (unsigned)f < CKPT_FORMAT_COUNT ? ckpt_format_names[f] : "unknown";
}

const char *ckpt_usage_name(ckpt_usage u) {
    return (unsigned)u < CKPT_USAGE_COUNT ? ckpt_usage_names[u] : "unknown";
}

static uint64_t ckpt_align(uint64_t bytes) {
    return (bytes + CKPT_ALIGN - 1) / CKPT_ALIGN * CKPT_ALIGN;
}

static uint32_t ckpt_crc(uint32_t crc, const void *bytes, uint64_t n) {
    return (uint32_t)crc32_z(crc, bytes, (size_t)n);
}

static uint32_t ckpt_crc_combine(uint32_t crc, uint32_t next, uint64_t next_bytes) {
    return (uint32_t)crc32_combine(crc, next, (z_off_t)next_bytes);
}

// Bytes of a shape in a format (E2M1: two codes per byte along the inner dimension).
static uint64_t ckpt_shape_bytes(const ckpt_region *e) {
    uint64_t inner = e->dims[e->rank - 1], outer = e->rank == 2 ? e->dims[0] : 1;
    switch ((ckpt_format)e->format) {
    case CKPT_FORMAT_F32: return outer * inner * 4;
    case CKPT_FORMAT_BF16: return outer * inner * 2;
    case CKPT_FORMAT_U64: return outer * inner * 8;
    case CKPT_FORMAT_E2M1X2: return outer * ((inner + 1) / 2);
    case CKPT_FORMAT_BYTES:
    case CKPT_FORMAT_E4M3:
    case CKPT_FORMAT_E5M2:
    case CKPT_FORMAT_E8M0: return outer * inner;
    case CKPT_FORMAT_COUNT: break;  // a read table's formats are checked before their shapes
    }
    QT_ASSERT(!"unknown region format");
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Planning: what every persistent region is

// The parts of a parameter that data parallelism leaves to its owner (model.c's
// model_param_regions): its master, unless the master is the weight, and its Adam moments.
enum { CKPT_PART_MASTER, CKPT_PART_M, CKPT_PART_V, CKPT_PARTS };

typedef struct ckpt_describer {
    ckpt_layout *c;
    uint32_t *index_of;  // the layout's: table entry of a device handle, or CKPT_NONE
    // Data parallelism: the table entry of each part of each parameter that this rank does
    // not hold (CKPT_NONE: it holds it, or the run has no such part).
    uint32_t remote[MODEL_PARAMS_MAX][CKPT_PARTS];
} ckpt_describer;

// A part's region on this rank, or MODEL_REGION_NONE.
static arena_handle ckpt_part_handle(const model_param *p, int part) {
    return part == CKPT_PART_MASTER ? p->master : part == CKPT_PART_M ? p->m : p->v;
}

// Table entry of a part of parameter `param` held here (h) or by its owner alone.
static uint32_t ckpt_entry_of(const ckpt_describer *d, arena_handle h, uint32_t param, int part) {
    if (h != MODEL_REGION_NONE) {
        QT_ASSERT(h < d->c->dev_regions && d->index_of[h] != CKPT_NONE);
        return d->index_of[h];
    }
    QT_ASSERT(param < MODEL_PARAMS_MAX && d->remote[param][part] != CKPT_NONE);
    return d->remote[param][part];
}

static void ckpt_describe_at(ckpt_describer *d, uint32_t index, ckpt_usage usage,
                             ckpt_format format, uint32_t param, uint32_t outer,
                             uint32_t inner) {
    ckpt_region *e = &d->c->table.regions[index];
    e->usage = usage;
    e->format = format;
    e->param = param;
    e->rank = outer == 0 ? 1 : 2;
    e->dims[0] = outer == 0 ? inner : outer;
    e->dims[1] = outer == 0 ? 0 : inner;
    // The planner rounds every region up to 16 bytes: the shape must be what it reserved.
    uint64_t bytes = ckpt_shape_bytes(e);
    QT_ASSERT(bytes <= e->bytes && e->bytes - bytes < 16);
}

static void ckpt_describe(ckpt_describer *d, arena_handle h, ckpt_usage usage,
                          ckpt_format format, uint32_t param, uint32_t outer, uint32_t inner) {
    QT_ASSERT(h < d->c->dev_regions && d->index_of[h] != CKPT_NONE);
    ckpt_describe_at(d, d->index_of[h], usage, format, param, outer, inner);
}

static ckpt_format ckpt_elem_format(qt_elem e) {
    switch (e) {
    case QT_ELEM_BF16: return CKPT_FORMAT_BF16;
    case QT_ELEM_E4M3: return CKPT_FORMAT_E4M3;
    case QT_ELEM_E5M2: return CKPT_FORMAT_E5M2;
    case QT_ELEM_E2M1: return CKPT_FORMAT_E2M1X2;
    case QT_ELEM_FP32:
    case QT_ELEM_E8M0:
    case QT_ELEM_COUNT: break;  // scale types, never codes
    }
    QT_ASSERT(!"not a code type");
    return CKPT_FORMAT_BYTES;
}

static uint32_t ckpt_blocks(uint32_t n, uint32_t block) { return (n + block - 1) / block; }

// The scale shapes of ptx/quant.h's table: rowwise then columnwise, [outer][inner].
static void ckpt_scale_shapes(const qt_quantizer *q, uint32_t rows, uint32_t cols,
                              uint32_t shape[2][2], ckpt_format *format) {
    switch (q->format) {
    case QT_FORMAT_MXFP8:
        *format = CKPT_FORMAT_E8M0;
        shape[0][0] = rows, shape[0][1] = ckpt_blocks(cols, 32);
        shape[1][0] = ckpt_blocks(rows, 32), shape[1][1] = cols;
        return;
    case QT_FORMAT_FP8_BLOCK_1D:
    case QT_FORMAT_FP8_BLOCK_2D:
        *format = CKPT_FORMAT_F32;
        if (q->two_d) {
            shape[0][0] = ckpt_blocks(rows, 128), shape[0][1] = ckpt_blocks(cols, 128);
            shape[1][0] = ckpt_blocks(cols, 128), shape[1][1] = ckpt_blocks(rows, 128);
        } else {
            shape[0][0] = ckpt_blocks(cols, 128), shape[0][1] = rows;
            shape[1][0] = ckpt_blocks(rows, 128), shape[1][1] = cols;
        }
        return;
    case QT_FORMAT_NVFP4:
        *format = CKPT_FORMAT_E4M3;
        shape[0][0] = rows, shape[0][1] = ckpt_blocks(cols, 16);
        shape[1][0] = cols, shape[1][1] = ckpt_blocks(rows, 16);
        return;
    case QT_FORMAT_BF16:
    case QT_FORMAT_FP8_E4M3:
    case QT_FORMAT_FP8_E5M2:
    case QT_FORMAT_COUNT: break;  // no block scales
    }
    QT_ASSERT(!"not a block-scaled format");
}

// A weight's quantized copies (model.c's model_qstore_reserve): data [rows][cols] rowwise;
// columnwise transposed except MXFP8's; scales per ptx/quant.h; the per-tensor quantities one
// per member of a stacked expert weight (`tensors` of them).
static void ckpt_describe_qstore(ckpt_describer *d, const model_quantizer *mq, uint32_t param,
                                 uint32_t rows, uint32_t cols, uint32_t tensors,
                                 const model_qstore *s) {
    const qt_quantizer *q = &mq->q;
    const qt_format_traits *f = qt_format_get(q->format);
    if (f->scale_kind == QT_SCALE_NONE) {
        ckpt_describe(d, s->bf16.ref.region, CKPT_USAGE_ROW_DATA, CKPT_FORMAT_BF16, param, rows,
                      cols);
        return;
    }
    ckpt_format codes = ckpt_elem_format(q->elem);
    bool transposed = f->colwise_transposed;
    if (s->rowwise) {
        ckpt_describe(d, s->row_data.region, CKPT_USAGE_ROW_DATA, codes, param, rows, cols);
    }
    if (s->colwise) {
        ckpt_describe(d, s->col_data.region, CKPT_USAGE_COL_DATA, codes, param,
                      transposed ? cols : rows, transposed ? rows : cols);
    }
    if (f->scale_kind == QT_SCALE_TENSOR_FP32) {
        ckpt_describe(d, s->scale_inv.region, CKPT_USAGE_SCALE_INV, CKPT_FORMAT_F32, param, 0,
                      tensors);
        if (q->scheme == QT_SCHEME_CURRENT) {
            ckpt_describe(d, s->amax_row.region, CKPT_USAGE_AMAX, CKPT_FORMAT_F32, param, 0,
                          tensors);
        }
        return;
    }
    uint32_t shape[2][2];
    ckpt_format scales;
    ckpt_scale_shapes(q, rows, cols, shape, &scales);
    if (s->rowwise) {
        ckpt_describe(d, s->row_scale.region, CKPT_USAGE_ROW_SCALE, scales, param, shape[0][0],
                      shape[0][1]);
    }
    if (s->colwise) {
        ckpt_describe(d, s->col_scale.region, CKPT_USAGE_COL_SCALE, scales, param, shape[1][0],
                      shape[1][1]);
    }
    if (f->scale_kind != QT_SCALE_BLOCK_E4M3_TENSOR_FP32) return;  // no global amax
    ckpt_describe(d, s->amax_row.region, CKPT_USAGE_AMAX, CKPT_FORMAT_F32, param, 0, tensors);
    if (s->amax_col.region != s->amax_row.region) {
        ckpt_describe(d, s->amax_col.region, CKPT_USAGE_AMAX_COL, CKPT_FORMAT_F32, param, 0,
                      tensors);
    }
}

static ckpt_param_kind ckpt_param_kind_of(const model_param *p) {
    if (p->quantizer >= 0 || p->init == MODEL_INIT_NORMAL) return CKPT_PARAM_WEIGHT;
    return p->init == MODEL_INIT_ONE ? CKPT_PARAM_GAIN : CKPT_PARAM_BIAS;
}

static void ckpt_describe_params(ckpt_describer *d, const model *m) {
    ckpt_table *t = &d->c->table;
    QT_ASSERT(m->param_count <= t->param_capacity);
    t->header.param_count = m->param_count;
    for (uint32_t i = 0; i < m->param_count; i++) {
        const model_param *p = &m->params[i];
        ckpt_param *e = &t->params[i];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", p->name);
        e->rows = p->rows;
        e->cols = p->cols;
        e->cols_valid = p->cols_valid;
        e->kind = ckpt_param_kind_of(p);
        e->master = ckpt_entry_of(d, p->master, i, CKPT_PART_MASTER);
        e->scheme = CKPT_NONE;
        ckpt_describe_at(d, e->master, CKPT_USAGE_MASTER, CKPT_FORMAT_F32, i, p->rows, p->cols);
        if (m->modes[MODEL_MODE_TRAIN]) {
            ckpt_describe_at(d, ckpt_entry_of(d, p->m, i, CKPT_PART_M), CKPT_USAGE_ADAM_M,
                             CKPT_FORMAT_F32, i, p->rows, p->cols);
            ckpt_describe_at(d, ckpt_entry_of(d, p->v, i, CKPT_PART_V), CKPT_USAGE_ADAM_V,
                             CKPT_FORMAT_F32, i, p->rows, p->cols);
        }
        if (p->quantizer < 0) continue;
        const model_quantizer *mq = &m->quantizers[p->quantizer];
        e->scheme = mq->q.scheme;
        rules_quantizer_format(&mq->q, e->quantizer, sizeof e->quantizer);
        ckpt_describe_qstore(d, mq, i, p->rows, p->cols, p->members ? p->members : 1,
                             &p->weight);
    }
}

static void ckpt_describe_state(ckpt_describer *d, const model *m) {
    for (uint32_t s = 0; s < m->state_count; s++) {
        const model_state *st = &m->states[s];
        ckpt_describe(d, st->history, CKPT_USAGE_HISTORY, CKPT_FORMAT_F32, CKPT_NONE,
                      st->history_len, st->slots);
        ckpt_describe(d, st->scale, CKPT_USAGE_STATE_SCALE, CKPT_FORMAT_F32, CKPT_NONE, 0,
                      st->slots);
    }
    const model_io *io = &m->io;
    ckpt_describe(d, io->counter, CKPT_USAGE_COUNTER, CKPT_FORMAT_U64, CKPT_NONE, 0, 1);
    ckpt_describe(d, io->optim_steps, CKPT_USAGE_OPTIM_STEPS, CKPT_FORMAT_U64, CKPT_NONE, 0, 1);
    if (m->modes[MODEL_MODE_TRAIN]) {
        ckpt_describe(d, io->lr_rows, CKPT_USAGE_LR_ROWS, CKPT_FORMAT_BYTES, CKPT_NONE, 0,
                      (uint32_t)arena_region_get(m->dev, io->lr_rows)->bytes);
    }
}

// Whether region `name` is one of parameter p's ("<param>.<part>", model_place's names).
static bool ckpt_region_of(const char *name, const model_param *p) {
    size_t n = strlen(p->name);
    return strncmp(name, p->name, n) == 0 && name[n] == '.';
}

static ckpt_region *ckpt_new_entry(ckpt_describer *d, uint32_t *count, uint64_t *offset,
                                   const char *name, uint64_t bytes, uint32_t category) {
    ckpt_table *t = &d->c->table;
    QT_ASSERT(*count < t->region_capacity);  // sized from the persistent and remote regions
    ckpt_region *e = &t->regions[*count];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    *offset = ckpt_align(*offset);
    e->offset = *offset;
    e->bytes = bytes;
    e->category = category;
    e->format = CKPT_FORMAT_BYTES;
    e->usage = CKPT_USAGE_OTHER;
    e->param = CKPT_NONE;
    // Opaque bytes: [bytes], or [bytes / 2^16][2^16] beyond 32 bits (the model describes
    // every large region it has, so this shape stays only on regions it does not know).
    e->rank = bytes <= UINT32_MAX ? 1 : 2;
    e->dims[0] = (uint32_t)(e->rank == 1 ? bytes : bytes >> 16);
    e->dims[1] = e->rank == 1 ? 0 : 1u << 16;
    d->c->handles[*count] = CKPT_NONE;
    d->c->owner[*count] = CKPT_NONE;
    *offset += bytes;
    return e;
}

// Whether the run has a part at all (the moments: when it trains).
static bool ckpt_part_exists(const model *m, int part) {
    return part == CKPT_PART_MASTER || m->modes[MODEL_MODE_TRAIN];
}

// Data parallelism: the parts of parameter i that only its owner holds get their entries
// where the run on one GPU has them (model_param_regions reserves master, m and v before the
// weight's copies): `first` of them here, the others after.
static void ckpt_list_parts(ckpt_describer *d, const model *m, uint32_t i, int first, int last,
                            uint32_t *count, uint64_t *offset) {
    const model_param *p = &m->params[i];
    static const char *const names[CKPT_PARTS] = {"master", "m", "v"};
    static const uint32_t categories[CKPT_PARTS] = {ARENA_CAT_MASTER, ARENA_CAT_OPTIM,
                                                    ARENA_CAT_OPTIM};
    uint64_t bytes = ((uint64_t)p->rows * p->cols * 4 + 15) / 16 * 16;  // model_region's
    for (int part = first; part <= last; part++) {
        if (!ckpt_part_exists(m, part)) continue;
        uint32_t at = *count;
        char name[ARENA_NAME_MAX];
        snprintf(name, sizeof name, "%s.%s", p->name, names[part]);
        ckpt_new_entry(d, count, offset, name, bytes, categories[part]);
        (*count)++;
        if (ckpt_part_handle(p, part) == MODEL_REGION_NONE) d->remote[i][part] = at;
    }
}

// Every persistent device region with bytes, in handle order, as opaque bytes; then what the
// model knows of them. Offsets: the regions one after the other from the header on. The device
// batch slots are left out: they hold the inputs of steps already done, and the loop stages
// every step's batch before the step reads it (runtime/schedule/schedule.h), a resumed run's first
// too. A data-parallel rank lists the masters and moments of other ranks' parameters too, in the
// places the run on one GPU has them, so every rank's table is that run's.
// So is the optimizer's table: it holds this process's addresses, which the init program
// wrote.
static void ckpt_list_regions(ckpt_describer *d, const model *m) {
    const arena *dev = m->dev;
    ckpt_table *t = &d->c->table;
    uint32_t count = 0;
    uint64_t offset = CKPT_HEADER_BYTES;
    bool placed[MODEL_PARAMS_MAX] = {false};
    for (uint32_t i = 0; i < MODEL_PARAMS_MAX; i++) {
        for (int part = 0; part < CKPT_PARTS; part++) d->remote[i][part] = CKPT_NONE;
    }
    for (uint32_t h = 0; h < dev->region_count; h++) {
        const arena_region *r = arena_region_get(dev, h);
        d->index_of[h] = CKPT_NONE;
        if (!r->persistent || r->bytes == 0 || !model_region_saved(m, h)) continue;
        // A parameter's first region here: the parts it lacks come first (a quantized
        // weight's master and moments) or right after its master (the moments of a master that
        // is the weight, which every rank holds).
        uint32_t after = UINT32_MAX;
        for (uint32_t i = 0; i < m->param_count && m->world > 1; i++) {
            if (placed[i] || !ckpt_region_of(r->name, &m->params[i])) continue;
            placed[i] = true;
            if (m->params[i].master == MODEL_REGION_NONE) {
                ckpt_list_parts(d, m, i, CKPT_PART_MASTER, CKPT_PART_V, &count, &offset);
            } else if (m->params[i].m == MODEL_REGION_NONE) {
                after = i;
            }
        }
        ckpt_new_entry(d, &count, &offset, r->name, r->bytes, r->category);
        d->c->handles[count] = h;
        d->index_of[h] = count++;
        if (after != UINT32_MAX) ckpt_list_parts(d, m, after, CKPT_PART_M, CKPT_PART_V, &count,
                                                 &offset);
    }
    // The owners of every part that one rank alone holds, whichever rank this is.
    for (uint32_t i = 0; i < m->param_count && m->world > 1; i++) {
        const model_param *p = &m->params[i];
        for (int part = 0; part < CKPT_PARTS; part++) {
            if (!ckpt_part_exists(m, part)) continue;
            if (part == CKPT_PART_MASTER && p->quantizer < 0) continue;  // every rank's
            arena_handle h = ckpt_part_handle(p, part);
            uint32_t e = h != MODEL_REGION_NONE ? d->index_of[h] : d->remote[i][part];
            QT_ASSERT(e != CKPT_NONE);
            d->c->owner[e] = m->param_owner[i];
        }
    }
    t->header.region_count = count;
    t->header.table_offset = ckpt_align(offset);
}

uint32_t ckpt_remote_regions(const model *m) {
    uint32_t count = 0;
    for (uint32_t i = 0; i < m->param_count && m->world > 1; i++) {
        const model_param *p = &m->params[i];
        for (int part = 0; part < CKPT_PARTS; part++) {
            count += ckpt_part_exists(m, part) &&
                     ckpt_part_handle(p, part) == MODEL_REGION_NONE;
        }
    }
    return count;
}

// Storage of a table's entries: regions, then parameters (entries of 128 bytes, so both stay
// aligned after any count).
static uint64_t ckpt_entries_bytes(uint32_t regions, uint32_t params) {
    return (uint64_t)regions * sizeof(ckpt_region) + (uint64_t)params * sizeof(ckpt_param);
}

static void ckpt_table_init(ckpt_table *t, uint8_t *storage, uint32_t regions, uint32_t params) {
    memset(t, 0, sizeof *t);
    t->regions = (ckpt_region *)(void *)storage;
    t->params = (ckpt_param *)(void *)(storage + (uint64_t)regions * sizeof(ckpt_region));
    t->region_capacity = regions;
    t->param_capacity = params;
}

uint64_t ckpt_layout_bytes(uint32_t regions, uint32_t params, uint32_t dev_regions) {
    return ckpt_entries_bytes(regions, params) + (uint64_t)regions * sizeof(arena_handle) +
           (uint64_t)regions * sizeof(uint32_t) + (uint64_t)dev_regions * sizeof(uint32_t);
}

qt_status ckpt_plan(ckpt_layout *c, const model *m, uint64_t recipe_hash, uint64_t seed,
                    const char *recipe_name, uint64_t chunk_bytes, void *storage,
                    uint32_t regions, uint32_t params) {
    memset(c, 0, sizeof *c);
    if (storage == NULL) {  // counting: the staging region is all that takes a table entry
        QT_ASSERT(arena_counting(m->dev) && arena_counting(m->host));
        return arena_reserve(m->host, "checkpoint.staging", CKPT_ALIGN, CKPT_ALIGN,
                             ARENA_CAT_STAGING, ARENA_LIFETIME_PERSISTENT, 0, &c->staging);
    }
    QT_ASSERT((uintptr_t)storage % 16 == 0);
    ckpt_table_init(&c->table, storage, regions, params);
    uint8_t *after = (uint8_t *)storage + ckpt_entries_bytes(regions, params);
    c->handles = (arena_handle *)(void *)after;
    after += (uint64_t)regions * sizeof(arena_handle);
    c->owner = (uint32_t *)(void *)after;
    c->index_of = (uint32_t *)(void *)(after + (uint64_t)regions * sizeof(uint32_t));
    c->dev_regions = m->dev->region_count;
    c->model = m;
    // About 5 KiB per 100 parameters: static storage would be shared between runtimes.
    ckpt_describer d;
    d.c = c;
    d.index_of = c->index_of;
    ckpt_list_regions(&d, m);
    ckpt_describe_params(&d, m);
    ckpt_describe_state(&d, m);
    ckpt_header *h = &c->table.header;
    memcpy(h->magic, CKPT_MAGIC, sizeof h->magic);
    h->version = CKPT_VERSION;
    h->header_bytes = CKPT_HEADER_BYTES;
    h->recipe_hash = recipe_hash;
    h->seed = seed;
    h->data_offset = CKPT_HEADER_BYTES;
    h->table_bytes = (uint64_t)h->region_count * sizeof(ckpt_region) +
                     (uint64_t)h->param_count * sizeof(ckpt_param) + sizeof(ckpt_host);
    h->file_bytes = h->table_offset + h->table_bytes + CKPT_TRAILER_BYTES;
    const char *slash = strrchr(recipe_name, '/');
    snprintf(h->recipe_name, sizeof h->recipe_name, "%s", slash ? slash + 1 : recipe_name);
    // A chunk larger than the largest region would be pinned memory that is never used.
    uint64_t largest = 0;
    for (uint32_t i = 0; i < h->region_count; i++) {
        if (c->table.regions[i].bytes > largest) largest = c->table.regions[i].bytes;
    }
    c->chunk_bytes = chunk_bytes ? chunk_bytes : CKPT_CHUNK_BYTES;
    if (c->chunk_bytes > largest) c->chunk_bytes = largest;
    c->chunk_bytes = ckpt_align(c->chunk_bytes);
    if (c->chunk_bytes < CKPT_ALIGN) c->chunk_bytes = CKPT_ALIGN;
    return arena_reserve(m->host, "checkpoint.staging", c->chunk_bytes, CKPT_ALIGN,
                         ARENA_CAT_STAGING, ARENA_LIFETIME_PERSISTENT, 0, &c->staging);
}

// ---------------------------------------------------------------------------------------------
// Writing

typedef struct ckpt_writer {
    atomic_file *file;  // PATH.tmp-PID until the commit
    uint64_t bytes;     // written so far
    uint32_t file_crc;  // of those bytes
    ckpt_hook_fn hook;
    void *ctx;
} ckpt_writer;

// Writes n bytes whose CRC is `crc` (the caller's, so region data is hashed once).
static qt_status ckpt_put(ckpt_writer *w, const void *bytes, uint64_t n, uint32_t crc) {
    QT_TRY(atomic_file_write(w->file, bytes, n));
    w->bytes += n;
    w->file_crc = ckpt_crc_combine(w->file_crc, crc, n);
    if (w->hook) w->hook(w->ctx, CKPT_PHASE_WRITTEN, w->bytes);
    return QT_OK;
}

static qt_status ckpt_put_hashed(ckpt_writer *w, const void *bytes, uint64_t n) {
    return ckpt_put(w, bytes, n, ckpt_crc(0, bytes, n));
}

// Zero bytes up to `offset` (the gaps before aligned data).
static qt_status ckpt_put_gap(ckpt_writer *w, uint64_t offset) {
    static const uint8_t zeros[CKPT_ALIGN];
    QT_ASSERT(offset >= w->bytes && offset - w->bytes < CKPT_ALIGN);
    return ckpt_put_hashed(w, zeros, offset - w->bytes);
}

// A broadcast outside any program, waited for (a save runs between steps): `bytes` of `buffer`
// from rank root's into every other rank's, on the backend's stream (GPU: one counted
// synchronization, as a save makes them) or through the group's twin. It lives here, with its one
// caller, so that the collectives (runtime/parallel/parallel.h) need nothing of the backend.
static qt_status ckpt_broadcast_now(const dp_comm *c, backend *b, prog_ref buffer,
                                    uint64_t bytes, uint32_t root) {
    QT_ASSERT(c->world > 1 && root < c->world);
    uint64_t address = arena_address(buffer.arena, buffer.region) + buffer.offset;
    dp_item it = {address, address, bytes, DP_COLL_BROADCAST, DP_DTYPE_U8, DP_OP_NONE, 0, root};
    if (b->kind != BACKEND_GPU) {
        dp_ref_item(c, &it);
        return QT_OK;
    }
    dp_collective_args a;
    memset(&a, 0, sizeof a);
    a.comm = (uint64_t)(uintptr_t)c;
    a.items = 1;
    a.item[0] = it;
    QT_TRY(dp_launch(&a, b->stream, false));
    return backend_finish(b);
}

// Data parallelism: where region i's bytes are on this rank for the save. A master or moment
// that rank 0 does not hold is first broadcast from its owner into the parameter's gradient
// region (the same bytes; transient, so free between steps) on every rank, every rank calling
// this for every region in table order.
static qt_status ckpt_gather(ckpt_layout *c, uint32_t i, backend *b, const arena *dev,
                             arena_handle *at) {
    *at = c->handles[i];
    uint32_t owner = c->owner[i];
    if (owner == CKPT_NONE || owner == 0) return QT_OK;
    const model *m = c->model;
    const ckpt_region *e = &c->table.regions[i];
    QT_ASSERT(e->param < m->param_count);
    if (*at == CKPT_NONE) *at = m->params[e->param].grad;
    QT_ASSERT(arena_region_get(dev, *at)->bytes >= e->bytes);
    return ckpt_broadcast_now(m->comm, b, (prog_ref){(arena *)dev, *at, 0}, e->bytes, owner);
}

// One region, device -> staging -> file, chunk by chunk.
static qt_status ckpt_put_region(ckpt_writer *w, ckpt_layout *c, uint32_t i, backend *b,
                                 const arena *dev, uint8_t *staging) {
    ckpt_region *e = &c->table.regions[i];
    arena_handle at;
    QT_TRY(ckpt_gather(c, i, b, dev, &at));
    QT_ASSERT(at != CKPT_NONE);
    QT_TRY(ckpt_put_gap(w, e->offset));
    uint32_t crc = 0;
    for (uint64_t done = 0; done < e->bytes;) {
        uint64_t n = e->bytes - done < c->chunk_bytes ? e->bytes - done : c->chunk_bytes;
        prog_ref src = {(arena *)dev, at, done};
        QT_TRY(backend_read(b, staging, src, n));
        uint32_t piece = ckpt_crc(0, staging, n);
        QT_TRY(ckpt_put(w, staging, n, piece));
        crc = ckpt_crc_combine(crc, piece, n);
        done += n;
    }
    e->crc = crc;
    return QT_OK;
}

// The table as it is on disk: regions, parameters, host state.
static uint32_t ckpt_table_crc(const ckpt_table *t) {
    uint64_t regions = (uint64_t)t->header.region_count * sizeof(ckpt_region);
    uint32_t crc = ckpt_crc(0, t->regions, regions);
    crc = ckpt_crc(crc, t->params, (uint64_t)t->header.param_count * sizeof(ckpt_param));
    return ckpt_crc(crc, &t->host, sizeof t->host);
}

static qt_status ckpt_put_table(ckpt_writer *w, const ckpt_table *t) {
    QT_TRY(ckpt_put_gap(w, t->header.table_offset));
    const ckpt_header *h = &t->header;
    QT_TRY(ckpt_put_hashed(w, t->regions, (uint64_t)h->region_count * sizeof(ckpt_region)));
    QT_TRY(ckpt_put_hashed(w, t->params, (uint64_t)h->param_count * sizeof(ckpt_param)));
    QT_TRY(ckpt_put_hashed(w, &t->host, sizeof t->host));
    uint8_t trailer[CKPT_TRAILER_BYTES];
    uint32_t crcs[2] = {ckpt_table_crc(t), w->file_crc};
    memcpy(trailer, crcs, sizeof crcs);
    memcpy(trailer + 8, CKPT_END_MAGIC, 8);
    QT_TRY(ckpt_put_hashed(w, trailer, sizeof trailer));
    QT_ASSERT(w->bytes == t->header.file_bytes);
    return QT_OK;
}

static qt_status ckpt_put_all(ckpt_writer *w, ckpt_layout *c, backend *b, const arena *dev,
                              uint8_t *staging) {
    ckpt_header *h = &c->table.header;
    h->header_crc = ckpt_crc(0, h, offsetof(ckpt_header, header_crc));
    QT_TRY(ckpt_put_hashed(w, h, sizeof *h));
    for (uint32_t i = 0; i < h->region_count; i++) {
        QT_TRY(ckpt_put_region(w, c, i, b, dev, staging));
    }
    QT_TRY(ckpt_put_table(w, &c->table));
    QT_TRY(atomic_file_sync(w->file));
    if (w->hook) w->hook(w->ctx, CKPT_PHASE_SYNCED, w->bytes);
    return QT_OK;
}

void ckpt_folder(const char *path, char *folder, size_t folder_bytes) {
    snprintf(folder, folder_bytes, "%s", path);
    char *slash = strrchr(folder, '/');
    if (slash == folder) {
        slash[1] = '\0';  // "/name": the root
    } else if (slash) {
        *slash = '\0';
    } else {
        snprintf(folder, folder_bytes, ".");
    }
}

qt_status ckpt_save(ckpt_layout *c, backend *b, const arena *dev, const arena *host_arena,
                    const ckpt_host *host, const char *path, bool replace, ckpt_hook_fn hook,
                    void *ctx) {
    ckpt_header *h = &c->table.header;
    c->table.host = *host;
    h->step = host->state.step;
    h->train_steps = host->state.train_steps;
    QT_TRY(atomic_file_create(&c->file, path, replace, "--force"));
    ckpt_writer w = {&c->file, 0, 0, hook, ctx};
    uint8_t *staging = arena_host_pointer(host_arena, c->staging);
    qt_status status = ckpt_put_all(&w, c, b, dev, staging);
    if (status == QT_OK) {
        status = atomic_file_commit(&c->file);  // PATH untouched on failure: the previous stands
    } else {
        atomic_file_abandon(&c->file);
    }
    if (status == QT_OK && hook) hook(ctx, CKPT_PHASE_DONE, w.bytes);
    return status;
}

qt_status ckpt_save_share(ckpt_layout *c, backend *b, const arena *dev) {
    QT_ASSERT(c->model->world > 1 && c->model->rank > 0);
    for (uint32_t i = 0; i < c->table.header.region_count; i++) {
        arena_handle at;
        QT_TRY(ckpt_gather(c, i, b, dev, &at));
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Reading

static qt_status ckpt_pread(const ckpt_reader *rd, void *dst, uint64_t n, uint64_t offset,
                            uint64_t *got) {
    uint8_t *p = dst;
    uint64_t done = 0;
    while (done < n) {
        ssize_t k = pread(rd->fd, p + done, (size_t)(n - done), (off_t)(offset + done));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return qt_fail(QT_ERR_IO, "%s: cannot read: %s", rd->path, strerror(errno));
        if (k == 0) break;
        done += (uint64_t)k;
    }
    if (got) {
        *got = done;
    } else if (done != n) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: the file ends at byte %" PRIu64 " inside "
                       "its data", rd->path, offset + done);
    }
    return QT_OK;
}

uint64_t ckpt_reader_bytes(uint32_t regions, uint32_t params) {
    return ckpt_entries_bytes(regions, params) + (uint64_t)regions * sizeof(uint32_t);
}

void ckpt_reader_init(ckpt_reader *rd, void *storage, uint32_t regions, uint32_t params) {
    QT_ASSERT((uintptr_t)storage % 16 == 0 || regions + params == 0);
    memset(rd, 0, sizeof *rd);
    rd->fd = -1;
    ckpt_table_init(&rd->table, storage, regions, params);
    rd->target = (uint32_t *)(void *)((uint8_t *)storage + ckpt_entries_bytes(regions, params));
}

static qt_status ckpt_check_header(ckpt_reader *rd, uint64_t size) {
    const ckpt_header *h = &rd->table.header;
    uint64_t got = 0;
    QT_TRY(ckpt_pread(rd, &rd->table.header, sizeof *h, 0, &got));
    if (got < 8 || memcmp(h->magic, CKPT_MAGIC, 8) != 0) {
        return qt_fail(QT_ERR_INPUT, "%s: not a qtrain checkpoint (it does not start with '"
                       CKPT_MAGIC "')", rd->path);
    }
    if (got < sizeof *h) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: %" PRIu64 " bytes, less than the %d-byte "
                       "header (was the save interrupted?)", rd->path, got, CKPT_HEADER_BYTES);
    }
    if (h->version != CKPT_VERSION) {
        return qt_fail(QT_ERR_INPUT, "%s: checkpoint format version %" PRIu32 "; this qtrain "
                       "reads version %d", rd->path, h->version, CKPT_VERSION);
    }
    uint32_t crc = ckpt_crc(0, h, offsetof(ckpt_header, header_crc));
    if (crc != h->header_crc) {
        return qt_fail(QT_ERR_INPUT, "%s: header: bad checksum (CRC-32 %08" PRIx32 ", stored "
                       "%08" PRIx32 "): the file is damaged", rd->path, crc, h->header_crc);
    }
    if (size < h->file_bytes) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: %" PRIu64 " of the %" PRIu64 " bytes its "
                       "header announces (was the save interrupted?)", rd->path, size,
                       h->file_bytes);
    }
    if (size > h->file_bytes) {
        return qt_fail(QT_ERR_INPUT, "%s: %" PRIu64 " bytes, but its header announces %" PRIu64
                       ": bytes after the end", rd->path, size, h->file_bytes);
    }
    uint64_t table = (uint64_t)h->region_count * sizeof(ckpt_region) +
                     (uint64_t)h->param_count * sizeof(ckpt_param) + sizeof(ckpt_host);
    if (h->header_bytes != CKPT_HEADER_BYTES || h->data_offset != CKPT_HEADER_BYTES ||
        h->table_bytes != table || h->table_offset < h->data_offset ||
        h->table_offset + table + CKPT_TRAILER_BYTES != h->file_bytes ||
        memchr(h->recipe_name, '\0', sizeof h->recipe_name) == NULL) {
        return qt_fail(QT_ERR_INPUT, "%s: header: inconsistent sizes (%" PRIu32 " regions, %"
                       PRIu32 " parameters, table at %" PRIu64 "); the file was not written "
                       "by qtrain", rd->path, h->region_count, h->param_count, h->table_offset);
    }
    return QT_OK;
}

// A name as qtrain writes them: NUL-terminated within its field, printable ASCII without the
// characters JSON escapes (exports copy names into a header of bounded size).
static bool ckpt_name_ok(const char *name, size_t field) {
    const char *end = memchr(name, '\0', field);
    if (end == NULL) return false;
    for (const char *c = name; c < end; c++) {
        if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\') return false;
    }
    return true;
}

// One table entry that cannot be right even with a good CRC: the file was not written by qtrain.
static qt_status ckpt_check_entries(const ckpt_reader *rd) {
    const ckpt_table *t = &rd->table;
    uint64_t end = t->header.data_offset;
    for (uint32_t i = 0; i < t->header.region_count; i++) {
        const ckpt_region *e = &t->regions[i];
        bool ok = ckpt_name_ok(e->name, sizeof e->name) && e->offset >= end &&
                  e->offset % CKPT_ALIGN == 0 && e->bytes <= t->header.table_offset &&
                  e->offset <= t->header.table_offset - e->bytes &&
                  e->offset - end < CKPT_ALIGN && e->format < CKPT_FORMAT_COUNT &&
                  e->usage < CKPT_USAGE_COUNT && (e->rank == 1 || e->rank == 2) &&
                  (e->param == CKPT_NONE || e->param < t->header.param_count) &&
                  ckpt_shape_bytes(e) <= e->bytes;
        if (!ok) {
            return qt_fail(QT_ERR_INPUT, "%s: region table: entry %" PRIu32 " is inconsistent "
                           "(offset %" PRIu64 ", %" PRIu64 " bytes); the file was not written "
                           "by qtrain", rd->path, i, e->offset, e->bytes);
        }
        end = e->offset + e->bytes;
    }
    for (uint32_t i = 0; i < t->header.param_count; i++) {
        const ckpt_param *p = &t->params[i];
        if (!ckpt_name_ok(p->name, sizeof p->name) ||
            !ckpt_name_ok(p->quantizer, sizeof p->quantizer) ||
            p->master >= t->header.region_count || p->cols_valid > p->cols ||
            t->regions[p->master].format != CKPT_FORMAT_F32 ||
            (uint64_t)p->rows * p->cols * 4 > t->regions[p->master].bytes) {
            return qt_fail(QT_ERR_INPUT, "%s: parameter table: entry %" PRIu32 " is "
                           "inconsistent; the file was not written by qtrain", rd->path, i);
        }
    }
    return QT_OK;
}

static qt_status ckpt_read_table(ckpt_reader *rd) {
    ckpt_table *t = &rd->table;
    if (t->header.region_count > t->region_capacity ||
        t->header.param_count > t->param_capacity) {
        return qt_fail(QT_ERR_MISMATCH, "%s: a table of %" PRIu32 " regions and %" PRIu32
                       " parameters, more than this run's checkpoints hold (%" PRIu32 " and %"
                       PRIu32 "): it was saved from another recipe ('%s')", rd->path,
                       t->header.region_count, t->header.param_count, t->region_capacity,
                       t->param_capacity, t->header.recipe_name);
    }
    uint8_t trailer[CKPT_TRAILER_BYTES];
    QT_TRY(ckpt_pread(rd, trailer, sizeof trailer, t->header.file_bytes - sizeof trailer, NULL));
    if (memcmp(trailer + 8, CKPT_END_MAGIC, 8) != 0) {
        return qt_fail(QT_ERR_INPUT, "%s: trailer: no end marker '" CKPT_END_MAGIC "': the "
                       "file is damaged", rd->path);
    }
    memcpy(&rd->table_crc, trailer, 4);
    memcpy(&rd->file_crc, trailer + 4, 4);
    uint64_t at = t->header.table_offset;
    uint64_t regions = (uint64_t)t->header.region_count * sizeof(ckpt_region);
    uint64_t params = (uint64_t)t->header.param_count * sizeof(ckpt_param);
    QT_TRY(ckpt_pread(rd, t->regions, regions, at, NULL));
    QT_TRY(ckpt_pread(rd, t->params, params, at + regions, NULL));
    QT_TRY(ckpt_pread(rd, &t->host, sizeof t->host, at + regions + params, NULL));
    uint32_t crc = ckpt_table_crc(t);
    if (crc != rd->table_crc) {
        return qt_fail(QT_ERR_INPUT, "%s: region table: bad checksum (CRC-32 %08" PRIx32
                       ", stored %08" PRIx32 "): the file is damaged", rd->path, crc,
                       rd->table_crc);
    }
    return ckpt_check_entries(rd);
}

// Opens path and checks its header and length; the table is not read.
static qt_status ckpt_open_header(ckpt_reader *rd, const char *path) {
    rd->fd = -1;
    if (snprintf(rd->path, sizeof rd->path, "%s", path) >= (int)sizeof rd->path) {
        return qt_fail(QT_ERR_INPUT, "checkpoint path '%.64s...' is too long", path);
    }
    QT_TRY(input_file_open(path, "checkpoint", NULL, &rd->fd, &rd->file_bytes));
    qt_status status = ckpt_check_header(rd, rd->file_bytes);
    if (status != QT_OK) ckpt_close(rd);
    return status;
}

qt_status ckpt_peek(const char *path, uint32_t *regions, uint32_t *params) {
    ckpt_reader rd;
    ckpt_reader_init(&rd, NULL, 0, 0);
    QT_TRY(ckpt_open_header(&rd, path));
    *regions = rd.table.header.region_count;
    *params = rd.table.header.param_count;
    ckpt_close(&rd);
    return QT_OK;
}

qt_status ckpt_open(ckpt_reader *rd, const char *path) {
    QT_TRY(ckpt_open_header(rd, path));
    qt_status status = ckpt_read_table(rd);
    if (status != QT_OK) ckpt_close(rd);
    return status;
}

void ckpt_close(ckpt_reader *rd) {
    if (rd->fd >= 0) close(rd->fd);
    rd->fd = -1;
}

// "e4m3 [64][32]" of a table entry.
static void ckpt_describe_entry(const ckpt_region *e, char *out, size_t bytes) {
    if (e->rank == 2) {
        snprintf(out, bytes, "%s %s [%" PRIu32 "][%" PRIu32 "], %" PRIu64 " bytes",
                 ckpt_usage_name(e->usage), ckpt_format_name(e->format), e->dims[0], e->dims[1],
                 e->bytes);
    } else {
        snprintf(out, bytes, "%s %s [%" PRIu32 "], %" PRIu64 " bytes",
                 ckpt_usage_name(e->usage), ckpt_format_name(e->format), e->dims[0], e->bytes);
    }
}

// The first region that differs between the file's table and the run's, into out; false when
// every region agrees.
static bool ckpt_first_difference(const ckpt_table *file, const ckpt_table *run, char *out,
                                  size_t bytes) {
    uint32_t n = file->header.region_count, m = run->header.region_count;
    for (uint32_t i = 0; i < n && i < m; i++) {
        const ckpt_region *a = &file->regions[i], *b = &run->regions[i];
        char da[128], db[128];
        ckpt_describe_entry(a, da, sizeof da);
        ckpt_describe_entry(b, db, sizeof db);
        if (strcmp(a->name, b->name) != 0) {
            snprintf(out, bytes, "region %" PRIu32 " is '%s' (%s) in the checkpoint, '%s' (%s) "
                     "in this run", i, a->name, da, b->name, db);
            return true;
        }
        if (strcmp(da, db) != 0 || a->category != b->category) {
            snprintf(out, bytes, "region '%s': other format: %s in the checkpoint, %s in this "
                     "run", a->name, da, db);
            return true;
        }
    }
    if (n != m) {
        snprintf(out, bytes, "the checkpoint has %" PRIu32 " regions, this run %" PRIu32, n, m);
        return true;
    }
    return false;
}

qt_status ckpt_match(const ckpt_reader *rd, const ckpt_layout *c) {
    const ckpt_header *f = &rd->table.header, *r = &c->table.header;
    char difference[512];
    bool differs = ckpt_first_difference(&rd->table, &c->table, difference, sizeof difference);
    if (f->recipe_hash != r->recipe_hash) {
        return qt_fail(QT_ERR_MISMATCH, "%s: saved from another recipe: '%s' (text hash %016"
                       PRIx64 "), this run '%s' (%016" PRIx64 "); %s", rd->path, f->recipe_name,
                       f->recipe_hash, r->recipe_name, r->recipe_hash,
                       differs ? difference : "its regions match this run's, the texts differ");
    }
    if (f->seed != r->seed) {
        return qt_fail(QT_ERR_MISMATCH, "%s: saved with seed %" PRIu64 ", this run has seed %"
                       PRIu64 "; resume with --seed %" PRIu64, rd->path, f->seed, r->seed,
                       f->seed);
    }
    if (differs) {
        // Same recipe text and seed: another qtrain planned the model's regions otherwise.
        return qt_fail(QT_ERR_MISMATCH, "%s: %s; the checkpoint holds this recipe's model as "
                       "another qtrain version planned it, which this one cannot resume ("
                       "`qtrain export` and `qtrain infer --from` still read its weights)",
                       rd->path, difference);
    }
    for (uint32_t i = 0; i < f->param_count; i++) {
        const ckpt_param *a = &rd->table.params[i];
        if (i >= r->param_count || memcmp(a, &c->table.params[i], sizeof *a) != 0) {
            return qt_fail(QT_ERR_MISMATCH, "%s: parameter '%s' differs from this run's",
                           rd->path, a->name);
        }
    }
    if (f->param_count != r->param_count) {
        return qt_fail(QT_ERR_MISMATCH, "%s: %" PRIu32 " parameters, this run has %" PRIu32,
                       rd->path, f->param_count, r->param_count);
    }
    return QT_OK;
}

// Reads [offset, offset + n) into the caller's buffer piece by piece: *crc grows over the bytes,
// sink (if any) gets them as region `region` from region_offset on.
static qt_status ckpt_stream(ckpt_reader *rd, uint8_t *buffer, uint64_t buffer_bytes,
                             uint64_t offset, uint64_t n, uint32_t *crc, ckpt_sink_fn sink,
                             void *ctx, uint32_t region) {
    for (uint64_t done = 0; done < n;) {
        uint64_t piece = n - done < buffer_bytes ? n - done : buffer_bytes;
        QT_TRY(ckpt_pread(rd, buffer, piece, offset + done, NULL));
        *crc = ckpt_crc(*crc, buffer, piece);
        if (sink) QT_TRY(sink(ctx, region, done, buffer, piece));
        done += piece;
    }
    return QT_OK;
}

qt_status ckpt_read_data(ckpt_reader *rd, void *buffer, uint64_t buffer_bytes, ckpt_sink_fn sink,
                         void *ctx) {
    QT_ASSERT(buffer_bytes >= CKPT_ALIGN);
    const ckpt_table *t = &rd->table;
    uint32_t file_crc = ckpt_crc(0, &t->header, sizeof t->header);
    uint64_t at = t->header.data_offset;
    for (uint32_t i = 0; i < t->header.region_count; i++) {
        const ckpt_region *e = &t->regions[i];
        QT_TRY(ckpt_stream(rd, buffer, buffer_bytes, at, e->offset - at, &file_crc, NULL, NULL,
                           i));
        uint32_t crc = 0;
        QT_TRY(ckpt_stream(rd, buffer, buffer_bytes, e->offset, e->bytes, &crc, sink, ctx, i));
        if (crc != e->crc) {
            return qt_fail(QT_ERR_INPUT, "%s: region '%s': bad checksum (CRC-32 %08" PRIx32
                           ", stored %08" PRIx32 "): the file is damaged", rd->path, e->name,
                           crc, e->crc);
        }
        file_crc = ckpt_crc_combine(file_crc, crc, e->bytes);
        at = e->offset + e->bytes;
    }
    QT_TRY(ckpt_stream(rd, buffer, buffer_bytes, at, t->header.table_offset - at, &file_crc,
                       NULL, NULL, 0));
    file_crc = ckpt_crc_combine(file_crc, rd->table_crc, t->header.table_bytes);
    if (file_crc != rd->file_crc) {
        return qt_fail(QT_ERR_INPUT, "%s: file: bad checksum (CRC-32 %08" PRIx32 ", stored %08"
                       PRIx32 "): the file is damaged", rd->path, file_crc, rd->file_crc);
    }
    return QT_OK;
}

qt_status ckpt_read_region(const ckpt_reader *rd, uint32_t region, uint64_t offset, void *dst,
                           uint64_t n) {
    QT_ASSERT(region < rd->table.header.region_count);
    const ckpt_region *e = &rd->table.regions[region];
    QT_ASSERT(offset <= e->bytes && n <= e->bytes - offset);
    return ckpt_pread(rd, dst, n, e->offset + offset, NULL);
}

typedef struct ckpt_load_ctx {
    const ckpt_layout *c;
    backend *b;
    const arena *dev;
} ckpt_load_ctx;

static qt_status ckpt_load_sink(void *ctx, uint32_t region, uint64_t offset, const void *bytes,
                                uint64_t n) {
    const ckpt_load_ctx *l = ctx;
    if (l->c->handles[region] == CKPT_NONE) return QT_OK;  // another rank's (still checked)
    prog_ref dst = {(arena *)l->dev, l->c->handles[region], offset};
    return backend_write(l->b, dst, bytes, n);
}

qt_status ckpt_load(ckpt_reader *rd, const ckpt_layout *c, backend *b, const arena *dev,
                    const arena *host_arena) {
    QT_ASSERT(rd->table.header.region_count == c->table.header.region_count);
    ckpt_load_ctx l = {c, b, dev};
    return ckpt_read_data(rd, arena_host_pointer(host_arena, c->staging), c->chunk_bytes,
                          ckpt_load_sink, &l);
}

// ---------------------------------------------------------------------------------------------
// Loading a model's weights (`qtrain infer --from`)

// What the forward pass reads: the parameters in every usage and the scaling state. The step
// plumbing (counter, optimizer state, learning-rate rows), the optimizer's moments and the
// workspaces stay the run's own.
static bool ckpt_model_usage(uint32_t usage) {
    switch ((ckpt_usage)usage) {
    case CKPT_USAGE_MASTER:
    case CKPT_USAGE_ROW_DATA:
    case CKPT_USAGE_ROW_SCALE:
    case CKPT_USAGE_COL_DATA:
    case CKPT_USAGE_COL_SCALE:
    case CKPT_USAGE_SCALE_INV:
    case CKPT_USAGE_AMAX:
    case CKPT_USAGE_AMAX_COL:
    case CKPT_USAGE_HISTORY:
    case CKPT_USAGE_STATE_SCALE: return true;
    case CKPT_USAGE_OTHER:
    case CKPT_USAGE_ADAM_M:
    case CKPT_USAGE_ADAM_V:
    case CKPT_USAGE_OPTIM_STEPS:
    case CKPT_USAGE_LR_ROWS:
    case CKPT_USAGE_COUNTER:
    case CKPT_USAGE_COUNT: return false;
    }
    return false;
}

static uint32_t ckpt_find_region(const ckpt_table *t, const char *name) {
    for (uint32_t i = 0; i < t->header.region_count; i++) {
        if (strcmp(t->regions[i].name, name) == 0) return i;
    }
    return CKPT_NONE;
}

// Every parameter of the run is in the file with its shape and quantizer.
static qt_status ckpt_match_params(const ckpt_reader *rd, const ckpt_table *run) {
    const ckpt_table *file = &rd->table;
    for (uint32_t i = 0; i < run->header.param_count; i++) {
        const ckpt_param *p = &run->params[i], *q = NULL;
        for (uint32_t j = 0; j < file->header.param_count && !q; j++) {
            if (strcmp(file->params[j].name, p->name) == 0) q = &file->params[j];
        }
        if (!q) {
            return qt_fail(QT_ERR_MISMATCH, "%s: has no parameter '%s' (saved from '%s'); load "
                           "a checkpoint of this recipe's model", rd->path, p->name,
                           file->header.recipe_name);
        }
        if (q->rows != p->rows || q->cols != p->cols || q->cols_valid != p->cols_valid ||
            q->kind != p->kind || q->scheme != p->scheme ||
            strcmp(q->quantizer, p->quantizer) != 0) {
            return qt_fail(QT_ERR_MISMATCH, "%s: parameter '%s' is [%" PRIu32 "][%" PRIu32 "] "
                           "'%s' in the checkpoint, [%" PRIu32 "][%" PRIu32 "] '%s' in this "
                           "recipe; load a checkpoint of this recipe's model and quantizers",
                           rd->path, p->name, q->rows, q->cols_valid, q->quantizer, p->rows,
                           p->cols_valid, p->quantizer);
        }
    }
    return QT_OK;
}

typedef struct ckpt_model_ctx {
    backend *b;
    const arena *dev;
    const uint32_t *target;  // the reader's: device region of file region i, or CKPT_NONE
} ckpt_model_ctx;

static qt_status ckpt_model_sink(void *ctx, uint32_t region, uint64_t offset, const void *bytes,
                                 uint64_t n) {
    const ckpt_model_ctx *l = ctx;
    if (l->target[region] == CKPT_NONE) return QT_OK;
    prog_ref dst = {(arena *)l->dev, l->target[region], offset};
    return backend_write(l->b, dst, bytes, n);
}

qt_status ckpt_load_model(ckpt_reader *rd, const ckpt_layout *c, backend *b, const arena *dev,
                          const arena *host_arena) {
    QT_TRY(ckpt_match_params(rd, &c->table));
    ckpt_model_ctx l = {b, dev, rd->target};
    for (uint32_t i = 0; i < rd->table.header.region_count; i++) rd->target[i] = CKPT_NONE;
    for (uint32_t i = 0; i < c->table.header.region_count; i++) {
        const ckpt_region *e = &c->table.regions[i];
        if (!ckpt_model_usage(e->usage)) continue;
        uint32_t k = ckpt_find_region(&rd->table, e->name);
        char want[128], have[128];
        ckpt_describe_entry(e, want, sizeof want);
        if (k == CKPT_NONE) {
            return qt_fail(QT_ERR_MISMATCH, "%s: has no region '%s' (%s), which this run's model "
                           "reads; load a checkpoint of this recipe's model", rd->path, e->name,
                           want);
        }
        ckpt_describe_entry(&rd->table.regions[k], have, sizeof have);
        if (strcmp(want, have) != 0) {
            return qt_fail(QT_ERR_MISMATCH, "%s: region '%s': other format: %s in the "
                           "checkpoint, %s in this run", rd->path, e->name, have, want);
        }
        rd->target[k] = c->handles[i];
    }
    return ckpt_read_data(rd, arena_host_pointer(host_arena, c->staging), c->chunk_bytes,
                          ckpt_model_sink, &l);
}
