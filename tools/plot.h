// plot: `qtrain plot A.trace [B.trace ...] -o curves.svg [--force]`, the curves of one or more
// runs as one self-contained SVG file (no scripts, no fonts, no external references).
//
// Owns the curves it reads (heap memory of the command, freed before it returns). One thread.
//
// Four panels, each with one polyline per trace (in the order given; the legend names each by
// its file name), against the step of the trace (its `step` field, which train, eval and infer
// steps share):
//
//   +-------------------------+-------------------------+
//   | training loss           | eval accuracy (%)       |   eval: one point per eval pass
//   | (log scale if it spans  | (eval loss when no eval |   (consecutive eval records), at its
//   |  a decade or more)      |  record has an accuracy)|   first step: the mean of its records
//   +-------------------------+-------------------------+
//   | gradient norm           | learning rate           |
//   | (log scale likewise)    |                         |
//   +-------------------------+-------------------------+
//
// Each polyline carries its values as attributes, so that tools and tests can read them without
// inverting the axes: data-points (points drawn), data-first and data-last ("STEP VALUE" of the
// first and last point, %.9g). Non-finite values are not drawn. A curve of more than
// PLOT_POINTS_MAX points is thinned to the minimum and maximum of each of PLOT_POINTS_MAX / 2
// buckets of consecutive steps (spikes stay visible), its first and last point always kept.
#ifndef QT_PLOT_H
#define QT_PLOT_H

#define PLOT_POINTS_MAX 4000

// argv[1] is "plot". Exit status: 0 written, 1 an error (a trace that cannot be read, an output
// that exists without --force), 2 a usage error.
int plot_main(int argc, char **argv);

#endif  // QT_PLOT_H
