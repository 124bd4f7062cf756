#include "runtime/ops/op_gemm.h"

#include <stddef.h>  // offsetof
#include <stdio.h>   // snprintf

#include "runtime/ops/op_quant_group.h"  // op_group, op_group_use

#define OP_GEMM_GRID_YZ_MAX 65535u

static uint32_t op_gemm_ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

op_gemm_operand op_gemm_operand_of(uint32_t format, uint32_t elem, uint32_t rows, uint32_t cols,
                                   bool columnwise, bool scale_2d, prog_ref data, prog_ref scale,
                                   prog_ref tensor_scale) {
    QT_ASSERT(format < GEMM_FORMAT_COUNT);
    QT_ASSERT(!scale_2d || format == GEMM_FORMAT_FP8_BLOCK);
    op_gemm_operand o = {0};
    o.data = data;
    o.scale = scale;
    o.tensor_scale = tensor_scale;
    o.elem = elem;
    o.flags = scale_2d ? GEMM_OPERAND_SCALE_2D : 0u;
    // Operand rows R and contraction length K of this copy.
    uint32_t r = columnwise ? cols : rows;
    uint32_t k = columnwise ? rows : cols;
    switch (format) {
    case GEMM_FORMAT_BF16:
        // One copy serves both directions: over its rows it is read outer-major.
        o.flags |= columnwise ? GEMM_OPERAND_OUTER_MAJOR : 0u;
        o.ld = cols;
        break;
    case GEMM_FORMAT_FP8:
        o.ld = k;  // rowwise [R][K]; columnwise the transpose [cols][rows]
        break;
    case GEMM_FORMAT_FP8_BLOCK:
        o.ld = k;
        // 1x128: [K/128][R] (rowwise [ceil(cols/128)][rows], columnwise [ceil(rows/128)][cols]);
        // 128x128: [R/128][K/128] in both directions.
        o.scale_ld = scale_2d ? op_gemm_ceil_div(k, GEMM_BLOCK_FP8) : r;
        break;
    case GEMM_FORMAT_MXFP8:
        // Columnwise data is not transposed: [rows][cols] = [k][r], scales [rows/32][cols].
        o.flags |= columnwise ? GEMM_OPERAND_OUTER_MAJOR : 0u;
        o.ld = cols;
        o.scale_ld = columnwise ? cols : op_gemm_ceil_div(cols, GEMM_BLOCK_MXFP8);
        break;
    case GEMM_FORMAT_NVFP4:
        o.ld = 2 * op_gemm_ceil_div(k, 2);  // rows of ceil(K/2) bytes
        o.scale_ld = op_gemm_ceil_div(k, GEMM_BLOCK_NVFP4);
        break;
    default:
        QT_ASSERT(false);
    }
    return o;
}

// Member i's n rows start n rows on in the rowwise copies (and in the BF16 and MXFP8 columnwise
// copies, which are not transposed), n columns on in the transposed columnwise copies; its block
// scales likewise, by whole blocks.
void op_gemm_operand_stack(op_gemm_operand *op, uint32_t f, bool two_d, bool colwise,
                           uint32_t member_rows, uint32_t cols) {
    uint64_t n = member_rows, k = cols;
    QT_ASSERT(n % qt_gemm_block_len(f) == 0);  // whole blocks along the rows too
    uint64_t data = 0, scale = 0;
    switch (f) {
    case GEMM_FORMAT_BF16: data = n * k * 2; break;
    case GEMM_FORMAT_FP8: data = colwise ? n : n * k; break;
    case GEMM_FORMAT_FP8_BLOCK: {
        uint64_t kb = (k + GEMM_BLOCK_FP8 - 1) / GEMM_BLOCK_FP8, nb = n / GEMM_BLOCK_FP8;
        data = colwise ? n : n * k;
        if (two_d) {
            scale = colwise ? nb * 4 : nb * kb * 4;
        } else {
            scale = colwise ? nb * k * 4 : n * 4;
        }
        break;
    }
    case GEMM_FORMAT_MXFP8: {
        uint64_t kb = (k + GEMM_BLOCK_MXFP8 - 1) / GEMM_BLOCK_MXFP8;
        data = n * k;
        scale = colwise ? n / GEMM_BLOCK_MXFP8 * k : n * kb;
        break;
    }
    case GEMM_FORMAT_NVFP4: {
        uint64_t kb = (k + GEMM_BLOCK_NVFP4 - 1) / GEMM_BLOCK_NVFP4;
        data = colwise ? n / 2 : n * ((k + 1) / 2);
        scale = colwise ? n / GEMM_BLOCK_NVFP4 : n * kb;
        break;
    }
    default:
        QT_ASSERT(false);
    }
    op->data_member_bytes = data;
    op->scale_member_bytes = scale;
}

