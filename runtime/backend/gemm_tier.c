#include "runtime/backend/gemm_tier.h"

#include <stdio.h>   // snprintf
#include <string.h>  // memcpy, memset

// Each format's portable GEMM kernel (the one programs hold), the sm90a kernel that takes its
// ops, and its small-tile entry point (ptx/gemm_portable.cu).
static const struct {
    kernel_id portable, sm90a, small;
} gemm_tier_kernels[] = {
    {KERNEL_GEMM_BF16_PORTABLE, KERNEL_GEMM_BF16_SM90A, KERNEL_GEMM_BF16_PORTABLE_SMALL},
    {KERNEL_GEMM_FP8_PORTABLE, KERNEL_GEMM_FP8_SM90A, KERNEL_GEMM_FP8_PORTABLE_SMALL},
    {KERNEL_GEMM_FP8_BLOCK_PORTABLE, KERNEL_GEMM_FP8_BLOCK_SM90A,
     KERNEL_GEMM_FP8_BLOCK_PORTABLE_SMALL},
    {KERNEL_GEMM_MXFP8_PORTABLE, KERNEL_GEMM_MXFP8_SM90A, KERNEL_GEMM_MXFP8_PORTABLE_SMALL},
    {KERNEL_GEMM_NVFP4_PORTABLE, KERNEL_GEMM_NVFP4_SM90A, KERNEL_GEMM_NVFP4_PORTABLE_SMALL},
};
#define GEMM_TIER_KERNELS (sizeof gemm_tier_kernels / sizeof gemm_tier_kernels[0])

// The row of a portable GEMM kernel, or GEMM_TIER_KERNELS for a kernel that is none.
static size_t gemm_tier_kernel_row(kernel_id portable) {
    size_t row = 0;
    while (row < GEMM_TIER_KERNELS && gemm_tier_kernels[row].portable != portable) row++;
    return row;
}

// The sm90a kernel that takes a portable GEMM kernel's ops, or KERNEL_COUNT for none.
kernel_id gemm_tier_sm90a_kernel(kernel_id portable) {
    size_t row = gemm_tier_kernel_row(portable);
    return row < GEMM_TIER_KERNELS ? gemm_tier_kernels[row].sm90a : KERNEL_COUNT;
}

// The small-tile entry point of a portable GEMM kernel, or KERNEL_COUNT for none.
static kernel_id gemm_tier_small_kernel(kernel_id portable) {
    size_t row = gemm_tier_kernel_row(portable);
    return row < GEMM_TIER_KERNELS ? gemm_tier_kernels[row].small : KERNEL_COUNT;
}

static bool gemm_tier_aligned16(uint64_t value) { return (value & 15u) == 0; }

static uint32_t gemm_tier_elem_bytes(const gemm_args *g) {
    return g->format == GEMM_FORMAT_BF16 ? 2u : 1u;
}

// Bytes of `elems` stored elements (NVFP4: two per byte; its lengths here are even).
static uint64_t gemm_tier_bytes(const gemm_args *g, uint64_t elems) {
    return g->format == GEMM_FORMAT_NVFP4 ? elems / 2 : elems * gemm_tier_elem_bytes(g);
}

// k values per stage: one 128-byte row of the swizzle span, or for the emulated formats the 64
// that decode into one.
static uint32_t gemm_tier_stage_k(const gemm_args *g) {
    if (qt_gemm_sm90a_emulated(g->format)) return GEMM_SM90A_EMU_K;
    return GEMM_SM90A_K_BYTES / gemm_tier_elem_bytes(g);
}

static bool gemm_tier_outer(const gemm_operand *op) {
    return (op->flags & GEMM_OPERAND_OUTER_MAJOR) != 0;
}

// TMA reads 16-byte aligned tensors whose stored rows (K-major: one per r; outer-major: one per
// k) are whole 16-byte pieces apart. Outer-major operands are BF16 only: wgmma transposes 16-bit
// operands as it reads them, not 8-bit ones (MXFP8's columnwise copy stays portable).
static bool gemm_tier_operand_ok(const gemm_args *g, const gemm_operand *op) {
    uint64_t row_bytes = gemm_tier_bytes(g, op->ld);
    return (!gemm_tier_outer(op) || g->format == GEMM_FORMAT_BF16) &&
           gemm_tier_aligned16(op->data) && gemm_tier_aligned16(row_bytes);
}

