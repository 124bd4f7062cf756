#include "runtime/io/data.h"

#include <errno.h>
#include <stdio.h>    // snprintf
#include <string.h>
#include <unistd.h>  // read, close
#include <zlib.h>    // inflate, for .gz IDX files

#include "ptx/core.h"  // qt_fill_value, qt_mix64
#include "runtime/base/input_file.h"  // input_file_open: regular files only
#include "runtime/io/npy.h"  // npy_open, npy_read: .npy sources
#include "ptx/philox.h"  // qt_philox_at
#include "ptx/qt_math.h"  // qt_expf, qt_logf: zipf= weights, the same bits everywhere
// pool_run, pool_for: synthetic sources and batch gathers on the pool
#include "runtime/base/pool.h"

#define IDX_MAGIC_IMAGES 0x00000803u  // unsigned bytes, 3 dims: count, rows, cols
#define IDX_MAGIC_LABELS 0x00000801u  // unsigned bytes, 1 dim: count
#define IDX_IMAGES_HEADER_BYTES 16
#define IDX_LABELS_HEADER_BYTES 8

// zlib allocates its inflate state (about 7 KiB) and the 32 KiB window through callbacks; they
// come from this pool, so that the library never reaches malloc, even inside zlib. zlib 1.2.13
// takes 39,936 bytes of it; a zlib that wanted more would fail inflateInit2, which is asserted.
#define STREAM_POOL_BYTES (48 * 1024)
#define STREAM_INPUT_BYTES (16 * 1024)

// Domain tags that give each synthetic quantity its own Philox key, derived from one seed.
#define TAG_INPUTS 0x494E505554530000ull   // "INPUTS"
#define TAG_CENTERS 0x43454E5445525300ull  // "CENTERS"
#define TAG_LABELS 0x4C4142454C530000ull   // "LABELS"
#define TAG_TEACHER1 0x5445414348310000ull // "TEACH1"
#define TAG_TEACHER2 0x5445414348320000ull // "TEACH2"
#define TAG_SHUFFLE 0x53485546464C4500ull  // "SHUFFLE"

// Class centers of `synthetic classes` are N(0, s^2) per feature with s = 3 / sqrt(features):
// two centers then lie about 3 sqrt(2) = 4.2 noise standard deviations apart (noise is N(0, 1)
// per feature) whatever the width, so a classifier can reach 95-99% but has to learn to. `spread=F`
// puts F in place of the 3.
#define CLASSES_CENTER_SPREAD 3.0f

// ---------------------------------------------------------------------------------------------
// Byte streams: a plain file, or a gzip file inflated on the fly into the caller's buffer.

typedef struct stream {
    const char *path;
    int fd;
    uint64_t file_bytes;  // the file's size when it was opened
    bool gz;
    bool file_end;      // read() returned 0
    bool stream_end;    // gz: the last member ended with a good CRC and the file ended
    bool broken;        // a read or the gzip data failed: the stream says nothing more
    uint64_t produced;  // uncompressed bytes delivered so far
    z_stream z;
    size_t pool_used;
    _Alignas(16) uint8_t pool[STREAM_POOL_BYTES];
    uint8_t input[STREAM_INPUT_BYTES];
} stream;

static voidpf stream_zalloc(voidpf opaque, uInt items, uInt size) {
    stream *s = opaque;
    size_t bytes = ((size_t)items * size + 15) & ~(size_t)15;
    if (bytes > sizeof s->pool - s->pool_used) return Z_NULL;
    void *p = s->pool + s->pool_used;
    s->pool_used += bytes;
    return p;
}

static void stream_zfree(voidpf opaque, voidpf address) {
    (void)opaque;  // the pool is released with the stream
    (void)address;
}

// read() until `bytes` arrived or the file ended; *got says how many did.
static qt_status file_read(stream *s, uint8_t *dst, size_t bytes, size_t *got) {
    size_t done = 0;
    while (done < bytes && !s->file_end) {
        ssize_t n = read(s->fd, dst + done, bytes - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            s->broken = true;
            return qt_fail(QT_ERR_IO, "%s: cannot read: %s", s->path, strerror(errno));
        }
        if (n == 0) s->file_end = true;
        done += (size_t)n;
    }
    *got = done;
    return QT_OK;
}

static qt_status stream_open(stream *s, const char *path) {
    memset(s, 0, offsetof(stream, pool));
    s->path = path;
    // The shipped recipes name Fashion-MNIST under .data/, where the package's files land
    // when it is unpacked there (installing it would put them under /usr/share instead).
    QT_TRY(input_file_open(path, "dataset", "; check the path in the recipe's [data] section "
                           "(Fashion-MNIST for the shipped recipes, from the repository root: "
                           "apt-get download dataset-fashion-mnist && dpkg -x "
                           "dataset-fashion-mnist_*.deb .data)", &s->fd, &s->file_bytes));
    // The gzip magic decides, not the name: IDX files start with two zero bytes, gzip with
    // 1f 8b, so the two cannot be confused.
    size_t got = 0;
    qt_status status = file_read(s, s->input, 2, &got);
    if (status != QT_OK) {
        close(s->fd);
        return status;
    }
    s->gz = got == 2 && s->input[0] == 0x1f && s->input[1] == 0x8b;
    s->z.next_in = s->input;
    s->z.avail_in = (uInt)got;
    if (!s->gz) return QT_OK;
    s->z.zalloc = stream_zalloc;
    s->z.zfree = stream_zfree;
    s->z.opaque = s;
    int rc = inflateInit2(&s->z, 15 + 16);  // 32 KiB window, gzip wrapper only
    QT_ASSERT(rc == Z_OK);                  // only Z_MEM_ERROR is possible: the pool is too small
    return QT_OK;
}

static void stream_close(stream *s) {
    if (s->gz) inflateEnd(&s->z);
    close(s->fd);
}

// Refills the input buffer when it is empty; sets file_end when the file has no more bytes.
static qt_status stream_refill(stream *s) {
    if (s->z.avail_in > 0 || s->file_end) return QT_OK;
    size_t got = 0;
    QT_TRY(file_read(s, s->input, sizeof s->input, &got));
    s->z.next_in = s->input;
    s->z.avail_in = (uInt)got;
    return QT_OK;
}

// Inflates into dst until `bytes` are there or the gzip data ends cleanly.
static qt_status gz_read(stream *s, uint8_t *dst, size_t bytes, size_t *got) {
    size_t done = 0;
    while (done < bytes && !s->stream_end) {
        QT_TRY(stream_refill(s));
        if (s->z.avail_in == 0) {
            s->broken = true;
            return qt_fail(QT_ERR_INPUT, "%s: the gzip data ends early, after %llu uncompressed "
                           "bytes: the file is truncated; download or extract it again", s->path,
                           (unsigned long long)(s->produced + done));
        }
        size_t want = bytes - done;
        s->z.next_out = dst + done;
        s->z.avail_out = want > UINT32_MAX ? UINT32_MAX : (uInt)want;
        uInt before = s->z.avail_out;
        int rc = inflate(&s->z, Z_NO_FLUSH);
        done += before - s->z.avail_out;
        if (rc == Z_STREAM_END) {
            // A gzip file may hold several members one after another (RFC 1952 2.2).
            QT_TRY(stream_refill(s));
            if (s->z.avail_in == 0) {
                s->stream_end = true;
            } else {
                QT_ASSERT(inflateReset(&s->z) == Z_OK);
            }
        } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
            QT_ASSERT(rc != Z_MEM_ERROR && rc != Z_STREAM_ERROR);
            s->broken = true;
            return qt_fail(QT_ERR_INPUT, "%s: corrupt gzip data after %llu uncompressed bytes "
                           "(zlib: %s); download or extract the file again", s->path,
                           (unsigned long long)(s->produced + done),
                           s->z.msg != NULL ? s->z.msg : "error");
        }
    }
    *got = done;
    return QT_OK;
}

