// runner: runs every test command given on the command line, echoes their output, counts the
// PASS/FAIL/SKIP lines, and prints one summary line `N passed, N failed, N skipped` last.
//
// A test program that exits non-zero without printing a FAIL line (a crash, an assert, a missing
// binary) counts as one failure, so nothing can pass by dying quietly.
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 1; i < argc; i++) {
        FILE *pipe = popen(argv[i], "r");
        if (!pipe) {
            printf("FAIL %s: cannot start\n", argv[i]);
            failed++;
            continue;
        }
        char line[4096];
        int failed_here = 0;
        while (fgets(line, sizeof line, pipe)) {
            fputs(line, stdout);
            if (strncmp(line, "PASS ", 5) == 0) passed++;
            if (strncmp(line, "SKIP ", 5) == 0) skipped++;
            if (strncmp(line, "FAIL ", 5) == 0) failed_here++;
        }
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
