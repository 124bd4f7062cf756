#include "runtime/base/status.h"

#include <inttypes.h>  // PRIX32
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>  // abort, getenv, strtoul
#include <string.h>

static _Thread_local char status_message[QT_ERROR_MESSAGE_MAX];

static const char *const status_names[] = {
    [QT_OK] = "QT_OK",
    [QT_ERR_INPUT] = "QT_ERR_INPUT",
    [QT_ERR_IO] = "QT_ERR_IO",
    [QT_ERR_NO_DRIVER] = "QT_ERR_NO_DRIVER",
    [QT_ERR_NO_DEVICE] = "QT_ERR_NO_DEVICE",
    [QT_ERR_DRIVER] = "QT_ERR_DRIVER",
    [QT_ERR_CAPACITY] = "QT_ERR_CAPACITY",
    [QT_ERR_MEMORY] = "QT_ERR_MEMORY",
    [QT_ERR_MISMATCH] = "QT_ERR_MISMATCH",
    [QT_ERR_STATE] = "QT_ERR_STATE",
};
_Static_assert(sizeof status_names / sizeof status_names[0] == QT_STATUS_COUNT,
               "a name per qt_status");

const char *qt_status_name(qt_status status) {
    if ((unsigned)status >= QT_STATUS_COUNT) return "QT_ERR_UNKNOWN";
    return status_names[status];
}

const char *qt_error_message(void) { return status_message; }

void qt_error_clear(void) { status_message[0] = '\0'; }

// Characters that print as nothing or as a blank, and would make a quoted word look like
// another one: C1 controls, no-break and other spaces, soft hyphen, zero-width and joiner
// characters, bidirectional marks and overrides, word joiners, variation selectors, the
// byte-order mark (zero-width no-break space), Hangul fillers, interlinear annotations, tags.
static bool is_invisible(uint32_t c) {
    static const uint32_t ranges[][2] = {
        {0x0080, 0x00A0}, {0x00AD, 0x00AD}, {0x034F, 0x034F}, {0x061C, 0x061C},
        {0x115F, 0x1160}, {0x17B4, 0x17B5}, {0x180B, 0x180F}, {0x2000, 0x200F},
        {0x2028, 0x202F}, {0x205F, 0x206F}, {0x3000, 0x3000}, {0x3164, 0x3164},
        {0xFE00, 0xFE0F}, {0xFEFF, 0xFEFF}, {0xFFA0, 0xFFA0}, {0xFFF0, 0xFFFB},
        {0x1D173, 0x1D17A}, {0xE0000, 0xE0FFF},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        if (c >= ranges[i][0] && c <= ranges[i][1]) return true;
    }
    return false;
}

// The UTF-8 sequence at p (n bytes available): its length and code point, or 0 when it is not
// well-formed (overlong forms, surrogates and values past U+10FFFF are not).
static size_t utf8_decode(const uint8_t *p, size_t n, uint32_t *c) {
    size_t length = p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : 2;
    if (p[0] < 0xC2 || p[0] > 0xF4 || n < length) return 0;
    uint32_t value = p[0] & (0x7F >> length);
    for (size_t i = 1; i < length; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        value = value << 6 | (p[i] & 0x3F);
    }
    static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (value < smallest[length] || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
        return 0;
    }
    *c = value;
    return length;
}

size_t qt_escape(const char *text, size_t bytes, char *out, size_t out_bytes, bool keep_newlines) {
    QT_ASSERT(out_bytes > 0);
    const uint8_t *p = (const uint8_t *)text;
    size_t used = 0;
    for (size_t i = 0; i < bytes;) {
        char piece[16];
        size_t take = 1;
        uint32_t c = 0;
        if (p[i] == '\t') {
            snprintf(piece, sizeof piece, "\\t");
        } else if (p[i] == '\r') {
            snprintf(piece, sizeof piece, "\\r");
        } else if (p[i] == '\n') {
            snprintf(piece, sizeof piece, "%s", keep_newlines ? "\n" : "\\n");
        } else if (p[i] < 0x20 || p[i] == 0x7F) {
            snprintf(piece, sizeof piece, "\\x%02X", p[i]);
        } else if (p[i] < 0x80) {
            piece[0] = (char)p[i];
            piece[1] = '\0';
        } else if ((take = utf8_decode(p + i, bytes - i, &c)) == 0) {
            take = 1;
            snprintf(piece, sizeof piece, "\\x%02X", p[i]);
        } else if (is_invisible(c)) {
            snprintf(piece, sizeof piece, "<U+%04" PRIX32 ">", c);
        } else {
            memcpy(piece, p + i, take);
            piece[take] = '\0';
        }
        size_t length = strlen(piece);
        if (used + length >= out_bytes) break;
        memcpy(out + used, piece, length);
        used += length;
        i += take;
    }
    out[used] = '\0';
    return used;
}

const char *qt_shown(const char *text) {
    static _Thread_local char buffers[QT_SHOWN_BUFFERS][512];
    static _Thread_local unsigned next;
    char *out = buffers[next++ % QT_SHOWN_BUFFERS];
    qt_escape(text, strlen(text), out, sizeof buffers[0], false);
    return out;
}

qt_status qt_fail(qt_status status, const char *fmt, ...) {
    QT_ASSERT(status != QT_OK);
    char raw[QT_ERROR_MESSAGE_MAX];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(raw, sizeof raw, fmt, args);
    va_end(args);
    size_t length = n < 0 ? 0 : (size_t)n < sizeof raw ? (size_t)n : sizeof raw - 1;
    qt_escape(raw, length, status_message, sizeof status_message, true);
    return status;
}

void qt_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

qt_status qt_env_u32(const char *variable, const char *meaning, uint32_t fallback, uint32_t max,
                     uint32_t *value) {
    *value = fallback;
    const char *text = getenv(variable);
    if (!text || !*text) return QT_OK;
    char *end = NULL;
    unsigned long number = strtoul(text, &end, 10);
    if (*end != '\0' || text[0] < '0' || text[0] > '9' || number > max) {
        return qt_fail(QT_ERR_INPUT, "%s is '%s': give %s, a whole number from 0 to %u "
                       "(unset: %u)", variable, text, meaning, max, fallback);
    }
    *value = (uint32_t)number;
    return QT_OK;
}

qt_status qt_env_switch(const char *variable, const char *meaning, bool fallback, bool *on) {
    uint32_t value = fallback;
    QT_TRY(qt_env_u32(variable, meaning, fallback, 1, &value));
    *on = value == 1;
    return QT_OK;
}