// Reads up to `bytes` uncompressed bytes; fewer only at the end of the data.
static qt_status stream_read(stream *s, void *dst, size_t bytes, size_t *got) {
    if (s->gz) {
        QT_TRY(gz_read(s, dst, bytes, got));
    } else {
        // The two bytes read to sniff the format are still in `input`.
        size_t early = s->z.avail_in < bytes ? s->z.avail_in : bytes;
        memcpy(dst, s->z.next_in, early);
        s->z.next_in += early;
        s->z.avail_in -= (uInt)early;
        size_t rest = 0;
        QT_TRY(file_read(s, (uint8_t *)dst + early, bytes - early, &rest));
        *got = early + rest;
    }
    s->produced += *got;
    return QT_OK;
}

// Reads exactly `bytes`, or fails naming what was being read.
static qt_status stream_read_exact(stream *s, void *dst, size_t bytes, uint64_t total,
                                   const char *what) {
    size_t got = 0;
    QT_TRY(stream_read(s, dst, bytes, &got));
    if (got < bytes) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: the %s need %llu bytes in all, the data "
                       "ends after %llu; download or extract the file again", s->path, what,
                       (unsigned long long)total, (unsigned long long)s->produced);
    }
    return QT_OK;
}

// After the last expected byte: the data must end here (for gzip, with a good CRC).
static qt_status stream_expect_end(stream *s, uint64_t total) {
    uint8_t extra;
    size_t got = 0;
    QT_TRY(stream_read(s, &extra, 1, &got));
    if (got != 0) {
        return qt_fail(QT_ERR_INPUT, "%s: trailing bytes after the %llu bytes that the header "
                       "describes; the file is not a single IDX array (or its header is wrong)",
                       s->path, (unsigned long long)total);
    }
    return QT_OK;
}

// Deflate never inflates a byte of input to more than 1032 bytes of output (zlib's documented
// limit, reached by long runs of one byte): a gzip file of F bytes holds at most 1032 F bytes.
#define GZIP_RATIO_MAX 1032

// A complaint about the content of a gzip file (its IDX header, its length, a label) may come
// from damaged gzip data, which can inflate to wrong bytes before zlib notices: the rest of the
// stream is inflated and its CRC checked first, and a gzip error, if there is one, is reported
// instead of `status` (whose message stays otherwise). A plain file whose name ends in .gz gets
// a note: its first bytes are not gzip's.
static qt_status stream_blame(stream *s, qt_status status) {
    char message[QT_ERROR_MESSAGE_MAX];
    snprintf(message, sizeof message, "%s", qt_error_message());
    size_t name = strlen(s->path);
    if (!s->gz && name >= 3 && strcmp(s->path + name - 3, ".gz") == 0) {
        return qt_fail(status, "%s (the name ends in .gz, but the file does not start with "
                       "gzip's bytes 1f 8b: it is not gzip data, or its first bytes are damaged)",
                       message);
    }
    if (!s->gz || s->broken) return status;
    uint8_t sink[4096];
    size_t got = sizeof sink;
    while (!s->stream_end && got > 0) {
        qt_status inflated = gz_read(s, sink, sizeof sink, &got);
        if (inflated != QT_OK) return inflated;
        s->produced += got;
    }
    return qt_fail(status, "%s", message);
}

// ---------------------------------------------------------------------------------------------
// IDX headers

typedef struct idx_header {
    uint32_t magic;
    uint64_t count;
    uint32_t rows, cols;  // images only
} idx_header;

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static const char *idx_magic_meaning(uint32_t magic) {
    if (magic == IDX_MAGIC_IMAGES) return "an IDX image file";
    if (magic == IDX_MAGIC_LABELS) return "an IDX label file";
    if ((magic >> 16) == 0) return "an IDX file of another type or rank";
    return "not an IDX file";
}

// Reads and checks the header of an image (images = true) or label file.
static qt_status idx_read_header(stream *s, bool images, idx_header *h) {
    uint8_t raw[IDX_IMAGES_HEADER_BYTES];
    size_t header_bytes = images ? IDX_IMAGES_HEADER_BYTES : IDX_LABELS_HEADER_BYTES;
    const char *role = images ? "IMAGES" : "LABELS";
    uint32_t expected = images ? IDX_MAGIC_IMAGES : IDX_MAGIC_LABELS;
    size_t got = 0;
    QT_TRY(stream_read(s, raw, header_bytes, &got));
    if (got >= 4 && be32(raw) != expected) {
        uint32_t other = images ? IDX_MAGIC_LABELS : IDX_MAGIC_IMAGES;
        return qt_fail(QT_ERR_INPUT, "%s: magic 0x%08x is %s; expected 0x%08x for %s%s", s->path,
                       be32(raw), idx_magic_meaning(be32(raw)), expected, role,
                       be32(raw) == other ? " (are IMAGES and LABELS swapped in the recipe's "
                                            "'idx IMAGES LABELS' line?)"
                                          : " (unsigned bytes, MNIST format)");
    }
    if (got < header_bytes) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: the IDX header needs %zu bytes, the data "
                       "ends after %zu; expected an IDX %s file", s->path, header_bytes, got,
                       images ? "image" : "label");
    }
    h->magic = be32(raw);
    h->count = be32(raw + 4);
    h->rows = images ? be32(raw + 8) : 1;
    h->cols = images ? be32(raw + 12) : 1;
    if (h->count == 0 || h->rows == 0 || h->cols == 0) {
        return qt_fail(QT_ERR_INPUT, "%s: the header gives %llu x %u x %u: a dataset needs at "
                       "least one sample of at least one value", s->path,
                       (unsigned long long)h->count, h->rows, h->cols);
    }
    return QT_OK;
}

// The bytes the header announces against the file's length, before anything is planned: a
// header that claims more samples than the file holds is a truncated file, to be named as such,
// not a dataset too large for memory. A gzip file's inflated length is known only at its end,
// but it cannot exceed GZIP_RATIO_MAX times the file.
static qt_status idx_check_length(const stream *s, bool images, const idx_header *h) {
    uint64_t header = images ? IDX_IMAGES_HEADER_BYTES : IDX_LABELS_HEADER_BYTES;
    uint64_t values = 0;  // count * rows * cols: at most 2^96, so it may overflow
    bool overflow = __builtin_mul_overflow(h->count, (uint64_t)h->rows * h->cols, &values) ||
                    values > UINT64_MAX - header;
    uint64_t expected = overflow ? UINT64_MAX : header + values;
    char what[96];
    if (images) {
        snprintf(what, sizeof what, "%llu images of %u x %u bytes", (unsigned long long)h->count,
                 h->rows, h->cols);
    } else {
        snprintf(what, sizeof what, "%llu labels of one byte", (unsigned long long)h->count);
    }
    if (!s->gz && s->file_bytes < expected) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: its header announces %s, %llu bytes with "
                       "the header, but the file has %llu; download or extract it again",
                       s->path, what, (unsigned long long)expected,
                       (unsigned long long)s->file_bytes);
    }
    if (!s->gz && s->file_bytes > expected) {
        return qt_fail(QT_ERR_INPUT, "%s: trailing bytes: its header announces %s, %llu bytes "
                       "with the header, but the file has %llu; the file is not a single IDX "
                       "array (or its header is wrong)", s->path, what,
                       (unsigned long long)expected, (unsigned long long)s->file_bytes);
    }
    if (s->gz && expected / GZIP_RATIO_MAX > s->file_bytes) {
        return qt_fail(QT_ERR_INPUT, "%s: truncated: its header announces %s, %llu bytes with "
                       "the header, but a gzip file of %llu bytes inflates to at most %d times "
                       "that; download or extract it again", s->path, what,
                       (unsigned long long)expected, (unsigned long long)s->file_bytes,
                       GZIP_RATIO_MAX);
    }
    return QT_OK;
}