static bool op_gemm_elem_ok(uint32_t format, uint32_t elem, bool is_b) {
    switch (format) {
    case GEMM_FORMAT_BF16:
        return elem == GEMM_ELEM_BF16;
    case GEMM_FORMAT_FP8:
    case GEMM_FORMAT_FP8_BLOCK:
        // The kernels instantiate E4M3 x E4M3 and E5M2 x E4M3 (gradients are A).
        return elem == GEMM_ELEM_E4M3 || (!is_b && elem == GEMM_ELEM_E5M2);
    case GEMM_FORMAT_MXFP8:
        return elem == GEMM_ELEM_E4M3 || elem == GEMM_ELEM_E5M2;
    case GEMM_FORMAT_NVFP4:
        return elem == GEMM_ELEM_E2M1;
    default:
        return false;
    }
}

// Programmer errors in a descriptor abort; they are never data-dependent.
static void op_gemm_check_operand(const op_gemm_desc *g, const op_gemm_operand *o, bool is_b,
                                  uint32_t rows) {
    uint32_t f = g->format;
    QT_ASSERT(o->data.arena != NULL);
    QT_ASSERT(op_gemm_elem_ok(f, o->elem, is_b));
    bool outer = (o->flags & GEMM_OPERAND_OUTER_MAJOR) != 0;
    QT_ASSERT(!outer || f == GEMM_FORMAT_BF16 || f == GEMM_FORMAT_MXFP8);
    QT_ASSERT(!(o->flags & GEMM_OPERAND_SCALE_2D) || (f == GEMM_FORMAT_FP8_BLOCK && is_b));
    bool block_scaled = f == GEMM_FORMAT_FP8_BLOCK || f == GEMM_FORMAT_MXFP8 ||
                        f == GEMM_FORMAT_NVFP4;
    QT_ASSERT(block_scaled == (o->scale.arena != NULL));
    bool tensor_scaled = f == GEMM_FORMAT_FP8 || f == GEMM_FORMAT_NVFP4 ||
                         (g->flags & GEMM_FLAG_ALPHA_NVFP4) != 0;
    QT_ASSERT(tensor_scaled == (o->tensor_scale.arena != NULL));
    QT_ASSERT(!(o->flags & GEMM_OPERAND_TENSOR_PER_MEMBER) || g->grouping != GEMM_DENSE);
    // Leading dimensions cover a row (outer-major: a k row spans the operand's rows).
    QT_ASSERT(o->ld >= (outer ? rows : g->k) || g->k == 0);
    QT_ASSERT(f != GEMM_FORMAT_NVFP4 || o->ld % 2 == 0);
    // Member strides: only stacked B of an M-grouped GEMM moves with the member.
    bool stacked = g->grouping == GEMM_GROUP_M && is_b;
    QT_ASSERT(stacked || (o->data_member_bytes == 0 && o->scale_member_bytes == 0));
}