// Stacked B members (GEMM_GROUP_M) one after another: member i's rows start
// data_member_bytes after member i - 1's, past all of them, so the map {k, n, members} has
// strides {row bytes, member bytes} that grow as cuTensorMapEncodeTiled requires (each stride
// at least the one before it times its dimension).
static bool gemm_tier_b_members_apart(const gemm_args *g) {
    uint64_t rows = gemm_tier_outer(&g->b) ? g->k : g->n;
    return g->b.data_member_bytes >= gemm_tier_bytes(g, g->b.ld) * rows;
}

// Stacked K-major B members side by side inside each stored row (the transposed columnwise copy
// of stacked weights, [n][members x k]): member i's k values start data_member_bytes after
// member i - 1's in every row. The map {k, members, n}, strides {member bytes, row bytes}, keeps
// the strides growing where {k, n, members} could not: a member's k fit before the next member
// and all members fit in a row.
static bool gemm_tier_b_members_inner(const gemm_args *g) {
    if (g->grouping != GEMM_GROUP_M || g->group.count <= 1 || gemm_tier_outer(&g->b)) {
        return false;
    }
    uint64_t member_bytes = g->b.data_member_bytes;
    return member_bytes >= gemm_tier_bytes(g, g->k) &&
           gemm_tier_bytes(g, g->b.ld) >= member_bytes * g->group.count;
}

// Bytes of one member's D (and C): m rows of ldd elements.
static uint64_t gemm_tier_d_bytes(const gemm_args *g) {
    return (uint64_t)g->m * g->ldd * (g->d_dtype == QT_DTYPE_BF16 ? 2u : 4u);
}

// GEMM_GROUP_K: BF16, per-tensor FP8 and FP8 block (the emulated formats' scale loaders index k
// from the tensor's start, not from a member's); each operand one grouped tensor (no member
// strides: the members are its row ranges), members' D apart so that no two tiles write one
// element, and a tile count (members x row tiles x column tiles) the kernel's 32-bit tile
// index holds.
static bool gemm_tier_k_grouped_ok(const gemm_args *g) {
    uint64_t row_tiles = (g->m + GEMM_SM90A_TILE_M - 1) / GEMM_SM90A_TILE_M;
    uint64_t col_tiles = (g->n + GEMM_SM90A_TILE_N_SPLIT - 1) / GEMM_SM90A_TILE_N_SPLIT;
    uint64_t tiles = g->group.count * row_tiles * col_tiles;  // the narrower tile: a bound
    return !qt_gemm_sm90a_emulated(g->format) && g->a.data_member_bytes == 0 &&
           g->b.data_member_bytes == 0 && g->a.scale_member_bytes == 0 &&
           g->b.scale_member_bytes == 0 &&
           (g->group.count == 1 || g->d_member_bytes >= gemm_tier_d_bytes(g)) &&
           tiles <= INT32_MAX;
}