static qt_status idx_probe_file(const char *path, bool images, idx_header *h) {
    stream s;
    qt_status status = stream_open(&s, path);
    if (status != QT_OK) return status;
    status = idx_read_header(&s, images, h);
    if (status == QT_OK) status = idx_check_length(&s, images, h);
    if (status != QT_OK) status = stream_blame(&s, status);
    stream_close(&s);
    return status;
}

static uint64_t align_up(uint64_t value, uint64_t align) {
    return (value + align - 1) / align * align;
}

// The dataset region's offsets from the sample counts and widths.
static void info_layout(data_info *info, uint64_t input_bytes_each, uint64_t scratch_bytes) {
    uint64_t target_bytes = info->target_type == DATA_TARGET_LABEL
                                ? sizeof(int32_t) : (uint64_t)info->outputs * sizeof(float);
    info->inputs_offset = 0;
    info->inputs_bytes = info->samples * info->features * input_bytes_each;
    info->targets_offset = align_up(info->inputs_bytes, DATA_ALIGN);
    info->targets_bytes = info->samples * target_bytes;
    info->scratch_offset = align_up(info->targets_offset + info->targets_bytes, DATA_ALIGN);
    info->scratch_bytes = scratch_bytes;
    info->bytes = align_up(info->scratch_offset + scratch_bytes, DATA_ALIGN);
}

static qt_status probe_idx(const recipe_source *src, uint32_t features, uint32_t outputs,
                           data_info *info) {
    idx_header im, lb;
    QT_TRY(idx_probe_file(src->images, true, &im));
    lb = im;  // inputs only: no label file, no count to compare
    if (src->labels[0] != '\0') QT_TRY(idx_probe_file(src->labels, false, &lb));
    if (im.count != lb.count) {
        return qt_fail(QT_ERR_INPUT, "%s: %llu labels, but %s holds %llu images; expected the "
                       "label file that belongs to these images", src->labels,
                       (unsigned long long)lb.count, src->images, (unsigned long long)im.count);
    }
    if ((uint64_t)im.rows * im.cols != features) {
        return qt_fail(QT_ERR_INPUT, "%s: images of %u x %u = %llu values; the model's input is "
                       "%u: set `input = %llu` in [model]", src->images, im.rows, im.cols,
                       (unsigned long long)im.rows * im.cols, features,
                       (unsigned long long)im.rows * im.cols);
    }
    // An IDX count is 32 bits, so DATA_SAMPLES_MAX holds for these files by construction.
    QT_ASSERT(im.count <= DATA_SAMPLES_MAX);
    info->kind = RECIPE_SOURCE_IDX;
    info->samples = im.count;
    info->features = features;
    info->image_rows = im.rows;
    info->image_cols = im.cols;
    info->outputs = outputs;
    info->input_type = DATA_INPUT_U8;
    info->target_type = DATA_TARGET_LABEL;
    info_layout(info, 1, 0);
    return QT_OK;
}

// `synthetic classes ... zipf=S`: the labels' cumulative table (u64 [classes]) follows the class
// centers in the scratch part.
static uint64_t classes_table_offset(uint32_t classes, uint32_t features) {
    return align_up((uint64_t)classes * features * sizeof(float), sizeof(uint64_t));
}

static qt_status probe_synthetic(const recipe_source *src, uint32_t features, uint32_t outputs,
                                 data_info *info) {
    bool teacher = src->kind == RECIPE_SOURCE_TEACHER;
    const char *name = teacher ? "synthetic teacher" : "synthetic classes";
    if (src->inputs != features || src->outputs != outputs) {
        return qt_fail(QT_ERR_INPUT, "%s: %u inputs and %u %s; the model has "
                       "%u inputs and %u outputs: make them equal", name, src->inputs,
                       src->outputs, teacher ? "outputs" : "classes", features, outputs);
    }
    if (src->samples > DATA_SAMPLES_MAX) {
        return qt_fail(QT_ERR_INPUT, "%s: %llu samples; at most %llu are "
                       "supported (the shuffle indexes samples with 32 bits)", name,
                       (unsigned long long)src->samples, (unsigned long long)DATA_SAMPLES_MAX);
    }
    info->kind = src->kind;
    info->samples = src->samples;
    info->features = features;
    info->image_rows = 1;
    info->image_cols = features;
    info->outputs = outputs;
    info->input_type = DATA_INPUT_F32;
    info->target_type = teacher ? DATA_TARGET_VALUES : DATA_TARGET_LABEL;
    // Scratch: the teacher's weights, or the class centers (and with zipf= the labels'
    // cumulative table after them).
    uint64_t scratch = teacher ? (uint64_t)DATA_TEACHER_HIDDEN * (features + (uint64_t)outputs)
                               : (uint64_t)outputs * features;
    uint64_t scratch_bytes = scratch * sizeof(float);
    if (!teacher && src->zipf > 0.0f) {
        scratch_bytes = classes_table_offset(outputs, features) + outputs * sizeof(uint64_t);
    }
    info_layout(info, sizeof(float), scratch_bytes);
    return QT_OK;
}

// .npy roles: features (samples, features) float32 or uint8; class labels (samples) of any
// integer type NumPy commonly saves, or regression targets (samples, outputs) float32.
static const npy_expect npy_features = {
    "FEATURES", {0, 0, NPY_DTYPE_BIT(NPY_DTYPE_F32) | NPY_DTYPE_BIT(NPY_DTYPE_U8)}};
static const npy_expect npy_targets = {
    "LABELS_OR_TARGETS",
    {0, NPY_DTYPE_BIT(NPY_DTYPE_U8) | NPY_DTYPE_BIT(NPY_DTYPE_I32) | NPY_DTYPE_BIT(NPY_DTYPE_I64),
     NPY_DTYPE_BIT(NPY_DTYPE_F32)}};

static qt_status probe_npy_targets(const recipe_source *src, const npy_info *x, uint32_t outputs,
                                   data_info *info) {
    npy_info y;
    QT_TRY(npy_probe(src->labels, &npy_targets, &y));
    const char *what = y.rank == 1 ? "labels" : "target rows";
    if (y.shape[0] != x->shape[0]) {
        return qt_fail(QT_ERR_INPUT, "%s: %llu %s, but %s holds %llu samples; expected one per "
                       "sample, in the same order", src->labels, (unsigned long long)y.shape[0],
                       what, src->images, (unsigned long long)x->shape[0]);
    }
    if (y.rank == 2 && y.shape[1] != outputs) {
        return qt_fail(QT_ERR_INPUT, "%s: %llu regression targets per sample; the model's last "
                       "layer has %u outputs: make them equal", src->labels,
                       (unsigned long long)y.shape[1], outputs);
    }
    info->target_type = y.rank == 1 ? DATA_TARGET_LABEL : DATA_TARGET_VALUES;
    return QT_OK;
}