static void op_gemm_check(const op_gemm_desc *g) {
    QT_ASSERT(g->format < GEMM_FORMAT_COUNT);
    QT_ASSERT(g->grouping <= GEMM_GROUP_K);
    QT_ASSERT((g->flags & ~(GEMM_FLAG_SPLIT_ACCUMULATE | GEMM_FLAG_ALPHA_NVFP4)) == 0);
    QT_ASSERT(!(g->flags & GEMM_FLAG_SPLIT_ACCUMULATE) || g->format == GEMM_FORMAT_FP8);
    QT_ASSERT(!(g->flags & GEMM_FLAG_ALPHA_NVFP4) || g->format == GEMM_FORMAT_BF16);
    QT_ASSERT(g->d.arena != NULL);
    QT_ASSERT(g->d_dtype == QT_DTYPE_BF16 || g->d_dtype == QT_DTYPE_F32);
    QT_ASSERT(g->bias.arena == NULL ||
              g->bias_dtype == QT_DTYPE_BF16 || g->bias_dtype == QT_DTYPE_F32);
    QT_ASSERT(g->ldd == 0 || g->ldd >= g->n);
    // Split-K: dense, parts of whole 128-wide K blocks, none empty (op_gemm_split_parts).
    QT_ASSERT(g->split_parts <= GEMM_SPLIT_PARTS_MAX);
    QT_ASSERT(g->split_parts <= 1 ||
              (g->grouping == GEMM_DENSE && g->workspace.arena != NULL &&
               (uint64_t)op_gemm_split_k(g->k, g->split_parts) * (g->split_parts - 1) < g->k));
    if (g->grouping == GEMM_DENSE) {
        QT_ASSERT(g->count == 0 && g->d_member_bytes == 0 && g->bias_member_bytes == 0);
    } else {
        QT_ASSERT(g->count >= 1);
        QT_ASSERT(g->row_offsets.arena != NULL && g->first_dims.arena != NULL);
        QT_ASSERT(g->grouping == GEMM_GROUP_K || g->d_member_bytes == 0);
    }
    op_gemm_check_operand(g, &g->a, false, g->m);
    op_gemm_check_operand(g, &g->b, true, g->n);
    QT_ASSERT(g->d_max.arena == NULL || g->grouping == GEMM_DENSE);
    // Norm units: what qt_gemm_norm_units_fit asks of the args.
    QT_ASSERT(g->norm_units.arena == NULL ||
              ((g->grouping == GEMM_DENSE || g->grouping == GEMM_GROUP_K) &&
               g->d_dtype == QT_DTYPE_F32 && (g->c.arena == NULL || g->beta == 0.0f) &&
               g->bias.arena == NULL));
}

// The small tile when the large tile's grid has fewer blocks of work than a GPU has SMs (about
// 132 on the GPUs this tier targets; 128 keeps the choice a plain tile count, since the SM count
// is not known when a program is planned): 4x the blocks, each a quarter of the work, so more
// SMs share the contraction. Training-sized GEMMs (256 x 1024 x 1024: 16 large tiles) are the
// case. Near the bound (64 large tiles: a 1024 x 1024 wgrad) the two tiles measured within a few
// percent of each other on an H100, so the bound stays a plain count. M-grouped GEMMs count
// their capacity's tiles, not the launch's empty ones.
uint32_t op_gemm_tile(const op_gemm_desc *g) {
    QT_ASSERT(g->tile <= OP_GEMM_TILE_SMALL);
    if (g->tile == OP_GEMM_TILE_LARGE) return GEMM_TILE_LARGE;
    if (g->tile == OP_GEMM_TILE_SMALL) return GEMM_TILE_SMALL;
    uint64_t members = g->grouping == GEMM_GROUP_K ? g->count : 1u;
    uint64_t tiles = (uint64_t)op_gemm_ceil_div(g->m, GEMM_TILE_M) *
                     op_gemm_ceil_div(g->n, GEMM_TILE_N) * members;
    return tiles < OP_GEMM_SMALL_TILE_BELOW ? GEMM_TILE_SMALL : GEMM_TILE_LARGE;
}

// The skinny kernels' rule (gemm.h "Skinny GEMMs"). A GEMM with n or m of at most 64 is
// memory-bound: its time is reading its large operand once. The portable tier's 64- or 128-column
// tiles and the sm_90a tier's 192 or 256 compute mostly padding there, and their pipelines, sized
// for square tiles, keep too few of the large operand's bytes in flight. The skinny kernels stream
// that operand in 16-byte copies, 4 to 6 stages deep, and give the portable tier's bits (gemm.h),
// so taking a GEMM moves no bit. On an H200 (moe8 bench, 16384 tokens of 2048):
//   N  n <= 64, A and B K-major: fprop of a head or router. Its block is the small tile's 64
//      rows, so at least as many blocks as the portable tier has (split parts included), each
//      with more of A in flight and none of the padding. The head's fprop (n = 16): 21 us, 43 on
//      the sm_90a tier.
//   M  m <= 64, A and B outer-major: their wgrad (columnwise BF16 copies), split into parts by
//      op_gemm_skinny_m_parts. The head's wgrad (m = 16, k = 16384): 28 us, 98 on the portable
//      tier's 4 split parts plus 3.5 of reduction.
// There is no kind K: a GEMM of k <= 64 (their dgrad, B the weight's outer-major copy) stays on
// the tiers, because writing D through them measured faster. The head's dgrad (16384 x 2048 of
// D, k = 16) took 28 us on the sm_90a tier and 100.6 us on a skinny kernel of one 64 x 128 tile
// of D a block, the router's 32 us against 118.7 (writing dx once takes about 17 us).
// Only dense BF16 GEMMs of the automatic tile (a forced tile asks for the portable tier, which
// tests compare with) whose streamed rows are whole 16-byte pieces (ld a multiple of 8; a
// 10-class head's 20-byte rows of dy would be read byte by byte, and stay portable). A function
// of the descriptor alone, so every GPU and the reference backend build the same program.
static bool op_gemm_outer(const op_gemm_operand *o) {
    return (o->flags & GEMM_OPERAND_OUTER_MAJOR) != 0;
}

