// Status and driver-loading tests that need no GPU: messages, names, and the no-driver path.
#include <string.h>

#include "driver.h"
#include "test.h"

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
    test_driver_fail_message();
    test_driver_load();
    return test_exit_code();
}
