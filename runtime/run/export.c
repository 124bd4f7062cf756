#include "runtime/run/export.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>   // snprintf, vsnprintf
#include <string.h>

#include "runtime/io/atomic_file.h"  // the export appears whole or not at all

// One tensor of the file: where its bytes come from and where they go.
typedef struct export_tensor {
    char name[ARENA_NAME_MAX + 8];
    const char *dtype;      // safetensors dtype
    uint32_t rank;
    uint64_t dims[2];
    uint32_t region;        // checkpoint region of its bytes
    uint64_t rows;          // copied as rows of row_bytes at a source stride of stride bytes
    uint64_t row_bytes, stride;
    uint64_t begin;         // data offset in the file's data part
    const ckpt_region *entry;  // quantized copies: the region (its usage and format)
    const ckpt_param *param;
} export_tensor;

typedef struct export_list {
    uint32_t count, capacity;
    export_tensor *tensors;  // [regions + params of the checkpoint], in the caller's memory
    uint64_t data_bytes;
} export_list;

// The JSON header's bound for a table of `entries` regions and parameters: a tensor's entry and
// its metadata line take less than 1024 bytes, as names are at most 72 characters that JSON
// does not escape (ckpt_open refuses others) and a description at most 256.
static uint64_t export_header_bytes(uint64_t entries) { return entries * 2 * 512 + 4096; }

// The caller's memory, carved: the reader's table, the tensor list, the header, the chunk, the
// output file's state.
typedef struct export_memory {
    uint64_t reader, tensors, header, chunk, file;  // offsets
    uint64_t header_bytes, total;
} export_memory;

static export_memory export_layout(uint32_t regions, uint32_t params) {
    export_memory m;
    uint64_t entries = (uint64_t)regions + params;
    m.reader = 0;
    m.tensors = (ckpt_reader_bytes(regions, params) + 15) / 16 * 16;
    m.header = m.tensors + (entries * sizeof(export_tensor) + 15) / 16 * 16;
    m.header_bytes = export_header_bytes(entries);
    m.chunk = m.header + (m.header_bytes + 15) / 16 * 16;
    m.file = m.chunk + CKPT_CHUNK_BYTES;
    m.total = m.file + (sizeof(atomic_file) + 15) / 16 * 16;
    return m;
}

uint64_t export_memory_bytes(uint32_t regions, uint32_t params) {
    return export_layout(regions, params).total;
}

// JSON text into the caller's buffer, with the room checked once per append.
typedef struct export_text {
    char *out;
    uint64_t bytes, used;
    bool full;
} export_text;

__attribute__((format(printf, 2, 3))) static void export_add(export_text *t, const char *fmt,
                                                              ...) {
    if (t->full) return;
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(t->out + t->used, t->bytes - t->used, fmt, args);
    va_end(args);
    if (n < 0 || (uint64_t)n >= t->bytes - t->used) {
        t->full = true;
        return;
    }
    t->used += (uint64_t)n;
}

// A JSON string: quotes, backslashes and control bytes escaped (names come from recipes).
static void export_string(export_text *t, const char *s) {
    export_add(t, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            export_add(t, "\\%c", *p);
        } else if (*p < 0x20) {
            export_add(t, "\\u%04x", *p);
        } else {
            export_add(t, "%c", *p);
        }
    }
    export_add(t, "\"");
}

// ---------------------------------------------------------------------------------------------
// The tensors

static void export_push(export_list *l, export_tensor *t) {
    QT_ASSERT(l->count < l->capacity);
    t->begin = l->data_bytes;
    l->data_bytes += t->rows * t->row_bytes;
    l->tensors[l->count++] = *t;
}

// "fc1.weight"; an RMSNorm gain "rmsnorm1.gamma" as "rmsnorm1.weight" (torch.nn.RMSNorm's).
static void export_param_name(const ckpt_param *p, char *out, size_t bytes) {
    size_t n = strlen(p->name);
    const char *gamma = ".gamma";
    if (p->kind == CKPT_PARAM_GAIN && n > strlen(gamma) &&
        strcmp(p->name + n - strlen(gamma), gamma) == 0) {
        snprintf(out, bytes, "%.*s.weight", (int)(n - strlen(gamma)), p->name);
        return;
    }
    snprintf(out, bytes, "%s", p->name);
}

static void export_masters(const ckpt_table *t, export_list *l) {
    for (uint32_t i = 0; i < t->header.param_count; i++) {
        const ckpt_param *p = &t->params[i];
        export_tensor e;
        memset(&e, 0, sizeof e);
        export_param_name(p, e.name, sizeof e.name);
        e.dtype = "F32";
        e.region = p->master;
        e.param = p;
        if (p->kind == CKPT_PARAM_WEIGHT) {
            e.rank = 2;
            e.dims[0] = p->rows;
            e.dims[1] = p->cols_valid;
        } else {
            e.rank = 1;
            e.dims[0] = (uint64_t)p->rows * p->cols_valid;
        }
        // Row by row: the padding columns of each row stay behind.
        e.rows = p->rows;
        e.row_bytes = (uint64_t)p->cols_valid * 4;
        e.stride = (uint64_t)p->cols * 4;
        export_push(l, &e);
    }
}

