// runner: runs every test command given on the command line, echoes their output, counts the
// PASS/FAIL/SKIP lines, and prints one summary line `N passed, N failed, N skipped` last.
//
// A test program that exits non-zero without printing a FAIL line (a crash, an assert, a missing
// binary) counts as one failure, so nothing can pass by dying quietly.
//
// Skipped cases are counted one by one but shown by group: a program's SKIP lines (`SKIP name:
// why`, tests/test.h) that give the same reason become one line after its output,
// `SKIP N cases of PROGRAM (NAME, ...): why`, naming the first case (a reason given once keeps its
// own line as it was). Without a GPU most cases of the kernel programs skip for the one reason
// that there is no driver, and a line each would bury the rest of the log.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#define RUNNER_LINE_BYTES 4096
#define RUNNER_REASONS_MAX 32  // distinct skip reasons grouped per program; more are echoed

typedef struct skip_group {
    char first[RUNNER_LINE_BYTES];   // the first case's line, as printed
    size_t name_bytes;               // its name: the bytes between "SKIP " and ": "
    const char *reason;              // inside first: the text after the name's ": "
    int count;
} skip_group;

static skip_group groups[RUNNER_REASONS_MAX];

// Adds a SKIP line to the group of its reason; false when it has no reason or there is no room.
static bool group_skip(const char *line, int *group_count) {
    const char *colon = strstr(line + 5, ": ");
    if (!colon) return false;
    const char *reason = colon + 2;
    for (int g = 0; g < *group_count; g++) {
        if (strcmp(groups[g].reason, reason) == 0) {
            groups[g].count++;
            return true;
        }
    }
    if (*group_count == RUNNER_REASONS_MAX) return false;
    skip_group *g = &groups[(*group_count)++];
    snprintf(g->first, sizeof g->first, "%s", line);
    g->name_bytes = (size_t)(colon - line) - 5;
    g->reason = g->first + (reason - line);
    g->count = 1;
    return true;
}

static void print_groups(const char *program, int group_count) {
    for (int i = 0; i < group_count; i++) {
        const skip_group *g = &groups[i];
        if (g->count == 1) {
            size_t n = strlen(g->first);
            printf("%s%s", g->first, g->first[n - 1] == '\n' ? "" : "\n");
        } else {
            size_t n = strlen(g->reason);
            printf("SKIP %d cases of %s (%.*s, ...): %s%s", g->count, program,
                   (int)g->name_bytes, g->first + 5, g->reason,
                   n && g->reason[n - 1] == '\n' ? "" : "\n");
        }
    }
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 1; i < argc; i++) {
        FILE *pipe = popen(argv[i], "r");
        if (!pipe) {
            printf("FAIL %s: cannot start\n", argv[i]);
            failed++;
            continue;
        }
        char line[RUNNER_LINE_BYTES];
        int failed_here = 0, group_count = 0;
        while (fgets(line, sizeof line, pipe)) {
            if (strncmp(line, "PASS ", 5) == 0) passed++;
            if (strncmp(line, "FAIL ", 5) == 0) failed_here++;
            if (strncmp(line, "SKIP ", 5) == 0) {
                skipped++;
                if (group_skip(line, &group_count)) continue;
            }
            fputs(line, stdout);
        }
        print_groups(argv[i], group_count);
        fflush(stdout);
        int status = pclose(pipe);
        int exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!exited_ok && failed_here == 0) {
            printf("FAIL %s: exited with status %d (signal %d) without a FAIL line\n", argv[i],
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                   WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            failed_here = 1;
        }
        failed += failed_here;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