static qt_status probe_npy(const recipe_source *src, uint32_t features, uint32_t outputs,
                           data_info *info) {
    npy_info x;
    QT_TRY(npy_probe(src->images, &npy_features, &x));
    if (x.shape[1] != features) {
        return qt_fail(QT_ERR_INPUT, "%s: %llu features per sample; the model's input is %u: set "
                       "`input = %llu` in [model]", src->images, (unsigned long long)x.shape[1],
                       features, (unsigned long long)x.shape[1]);
    }
    if (x.shape[0] > DATA_SAMPLES_MAX) {
        return qt_fail(QT_ERR_INPUT, "%s: %llu samples; at most %llu are supported (the shuffle "
                       "indexes samples with 32 bits)", src->images,
                       (unsigned long long)x.shape[0], (unsigned long long)DATA_SAMPLES_MAX);
    }
    info->kind = RECIPE_SOURCE_NPY;
    info->samples = x.shape[0];
    info->features = features;
    info->image_rows = 1;
    info->image_cols = features;
    info->outputs = outputs;
    info->input_type = x.dtype == NPY_DTYPE_U8 ? DATA_INPUT_U8 : DATA_INPUT_F32;
    info->target_type = DATA_TARGET_LABEL;  // inputs only: padding labels
    if (src->labels[0] != '\0') QT_TRY(probe_npy_targets(src, &x, outputs, info));
    info_layout(info, info->input_type == DATA_INPUT_U8 ? 1 : sizeof(float), 0);
    return QT_OK;
}

qt_status data_source_inputs(const char *path, recipe_source *out) {
    memset(out, 0, sizeof *out);
    if (strlen(path) >= sizeof out->images) {
        return qt_fail(QT_ERR_INPUT, "input path '%.64s...' is longer than %zu bytes; use a "
                       "shorter path", path, sizeof out->images - 1);
    }
    snprintf(out->images, sizeof out->images, "%s", path);
    int fd = -1;
    uint64_t file_bytes = 0;
    QT_TRY(input_file_open(path, "dataset", NULL, &fd, &file_bytes));
    char magic[NPY_MAGIC_BYTES];
    ssize_t got = read(fd, magic, sizeof magic);
    close(fd);
    bool npy = got == NPY_MAGIC_BYTES && memcmp(magic, NPY_MAGIC, NPY_MAGIC_BYTES) == 0;
    out->kind = npy ? RECIPE_SOURCE_NPY : RECIPE_SOURCE_IDX;
    return QT_OK;
}

qt_status data_probe(const recipe_source *src, uint32_t features, uint32_t outputs,
                     data_info *info) {
    QT_ASSERT(features > 0 && outputs > 0);
    memset(info, 0, sizeof *info);
    switch (src->kind) {
    case RECIPE_SOURCE_IDX: return probe_idx(src, features, outputs, info);
    case RECIPE_SOURCE_TEACHER:
    case RECIPE_SOURCE_CLASSES: return probe_synthetic(src, features, outputs, info);
    case RECIPE_SOURCE_NPY: return probe_npy(src, features, outputs, info);
    case RECIPE_SOURCE_NONE: break;
    }
    QT_ASSERT(!"data_probe: a source of kind NONE");
    return QT_ERR_INPUT;
}

// ---------------------------------------------------------------------------------------------
// Loading IDX files

static qt_status idx_reopen(stream *s, const char *path, bool images, const data_info *info) {
    QT_TRY(stream_open(s, path));
    idx_header h = {0};
    qt_status status = idx_read_header(s, images, &h);
    if (status != QT_OK) status = stream_blame(s, status);
    if (status == QT_OK && (h.count != info->samples ||
                            (images && (h.rows != info->image_rows ||
                                        h.cols != info->image_cols)))) {
        status = qt_fail(QT_ERR_MISMATCH, "%s: the header changed since the file was probed "
                         "(now %llu x %u x %u, was %llu x %u x %u); do not replace data files "
                         "while qtrain starts", path, (unsigned long long)h.count, h.rows,
                         h.cols, (unsigned long long)info->samples,
                         images ? info->image_rows : 1, images ? info->image_cols : 1);
    }
    if (status != QT_OK) stream_close(s);
    return status;
}

static qt_status load_idx_images(stream *s, const recipe_source *src, const data_info *info,
                                 uint8_t *dst) {
    QT_TRY(idx_reopen(s, src->images, true, info));
    uint64_t total = IDX_IMAGES_HEADER_BYTES + info->inputs_bytes;
    qt_status status = stream_read_exact(s, dst + info->inputs_offset, info->inputs_bytes, total,
                                         "images");
    if (status == QT_OK) status = stream_expect_end(s, total);
    if (status != QT_OK) status = stream_blame(s, status);
    stream_close(s);
    return status;
}

// Labels arrive as bytes and are widened to int32 (the staging slots' type, which also has room
// for the padding label -1) and checked against the number of classes on the way.
static qt_status widen_labels(stream *s, const data_info *info, int32_t *labels) {
    uint64_t total = IDX_LABELS_HEADER_BYTES + info->samples;
    uint8_t chunk[4096];
    for (uint64_t done = 0; done < info->samples;) {
        uint64_t left = info->samples - done;
        size_t n = left < sizeof chunk ? (size_t)left : sizeof chunk;
        QT_TRY(stream_read_exact(s, chunk, n, total, "labels"));
        for (size_t i = 0; i < n; i++) {
            if (chunk[i] >= info->outputs) {
                return qt_fail(QT_ERR_INPUT, "%s: label %u of sample %llu is out of range: the "
                               "model's last layer has %u outputs, so labels must be below %u",
                               s->path, chunk[i], (unsigned long long)(done + i), info->outputs,
                               info->outputs);
            }
            labels[done + i] = chunk[i];
        }
        done += n;
    }
    return stream_expect_end(s, total);
}

// An inputs-only source (`qtrain infer`'s input) has no targets: every row is labelled as padding,
// which the infer program never reads.
static void fill_padding_labels(const data_info *info, int32_t *labels) {
    QT_ASSERT(info->target_type == DATA_TARGET_LABEL);
    for (uint64_t i = 0; i < info->samples; i++) labels[i] = DATA_LABEL_PAD;
}

static qt_status load_idx(const recipe_source *src, const data_info *info, uint8_t *dst) {
    // One stream at a time: the struct holds zlib's pool and window (about 64 KiB of stack).
    stream s;
    QT_TRY(load_idx_images(&s, src, info, dst));
    if (src->labels[0] == '\0') {
        fill_padding_labels(info, (int32_t *)(dst + info->targets_offset));
        return QT_OK;
    }
    QT_TRY(idx_reopen(&s, src->labels, false, info));
    qt_status status = widen_labels(&s, info, (int32_t *)(dst + info->targets_offset));
    if (status != QT_OK) status = stream_blame(&s, status);
    stream_close(&s);
    return status;
}

// ---------------------------------------------------------------------------------------------
// Loading .npy files

