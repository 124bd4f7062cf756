// Status and driver-loading tests that need no GPU: messages, names, and the no-driver path.
#include <stdio.h>
#include <string.h>

#include "runtime/driver/driver.h"
#include "tests/test.h"

static void test_status_names_and_messages(void) {
    test_begin("status_names_and_messages");
    for (int s = 0; s < QT_STATUS_COUNT; s++) {
        const char *name = qt_status_name((qt_status)s);
        CHECK(name && strncmp(name, "QT_", 3) == 0, "status %d has name %s", s, name);
    }
    CHECK(strcmp(qt_status_name((qt_status)999), "QT_ERR_UNKNOWN") == 0, "out-of-range name");
    qt_status s = qt_fail(QT_ERR_INPUT, "%s:%d:%d: unknown format '%s'", "r.recipe", 12, 9, "fp9");
    CHECK(s == QT_ERR_INPUT, "qt_fail returns its status");
    CHECK(strcmp(qt_error_message(), "r.recipe:12:9: unknown format 'fp9'") == 0, "message %s",
          qt_error_message());
    qt_error_clear();
    CHECK(qt_error_message()[0] == '\0', "clear");
    test_end();
}

// User text quoted in a message shows what it holds: bytes and characters that would not show,
// or would look like others, are escaped; visible UTF-8 stays.
static void test_messages_escape_invisible_text(void) {
    test_begin("messages_escape_invisible_text");
    static const struct {
        const char *text, *shown;
    } cases[] = {
        {"\xEF\xBB\xBF[model]", "<U+FEFF>[model]"},           // a byte-order mark
        {"relu\xC2\xA0gelu", "relu<U+00A0>gelu"},               // a no-break space
        {"[model]\rinput = 4\r", "[model]\\rinput = 4\\r"},  // CR-only line ends
        {"a\tb\x01\x7F", "a\\tb\\x01\\x7F"},                  // control bytes
        {"x\xFFy\xC3", "x\\xFFy\\xC3"},                         // not UTF-8, a cut sequence
        {"\xC0\xAF", "\\xC0\\xAF"},                               // an overlong '/'
        {"\xE2\x80\x8B\xE2\x80\xAE\xE2\x81\xA0", "<U+200B><U+202E><U+2060>"},
        {"\xC2\x85", "<U+0085>"},                                // a C1 control
        {"caf\xC3\xA9 \xE6\x97\xA5\xF0\x9F\x98\x80",                    // visible: kept
         "caf\xC3\xA9 \xE6\x97\xA5\xF0\x9F\x98\x80"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qt_fail(QT_ERR_INPUT, "r.recipe:1:1: found '%s'", cases[i].text);
        char expected[256];
        snprintf(expected, sizeof expected, "r.recipe:1:1: found '%s'", cases[i].shown);
        CHECK(strcmp(qt_error_message(), expected) == 0, "case %zu: %s", i, qt_error_message());
        CHECK(strcmp(qt_shown(cases[i].text), cases[i].shown) == 0, "case %zu: qt_shown %s", i,
              qt_shown(cases[i].text));
    }
    // Line breaks stay in messages (a report may span lines), not in quoted text.
    qt_fail(QT_ERR_MISMATCH, "two\nlines");
    CHECK(strcmp(qt_error_message(), "two\nlines") == 0, "%s", qt_error_message());
    CHECK(strcmp(qt_shown("a\nb"), "a\\nb") == 0, "%s", qt_shown("a\nb"));
    // A full buffer cuts at an escape's boundary.
    char out[8];
    size_t n = qt_escape("ab\x01\x02", 4, out, sizeof out, false);
    CHECK(n == 6 && strcmp(out, "ab\\x01") == 0, "%zu: %s", n, out);
    test_end();
}

static void test_driver_fail_message(void) {
    test_begin("driver_fail_names_the_call");
    qt_status s = driver_fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(&ptr, bytes)", "x.c", 7);
    CHECK(s == QT_ERR_DRIVER, "status");
    CHECK(strstr(qt_error_message(), "x.c:7: cuMemAlloc(&ptr, bytes) failed") != NULL,
          "message %s", qt_error_message());
    CHECK(strstr(qt_error_message(), "(2)") != NULL, "error number in %s", qt_error_message());
    test_end();
}

// On a machine without libcuda.so.1 the load fails cleanly and says so; with a GPU it succeeds.
static void test_driver_load(void) {
    test_begin("driver_load_reports_cleanly");
    qt_status s = driver_load();
    if (s == QT_OK) {
        CHECK(driver_loaded(), "loaded flag");
        CHECK(drv.cuLaunchKernel != NULL && drv.cuGraphLaunch != NULL, "entry points resolved");
        CHECK(driver_load() == QT_OK, "idempotent");
    } else {
        CHECK(s == QT_ERR_NO_DRIVER || s == QT_ERR_NO_DEVICE, "status %s", qt_status_name(s));
        CHECK(strstr(qt_error_message(), "CUDA") != NULL || strstr(qt_error_message(), "GPU"),
              "message %s", qt_error_message());
        CHECK(!driver_loaded(), "not loaded");
    }
    test_end();
}

int main(void) {
    test_status_names_and_messages();
    test_messages_escape_invisible_text();
    test_driver_fail_message();
    test_driver_load();
    return test_exit_code();
}