uint32_t op_gemm_skinny(const op_gemm_desc *g) {
    if (g->format != GEMM_FORMAT_BF16 || g->grouping != GEMM_DENSE ||
        g->tile != OP_GEMM_TILE_AUTO) {
        return GEMM_SKINNY_NONE;
    }
    bool a_outer = op_gemm_outer(&g->a), b_outer = op_gemm_outer(&g->b);
    bool a_rows16 = g->a.ld % 8 == 0, b_rows16 = g->b.ld % 8 == 0;
    if (g->n <= GEMM_SKINNY_MAX && !a_outer && !b_outer && a_rows16 && b_rows16) {
        return GEMM_SKINNY_N;
    }
    if (g->m <= GEMM_SKINNY_MAX && a_outer && b_outer && a_rows16 && b_rows16) {
        return GEMM_SKINNY_M;
    }
    return GEMM_SKINNY_NONE;
}

uint32_t op_gemm_split_k(uint32_t k, uint32_t parts) {
    QT_ASSERT(parts > 1);
    uint32_t blocks = op_gemm_ceil_div(k, GEMM_SPLIT_K_ALIGN);
    return op_gemm_ceil_div(blocks, parts) * GEMM_SPLIT_K_ALIGN;
}

// Parts of whole 128-wide K blocks, `parts` at most, the last the rest: as many as that takes.
static uint32_t op_gemm_whole_parts(uint32_t k, uint64_t parts) {
    if (parts > GEMM_SPLIT_PARTS_MAX) parts = GEMM_SPLIT_PARTS_MAX;
    if (parts <= 1) return 1;
    return op_gemm_ceil_div(k, op_gemm_split_k(k, (uint32_t)parts));
}

// Kind M's parts: about two blocks per SM (128 columns of D a block, 2 x 132 blocks in all: two
// or three fit an SM, and that keeps every SM's share of the stream in flight), each part at
// least max(256, 16 m) rows, so that the parts' FP32 sums (written and read again: 8 m bytes per
// column of a part) stay within a quarter of the operand bytes they replace (2 bytes per row and
// column). The moe8 head's 16 x 2048 x 16384: 16 parts of 1024 rows, 256 blocks.
static uint32_t op_gemm_skinny_m_parts(const op_gemm_desc *g, uint32_t sm_count) {
    uint64_t want = op_gemm_ceil_div(2u * sm_count, op_gemm_ceil_div(g->n, GEMM_SKINNY_M_COLS));
    uint32_t rows_min = 16u * g->m > 256u ? 16u * g->m : 256u;
    uint64_t by_rows = g->k / rows_min;
    return op_gemm_whole_parts(g->k, want < by_rows ? want : by_rows);
}

uint32_t op_gemm_split_parts(const op_gemm_desc *g, uint32_t sm_count) {
    if (g->grouping != GEMM_DENSE || g->m == 0 || g->n == 0) return 1;
    if (op_gemm_skinny(g) == GEMM_SKINNY_M) return op_gemm_skinny_m_parts(g, sm_count);
    uint32_t rows = GEMM_TILE_ROWS(op_gemm_tile(g));
    uint64_t tiles = (uint64_t)op_gemm_ceil_div(g->m, rows) * op_gemm_ceil_div(g->n, rows);
    uint32_t blocks = op_gemm_ceil_div(g->k, GEMM_SPLIT_K_ALIGN);
    if (tiles * 2 > sm_count || blocks < OP_GEMM_SPLIT_BLOCKS_MIN) return 1;
    uint64_t parts = sm_count / tiles;
    return op_gemm_whole_parts(g->k, parts < blocks ? parts : blocks);
}

uint64_t op_gemm_workspace_bytes(const op_gemm_desc *g, uint32_t parts) {
    return parts > 1 ? (uint64_t)parts * g->m * g->n * sizeof(float) : 0u;
}

