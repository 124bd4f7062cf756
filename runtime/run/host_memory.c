#include "runtime/run/host_memory.h"

#include <fcntl.h>         // open
#include <inttypes.h>      // SCNu64
#include <stdbool.h>
#include <stdio.h>         // snprintf, sscanf
#include <string.h>
#include <sys/resource.h>  // getrlimit
#include <unistd.h>        // read, close, sysconf

#define HOST_MEMORY_TEXT_BYTES 4096
#define HOST_MEMORY_PATH_BYTES 1024

// The first bytes of a small file (/proc, /sys), NUL-terminated; false when it cannot be read.
static bool read_text(const char *path, char *text, size_t bytes) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    size_t used = 0;
    while (used + 1 < bytes) {
        ssize_t n = read(fd, text + used, bytes - 1 - used);
        if (n <= 0) break;
        used += (size_t)n;
    }
    close(fd);
    text[used] = '\0';
    return used > 0;
}

// The number after `key` in a "Key:   123 kB" file (/proc/meminfo, /proc/self/status), in bytes.
static uint64_t read_kib_field(const char *path, const char *key) {
    char text[HOST_MEMORY_TEXT_BYTES * 2];
    if (!read_text(path, text, sizeof text)) return UINT64_MAX;
    const char *at = strstr(text, key);
    uint64_t kib = 0;
    if (at == NULL || sscanf(at + strlen(key), " %" SCNu64, &kib) != 1) return UINT64_MAX;
    return kib * 1024;
}

static uint64_t left_of(uint64_t limit, uint64_t used) {
    if (limit == UINT64_MAX || used == UINT64_MAX) return limit;
    return limit > used ? limit - used : 0;
}

static uint64_t rlimit_left(int resource, const char *status_key) {
    struct rlimit rl;
    if (getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    return left_of((uint64_t)rl.rlim_cur, read_kib_field("/proc/self/status", status_key));
}

// A cgroup file holding one number, or "max" (v2's no limit): UINT64_MAX when absent or "max".
static uint64_t read_number(const char *folder, const char *name) {
    char path[HOST_MEMORY_PATH_BYTES], text[64];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    uint64_t value = 0;
    if (!read_text(path, text, sizeof text) || sscanf(text, "%" SCNu64, &value) != 1) {
        return UINT64_MAX;
    }
    return value;
}

// The least room under `limit_file` less `usage_file` in the cgroup folder mount/path and each
// of its ancestors up to the mount (a parent's limit binds its children too). A folder that is
// not there (another cgroup namespace) is passed over.
static uint64_t cgroup_left(const char *mount, const char *path, const char *limit_file,
                            const char *usage_file) {
    char folder[HOST_MEMORY_PATH_BYTES];
    snprintf(folder, sizeof folder, "%s%s", mount, path);
    size_t root = strlen(mount);
    uint64_t least = UINT64_MAX;
    for (;;) {
        uint64_t limit = read_number(folder, limit_file);
        // v1 writes "no limit" as the largest page-aligned int64.
        if (limit != UINT64_MAX && limit < (UINT64_C(1) << 62)) {
            uint64_t left = left_of(limit, read_number(folder, usage_file));
            if (left < least) least = left;
        }
        char *slash = strrchr(folder, '/');
        if (slash == NULL || (size_t)(slash - folder) < root) break;
        *slash = '\0';
    }
    return least;
}

// The process's memory cgroup from /proc/self/cgroup: v1 ("N:...memory...:/path") or v2
// ("0::/path").
static uint64_t cgroup_memory_left(void) {
    char text[HOST_MEMORY_TEXT_BYTES];
    if (!read_text("/proc/self/cgroup", text, sizeof text)) return UINT64_MAX;
    uint64_t least = UINT64_MAX;
    char *cursor = NULL;
    for (char *line = strtok_r(text, "\n", &cursor); line != NULL;
         line = strtok_r(NULL, "\n", &cursor)) {
        char *first = strchr(line, ':');
        char *second = first ? strchr(first + 1, ':') : NULL;
        if (second == NULL) continue;
        const char *path = second + 1;
        *second = '\0';
        const char *controllers = first + 1;
        uint64_t left = UINT64_MAX;
        if (controllers[0] == '\0') {  // v2: unified hierarchy, alone or beside v1 (hybrid)
            left = cgroup_left("/sys/fs/cgroup", path, "memory.max", "memory.current");
            uint64_t hybrid = cgroup_left("/sys/fs/cgroup/unified", path, "memory.max",
                                          "memory.current");
            if (hybrid < left) left = hybrid;
        } else {
            char list[256];
            snprintf(list, sizeof list, ",%s,", controllers);
            if (strstr(list, ",memory,") != NULL) {
                left = cgroup_left("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes",
                                   "memory.usage_in_bytes");
            }
        }
        if (left < least) least = left;
    }
    return least;
}

void host_memory_read(host_memory *m) {
    m->left[HOST_MEMORY_AVAILABLE] = read_kib_field("/proc/meminfo", "MemAvailable:");
    m->left[HOST_MEMORY_RLIMIT_AS] = rlimit_left(RLIMIT_AS, "VmSize:");
    m->left[HOST_MEMORY_RLIMIT_DATA] = rlimit_left(RLIMIT_DATA, "VmData:");
    m->left[HOST_MEMORY_CGROUP] = cgroup_memory_left();
    m->available = UINT64_MAX;
    m->tightest = HOST_MEMORY_AVAILABLE;
    for (int i = 0; i < HOST_MEMORY_LIMIT_COUNT; i++) {
        if (m->left[i] < m->available) {
            m->available = m->left[i];
            m->tightest = (host_memory_limit)i;
        }
    }
}

const char *host_memory_limit_name(host_memory_limit limit) {
    switch (limit) {
    case HOST_MEMORY_AVAILABLE: return "MemAvailable in /proc/meminfo";
    case HOST_MEMORY_RLIMIT_AS: return "RLIMIT_AS (ulimit -v) less the address space in use";
    case HOST_MEMORY_RLIMIT_DATA: return "RLIMIT_DATA (ulimit -d) less the data in use";
    case HOST_MEMORY_CGROUP: return "the cgroup's memory limit less its usage";
    case HOST_MEMORY_LIMIT_COUNT: break;
    }
    return "unknown";
}