bool gemm_tier_sm90a_supports(const gemm_args *g) {
    bool format_ok = g->format == GEMM_FORMAT_BF16 || g->format == GEMM_FORMAT_FP8 ||
                     g->format == GEMM_FORMAT_FP8_BLOCK || g->format == GEMM_FORMAT_MXFP8 ||
                     // TMA loads whole bytes: an odd contraction would read a stray nibble.
                     (g->format == GEMM_FORMAT_NVFP4 && g->k % 2 == 0);
    bool grouping_ok = g->grouping == GEMM_DENSE ||
                       ((g->grouping == GEMM_GROUP_M || g->grouping == GEMM_GROUP_K) &&
                        g->group.count >= 1);
    // TMA coordinates are signed 32-bit (k's reach a stage past k); a contraction of length 0 has
    // no stage to load. A split-K GEMM (gemm.h) writes FP32 parts for its reduction op, which
    // only the portable kernels do; op_gemm_split_parts splits only GEMMs of too few tiles for
    // this tier anyway.
    if (!format_ok || !grouping_ok || g->k == 0 || g->m > INT32_MAX || g->n > INT32_MAX ||
        g->k > INT32_MAX - GEMM_SM90A_K_BYTES || qt_gemm_is_split(g)) {
        return false;
    }
    if (!gemm_tier_operand_ok(g, &g->a) || !gemm_tier_operand_ok(g, &g->b)) return false;
    if (g->grouping == GEMM_GROUP_M && g->group.count > 1 &&
        (!gemm_tier_aligned16(g->b.data_member_bytes) ||
         !(gemm_tier_b_members_apart(g) || gemm_tier_b_members_inner(g)))) {
        return false;
    }
    if (g->grouping == GEMM_GROUP_K && !gemm_tier_k_grouped_ok(g)) return false;
    if (g->format == GEMM_FORMAT_MXFP8 &&
        (g->a.elem != GEMM_ELEM_E4M3 || g->b.elem != GEMM_ELEM_E4M3)) {
        return false;  // the tier decodes E4M3 (the only K-major x K-major MXFP8 GEMM is fprop)
    }
    if (g->format == GEMM_FORMAT_FP8_BLOCK && !(g->b.flags & GEMM_OPERAND_SCALE_2D)) {
        // Per-column scales of B travel by TMA with the stage: one B (dense or K-grouped, whose
        // members are B's row ranges), 16-byte rows.
        return g->grouping != GEMM_GROUP_M && gemm_tier_aligned16(g->b.scale) &&
               g->b.scale_ld % 4 == 0;
    }
    return true;
}

static uint32_t gemm_tier_ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// Row tiles of the launch: dense and GEMM_GROUP_K (per member) ceil(m / 128); GEMM_GROUP_M the
// bound of qt_gemm_member_tiles (padded rows sum to at most m, one partial tile per member),
// since it counts its row tiles on the device from the member sizes there.
static uint32_t gemm_tier_row_tiles_max(const gemm_args *g) {
    uint32_t tiles = gemm_tier_ceil_div(g->m, GEMM_SM90A_TILE_M);
    return g->grouping == GEMM_GROUP_M ? tiles + g->group.count : tiles;
}

static uint32_t gemm_tier_col_tiles(const gemm_args *g) {
    return gemm_tier_ceil_div(g->n, qt_gemm_sm90a_tile_n(g->format, g->flags));
}

// Tiles of the launch (at most; GEMM_GROUP_M counts its own): GEMM_GROUP_K has every member's
// row and column tiles, an empty member's too (their D is written).
static uint64_t gemm_tier_tiles_max(const gemm_args *g) {
    uint64_t tiles = (uint64_t)gemm_tier_row_tiles_max(g) * gemm_tier_col_tiles(g);
    return g->grouping == GEMM_GROUP_K ? tiles * g->group.count : tiles;
}

// AUTO's shape rule. One sm_90a tile is 128 x 192 or 128 x 256 of D for one CTA per SM; with
// fewer tiles than about a quarter of the SMs, the portable tier's grid (64 x 64 tiles there,
// several per SM) finishes first: the Fashion-MNIST fprop 256 x 1024 x 1024 takes 8 sm_90a tiles
// and ran in about 34 us there against about 19 us on the portable small tile (H100). The
// threshold is a constant (a quarter of an H100 SXM's 132 SMs), not the device's SM count, so
// that every compute capability 9.0 GPU picks the same tier for a GEMM and gives the same bits.
#define GEMM_TIER_AUTO_MIN_TILES 32u

static bool gemm_tier_fills(const gemm_args *g) {
    return gemm_tier_tiles_max(g) >= GEMM_TIER_AUTO_MIN_TILES;
}