// The skinny kernels' launches (ptx/gemm_skinny.cu): block z of kinds N and M is split part z.
static launch_shape op_gemm_skinny_shape(const op_gemm_desc *g, uint32_t kind) {
    uint32_t parts = g->split_parts > 1 ? g->split_parts : 1u;
    launch_shape shape = {{1, 1, 1}, {GEMM_SKINNY_THREADS, 1, 1}, 0};
    if (kind == GEMM_SKINNY_N) {
        shape.grid[0] = op_gemm_ceil_div(g->m, GEMM_SKINNY_N_ROWS);
        shape.grid[2] = parts;
        shape.smem_bytes = GEMM_SKINNY_N_SMEM_BYTES(qt_gemm_skinny_n_frags(g->n));
    } else {
        QT_ASSERT(kind == GEMM_SKINNY_M);
        shape.grid[0] = op_gemm_ceil_div(g->n, GEMM_SKINNY_M_COLS);
        shape.grid[2] = parts;
        shape.smem_bytes = GEMM_SKINNY_M_SMEM_BYTES(qt_gemm_skinny_m_frags(g->m));
    }
    return shape;
}

launch_shape op_gemm_shape(const op_gemm_desc *g) {
    uint32_t skinny = op_gemm_skinny(g);
    if (skinny != GEMM_SKINNY_NONE) return op_gemm_skinny_shape(g, skinny);
    uint32_t tile = op_gemm_tile(g);
    uint32_t rows = GEMM_TILE_ROWS(tile);
    uint32_t row_tiles = op_gemm_ceil_div(g->m, rows);
    if (g->grouping == GEMM_GROUP_M) row_tiles += g->count;  // see qt_gemm_member_row_tiles
    uint32_t members = g->grouping == GEMM_GROUP_K ? g->count : 1u;
    if (g->split_parts > 1) members = g->split_parts;  // block z: split part z
    launch_shape shape = {{op_gemm_ceil_div(g->n, rows), row_tiles, members},
                          {GEMM_TILE_THREADS(tile), 1, 1},
                          GEMM_PORTABLE_SMEM_BYTES_TILE(g->format, tile)};
    return shape;
}

static const kernel_id op_gemm_kernels[GEMM_FORMAT_COUNT] = {
    [GEMM_FORMAT_BF16] = KERNEL_GEMM_BF16_PORTABLE,
    [GEMM_FORMAT_FP8] = KERNEL_GEMM_FP8_PORTABLE,
    [GEMM_FORMAT_FP8_BLOCK] = KERNEL_GEMM_FP8_BLOCK_PORTABLE,
    [GEMM_FORMAT_MXFP8] = KERNEL_GEMM_MXFP8_PORTABLE,
    [GEMM_FORMAT_NVFP4] = KERNEL_GEMM_NVFP4_PORTABLE,
};

kernel_id op_gemm_kernel(const op_gemm_desc *g) {
    switch (op_gemm_skinny(g)) {
    case GEMM_SKINNY_N: return KERNEL_GEMM_BF16_SKINNY_N;
    case GEMM_SKINNY_M: return KERNEL_GEMM_BF16_SKINNY_M;
    default: return op_gemm_kernels[g->format];
    }
}

static gemm_operand op_gemm_operand_args(const op_gemm_operand *o) {
    gemm_operand a = {0};
    a.data_member_bytes = o->data_member_bytes;
    a.scale_member_bytes = o->scale_member_bytes;
    a.ld = o->ld;
    a.scale_ld = o->scale_ld;
    a.elem = o->elem;
    a.flags = o->flags;
    return a;
}

// Declares one operand's regions; the addresses land in args.<side>.data/scale/tensor_scale.
static qt_status op_gemm_use_operand(program *p, uint32_t op, size_t base,
                                     const op_gemm_operand *o) {
    QT_TRY(prog_use(p, op, (uint32_t)(base + offsetof(gemm_operand, data)), o->data, PROG_READ));
    QT_TRY(prog_use_optional(p, op, (uint32_t)(base + offsetof(gemm_operand, scale)), o->scale,
                             0, PROG_READ));
    return prog_use_optional(p, op, (uint32_t)(base + offsetof(gemm_operand, tensor_scale)),
                             o->tensor_scale, 0, PROG_READ);
}