// Opens a probed file again and checks that it still is what data_probe saw.
static qt_status npy_reopen(npy_reader *r, const char *path, const npy_expect *expect,
                            const data_info *info, uint32_t rank, uint64_t cols) {
    QT_TRY(npy_open(r, path, expect));
    if (r->info.rank != rank || r->info.shape[0] != info->samples || r->info.shape[1] != cols) {
        npy_close(r);
        return qt_fail(QT_ERR_MISMATCH, "%s: the file changed since it was probed; do not "
                       "replace data files while qtrain starts", path);
    }
    return QT_OK;
}

// The model is trained on finite numbers only; a NaN or infinity in the data is a data error.
static qt_status check_finite(const char *path, const char *role, const float *v,
                              uint64_t count, uint64_t cols) {
    for (uint64_t i = 0; i < count; i++) {
        if ((qt_f32_bits(v[i]) & 0x7FFFFFFFu) >= 0x7F800000u) {
            return qt_fail(QT_ERR_INPUT, "%s: %s of sample %llu, column %llu, is %s; qtrain trains "
                           "on finite values: fix or drop that sample", path, role,
                           (unsigned long long)(i / cols), (unsigned long long)(i % cols),
                           v[i] != v[i] ? "NaN" : "infinite");
        }
    }
    return QT_OK;
}

static qt_status load_npy_features(const recipe_source *src, const data_info *info,
                                   uint8_t *dst) {
    npy_reader r;
    QT_TRY(npy_reopen(&r, src->images, &npy_features, info, 2, info->features));
    bool u8 = r.info.dtype == NPY_DTYPE_U8;
    qt_status status = QT_OK;
    if (u8 != (info->input_type == DATA_INPUT_U8)) {
        status = qt_fail(QT_ERR_MISMATCH, "%s: the file changed since it was probed; do not "
                         "replace data files while qtrain starts", src->images);
    }
    if (status == QT_OK) status = npy_read(&r, dst + info->inputs_offset, info->inputs_bytes);
    npy_close(&r);
    if (status != QT_OK || u8) return status;
    return check_finite(src->images, "the feature", (const float *)(dst + info->inputs_offset),
                        info->samples * info->features, info->features);
}

