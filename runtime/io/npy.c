#include "runtime/io/npy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>     // snprintf
#include <string.h>
#include <sys/stat.h>  // fstat
#include <unistd.h>    // read, close

#include "runtime/base/input_file.h"  // input_file_open: regular files only

#define NPY_PREAMBLE_BYTES_MAX 12   // magic, version, u32 header length (v2, v3)
#define NPY_DIMS_PARSED_MAX 8       // dims recorded for messages; more make the header malformed
#define NPY_DESCR_BYTES_MAX 32
#define NPY_DATA_BYTES_MAX (UINT64_C(1) << 62)

static const struct {
    const char *descr, *name;
    uint32_t bytes;
} npy_dtypes[NPY_DTYPE_COUNT] = {
    [NPY_DTYPE_F32] = {"<f4", "float32", 4},
    [NPY_DTYPE_U8] = {"|u1", "uint8", 1},
    [NPY_DTYPE_I32] = {"<i4", "int32", 4},
    [NPY_DTYPE_I64] = {"<i8", "int64", 8},
};

uint32_t npy_dtype_bytes(npy_dtype dtype) { return npy_dtypes[dtype].bytes; }
const char *npy_dtype_descr(npy_dtype dtype) { return npy_dtypes[dtype].descr; }
const char *npy_dtype_name(npy_dtype dtype) { return npy_dtypes[dtype].name; }

// ---------------------------------------------------------------------------------------------
// The header's dict

typedef struct npy_header {
    char descr[NPY_DESCR_BYTES_MAX];
    bool fortran_order;
    uint32_t rank;
    uint64_t dims[NPY_DIMS_PARSED_MAX];
    uint32_t keys_seen;  // bit 0 descr, 1 fortran_order, 2 shape
} npy_header;

typedef struct cursor {
    const char *p, *end, *start;
} cursor;

static void skip_blanks(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) {
        c->p++;
    }
}

static bool take(cursor *c, char ch) {
    skip_blanks(c);
    if (c->p == c->end || *c->p != ch) return false;
    c->p++;
    return true;
}

static bool take_word(cursor *c, const char *word) {
    skip_blanks(c);
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return false;
    c->p += n;
    return true;
}

// A Python string literal in single or double quotes, without escapes.
static bool take_string(cursor *c, char *out, size_t out_bytes) {
    skip_blanks(c);
    if (c->p == c->end || (*c->p != '\'' && *c->p != '"')) return false;
    char quote = *c->p++;
    const char *begin = c->p;
    while (c->p < c->end && *c->p != quote && *c->p != '\\') c->p++;
    if (c->p == c->end || *c->p != quote || (size_t)(c->p - begin) >= out_bytes) return false;
    memcpy(out, begin, (size_t)(c->p - begin));
    out[c->p - begin] = '\0';
    c->p++;
    return true;
}

static bool take_u64(cursor *c, uint64_t *out) {
    skip_blanks(c);
    uint64_t v = 0;
    const char *begin = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        uint64_t digit = (uint64_t)(*c->p - '0');
        if (v > (UINT64_MAX - digit) / 10) return false;
        v = v * 10 + digit;
        c->p++;
    }
    *out = v;
    return c->p > begin;
}

// (A, B, ...) with an optional trailing comma; () is rank 0.
static bool take_shape(cursor *c, npy_header *h) {
    if (!take(c, '(')) return false;
    h->rank = 0;
    for (;;) {
        if (take(c, ')')) return true;
        if (h->rank == NPY_DIMS_PARSED_MAX || !take_u64(c, &h->dims[h->rank])) return false;
        h->rank++;
        if (take(c, ')')) return true;
        if (!take(c, ',')) return false;
    }
}

static bool take_entry(cursor *c, npy_header *h) {
    char key[32];
    if (!take_string(c, key, sizeof key) || !take(c, ':')) return false;
    uint32_t bit;
    bool ok;
    if (strcmp(key, "descr") == 0) {
        bit = 1;
        ok = take_string(c, h->descr, sizeof h->descr);
    } else if (strcmp(key, "fortran_order") == 0) {
        bit = 2;
        h->fortran_order = take_word(c, "True");
        ok = h->fortran_order || take_word(c, "False");
    } else if (strcmp(key, "shape") == 0) {
        bit = 4;
        ok = take_shape(c, h);
    } else {
        return false;
    }
    if (!ok || (h->keys_seen & bit)) return false;
    h->keys_seen |= bit;
    return true;
}