bool gemm_tier_units_after(const prog_op *op, gemm_args *g, launch_shape *shape) {
    switch (op->kernel) {
    case KERNEL_GEMM_BF16_PORTABLE:
    case KERNEL_GEMM_FP8_PORTABLE:
    case KERNEL_GEMM_FP8_BLOCK_PORTABLE:
    case KERNEL_GEMM_MXFP8_PORTABLE:
    case KERNEL_GEMM_NVFP4_PORTABLE:
    case KERNEL_GEMM_BF16_SKINNY_N:
    case KERNEL_GEMM_BF16_SKINNY_M:
    case KERNEL_GEMM_SPLIT_REDUCE: break;
    default: return false;
    }
    QT_ASSERT(op->args_bytes == sizeof *g);
    memcpy(g, op->args, sizeof *g);
    if (g->norm_units == 0) return false;
    const uint64_t per_block = GEMM_NORM_UNITS_THREADS / 32u;  // a warp per unit
    uint64_t blocks = (qt_gemm_norm_units_of(g) + per_block - 1) / per_block;
    QT_ASSERT(blocks >= 1 && blocks <= 0x7FFFFFFFu);
    *shape = (launch_shape){{(uint32_t)blocks, 1, 1}, {GEMM_NORM_UNITS_THREADS, 1, 1}, 0};
    return true;
}

bool gemm_tier_takes(const gemm_tier_device *d, const prog_op *op) {
    kernel_id sm90a = gemm_tier_sm90a_kernel(op->kernel);
    if (sm90a == KERNEL_COUNT || !d->gpu || d->setting == BACKEND_GEMM_TIER_PORTABLE ||
        d->cc_major != 9 || d->cc_minor != 0 || !modules_loaded(d->modules, sm90a)) {
        return false;
    }
    QT_ASSERT(op->args_bytes == sizeof(gemm_args));
    gemm_args g;
    memcpy(&g, op->args, sizeof g);
    return gemm_tier_sm90a_supports(&g) &&
           (d->setting == BACKEND_GEMM_TIER_SM90A || gemm_tier_fills(&g));
}

// One tensor map (cuTensorMapEncodeTiled), copied into the args' opaque slot.
typedef struct gemm_tier_map {
    CUtensorMapDataType type;
    cuuint32_t rank;
    uint64_t address;
    cuuint64_t dims[3];
    cuuint64_t strides[2];  // bytes, of dimensions 1 and 2
    cuuint32_t box[3];
    CUtensorMapSwizzle swizzle;
} gemm_tier_map;

static qt_status gemm_tier_encode(const gemm_tier_map *m, gemm_tensor_map *out) {
    CUtensorMap map;
    const cuuint32_t element_strides[3] = {1, 1, 1};
    CUresult result = drv.cuTensorMapEncodeTiled(
        &map, m->type, m->rank, (void *)(uintptr_t)m->address, m->dims, m->strides, m->box,
        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, m->swizzle,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
        char call[192];
        snprintf(call, sizeof call, "cuTensorMapEncodeTiled(rank %u, dims %llu x %llu x %llu, "
                 "strides %llu %llu, box %u x %u x %u)", m->rank,
                 (unsigned long long)m->dims[0], (unsigned long long)m->dims[1],
                 (unsigned long long)m->dims[2], (unsigned long long)m->strides[0],
                 (unsigned long long)m->strides[1], m->box[0], m->box[1], m->box[2]);
        return driver_fail(result, call, __FILE__, __LINE__);
    }
    QT_STATIC_ASSERT(sizeof(CUtensorMap) == sizeof(gemm_tensor_map), "CUtensorMap size");
    memcpy(out, &map, sizeof *out);
    return QT_OK;
}

// Scale groups of the emulated formats: whole groups of 8 stages (K a multiple of 512, so no
// group reads scale bytes past the contraction), scale arrays and rows in whole 16-byte pieces,
// A's scales indexed by row alone, and B's members' scales 16-byte aligned and apart. Otherwise
// the loader warps load them.
bool gemm_tier_scale_groups(const gemm_args *g) {
    const uint64_t group_k = (uint64_t)GEMM_SM90A_EMU_SCALE_GROUP * GEMM_SM90A_EMU_K;
    bool stacked = g->grouping == GEMM_GROUP_M && g->group.count > 1;
    return qt_gemm_sm90a_emulated(g->format) && g->k % group_k == 0 &&
           gemm_tier_aligned16(g->a.scale) && gemm_tier_aligned16(g->a.scale_ld) &&
           gemm_tier_aligned16(g->b.scale) && gemm_tier_aligned16(g->b.scale_ld) &&
           (g->grouping == GEMM_DENSE || g->a.scale_member_bytes == 0) &&
           (!stacked || (gemm_tier_aligned16(g->b.scale_member_bytes) &&
                         g->b.scale_member_bytes >= (uint64_t)g->b.scale_ld * g->n));
}