static const char *export_dtype(ckpt_format f) {
    switch (f) {
    case CKPT_FORMAT_F32: return "F32";
    case CKPT_FORMAT_BF16: return "BF16";
    case CKPT_FORMAT_E4M3: return "F8_E4M3";
    case CKPT_FORMAT_E5M2: return "F8_E5M2";
    case CKPT_FORMAT_U64: return "U64";
    case CKPT_FORMAT_E8M0:    // E8M0 scales, packed E2M1 pairs, opaque bytes
    case CKPT_FORMAT_E2M1X2:
    case CKPT_FORMAT_BYTES:
    case CKPT_FORMAT_COUNT: break;
    }
    return "U8";
}

// The codes and scales that a weight's GEMMs read (the current-scaling amax is a workspace).
static bool export_is_copy(const ckpt_table *t, const ckpt_region *e) {
    if (e->param == CKPT_NONE) return false;
    switch ((ckpt_usage)e->usage) {
    case CKPT_USAGE_ROW_DATA:
    case CKPT_USAGE_ROW_SCALE:
    case CKPT_USAGE_COL_DATA:
    case CKPT_USAGE_COL_SCALE:
    case CKPT_USAGE_SCALE_INV:
    case CKPT_USAGE_AMAX_COL: return true;
    case CKPT_USAGE_AMAX: return t->params[e->param].scheme == QT_SCHEME_NVFP4;
    case CKPT_USAGE_OTHER:
    case CKPT_USAGE_MASTER:
    case CKPT_USAGE_ADAM_M:
    case CKPT_USAGE_ADAM_V:
    case CKPT_USAGE_HISTORY:
    case CKPT_USAGE_STATE_SCALE:
    case CKPT_USAGE_OPTIM_STEPS:
    case CKPT_USAGE_LR_ROWS:
    case CKPT_USAGE_COUNTER:
    case CKPT_USAGE_COUNT: break;
    }
    return false;
}

static void export_copies(const ckpt_table *t, export_list *l) {
    for (uint32_t i = 0; i < t->header.region_count; i++) {
        const ckpt_region *r = &t->regions[i];
        if (!export_is_copy(t, r)) continue;
        export_tensor e;
        memset(&e, 0, sizeof e);
        snprintf(e.name, sizeof e.name, "%s", r->name);
        e.dtype = export_dtype(r->format);
        e.region = i;
        e.entry = r;
        e.param = &t->params[r->param];
        e.rank = r->rank;
        e.dims[0] = r->dims[0];
        e.dims[1] = r->rank == 2 ? r->dims[1] : 0;
        uint64_t inner = e.dims[r->rank - 1];
        if (r->format == CKPT_FORMAT_E2M1X2) e.dims[r->rank - 1] = (inner + 1) / 2;
        uint64_t elem = r->format == CKPT_FORMAT_F32 ? 4 : r->format == CKPT_FORMAT_BF16 ? 2 : 1;
        e.rows = 1;
        e.row_bytes = e.dims[0] * (r->rank == 2 ? e.dims[1] : 1) * elem;
        e.stride = e.row_bytes;
        export_push(l, &e);
    }
}

// ---------------------------------------------------------------------------------------------
// The header

static void export_metadata(const ckpt_table *t, const export_list *l, bool quantized,
                            export_text *x) {
    const ckpt_header *h = &t->header;
    const sched_state *s = &t->host.state;
    export_add(x, "{\"__metadata__\":{\"format\":\"pt\",\"qtrain.recipe\":");
    export_string(x, h->recipe_name);
    export_add(x, ",\"qtrain.recipe_hash\":\"%016" PRIx64 "\",\"qtrain.step\":\"%" PRIu64 "\","
               "\"qtrain.train_step\":\"%" PRIu64 "\",\"qtrain.seed\":\"%" PRIu64 "\"",
               h->recipe_hash, h->step, h->train_steps, h->seed);
    if (s->has_eval) {
        export_add(x, ",\"qtrain.eval_loss\":\"%.9g\",\"qtrain.eval_accuracy\":\"%.9g\","
                   "\"qtrain.eval_samples\":\"%" PRIu64 "\"", s->eval_loss, s->eval_accuracy,
                   s->eval_samples);
    }
    for (uint32_t i = 0; i < h->param_count; i++) {
        const ckpt_param *p = &t->params[i];
        if (p->scheme == CKPT_NONE) continue;
        char key[ARENA_NAME_MAX + 32];
        snprintf(key, sizeof key, "qtrain.quantizer.%s", p->name);
        export_add(x, ",");
        export_string(x, key);
        export_add(x, ":");
        export_string(x, p->quantizer);
    }
    for (uint32_t i = 0; quantized && i < l->count; i++) {
        const export_tensor *e = &l->tensors[i];
        if (!e->entry) continue;
        char key[ARENA_NAME_MAX + 32], value[256];
        snprintf(key, sizeof key, "qtrain.tensor.%s", e->name);
        const ckpt_region *r = e->entry;
        char shape[48];
        if (r->rank == 2) {
            snprintf(shape, sizeof shape, "[%" PRIu32 "][%" PRIu32 "]", r->dims[0], r->dims[1]);
        } else {
            snprintf(shape, sizeof shape, "[%" PRIu32 "]", r->dims[0]);
        }
        snprintf(value, sizeof value, "%s %s %s of %s (%s)", ckpt_usage_name(r->usage),
                 ckpt_format_name(r->format), shape, e->param->name, e->param->quantizer);
        export_add(x, ",");
        export_string(x, key);
        export_add(x, ":");
        export_string(x, value);
    }
    export_add(x, "}");
}