static gemm_args op_gemm_args(const op_gemm_desc *g) {
    gemm_args args = {0};
    args.a = op_gemm_operand_args(&g->a);
    args.b = op_gemm_operand_args(&g->b);
    args.ldd = g->ldd ? g->ldd : g->n;
    args.d_member_bytes = g->d_member_bytes;
    if (g->grouping == GEMM_GROUP_K && args.d_member_bytes == 0) {
        uint64_t elem_bytes = g->d_dtype == QT_DTYPE_BF16 ? 2 : 4;
        args.d_member_bytes = (uint64_t)g->m * args.ldd * elem_bytes;
    }
    args.bias_member_bytes = g->bias_member_bytes;
    args.m = g->m;
    args.n = g->n;
    args.k = g->k;
    args.alpha = g->alpha;
    args.beta = g->c.arena ? g->beta : 0.0f;
    args.d_dtype = g->d_dtype;
    args.bias_dtype = g->bias_dtype;
    args.grouping = g->grouping;
    args.format = g->format;
    args.flags = g->flags;
    args.tile = op_gemm_tile(g);
    if (g->split_parts > 1) {
        args.split_parts = g->split_parts;
        args.split_k = op_gemm_split_k(g->k, g->split_parts);
    }
    return args;
}

bool op_gemm_writes_d_max(const op_gemm_desc *g) {
    return prog_ref_present(g->d_max) && g->grouping == GEMM_DENSE && g->split_parts <= 1 &&
           op_gemm_skinny(g) == GEMM_SKINNY_NONE;
}

// The fused reduction's activation args (gemm_act_args.act); the act's addresses are declared
// by op_gemm_split_reduce.
static act_args op_gemm_act_args(const op_gemm_desc *g, const op_gemm_act_desc *act) {
    act_args a = {0};
    a.rows = g->m;
    a.cols = g->n;
    a.act = act->act;
    a.x_dtype = act->backward ? act->x.dtype : g->d_dtype;
    a.bias_dtype = act->bias.dtype;
    a.dy_dtype = g->d_dtype;
    a.out_dtype = act->out.dtype;
    return a;
}

// D's norm units, where the GEMM has them, in the op that writes D (the split GEMM's reduction).
static qt_status op_gemm_use_units(program *p, uint32_t op, const op_gemm_desc *g) {
    if (!prog_ref_present(g->norm_units)) return QT_OK;
    uint64_t members = g->grouping == GEMM_GROUP_K ? g->count : 1u;
    return prog_use_span(p, op, offsetof(gemm_args, norm_units), g->norm_units,
                         members * qt_gemm_norm_unit_count(g->m, g->n) * 8u, PROG_WRITE);
}

// The reduction of a split GEMM's parts into D with the epilogue, one thread per element; with
// `act`, fused with the activation of D (gemm_act_args), named after the activation.
static qt_status op_gemm_split_reduce(program *p, const char *name, const op_gemm_desc *g,
                                      const gemm_args *args, const op_gemm_act_desc *act) {
    uint64_t blocks = ((uint64_t)g->m * g->n + GEMM_SPLIT_REDUCE_THREADS - 1) /
                      GEMM_SPLIT_REDUCE_THREADS;
    if (blocks > 0x7FFFFFFFu) blocks = 0x7FFFFFFFu;  // the kernel strides over the rest
    launch_shape shape = {{(uint32_t)blocks, 1, 1}, {GEMM_SPLIT_REDUCE_THREADS, 1, 1}, 0};
    char reduce_name[PROG_OP_NAME_MAX];
    snprintf(reduce_name, sizeof reduce_name, "%s.sum", name);
    uint32_t op;
    if (act == NULL) {
        QT_TRY(prog_append(p, KERNEL_GEMM_SPLIT_REDUCE, reduce_name, &shape, args, sizeof *args,
                           &op));
    } else {
        gemm_act_args fused = {*args, op_gemm_act_args(g, act)};
        kernel_id kernel = act->backward ? KERNEL_GEMM_SPLIT_REDUCE_ACT_BWD
                                         : KERNEL_GEMM_SPLIT_REDUCE_ACT_FWD;
        QT_TRY(prog_append(p, kernel, act->name, &shape, &fused, sizeof fused, &op));
        const size_t at = offsetof(gemm_act_args, act);
        if (act->backward) QT_TRY(prog_use(p, op, at + offsetof(act_args, x), act->x.ref,
                                           PROG_READ));
        QT_TRY(prog_use_optional(p, op, at + offsetof(act_args, bias), act->bias.ref, 0,
                                 PROG_READ));
        QT_TRY(prog_use_optional(p, op, at + offsetof(act_args, amax), act->amax, 4,
                                 PROG_READ_WRITE));
        QT_TRY(prog_use(p, op, at + offsetof(act_args, out), act->out.ref, PROG_WRITE));
    }
    // The GEMM's fields have the same offsets in both args structs (gemm_act_args.gemm first).
    QT_STATIC_ASSERT(offsetof(gemm_act_args, gemm) == 0, "gemm_args at the start");
    // alpha' reads the operands' per-tensor factors; their data is the GEMM op's alone.
    QT_TRY(prog_use_optional(p, op, offsetof(gemm_args, a) + offsetof(gemm_operand, tensor_scale),
                             g->a.tensor_scale, 4, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(gemm_args, b) + offsetof(gemm_operand, tensor_scale),
                             g->b.tensor_scale, 4, PROG_READ));
    QT_TRY(prog_use_span(p, op, offsetof(gemm_args, workspace), g->workspace,
                         op_gemm_workspace_bytes(g, g->split_parts), PROG_READ));
    bool reads_c = g->c.arena != NULL && g->beta != 0.0f;
    if (reads_c) QT_TRY(prog_use(p, op, offsetof(gemm_args, c), g->c, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(gemm_args, d), g->d, PROG_WRITE));
    QT_TRY(op_gemm_use_units(p, op, g));
    return prog_use_optional(p, op, offsetof(gemm_args, bias), g->bias, 0, PROG_READ);
}