// A: {k, m} K-major, box {stage k, 128}; B: {k, n, members}, box {stage k, N, 1}, members
// data_member_bytes apart (dense and GEMM_GROUP_K: one member), or members side by side inside
// B's rows {k, members, n}, box {stage k, 1, N} (gemm_tier_b_members_inner). An outer-major
// (BF16) operand swaps the first two dimensions, box {64 rows, 64 k}: the kernel loads one box
// per 64 tile rows. Out-of-bounds elements read as zeros. The
// emulated formats' maps count bytes of codes along k, in the swizzle of their stage row (64
// bytes MXFP8, 32 NVFP4), which the consumers undo as they read.
static qt_status gemm_tier_operand_maps(const gemm_args *g, gemm_sm90a_args *args,
                                        uint32_t tile_n) {
    bool emulated = qt_gemm_sm90a_emulated(g->format);
    CUtensorMapDataType type = g->format == GEMM_FORMAT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    uint32_t box_k = emulated ? GEMM_SM90A_EMU_ROW_BYTES(g->format) : gemm_tier_stage_k(g);
    uint64_t k_elems = emulated ? gemm_tier_bytes(g, g->k) : g->k;
    CUtensorMapSwizzle swizzle = !emulated                           ? CU_TENSOR_MAP_SWIZZLE_128B
                                 : g->format == GEMM_FORMAT_NVFP4 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                                  : CU_TENSOR_MAP_SWIZZLE_64B;
    uint64_t a_row_bytes = gemm_tier_bytes(g, g->a.ld);
    gemm_tier_map a = {type, 2, g->a.data, {k_elems, g->m, 1}, {a_row_bytes, 0},
                       {box_k, GEMM_SM90A_TILE_M, 1}, swizzle};
    if (gemm_tier_outer(&g->a)) {
        gemm_tier_map outer = {type, 2, g->a.data, {g->m, g->k, 1}, {a_row_bytes, 0},
                               {GEMM_SM90A_OUTER_BOX_ROWS, GEMM_SM90A_OUTER_BOX_K, 1}, swizzle};
        a = outer;
    }
    QT_TRY(gemm_tier_encode(&a, &args->a));
    uint64_t b_row_bytes = gemm_tier_bytes(g, g->b.ld);
    bool stacked = g->grouping == GEMM_GROUP_M && g->group.count > 1;
    uint64_t b_rows_stored = gemm_tier_outer(&g->b) ? g->k : g->n;
    uint64_t b_member_bytes = stacked ? g->b.data_member_bytes : b_row_bytes * b_rows_stored;
    gemm_tier_map b = {type, 3, g->b.data, {k_elems, g->n, stacked ? g->group.count : 1u},
                       {b_row_bytes, b_member_bytes}, {box_k, tile_n, 1}, swizzle};
    if (gemm_tier_outer(&g->b)) {
        gemm_tier_map outer = {type, 3, g->b.data, {g->n, g->k, stacked ? g->group.count : 1u},
                               {b_row_bytes, b_member_bytes},
                               {GEMM_SM90A_OUTER_BOX_ROWS, GEMM_SM90A_OUTER_BOX_K, 1}, swizzle};
        b = outer;
    } else if (stacked && !gemm_tier_b_members_apart(g)) {
        QT_ASSERT(gemm_tier_b_members_inner(g));
        gemm_tier_map inner = {type, 3, g->b.data, {k_elems, g->group.count, g->n},
                               {b_member_bytes, b_row_bytes}, {box_k, 1, tile_n}, swizzle};
        b = inner;
        args->b_members_inner = 1;
    }
    QT_TRY(gemm_tier_encode(&b, &args->b));
    if (g->format == GEMM_FORMAT_FP8_BLOCK && !(g->b.flags & GEMM_OPERAND_SCALE_2D)) {
        // Per-column scales [k block][n]: the tile's row of them with each stage.
        gemm_tier_map s = {CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, g->b.scale,
                           {g->n, args->k_stages, 1}, {(uint64_t)g->b.scale_ld * 4, 0},
                           {tile_n, 1, 1}, CU_TENSOR_MAP_SWIZZLE_NONE};
        QT_TRY(gemm_tier_encode(&s, &args->b_scale));
    }
    if (gemm_tier_scale_groups(g)) {
        // Scale groups (gemm_sm90a.h): 8 stages' scale bytes of each tile row.
        cuuint32_t row_bytes = GEMM_SM90A_EMU_SCALE_ROW_BYTES(g->format);
        gemm_tier_map a_scale = {CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, g->a.scale,
                                 {g->a.scale_ld, g->m, 1}, {g->a.scale_ld, 0},
                                 {row_bytes, GEMM_SM90A_TILE_M, 1}, CU_TENSOR_MAP_SWIZZLE_NONE};
        QT_TRY(gemm_tier_encode(&a_scale, &args->a_scale));
        uint64_t b_member = stacked ? g->b.scale_member_bytes : (uint64_t)g->b.scale_ld * g->n;
        gemm_tier_map b_scale = {CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, g->b.scale,
                                 {g->b.scale_ld, g->n, stacked ? g->group.count : 1u},
                                 {g->b.scale_ld, b_member},
                                 {row_bytes, tile_n, 1}, CU_TENSOR_MAP_SWIZZLE_NONE};
        QT_TRY(gemm_tier_encode(&b_scale, &args->b_scale));
        args->scale_tma = 1;
    }
    return QT_OK;
}