static int64_t label_at(const uint8_t *chunk, npy_dtype dtype, size_t i) {
    if (dtype == NPY_DTYPE_U8) return chunk[i];
    if (dtype == NPY_DTYPE_I32) {
        int32_t v;
        memcpy(&v, chunk + i * 4, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, chunk + i * 8, 8);
    return v;
}

// Labels of any accepted integer type become the dataset's int32, each checked against the
// number of classes.
static qt_status load_npy_labels(npy_reader *r, const data_info *info, int32_t *labels) {
    npy_dtype dtype = r->info.dtype;
    uint32_t each = npy_dtype_bytes(dtype);
    uint8_t chunk[4096];
    for (uint64_t done = 0; done < info->samples;) {
        uint64_t left = info->samples - done;
        size_t n = left < sizeof chunk / each ? (size_t)left : sizeof chunk / each;
        QT_TRY(npy_read(r, chunk, (uint64_t)n * each));
        for (size_t i = 0; i < n; i++) {
            int64_t label = label_at(chunk, dtype, i);
            if (label < 0 || label >= (int64_t)info->outputs) {
                return qt_fail(QT_ERR_INPUT, "%s: label %lld of sample %llu is out of range: the "
                               "model's last layer has %u outputs, so labels must be in 0..%u",
                               r->path, (long long)label, (unsigned long long)(done + i),
                               info->outputs, info->outputs - 1);
            }
            labels[done + i] = (int32_t)label;
        }
        done += n;
    }
    return QT_OK;
}

static qt_status load_npy(const recipe_source *src, const data_info *info, uint8_t *dst) {
    QT_TRY(load_npy_features(src, info, dst));
    int32_t *labels = (int32_t *)(dst + info->targets_offset);
    if (src->labels[0] == '\0') {
        fill_padding_labels(info, labels);
        return QT_OK;
    }
    bool values = info->target_type == DATA_TARGET_VALUES;
    npy_reader r;
    QT_TRY(npy_reopen(&r, src->labels, &npy_targets, info, values ? 2 : 1,
                      values ? info->outputs : 1));
    qt_status status;
    if (values) {
        float *targets = (float *)(dst + info->targets_offset);
        status = npy_read(&r, targets, info->targets_bytes);
        if (status == QT_OK) {
            status = check_finite(src->labels, "the target", targets,
                                  info->samples * info->outputs, info->outputs);
        }
    } else {
        status = load_npy_labels(&r, info, labels);
    }
    npy_close(&r);
    return status;
}

// ---------------------------------------------------------------------------------------------
// Synthetic sources. Every value is a pure function of (seed, tag, index) through the same
// Philox normal as the device fill kernel (ptx/core.h), so the data does not depend on the order
// of generation (or the number of threads) and a GPU could produce the same bits. Generating a
// synthetic dataset is the one long computation of start-up (about 10 s for 16384 x 4096 values
// on one core), so the work is split into contiguous index ranges, one task of the thread pool
// each (pool_run_ranges); each task writes only its range, with the arithmetic of the sequential
// loop.

static uint64_t tag_seed(uint64_t seed, uint64_t tag) { return qt_mix64(seed ^ tag); }

static float normal_at(uint64_t key, uint64_t index, float mean, float stddev) {
    return qt_fill_value(key, index, QT_FILL_NORMAL, mean, stddev);
}

// Box-Muller's logarithm and cosine are mostly qt_fmaf: the generators take the pool's CPU clones
// (pool.h), where it is one instruction on processors with FMA (the same correctly rounded
// results, a third less time).
#define DATA_GENERATOR POOL_CPU_CLONES

typedef struct classes_job {
    const data_info *info;
    float *x;             // (samples, features)
    int32_t *labels;      // (samples)
    float *centers;       // (classes, features), in the scratch part
    // zipf= only (else NULL): bound[c] = 2^32 x P(label <= c), bound[classes - 1] = 2^32
    const uint64_t *bound;
    float spread;
    uint64_t key_x, key_c, key_l;
} classes_job;

// The cumulative table of `synthetic classes ... zipf=S`: class c weighs (c + 1)^-S, computed as
// qt_expf(-S qt_logf(c + 1)) (qt_math.h: the same bits on every machine, unlike libm's pow), the
// weights are summed in double in class order, and each prefix sum becomes a bound in units of
// 2^-32 (truncated: exact IEEE operations only), so that a label is the first class whose bound
// exceeds a uniform 32-bit word: P(c) is its weight's share to within 2^-32. A class whose share
// is below that may get no sample.
static void classes_zipf_table(uint32_t classes, float zipf, uint64_t *bound) {
    double total = 0.0;
    for (uint32_t c = 0; c < classes; c++) {
        total += (double)qt_expf(-zipf * qt_logf((float)(c + 1)));
    }
    double sum = 0.0;
    for (uint32_t c = 0; c < classes; c++) {
        sum += (double)qt_expf(-zipf * qt_logf((float)(c + 1)));
        bound[c] = (uint64_t)(sum / total * 4294967296.0);
    }
    // The same additions in the same order: the last prefix is the total, exactly.
    QT_ASSERT(bound[classes - 1] == UINT64_C(1) << 32);
}

// The label of a uniform 32-bit word: the first class whose bound exceeds it (binary search; the
// last bound, 2^32, exceeds every word).
static uint32_t classes_zipf_label(const uint64_t *bound, uint32_t classes, uint32_t word) {
    uint32_t lo = 0, hi = classes - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)word < bound[mid]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

DATA_GENERATOR static void classes_centers(void *ctx, uint64_t begin, uint64_t end) {
    const classes_job *job = ctx;
    for (uint64_t i = begin; i < end; i++) {
        job->centers[i] = normal_at(job->key_c, i, 0.0f, job->spread);
    }
}

// Labels uniform over the classes (multiply-shift of a 32-bit word; the bias, below classes /
// 2^32, is immaterial) or, with zipf=, the same word looked up in the cumulative table; then
// inputs = center of the class + N(0, 1) noise.
DATA_GENERATOR static void classes_rows(void *ctx, uint64_t begin, uint64_t end) {
    const classes_job *job = ctx;
    uint64_t n = job->info->features;
    uint32_t classes = job->info->outputs;
    for (uint64_t s = begin; s < end; s++) {
        uint32_t word = qt_philox_at(job->key_l, s, 0).v[0];
        uint32_t label = job->bound ? classes_zipf_label(job->bound, classes, word)
                                    : (uint32_t)(((uint64_t)word * classes) >> 32);
        job->labels[s] = (int32_t)label;
        const float *center = job->centers + label * n;
        float *row = job->x + s * n;
        for (uint64_t f = 0; f < n; f++) row[f] = normal_at(job->key_x, s * n + f, center[f], 1.0f);
    }
}

// `synthetic classes`: the class centers first (each is read by every sample of its class), and
// with zipf= the labels' table (on this thread: a few operations per class), then the samples.
static void generate_classes(const recipe_source *src, const data_info *info, uint8_t *dst,
                             uint32_t parts) {
    uint64_t *bound = NULL;
    if (src->zipf > 0.0f) {
        uint64_t offset = info->scratch_offset +
                          classes_table_offset(info->outputs, info->features);
        QT_ASSERT(offset + info->outputs * sizeof(uint64_t) <=
                  info->scratch_offset + info->scratch_bytes);
        bound = (uint64_t *)(dst + offset);
        classes_zipf_table(info->outputs, src->zipf, bound);
    }
    classes_job job = {
        .bound = bound,
        .info = info,
        .x = (float *)(dst + info->inputs_offset),
        .labels = (int32_t *)(dst + info->targets_offset),
        .centers = (float *)(dst + info->scratch_offset),
        .spread = (src->spread > 0.0f ? src->spread : CLASSES_CENTER_SPREAD) /
                  qt_sqrtf((float)info->features),
        .key_x = tag_seed(src->seed, TAG_INPUTS),
        .key_c = tag_seed(src->task, TAG_CENTERS),
        .key_l = tag_seed(src->seed, TAG_LABELS),
    };
    pool_run_ranges((uint64_t)info->outputs * info->features, parts, classes_centers, &job);
    pool_run_ranges(info->samples, parts, classes_rows, &job);
}

#define TEACHER_SUMS 8  // hidden units summed together
QT_STATIC_ASSERT(DATA_TEACHER_HIDDEN % TEACHER_SUMS == 0, "teacher units in whole groups");

typedef struct teacher_job {
    const data_info *info;
    float *x;             // (samples, features)
    float *y;             // (samples, outputs)
    float *w1;            // (hidden, features), then w2 (outputs, hidden), in the scratch part
    uint64_t key_x, key_1, key_2;
} teacher_job;

DATA_GENERATOR static void teacher_weights(void *ctx, uint64_t begin, uint64_t end) {
    const teacher_job *job = ctx;
    uint64_t w1_count = (uint64_t)DATA_TEACHER_HIDDEN * job->info->features;
    for (uint64_t i = begin; i < end; i++) {
        job->w1[i] = i < w1_count ? normal_at(job->key_1, i, 0.0f, 1.0f)
                                  : normal_at(job->key_2, i - w1_count, 0.0f, 1.0f);
    }
}

// Computed in double in a fixed order (exact IEEE operations only, no libm) and rounded once to
// FP32, so the targets are the same bits everywhere. Each hidden unit sums over the features in
// ascending order; TEACHER_SUMS units are summed side by side, so that the loop is bound by
// throughput rather than by one chain of dependent additions.
DATA_GENERATOR static void teacher_rows(void *ctx, uint64_t begin, uint64_t end) {
    const teacher_job *job = ctx;
    uint64_t n = job->info->features, h = DATA_TEACHER_HIDDEN, m = job->info->outputs;
    const float *w1 = job->w1, *w2 = job->w1 + h * n;
    double scale1 = 1.0 / __builtin_sqrt((double)n), scale2 = __builtin_sqrt(2.0 / (double)h);
    for (uint64_t s = begin; s < end; s++) {
        float *xs = job->x + s * n;
        for (uint64_t f = 0; f < n; f++) xs[f] = normal_at(job->key_x, s * n + f, 0.0f, 1.0f);
        double hidden[DATA_TEACHER_HIDDEN];
        for (uint64_t j0 = 0; j0 < h; j0 += TEACHER_SUMS) {
            double sum[TEACHER_SUMS] = {0.0};
            const float *w = w1 + j0 * n;
            for (uint64_t f = 0; f < n; f++) {
                double xf = (double)xs[f];
                for (int u = 0; u < TEACHER_SUMS; u++) sum[u] += (double)w[u * n + f] * xf;
            }
            for (int u = 0; u < TEACHER_SUMS; u++) {
                hidden[j0 + u] = sum[u] > 0.0 ? sum[u] * scale1 : 0.0;
            }
        }
        for (uint64_t k = 0; k < m; k++) {
            double sum = 0.0;
            for (uint64_t j = 0; j < h; j++) sum += (double)w2[k * h + j] * hidden[j];
            job->y[s * m + k] = (float)(sum * scale2);
        }
    }
}

// `synthetic teacher`: inputs N(0, 1); targets y = W2 relu(W1 x) with W1, W2 entries N(0, 1)
// scaled by 1/sqrt(features) and sqrt(2/hidden), so the pre-activations and the targets have
// unit variance.
static void generate_teacher(const recipe_source *src, const data_info *info, uint8_t *dst,
                             uint32_t parts) {
    teacher_job job = {
        .info = info,
        .x = (float *)(dst + info->inputs_offset),
        .y = (float *)(dst + info->targets_offset),
        .w1 = (float *)(dst + info->scratch_offset),
        .key_x = tag_seed(src->seed, TAG_INPUTS),
        .key_1 = tag_seed(src->task, TAG_TEACHER1),
        .key_2 = tag_seed(src->task, TAG_TEACHER2),
    };
    uint64_t weights = (uint64_t)DATA_TEACHER_HIDDEN * (info->features + (uint64_t)info->outputs);
    pool_run_ranges(weights, parts, teacher_weights, &job);
    pool_run_ranges(info->samples, parts, teacher_rows, &job);
}

// A range per this many generated values at least: small datasets (the tests' thousands of
// values) stay one task, since waking the pool's threads costs about what generating 1000 values
// does.
#define DATA_VALUES_PER_PART_MIN (1u << 18)

qt_status data_load(const recipe_source *src, const data_info *info, void *dst, uint64_t bytes,
                    data_set *set) {
    uint64_t values = info->kind == RECIPE_SOURCE_IDX ? 0 : info->samples * info->features;
    uint64_t useful = values / DATA_VALUES_PER_PART_MIN;
    if (useful > 1) pool_start(0);  // at start-up; nothing when the backend has started it
    uint32_t parts = pool_threads();
    if (useful < parts) parts = useful > 1 ? (uint32_t)useful : 1;
    return data_load_parts(src, info, dst, bytes, set, parts);
}

qt_status data_load_parts(const recipe_source *src, const data_info *info, void *dst,
                          uint64_t bytes, data_set *set, uint32_t parts) {
    QT_ASSERT(src->kind == info->kind);
    QT_ASSERT(bytes >= info->bytes);
    QT_ASSERT((uintptr_t)dst % DATA_ALIGN == 0);
    QT_ASSERT(parts >= 1);
    uint8_t *base = dst;
    if (info->kind == RECIPE_SOURCE_IDX) {
        QT_TRY(load_idx(src, info, base));
    } else if (info->kind == RECIPE_SOURCE_NPY) {
        QT_TRY(load_npy(src, info, base));
    } else if (info->kind == RECIPE_SOURCE_CLASSES) {
        generate_classes(src, info, base, parts);
    } else {
        QT_ASSERT(info->kind == RECIPE_SOURCE_TEACHER);
        generate_teacher(src, info, base, parts);
    }
    memset(set, 0, sizeof *set);
    set->info = *info;
    if (info->input_type == DATA_INPUT_U8) {
        set->inputs_u8 = base + info->inputs_offset;
    } else {
        set->inputs_f32 = (const float *)(base + info->inputs_offset);
    }
    if (info->target_type == DATA_TARGET_LABEL) {
        set->labels = (const int32_t *)(base + info->targets_offset);
    } else {
        set->targets = (const float *)(base + info->targets_offset);
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Shuffle, slots and feeds

uint64_t data_order_bytes(uint64_t samples) {
    QT_ASSERT(samples <= DATA_SAMPLES_MAX);
    return align_up(samples * sizeof(uint32_t), DATA_ALIGN);
}

uint64_t data_batches_per_epoch(uint64_t samples, uint32_t batch) {
    QT_ASSERT(batch > 0);
    return (samples + batch - 1) / batch;
}

// j uniform in [0, i] from a 64-bit Philox draw by multiply-shift: the bias is below
// (i + 1) / 2^64, far below anything a training run could notice.
void data_shuffle(uint32_t *order, uint64_t samples, uint64_t seed, uint64_t epoch) {
    QT_ASSERT(samples <= DATA_SAMPLES_MAX);
    uint64_t key = tag_seed(seed, TAG_SHUFFLE);
    for (uint64_t i = 0; i < samples; i++) order[i] = (uint32_t)i;
    for (uint64_t i = samples; i-- > 1;) {
        qt_philox4 r = qt_philox_at(key, i, epoch);
        uint64_t word = (uint64_t)r.v[0] | (uint64_t)r.v[1] << 32;
        uint64_t j = (uint64_t)(((unsigned __int128)word * (i + 1)) >> 64);
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

static uint64_t input_bytes(data_input_type type) {
    return type == DATA_INPUT_U8 ? 1 : sizeof(float);
}

static data_slot_layout slot_plan(const data_info *info, uint32_t batch, uint32_t stride,
                                  data_input_type input_type, bool resident) {
    QT_ASSERT(batch > 0);
    if (stride == 0) stride = info->features;
    QT_ASSERT(stride >= info->features);
    data_slot_layout l;
    memset(&l, 0, sizeof l);
    l.batch = batch;
    l.features = info->features;
    l.stride = stride;
    l.outputs = info->outputs;
    l.target_type = info->target_type;
    l.input_type = input_type;
    l.resident = resident;
    l.inputs_offset = align_up(sizeof(data_slot_header), DATA_ALIGN);
    if (resident) {
        l.indices_offset = l.inputs_offset;
        l.inputs_offset = align_up(l.indices_offset + (uint64_t)batch * sizeof(uint32_t),
                                   DATA_ALIGN);
    }
    l.targets_offset = align_up(l.inputs_offset + (uint64_t)batch * stride *
                                input_bytes(input_type), DATA_ALIGN);
    uint64_t target_bytes = info->target_type == DATA_TARGET_LABEL
                                ? sizeof(int32_t) : (uint64_t)info->outputs * sizeof(float);
    l.bytes = align_up(l.targets_offset + batch * target_bytes, DATA_ALIGN);
    return l;
}

data_slot_layout data_slot_plan(const data_info *info, uint32_t batch, uint32_t stride,
                                bool resident) {
    return slot_plan(info, batch, stride, info->input_type, resident);
}

data_slot_layout data_batch_plan(const data_info *info, uint32_t batch, uint32_t stride,
                                 bool resident) {
    return slot_plan(info, batch, stride, DATA_INPUT_F32, resident);
}

uint64_t data_slot_copy_bytes(const data_slot_layout *layout, const void *slot) {
    const data_slot_header *h = slot;
    return h->dataset != 0 ? layout->inputs_offset : layout->bytes;
}

static uint64_t slot_input_bytes(const data_slot_layout *l) {
    return input_bytes(l->input_type);
}

void data_feed_init(data_feed *f, const data_set *set, uint32_t batch, bool shuffle,
                    uint64_t seed, uint32_t *order) {
    QT_ASSERT(batch > 0);
    QT_ASSERT(!shuffle || order != NULL);
    memset(f, 0, sizeof *f);
    f->set = set;
    f->batch = batch;
    f->shuffle = shuffle;
    f->seed = seed;
    f->order = order;
    f->order_epoch = UINT64_MAX;
    f->share_first = 0;
    f->share_rows = batch;
}

void data_feed_share(data_feed *f, uint32_t rank, uint32_t world) {
    QT_ASSERT(world >= 1 && rank < world && f->batch % world == 0);
    f->share_rows = f->batch / world;
    f->share_first = rank * f->share_rows;
}

void data_feed_resident(data_feed *f, uint32_t dataset) {
    QT_ASSERT(dataset == DATA_DATASET_TRAIN || dataset == DATA_DATASET_EVAL);
    f->dataset = dataset + 1;
}

qt_status data_feed_seek(data_feed *f, data_cursor cursor) {
    if (cursor.position >= f->set->info.samples) {
        return qt_fail(QT_ERR_MISMATCH, "data cursor at sample %llu of epoch %llu, but the "
                       "dataset has %llu samples; the checkpoint was saved with other data",
                       (unsigned long long)cursor.position, (unsigned long long)cursor.epoch,
                       (unsigned long long)f->set->info.samples);
    }
    f->cursor = cursor;
    return QT_OK;
}

// Row r of the slot from sample `sample`: the inputs as stored, zero beyond `features`; the
// target.
static void stage_row(const data_set *set, const data_slot_layout *l, uint8_t *slot, uint32_t r,
                      uint64_t sample) {
    uint64_t n = set->info.features, elem = slot_input_bytes(l);
    uint8_t *x = slot + l->inputs_offset + (uint64_t)r * l->stride * elem;
    const void *src = set->inputs_u8 != NULL ? (const void *)(set->inputs_u8 + sample * n)
                                             : (const void *)(set->inputs_f32 + sample * n);
    memcpy(x, src, n * elem);
    memset(x + n * elem, 0, (l->stride - n) * elem);
    if (set->labels != NULL) {
        ((int32_t *)(slot + l->targets_offset))[r] = set->labels[sample];
    } else {
        float *y = (float *)(slot + l->targets_offset) + (uint64_t)r * l->outputs;
        memcpy(y, set->targets + sample * l->outputs, l->outputs * sizeof(float));
    }
}

static void stage_padding(const data_slot_layout *l, uint8_t *slot, uint32_t r) {
    uint64_t row_bytes = (uint64_t)l->stride * slot_input_bytes(l);
    memset(slot + l->inputs_offset + (uint64_t)r * row_bytes, 0, row_bytes);
    if (l->target_type == DATA_TARGET_LABEL) {
        ((int32_t *)(slot + l->targets_offset))[r] = DATA_LABEL_PAD;
    } else {
        float *y = (float *)(slot + l->targets_offset) + (uint64_t)r * l->outputs;
        memset(y, 0, (uint64_t)l->outputs * sizeof(float));
    }
}

// Zeroes the bytes between the parts, so that a slot's every byte is a function of the batch
// (the device copies the slot whole).
static void stage_gaps(const data_slot_layout *l, uint8_t *slot) {
    uint64_t inputs_end = l->inputs_offset +
                          (uint64_t)l->batch * l->stride * slot_input_bytes(l);
    uint64_t target_bytes = l->target_type == DATA_TARGET_LABEL
                                ? sizeof(int32_t) : (uint64_t)l->outputs * sizeof(float);
    uint64_t targets_end = l->targets_offset + l->batch * target_bytes;
    memset(slot, 0, l->inputs_offset);  // header and indices: the caller writes them after
    memset(slot + inputs_end, 0, l->targets_offset - inputs_end);
    memset(slot + targets_end, 0, l->bytes - targets_end);
}

// The rows of one batch, a pool task per range of rows.
typedef struct stage_job {
    const data_feed *feed;
    const data_slot_layout *layout;
    uint8_t *slot;
} stage_job;

static void stage_rows(void *ctx, uint64_t begin, uint64_t end) {
    const stage_job *j = ctx;
    const data_feed *f = j->feed;
    for (uint64_t r = begin; r < end; r++) {
        uint64_t at = f->cursor.position + f->share_first + r;
        stage_row(f->set, j->layout, j->slot, (uint32_t)r, f->shuffle ? f->order[at] : at);
    }
}

// A task per this many bytes of gathered rows at least: a large batch (16384 rows of 2048 FP32
// values, 134 MB) is a copy at memory bandwidth that one thread does in about 20 ms, longer than
// the GPU step it feeds; a small one (Fashion-MNIST's 256 x 784 bytes) stays one task.
#define DATA_STAGE_BYTES_PER_TASK_MIN (1u << 20)

// The slot's first bytes: its rows and widths, and the cursor of its first row.
static void stage_header(const data_slot_layout *l, uint32_t rows, uint32_t rows_global,
                         data_cursor cursor, uint32_t dataset, uint8_t *slot) {
    data_slot_header header = {
        .dataset = dataset,
        .rows_valid = rows,
        .rows_global = rows_global,
        .batch = l->batch,
        .features = l->features,
        .stride = l->stride,
        .outputs = l->outputs,
        .target_type = (uint32_t)l->target_type,
        .epoch = cursor.epoch,
        .position = cursor.position,
    };
    memcpy(slot, &header, sizeof header);
}

void data_stage_rows(const data_slot_layout *layout, uint32_t rows, const void *inputs,
                     const int32_t *labels, const float *targets, void *slot) {
    QT_ASSERT(rows >= 1 && rows <= layout->batch);
    // The caller's arrays as a dataset of `rows` samples, staged row r from sample r; a batch
    // without targets gets the padding rows' (label -1, zero targets) in its real rows too.
    data_set set = {.info = {.samples = rows, .features = layout->features,
                             .outputs = layout->outputs, .input_type = layout->input_type,
                             .target_type = layout->target_type}};
    if (layout->input_type == DATA_INPUT_U8) {
        set.inputs_u8 = inputs;
    } else {
        set.inputs_f32 = inputs;
    }
    set.labels = layout->target_type == DATA_TARGET_LABEL ? labels : NULL;
    set.targets = layout->target_type == DATA_TARGET_VALUES ? targets : NULL;
    bool has_targets = set.labels != NULL || set.targets != NULL;
    uint8_t *bytes = slot;
    for (uint32_t r = 0; r < layout->batch; r++) {
        if (r < rows && has_targets) {
            stage_row(&set, layout, bytes, r, r);
            continue;
        }
        stage_padding(layout, bytes, r);
        if (r >= rows) continue;
        uint64_t elem = slot_input_bytes(layout);  // the row's inputs, targets left as padding
        memcpy(bytes + layout->inputs_offset + (uint64_t)r * layout->stride * elem,
               (const uint8_t *)inputs + (uint64_t)r * layout->features * elem,
               layout->features * elem);
    }
    stage_gaps(layout, bytes);
    stage_header(layout, rows, rows, (data_cursor){UINT64_MAX, 0}, 0, bytes);  // no dataset's
}

uint32_t data_feed_next(data_feed *f, const data_slot_layout *layout, void *slot) {
    const data_set *set = f->set;
    uint64_t samples = set->info.samples;
    QT_ASSERT(layout->batch == f->share_rows && layout->features == set->info.features);
    QT_ASSERT(layout->outputs == set->info.outputs &&
              layout->target_type == set->info.target_type &&
              layout->input_type == set->info.input_type);
    QT_ASSERT(f->cursor.position < samples);
    if (f->shuffle && f->order_epoch != f->cursor.epoch) {
        data_shuffle(f->order, samples, f->seed, f->cursor.epoch);
        f->order_epoch = f->cursor.epoch;
    }
    uint64_t left = samples - f->cursor.position;
    uint32_t rows_global = left < f->batch ? (uint32_t)left : f->batch;
    uint32_t rows = rows_global <= f->share_first ? 0 : rows_global - f->share_first;
    if (rows > f->share_rows) rows = f->share_rows;
    uint8_t *bytes = slot;
    if (f->dataset != 0) {
        // Indices only: the device gathers the rows (qt_sched_gather) as stage_row would.
        QT_ASSERT(layout->resident);
        memset(bytes, 0, layout->inputs_offset);
        uint32_t *index = (uint32_t *)(void *)(bytes + layout->indices_offset);
        for (uint32_t r = 0; r < f->share_rows; r++) {
            uint64_t at = f->cursor.position + f->share_first + r;
            index[r] = r < rows ? (uint32_t)(f->shuffle ? f->order[at] : at) : DATA_INDEX_PAD;
        }
    } else {
        // Each row is written by one task and its bytes depend on its sample alone, so the slot
        // is the same on any number of threads.
        uint64_t row_bytes = (uint64_t)layout->stride * slot_input_bytes(layout);
        uint64_t grain = DATA_STAGE_BYTES_PER_TASK_MIN / (row_bytes ? row_bytes : 1) + 1;
        stage_job job = {f, layout, bytes};
        pool_for(rows, grain, stage_rows, &job);
        for (uint32_t r = rows; r < f->share_rows; r++) stage_padding(layout, bytes, r);
        stage_gaps(layout, bytes);
    }
    stage_header(layout, rows, rows_global, f->cursor, f->dataset, bytes);
    f->cursor.position += rows_global;
    if (f->cursor.position == samples) {
        f->cursor.epoch++;
        f->cursor.position = 0;
    }
    return rows;
}