// op_gemm, and with `act` (a split GEMM that op_gemm_act_fuses takes) the reduction fused with
// the activation.
static qt_status op_gemm_append(program *p, const char *name, const op_gemm_desc *g,
                                const op_gemm_act_desc *act) {
    op_gemm_check(g);
    QT_ASSERT(act == NULL || g->norm_units.arena == NULL);
    if (g->m == 0 || g->n == 0) return QT_OK;
    launch_shape shape = op_gemm_shape(g);
    if (shape.grid[1] > OP_GEMM_GRID_YZ_MAX || shape.grid[2] > OP_GEMM_GRID_YZ_MAX) {
        return qt_fail(QT_ERR_INPUT, "gemm '%s': %u row tiles and %u members exceed the grid "
                       "limit of %u; split the GEMM", name, shape.grid[1], shape.grid[2],
                       OP_GEMM_GRID_YZ_MAX);
    }
    gemm_args args = op_gemm_args(g);
    uint32_t op;
    QT_TRY(prog_append(p, op_gemm_kernel(g), name, &shape, &args, sizeof args, &op));
    QT_TRY(op_gemm_use_operand(p, op, offsetof(gemm_args, a), &g->a));
    QT_TRY(op_gemm_use_operand(p, op, offsetof(gemm_args, b), &g->b));
    if (g->split_parts > 1) {
        QT_TRY(prog_use_span(p, op, offsetof(gemm_args, workspace), g->workspace,
                             op_gemm_workspace_bytes(g, g->split_parts), PROG_WRITE));
        // The reduction's args are the GEMM's with every address resolved in its own op.
        return op_gemm_split_reduce(p, name, g, &args, act);
    }
    QT_ASSERT(act == NULL);
    bool reads_c = g->c.arena != NULL && g->beta != 0.0f;
    if (reads_c) QT_TRY(prog_use(p, op, offsetof(gemm_args, c), g->c, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(gemm_args, d), g->d, PROG_WRITE));
    QT_TRY(op_gemm_use_units(p, op, g));
    QT_TRY(prog_use_optional(p, op, offsetof(gemm_args, bias), g->bias, 0, PROG_READ));
    if (op_gemm_writes_d_max(g)) {  // an atomic maximum into the slot
        QT_TRY(prog_use_span(p, op, offsetof(gemm_args, d_max), g->d_max, 4, PROG_READ_WRITE));
    }
    if (g->grouping == GEMM_DENSE) return QT_OK;
    op_group group = {g->count, g->row_offsets, g->first_dims};
    return op_group_use(p, op, offsetof(gemm_args, group), &group);
}

qt_status op_gemm(program *p, const char *name, const op_gemm_desc *g) {
    return op_gemm_append(p, name, g, NULL);
}