static qt_status parse_dict(const char *path, const char *text, size_t bytes, npy_header *h) {
    memset(h, 0, sizeof *h);
    cursor c = {text, text + bytes, text};
    bool ok = take(&c, '{');
    while (ok && !take(&c, '}')) {
        ok = take_entry(&c, h) && (take(&c, ',') || (skip_blanks(&c), c.p < c.end && *c.p == '}'));
    }
    skip_blanks(&c);
    if (ok && c.p == c.end && h->keys_seen == 7) return QT_OK;
    size_t at = (size_t)(c.p - text);
    return qt_fail(QT_ERR_INPUT, "%s: malformed .npy header near byte %zu of '%.*s': expected a "
                   "dict with exactly the keys 'descr' (a type string such as '<f4'), "
                   "'fortran_order' and 'shape' (a tuple of integers); write the file with "
                   "numpy.save", path, at, (int)(bytes < 120 ? bytes : 120), text);
}

// ---------------------------------------------------------------------------------------------
// Checks

// "(60000, 784)", "(10,)", "()" as Python prints a shape.
static void format_shape(const uint64_t *dims, uint32_t rank, char *out, size_t bytes) {
    size_t used = (size_t)snprintf(out, bytes, "(");
    for (uint32_t i = 0; i < rank && used < bytes; i++) {
        used += (size_t)snprintf(out + used, bytes - used, "%s%" PRIu64, i ? ", " : "", dims[i]);
    }
    if (used < bytes) snprintf(out + used, bytes - used, "%s)", rank == 1 ? "," : "");
}

// A readable name for a type string, known or not: '<f8' is "float64", '>f4' "big-endian
// float32", '|b1' "bool".
static void describe_descr(const char *descr, char *out, size_t bytes) {
    const char *d = descr;
    bool big = *d == '>';
    if (*d == '<' || *d == '>' || *d == '|' || *d == '=') d++;
    unsigned size = 0;
    int end = -1;
    char kind = d[0];
    if (kind == '\0' || sscanf(d + 1, "%u%n", &size, &end) != 1 || d[1 + end] != '\0') {
        snprintf(out, bytes, "an unsupported type");
        return;
    }
    const char *kinds = kind == 'f' ? "float" : kind == 'i' ? "int" : kind == 'u' ? "uint"
                      : kind == 'c' ? "complex" : kind == 'b' ? "bool" : NULL;
    if (kinds == NULL) {
        snprintf(out, bytes, "type code '%c'", kind);
    } else if (kind == 'b') {
        snprintf(out, bytes, "bool");
    } else {
        snprintf(out, bytes, "%s%s%u", big && size > 1 ? "big-endian " : "", kinds, size * 8);
    }
}

static bool find_dtype(const char *descr, npy_dtype *out) {
    for (int d = 0; d < NPY_DTYPE_COUNT; d++) {
        if (strcmp(descr, npy_dtypes[d].descr) == 0) {
            *out = (npy_dtype)d;
            return true;
        }
    }
    // One byte has no byte order: NumPy writes '|u1', other writers '<u1' or '=u1'.
    if (descr[0] != '\0' && strcmp(descr + 1, "u1") == 0) {
        *out = NPY_DTYPE_U8;
        return true;
    }
    return false;
}

// "a 2-D array of float32 ('<f4') or uint8 ('|u1')", "a 1-D array of ... or a 2-D array of ...".
static void describe_expect(const npy_expect *e, char *out, size_t bytes) {
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t rank = 1; rank <= 2; rank++) {
        uint32_t mask = e->dtypes[rank];
        if (mask == 0 || used >= bytes) continue;
        used += (size_t)snprintf(out + used, bytes - used, "%sa %u-D array of ",
                                 used ? " or " : "", rank);
        uint32_t listed = 0, count = (uint32_t)__builtin_popcount(mask);
        for (int d = 0; d < NPY_DTYPE_COUNT && used < bytes; d++) {
            if (!(mask & NPY_DTYPE_BIT(d))) continue;
            const char *sep = listed == 0 ? "" : listed + 1 == count ? " or " : ", ";
            used += (size_t)snprintf(out + used, bytes - used, "%s%s ('%s')", sep,
                                     npy_dtypes[d].name, npy_dtypes[d].descr);
            listed++;
        }
    }
}

