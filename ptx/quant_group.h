// quant_group: grouped-tensor row bookkeeping shared by every quantization family: the offsets
// kernel (ptx/quant_group.cu) that turns device-written member sizes into row offsets, and the
// member lookups every grouped kernel and its C twin use. Layout rules: ptx/quant.h.
//
// Owns nothing. A grouped tensor of n members (qt_group_desc, count = n > 0) over a buffer of
// rows_capacity rows:
//
//   row_offsets  u32 [n + 1]   0 = off[0] <= off[1] <= ... <= off[n] (the active end)
//   first_dims   u32 [n]       valid rows of member i
//
//   rows  off[i]        off[i] + min(first_dims[i], off[i+1] - off[i])         off[i+1]
//         |---- valid data of member i ----|------ padding (zero codes) -------|
//
//   Rows at or beyond min(off[n], rows_capacity) belong to no member: kernels neither read them
//   for amaxes nor write them. An empty member (off[i] == off[i+1]) owns no row.
//
// qt_group_offsets writes off[i+1] = sum over j <= i of roundup(first_dims[j], row_align). The
// sum is integer arithmetic, exact in any order, so the block scan gives the C twin's bits. The
// producer (a router) must keep the padded total within u32 and within rows_capacity; rows past
// rows_capacity are never touched by any kernel anyway.
//
// A dense tensor (count = 0) is one implicit member owning every row; the helpers below take the
// count and handle both.
#ifndef QT_QUANT_GROUP_H
#define QT_QUANT_GROUP_H

#include "ptx/quant.h"  // qt_group_desc

typedef struct group_offsets_args {
    uint64_t first_dims;   // u32 [count] device, read
    uint64_t row_offsets;  // u32 [count + 1] device, written
    uint32_t count;        // members; 0 writes row_offsets[0] = 0 only
    uint32_t row_align;    // >= 1
} group_offsets_args;
QT_STATIC_ASSERT(sizeof(group_offsets_args) == 24, "group_offsets_args layout");

// One block scans the whole array in chunks; the launch shape is fixed.
#define QT_GROUP_OFFSETS_THREADS 1024

#define QT_KERNELS_QUANT_GROUP(X) \
    X(KERNEL_GROUP_OFFSETS, quant_group, qt_group_offsets, group_offsets_args)

QT_HD uint32_t qt_group_roundup(uint32_t rows, uint32_t row_align) {
    return (rows + row_align - 1u) / row_align * row_align;
}

// Rows of one member (for a dense tensor, member 0 owns [0, rows)).
typedef struct qt_group_rows {
    uint32_t begin;      // first row
    uint32_t valid_end;  // end of the valid rows; [valid_end, end) is padding
    uint32_t end;        // one past the last row (the next member's begin)
} qt_group_rows;

QT_HD qt_group_rows qt_group_member_rows(qt_group_desc g, uint32_t rows, uint32_t member) {
    qt_group_rows r;
    if (g.count == 0) {
        r.begin = 0;
        r.valid_end = rows;
        r.end = rows;
        return r;
    }
    const uint32_t *off = (const uint32_t *)(uintptr_t)g.row_offsets;
    const uint32_t *dims = (const uint32_t *)(uintptr_t)g.first_dims;
    r.begin = off[member];
    r.end = off[member + 1];
    uint32_t span = r.end - r.begin;
    r.valid_end = r.begin + (dims[member] < span ? dims[member] : span);
    return r;
}

// Rows [0, active end) are owned by members; the rest of the buffer is untouched.
QT_HD uint32_t qt_group_active_rows(qt_group_desc g, uint32_t rows) {
    if (g.count == 0) return rows;
    uint32_t end = ((const uint32_t *)(uintptr_t)g.row_offsets)[g.count];
    return end < rows ? end : rows;
}

// The member owning `row`: the largest i in [lo, hi) with off[i] <= row (empty members share
// their offset with the next one, so "largest" skips them). Requires off[lo] <= row < off[hi]
// (hi <= count). Plain binary search, used by the C twins and by kernels for the rare rows whose
// tile spans several members.
QT_HD uint32_t qt_group_find(qt_group_desc g, uint32_t lo, uint32_t hi, uint32_t row) {
    if (g.count == 0) return 0;
    const uint32_t *off = (const uint32_t *)(uintptr_t)g.row_offsets;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (off[mid] <= row) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

#if defined(__CUDACC__)
// The same answer as qt_group_find(g, 0, count, row), found by one warp: each step samples 32
// evenly spaced offsets with one load per lane and keeps the interval between the last sample
// <= row and the first sample > row, so n members take ceil(log32(n)) dependent loads instead of
// log2(n). Every lane of the warp must call it with the same row; all get the answer.
__device__ __forceinline__ uint32_t qt_group_find_warp(qt_group_desc g, uint32_t row) {
    if (g.count == 0) return 0;
    const uint32_t *off = (const uint32_t *)(uintptr_t)g.row_offsets;
    uint32_t lane = threadIdx.x & 31u;
    uint32_t lo = 0, hi = g.count;
    while (hi - lo > 1) {
        uint32_t step = (hi - lo + 31u) / 32u;
        uint32_t probe = lo + lane * step;
        bool below = probe < hi && off[probe] <= row;
        // Offsets never decrease, so the lanes that see off[probe] <= row form a prefix; lane 0
        // (probe = lo) is always in it.
        uint32_t taken = (uint32_t)__popc(__ballot_sync(0xFFFFFFFFu, below));
        uint32_t new_lo = lo + (taken - 1u) * step;
        uint32_t new_hi = lo + taken * step;
        lo = new_lo;
        hi = new_hi < hi ? new_hi : hi;
    }
    return lo;
}
#endif

#endif  // QT_QUANT_GROUP_H
