// test_memory: what the process can get (runtime/run/host_memory.c), which the run's memory check
// compares its needs with.
//
// MemAvailable is read; an address-space limit (ulimit -v) and a data limit (ulimit -d) set in a
// child each become the tightest limit, less what the child uses already, to within a few MiB;
// every limit has a name for messages.
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>  // setrlimit
#include <sys/wait.h>      // waitpid
#include <unistd.h>        // fork

#include "runtime/run/host_memory.h"
#include "tests/test.h"

#define MIB (UINT64_C(1) << 20)

static void test_available(void) {
    test_begin("host_memory_reads_meminfo");
    host_memory m;
    host_memory_read(&m);
    uint64_t available = m.left[HOST_MEMORY_AVAILABLE];
    CHECK(available != UINT64_MAX && available > 16 * MIB, "MemAvailable %llu",
          (unsigned long long)available);
    CHECK(m.available <= available && m.left[m.tightest] == m.available, "least %llu of %d",
          (unsigned long long)m.available, (int)m.tightest);
    for (int i = 0; i < HOST_MEMORY_LIMIT_COUNT; i++) {
        const char *name = host_memory_limit_name((host_memory_limit)i);
        CHECK(name != NULL && strcmp(name, "unknown") != 0, "limit %d has no name", i);
    }
    test_end();
}

// In a child: the limit `resource` set to what is in use now plus 64 MiB must read back as the
// tightest limit, with 64 MiB left (less what the read itself maps, a few MiB at most).
static void test_rlimit(const char *name, int resource, host_memory_limit which) {
    test_begin(name);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl;
        getrlimit(resource, &rl);
        // What is in use: what a known limit leaves unused (a huge one, when there is none).
        if (rl.rlim_cur == RLIM_INFINITY) {
            rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 62 : rl.rlim_max;
            if (setrlimit(resource, &rl) != 0) _exit(3);
        }
        host_memory probe;
        host_memory_read(&probe);
        uint64_t used = (uint64_t)rl.rlim_cur - probe.left[which];
        rl.rlim_cur = (rlim_t)(used + 64 * MIB);
        if (setrlimit(resource, &rl) != 0) _exit(3);
        host_memory m;
        host_memory_read(&m);
        bool near = m.left[which] <= 64 * MIB && m.left[which] >= 56 * MIB;
        bool tightest = m.tightest == which && m.available == m.left[which];
        _exit(!near ? 1 : !tightest ? 2 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 99;
    static const char *const why[] = {"", "the bytes left are not 64 MiB less the use",
                                      "it is not the tightest limit", "setrlimit failed"};
    CHECK(code == 0, "%s", code < 4 ? why[code] : "the child died");
    test_end();
}

int main(void) {
    test_available();
    test_rlimit("host_memory_reads_rlimit_as", RLIMIT_AS, HOST_MEMORY_RLIMIT_AS);
    test_rlimit("host_memory_reads_rlimit_data", RLIMIT_DATA, HOST_MEMORY_RLIMIT_DATA);
    return test_exit_code();
}