// The JSON header, padded with spaces to a multiple of 8 bytes, after the 8-byte length.
static qt_status export_header(const ckpt_table *t, const export_list *l, bool quantized,
                               uint8_t *out, uint64_t out_bytes, uint64_t *total) {
    QT_ASSERT(out_bytes > 8);
    export_text x = {(char *)out + 8, out_bytes - 8, 0, false};
    export_metadata(t, l, quantized, &x);
    for (uint32_t i = 0; i < l->count; i++) {
        const export_tensor *e = &l->tensors[i];
        export_add(&x, ",");
        export_string(&x, e->name);
        export_add(&x, ":{\"dtype\":\"%s\",\"shape\":[%" PRIu64, e->dtype, e->dims[0]);
        if (e->rank == 2) export_add(&x, ",%" PRIu64, e->dims[1]);
        export_add(&x, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", e->begin,
                   e->begin + e->rows * e->row_bytes);
    }
    export_add(&x, "}");
    while (!x.full && x.used % 8 != 0) export_add(&x, " ");
    // Every entry is bounded (names and shapes are), so the bound of export_header_bytes holds.
    QT_ASSERT(!x.full);
    uint64_t n = x.used;  // little-endian, as the host is
    memcpy(out, &n, 8);
    *total = 8 + n;
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Writing

static qt_status export_data(const ckpt_reader *rd, const export_list *l, atomic_file *out,
                             uint8_t *buffer, uint64_t buffer_bytes) {
    for (uint32_t i = 0; i < l->count; i++) {
        const export_tensor *e = &l->tensors[i];
        for (uint64_t r = 0; r < e->rows; r++) {
            for (uint64_t done = 0; done < e->row_bytes;) {
                uint64_t n = e->row_bytes - done;
                if (n > buffer_bytes) n = buffer_bytes;
                QT_TRY(ckpt_read_region(rd, e->region, r * e->stride + done, buffer, n));
                QT_TRY(atomic_file_write(out, buffer, n));
                done += n;
            }
        }
    }
    return QT_OK;
}

static qt_status export_write(const ckpt_reader *rd, const export_list *l, bool quantized,
                              atomic_file *out, uint8_t *header_memory, uint64_t header_bytes,
                              uint8_t *chunk) {
    uint64_t header = 0;
    QT_TRY(export_header(&rd->table, l, quantized, header_memory, header_bytes, &header));
    QT_TRY(atomic_file_write(out, header_memory, header));
    return export_data(rd, l, out, chunk, CKPT_CHUNK_BYTES);
}

qt_status export_safetensors(ckpt_reader *rd, const char *ckpt_path, const char *out_path,
                             bool quantized, bool force, void *memory, uint64_t memory_bytes) {
    QT_ASSERT((uintptr_t)memory % 16 == 0);
    // Refused before the checkpoint is read: nothing is replaced by surprise.
    QT_TRY(atomic_file_check(out_path, force, "--force"));
    // The largest table this memory holds: the caller sized it with ckpt_peek's counts.
    uint32_t regions = 0, params = 0;
    QT_TRY(ckpt_peek(ckpt_path, &regions, &params));
    export_memory at = export_layout(regions, params);
    if (at.total > memory_bytes) {
        return qt_fail(QT_ERR_CAPACITY, "%s: exporting its table of %" PRIu32 " regions and %"
                       PRIu32 " parameters takes %" PRIu64 " bytes, %" PRIu64 " were given",
                       ckpt_path, regions, params, at.total, memory_bytes);
    }
    uint8_t *base = memory;
    ckpt_reader_init(rd, base + at.reader, regions, params);
    QT_TRY(ckpt_open(rd, ckpt_path));
    export_list list = {0, regions + params, (export_tensor *)(void *)(base + at.tensors), 0};
    atomic_file *out = (atomic_file *)(void *)(base + at.file);
    uint8_t *chunk = base + at.chunk;
    qt_status status = ckpt_read_data(rd, chunk, CKPT_CHUNK_BYTES, NULL, NULL);
    if (status == QT_OK) {
        export_masters(&rd->table, &list);
        if (quantized) export_copies(&rd->table, &list);
        status = atomic_file_create(out, out_path, force, "--force");
        if (status == QT_OK) {
            status = export_write(rd, &list, quantized, out, base + at.header, at.header_bytes,
                                  chunk);
        }
        if (status == QT_OK) {
            status = atomic_file_commit(out);
        } else {
            atomic_file_abandon(out);
        }
    }
    ckpt_close(rd);
    return status;
}