bool op_gemm_act_fuses(const op_gemm_desc *g) {
    return g->split_parts > 1 && g->grouping == GEMM_DENSE && (g->ldd == 0 || g->ldd == g->n);
}

static void op_gemm_act_check_tensor(op_act_tensor t) {
    QT_ASSERT(prog_ref_present(t.ref));
    QT_ASSERT(t.dtype == QT_DTYPE_BF16 || t.dtype == QT_DTYPE_F32);
}

qt_status op_gemm_act(program *p, const char *name, const op_gemm_desc *g,
                      const op_gemm_act_desc *act) {
    QT_ASSERT(act->act == QT_ACT_RELU || act->act == QT_ACT_GELU || act->act == QT_ACT_SILU);
    QT_ASSERT(g->m >= 1 && g->n >= 1);
    op_gemm_act_check_tensor(act->out);
    if (act->backward) op_gemm_act_check_tensor(act->x);
    if (prog_ref_present(act->bias.ref)) op_gemm_act_check_tensor(act->bias);
    // out may be D itself (dx over the dgrad, in place): then the very same bytes and dtype
    // (the fused kernel stores D's element, then out's over it; op_act_append asserts the same
    // of the unfused pair).
    if (prog_ref_same_region(act->out.ref, g->d)) {
        QT_ASSERT(act->backward && act->out.ref.offset == g->d.offset &&
                  act->out.dtype == g->d_dtype && (g->ldd == 0 || g->ldd == g->n));
    }
    if (op_gemm_act_fuses(g)) return op_gemm_append(p, name, g, act);
    QT_TRY(op_gemm(p, name, g));
    op_act_tensor d = {g->d, g->d_dtype};
    if (act->backward) {
        return op_act_backward(p, act->name, act->act, g->m, g->n, act->x, act->bias, d,
                               act->out, act->amax);
    }
    return op_act_forward(p, act->name, act->act, g->m, g->n, d, act->bias, act->out,
                          act->amax);
}

qt_status op_gemm_decode_table(program *p, const char *name, uint32_t path, uint32_t elem,
                               uint32_t piece, prog_ref out) {
    QT_ASSERT(path <= GEMM_DECODE_NVFP4);
    QT_ASSERT(path == GEMM_DECODE_NVFP4 || elem == GEMM_ELEM_E4M3 || elem == GEMM_ELEM_E5M2);
    QT_ASSERT(piece == 8 || piece == 16);
    gemm_decode_table_args args = {0};
    args.path = path;
    args.elem = path == GEMM_DECODE_NVFP4 ? GEMM_ELEM_E2M1 : elem;
    args.piece = piece;
    launch_shape shape = {{256, 1, 1}, {GEMM_DECODE_TABLE_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_GEMM_DECODE_TABLE, name, &shape, &args, sizeof args, &op));
    return prog_use(p, op, offsetof(gemm_decode_table_args, out), out, PROG_WRITE);
}

qt_status op_gemm_bias_grad(program *p, const char *name, prog_ref dy, uint32_t dtype,
                            uint32_t rows, uint32_t cols, uint32_t ld, uint32_t count,
                            prog_ref row_offsets, prog_ref first_dims, prog_ref out) {
    QT_ASSERT(dtype == QT_DTYPE_BF16 || dtype == QT_DTYPE_F32);
    QT_ASSERT(ld >= cols);
    QT_ASSERT(count == 0 || (row_offsets.arena != NULL && first_dims.arena != NULL));
    if (cols == 0) return QT_OK;
    uint32_t members = count ? count : 1u;
    if (members > OP_GEMM_GRID_YZ_MAX) {
        return qt_fail(QT_ERR_INPUT, "bias gradient '%s': %u members exceed the grid limit of "
                       "%u", name, members, OP_GEMM_GRID_YZ_MAX);
    }
    gemm_bias_grad_args args = {0};
    args.rows = rows;
    args.cols = cols;
    args.ld = ld;
    args.dtype = dtype;
    launch_shape shape = {{op_gemm_ceil_div(cols, GEMM_BGRAD_COLS), members, 1},
                          {GEMM_BGRAD_THREADS, 1, 1},
                          0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_GEMM_BIAS_GRAD, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(gemm_bias_grad_args, dy), dy, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(gemm_bias_grad_args, out), out, PROG_WRITE));
    op_group group = {count, row_offsets, first_dims};
    return op_group_use(p, op, offsetof(gemm_bias_grad_args, group), &group);
}