static qt_status check_header(const char *path, const npy_header *h, const npy_expect *e,
                              npy_info *info) {
    char shape[128], found[48], wanted[320];
    format_shape(h->dims, h->rank, shape, sizeof shape);
    describe_descr(h->descr, found, sizeof found);
    describe_expect(e, wanted, sizeof wanted);
    if (h->fortran_order) {
        return qt_fail(QT_ERR_INPUT, "%s: the array is in Fortran (column-major) order; %s takes "
                       "%s in C order: save numpy.ascontiguousarray(a) instead", path, e->role,
                       wanted);
    }
    npy_dtype dtype = NPY_DTYPE_COUNT;
    if (!find_dtype(h->descr, &dtype) || h->rank < 1 || h->rank > 2 ||
        !(e->dtypes[h->rank] & NPY_DTYPE_BIT(dtype))) {
        return qt_fail(QT_ERR_INPUT, "%s: found dtype '%s' (%s) and shape %s; %s takes %s: "
                       "convert it in NumPy (a.astype(...), a.reshape(...)) and save it again",
                       path, h->descr, found, shape, e->role, wanted);
    }
    uint64_t elements = 1;
    for (uint32_t i = 0; i < h->rank; i++) {
        if (h->dims[i] == 0 || h->dims[i] > NPY_DIM_MAX) {
            return qt_fail(QT_ERR_INPUT, "%s: shape %s; %s needs every dimension between 1 and "
                           "2^40", path, shape, e->role);
        }
        elements *= h->dims[i];  // two dims of at most 2^40: no overflow before the check
        if (elements > NPY_DATA_BYTES_MAX / 8) {
            return qt_fail(QT_ERR_INPUT, "%s: shape %s holds more than 2^59 values; too large",
                           path, shape);
        }
    }
    info->dtype = dtype;
    info->rank = h->rank;
    info->shape[0] = h->dims[0];
    info->shape[1] = h->rank == 2 ? h->dims[1] : 1;
    info->data_bytes = elements * npy_dtypes[dtype].bytes;
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Reading

static qt_status read_exact(int fd, const char *path, void *dst, uint64_t bytes, uint64_t *got) {
    uint8_t *p = dst;
    uint64_t done = 0;
    while (done < bytes) {
        size_t want = bytes - done > (1u << 30) ? (1u << 30) : (size_t)(bytes - done);
        ssize_t n = read(fd, p + done, want);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return qt_fail(QT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        if (n == 0) break;
        done += (uint64_t)n;
    }
    *got = done;
    return QT_OK;
}

static uint32_t le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// The preamble: magic, version, the header's length and where it starts.
static qt_status read_preamble(int fd, const char *path, uint64_t *header_bytes,
                               uint64_t *header_offset) {
    uint8_t pre[NPY_PREAMBLE_BYTES_MAX];
    uint64_t got = 0;
    QT_TRY(read_exact(fd, path, pre, 10, &got));
    if (got < NPY_MAGIC_BYTES || memcmp(pre, NPY_MAGIC, NPY_MAGIC_BYTES) != 0) {
        return qt_fail(QT_ERR_INPUT, "%s: not an .npy file (it does not start with the magic "
                       "\\x93NUMPY); write the array with numpy.save", path);
    }
    if (got < 10) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: the file ends inside the .npy preamble "
                       "(%" PRIu64 " bytes); write it again", path, got);
    }
    uint32_t major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0) {
        return qt_fail(QT_ERR_INPUT, "%s: .npy format version %u.%u; this reader takes 1.0, "
                       "2.0 and 3.0", path, major, minor);
    }
    *header_offset = 10;
    *header_bytes = le16(pre + 8);
    if (major >= 2) {
        QT_TRY(read_exact(fd, path, pre + 10, 2, &got));
        if (got < 2) {
            return qt_fail(QT_ERR_INPUT, "%s: truncated: the file ends inside the .npy "
                           "preamble; write it again", path);
        }
        *header_offset = 12;
        *header_bytes = le32(pre + 8);
    }
    if (*header_bytes > NPY_HEADER_BYTES_MAX) {
        return qt_fail(QT_ERR_INPUT, "%s: .npy header of %" PRIu64 " bytes; at most %d are "
                       "accepted (a plain array's header is about 100 bytes)", path,
                       *header_bytes, NPY_HEADER_BYTES_MAX);
    }
    return QT_OK;
}

// Header and size of the open file fd.
static qt_status read_info(int fd, const char *path, const npy_expect *expect, npy_info *info) {
    memset(info, 0, sizeof *info);
    uint64_t header_bytes = 0, header_offset = 0, got = 0;
    QT_TRY(read_preamble(fd, path, &header_bytes, &header_offset));
    char text[NPY_HEADER_BYTES_MAX];
    QT_TRY(read_exact(fd, path, text, header_bytes, &got));
    if (got < header_bytes) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: the file ends inside the .npy header (%"
                       PRIu64 " of %" PRIu64 " bytes); write it again", path, got, header_bytes);
    }
    npy_header h;
    QT_TRY(parse_dict(path, text, (size_t)header_bytes, &h));
    QT_TRY(check_header(path, &h, expect, info));
    info->data_offset = header_offset + header_bytes;
    struct stat st;
    if (fstat(fd, &st) != 0) return qt_fail(QT_ERR_IO, "%s: cannot stat: %s", path,
                                            strerror(errno));
    uint64_t expected = info->data_offset + info->data_bytes, size = (uint64_t)st.st_size;
    if (size != expected) {
        char shape[64];
        format_shape(info->shape, info->rank, shape, sizeof shape);
        return qt_fail(QT_ERR_INPUT, "%s: %s: a %s array of shape %s needs %" PRIu64 " bytes "
                       "after the %" PRIu64 "-byte header, %" PRIu64 " in all; the file has %"
                       PRIu64 "%s", path, size < expected ? "truncated" : "trailing bytes",
                       npy_dtypes[info->dtype].name, shape, info->data_bytes, info->data_offset,
                       expected, size, size < expected ? ": it was cut short, write it again"
                                                       : ": not a single array");
    }
    return QT_OK;
}