// D's map for the epilogue's TMA stores (gemm_sm90a.h): {n, m}, box {128 bytes of columns, 64
// rows}, 128-byte swizzle; {n, m, members}, box {.., .., 1} where each member has its own D (the
// K-grouped wgrad's, d_member_bytes apart). Only where the staged epilogue can write D as the
// register stores would: D, its row pitch, its row length and the distance between members' Ds
// in whole 16-byte pieces (TMA's alignment, and the copies of the boxes that would cross a
// member), no C to read (beta C is added on the register path). Otherwise d_tma stays 0.
// A single D keeps the rank-2 map (and the kernel its 2D store): one rank-3 map for every D
// measured 0.17-0.38 ms slower on moe_dense_current in both calls that ran it, and no faster
// elsewhere (BENCHMARKS.md, "the K-grouped wgrad stores by TMA").
static qt_status gemm_tier_output_map(const gemm_args *g, gemm_sm90a_args *args) {
    bool bf16 = g->d_dtype == QT_DTYPE_BF16;
    uint64_t elem_bytes = bf16 ? 2u : 4u;
    uint64_t row_bytes = g->ldd * elem_bytes;
    bool reads_c = g->c != 0 && g->beta != 0.0f;
    bool members_apart = g->d_member_bytes != 0;
    if ((!bf16 && g->d_dtype != QT_DTYPE_F32) || reads_c || !gemm_tier_aligned16(g->d) ||
        !gemm_tier_aligned16(row_bytes) || !gemm_tier_aligned16(g->n * elem_bytes) ||
        (members_apart && !gemm_tier_aligned16(g->d_member_bytes))) {
        return QT_OK;
    }
    gemm_tier_map d = {bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                       members_apart ? 3u : 2u,
                       g->d,
                       {g->n, g->m, members_apart ? g->group.count : 1u},
                       {row_bytes, members_apart ? g->d_member_bytes : 0u},
                       {(cuuint32_t)(128u / elem_bytes), GEMM_SM90A_EPI_ROWS, 1},
                       CU_TENSOR_MAP_SWIZZLE_128B};
    QT_TRY(gemm_tier_encode(&d, &args->d));
    args->d_tma = 1;
    return QT_OK;
}

