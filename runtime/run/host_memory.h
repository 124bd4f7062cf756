// host_memory: how much more memory this process can get, from every limit that applies.
//
// Owns nothing; reads /proc and /sys into stack buffers (no allocation). Callers: the run's
// memory check before its arenas and datasets are allocated (runtime/run/run.h). Any thread.
//
// A process is refused memory, or killed for it, by whichever limit it meets first, so each is
// read and the least one is what it can get:
//   MemAvailable   /proc/meminfo: what the system can give without swapping
//   RLIMIT_AS      `ulimit -v`: address space, less what the process maps already (VmSize)
//   RLIMIT_DATA    `ulimit -d`: data segment and private writable mappings, less VmData
//   cgroup         memory.max less memory.current, of the process's cgroup (v2) and every
//                  ancestor; or memory.limit_in_bytes less memory.usage_in_bytes (v1)
// A limit that is absent or unreadable is UINT64_MAX (no limit known).
#ifndef QT_HOST_MEMORY_H
#define QT_HOST_MEMORY_H

#include <stdint.h>

typedef enum host_memory_limit {
    HOST_MEMORY_AVAILABLE,  // MemAvailable
    HOST_MEMORY_RLIMIT_AS,
    HOST_MEMORY_RLIMIT_DATA,
    HOST_MEMORY_CGROUP,
    HOST_MEMORY_LIMIT_COUNT
} host_memory_limit;

typedef struct host_memory {
    uint64_t left[HOST_MEMORY_LIMIT_COUNT];  // bytes each limit still allows; UINT64_MAX: none
    uint64_t available;                      // the least of them
    host_memory_limit tightest;              // which one that is
} host_memory;

void host_memory_read(host_memory *m);

// "MemAvailable in /proc/meminfo", "RLIMIT_AS (ulimit -v)", ... for messages.
const char *host_memory_limit_name(host_memory_limit limit);

#endif  // QT_HOST_MEMORY_H
