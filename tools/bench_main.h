// bench_main: `qtrain bench ...`, the GPU benchmarks (tools/bench.c). They time the runtime's
// kernels one program at a time, below the C API, so bench.c builds on the internal headers;
// this header, which the CLI includes, names the entry point alone.
#ifndef QT_BENCH_MAIN_H
#define QT_BENCH_MAIN_H

// argv[1] is "bench". Exit status: 0 measured, 1 a failure, 2 a usage error.
int bench_main(int argc, char **argv);

#endif  // QT_BENCH_MAIN_H