// The persistent grid: one CTA per SM (at most ctas_max, at most one per tile), each with the
// shared memory of the format's tile.
static launch_shape gemm_tier_shape(const gemm_tier_device *d, const gemm_args *g) {
    uint32_t tile_n = qt_gemm_sm90a_tile_n(g->format, g->flags);
    uint32_t smem_bytes = qt_gemm_sm90a_emulated(g->format) ? GEMM_SM90A_EMU_SMEM_BYTES(g->format)
                                                             : GEMM_SM90A_SMEM_BYTES(tile_n);
    uint64_t tiles = gemm_tier_tiles_max(g);
    uint64_t ctas = (uint64_t)(d->sm_count > 0 ? d->sm_count : 1);
    if (d->ctas_max != 0 && d->ctas_max < ctas) ctas = d->ctas_max;
    if (tiles < ctas) ctas = tiles;
    return (launch_shape){{(uint32_t)ctas, 1, 1}, {GEMM_SM90A_THREADS, 1, 1}, smem_bytes};
}

kernel_id gemm_tier_portable_kernel(const gemm_tier_device *d, const prog_op *op) {
    kernel_id small = gemm_tier_small_kernel(op->kernel);
    if (small == KERNEL_COUNT || !d->gpu || !modules_loaded(d->modules, small)) return op->kernel;
    QT_ASSERT(op->args_bytes == sizeof(gemm_args));
    gemm_args g;
    memcpy(&g, op->args, sizeof g);
    return g.tile == GEMM_TILE_SMALL ? small : op->kernel;
}

qt_status gemm_tier_launch(const gemm_tier_device *d, const prog_op *op, CUstream stream) {
    kernel_id kernel = gemm_tier_sm90a_kernel(op->kernel);
    QT_ASSERT(kernel != KERNEL_COUNT && op->args_bytes == sizeof(gemm_args));
    gemm_sm90a_args args;
    memset(&args, 0, sizeof args);
    memcpy(&args.gemm, op->args, sizeof args.gemm);
    const gemm_args *g = &args.gemm;
    QT_ASSERT(gemm_tier_sm90a_supports(g));
    uint32_t tile_n = qt_gemm_sm90a_tile_n(g->format, g->flags);
    args.col_tiles = gemm_tier_col_tiles(g);
    args.k_stages = gemm_tier_ceil_div(g->k, gemm_tier_stage_k(g));
    uint32_t row_tiles_max = gemm_tier_row_tiles_max(g);
    if (g->grouping != GEMM_GROUP_M) args.row_tiles = row_tiles_max;  // else counted on the device
    QT_TRY(gemm_tier_operand_maps(g, &args, tile_n));
    QT_TRY(gemm_tier_output_map(g, &args));
    launch_shape shape = gemm_tier_shape(d, g);
    return modules_launch(d->modules, kernel, &shape, stream, &args, sizeof args);
}

void gemm_tier_launched(const gemm_tier_device *d, const prog_op *op, kernel_id *kernel,
                        launch_shape *shape) {
    *kernel = gemm_tier_sm90a_kernel(op->kernel);
    QT_ASSERT(*kernel != KERNEL_COUNT && op->args_bytes == sizeof(gemm_args));
    gemm_args g;
    memcpy(&g, op->args, sizeof g);
    *shape = gemm_tier_shape(d, &g);
}

const char *gemm_tier_describe(const gemm_tier_device *d) {
    if (!d->gpu) return "reference (C twins)";
    bool sm90 = d->cc_major == 9 && d->cc_minor == 0 &&
                modules_loaded(d->modules, KERNEL_GEMM_BF16_SM90A);
    if (!sm90) return "portable (mma.sync): the sm_90a tier needs compute capability 9.0";
    if (d->setting == BACKEND_GEMM_TIER_PORTABLE) return "portable (mma.sync), forced";
    if (d->setting == BACKEND_GEMM_TIER_SM90A) {
        return "sm_90a (TMA + wgmma) for every bf16 GEMM (K-major or outer-major operands) and "
               "every K-major fp8, fp8 block, mxfp8 and nvfp4 GEMM, dense and M-grouped, and "
               "K-grouped bf16, fp8 and fp8 block, forced; portable (mma.sync) for the rest";
    }
    return "sm_90a (TMA + wgmma) for bf16 GEMMs (K-major or outer-major operands) and K-major fp8, "
           "fp8 block, mxfp8 and nvfp4 GEMMs, dense and M-grouped, and K-grouped bf16, fp8 and "
           "fp8 block, of at least 32 tiles; portable (mma.sync) for the rest";
}