static qt_status open_file(const char *path, int *fd) {
    uint64_t bytes = 0;
    return input_file_open(path, "dataset", "; check the path", fd, &bytes);
}

qt_status npy_open(npy_reader *r, const char *path, const npy_expect *expect) {
    QT_ASSERT(expect->dtypes[0] == 0 && (expect->dtypes[1] | expect->dtypes[2]) != 0);
    memset(r, 0, sizeof *r);
    r->path = path;
    QT_TRY(open_file(path, &r->fd));
    qt_status status = read_info(r->fd, path, expect, &r->info);
    if (status != QT_OK) close(r->fd);
    return status;
}

qt_status npy_read(npy_reader *r, void *dst, uint64_t bytes) {
    QT_ASSERT(r->done + bytes <= r->info.data_bytes);
    uint64_t got = 0;
    QT_TRY(read_exact(r->fd, r->path, dst, bytes, &got));
    r->done += got;
    if (got < bytes) {
        return qt_fail(QT_ERR_INPUT, "%s: the data ends after %" PRIu64 " of %" PRIu64 " bytes: "
                       "the file was cut short while qtrain read it", r->path, r->done,
                       r->info.data_bytes);
    }
    return QT_OK;
}

void npy_close(npy_reader *r) { close(r->fd); }

qt_status npy_probe(const char *path, const npy_expect *expect, npy_info *info) {
    npy_reader r;
    QT_TRY(npy_open(&r, path, expect));
    *info = r.info;
    npy_close(&r);
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Writing

uint32_t npy_format_header(npy_dtype dtype, uint32_t rank, const uint64_t shape[2], char *out) {
    QT_ASSERT(rank == 1 || rank == 2);
    char dims[64];
    format_shape(shape, rank, dims, sizeof dims);
    char dict[NPY_ALIGN * 3];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     npy_dtypes[dtype].descr, dims);
    QT_ASSERT(n > 0 && (size_t)n < sizeof dict);
    // Magic, version 1.0, u16 length, the dict, spaces, \n: a multiple of NPY_ALIGN in all.
    uint32_t total = (10u + (uint32_t)n + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    uint32_t header_bytes = total - 10;
    memcpy(out, NPY_MAGIC, NPY_MAGIC_BYTES);
    out[6] = 1;
    out[7] = 0;
    out[8] = (char)(header_bytes & 0xff);
    out[9] = (char)(header_bytes >> 8);
    memcpy(out + 10, dict, (size_t)n);
    memset(out + 10 + n, ' ', total - 10 - (uint32_t)n - 1);
    out[total - 1] = '\n';
    return total;
}

qt_status npy_create(npy_writer *w, const char *path, npy_dtype dtype, uint32_t rank,
                     const uint64_t shape[2], bool replace, const char *replace_hint) {
    memset(w, 0, sizeof *w);
    char header[NPY_ALIGN * 4];
    w->header_bytes = npy_format_header(dtype, rank, shape, header);
    w->data_bytes = shape[0] * (rank == 2 ? shape[1] : 1) * npy_dtypes[dtype].bytes;
    QT_TRY(atomic_file_create(&w->file, path, replace, replace_hint));
    qt_status status = atomic_file_write(&w->file, header, w->header_bytes);
    if (status != QT_OK) atomic_file_abandon(&w->file);
    return status;
}

qt_status npy_write(npy_writer *w, const void *data, uint64_t bytes) {
    QT_ASSERT(w->file.bytes + bytes <= w->header_bytes + w->data_bytes);
    return atomic_file_write(&w->file, data, bytes);
}

qt_status npy_commit(npy_writer *w) {
    uint64_t written = w->file.bytes - w->header_bytes;
    if (written != w->data_bytes) {
        atomic_file_abandon(&w->file);
        return qt_fail(QT_ERR_MISMATCH, "%s: %" PRIu64 " bytes of data were written where the "
                       "header promises %" PRIu64 "; the file was not created", w->file.path,
                       written, w->data_bytes);
    }
    return atomic_file_commit(&w->file);
}

void npy_abandon(npy_writer *w) { atomic_file_abandon(&w->file); }
