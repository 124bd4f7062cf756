// op_gemm: builders that append the GEMM kernels (ptx/gemm_portable.cu, ptx/gemm_skinny.cu), the
// bias gradient, and a GEMM with the activation that reads its D (op_gemm_act: a split GEMM's
// reduction fused with it, ptx/act.cu) to a program.
//
// Owns nothing; each builder checks the descriptor, picks the kernel and launch shape, fills the
// args struct (ptx/gemm.h) and declares every region the op reads and writes.
//
// A GEMM is described by its two operands, each one stored copy of a quantized tensor. For a
// Linear layer (x [T][K], W [N][K], dy [T][N]):
//
//   GEMM    D           A                    B                    m  n  k   grouped
//   fprop   y  [T][N]   x rowwise            W rowwise            T  N  K   GEMM_GROUP_M
//   dgrad   dx [T][K]   dy rowwise           W columnwise         T  K  N   GEMM_GROUP_M
//   wgrad   dW [N][K]   dy columnwise        x columnwise         N  K  T   GEMM_GROUP_K
//
// op_gemm_operand_of fills an operand from a copy's buffers and the tensor's logical shape, per
// the layouts of ptx/quant.h. Stacked per-member weights (GEMM_GROUP_M) add their member strides
// and GEMM_OPERAND_TENSOR_PER_MEMBER; grouped tensors pass their capacity as rows.
#ifndef QT_OP_GEMM_H
#define QT_OP_GEMM_H

#include "ptx/gemm.h"                 // gemm_args, GEMM_*
#include "runtime/ops/op_act.h"       // op_act_tensor
#include "runtime/ops/op_core.h"      // OP_PLAN_SMS
#include "runtime/program/program.h"  // program, prog_ref

typedef struct op_gemm_operand {
    prog_ref data;          // codes
    prog_ref scale;         // block scales; .arena NULL when the format has none
    prog_ref tensor_scale;  // f32 [1] or [count]: fp8 scale_inv, nvfp4 amax; else .arena NULL
    uint32_t elem;          // GEMM_ELEM_*
    uint32_t flags;         // GEMM_OPERAND_*
    uint32_t ld;            // elements between stored rows
    uint32_t scale_ld;      // entries between scale rows
    uint64_t data_member_bytes;   // GEMM_GROUP_M operand B only
    uint64_t scale_member_bytes;  // GEMM_GROUP_M operand B only
} op_gemm_operand;

// The portable tier's tile of a GEMM (gemm.h GEMM_TILE_*): AUTO picks it from the shape (see
// op_gemm_tile); tests and benchmarks may force one, with the same results.
#define OP_GEMM_TILE_AUTO 0u
#define OP_GEMM_TILE_LARGE 1u
#define OP_GEMM_TILE_SMALL 2u

typedef struct op_gemm_desc {
    uint32_t format;    // GEMM_FORMAT_*
    uint32_t grouping;  // GEMM_DENSE | GEMM_GROUP_M | GEMM_GROUP_K
    uint32_t flags;     // GEMM_FLAG_*
    uint32_t m, n, k;   // GEMM_GROUP_M: m = rows capacity; GEMM_GROUP_K: k = rows capacity
    op_gemm_operand a, b;
    float alpha;
    prog_ref d;               // [m][ldd] (GEMM_GROUP_K: one per member, d_member_bytes apart)
    uint32_t d_dtype;         // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t ldd;             // 0: n
    uint64_t d_member_bytes;  // GEMM_GROUP_K: 0 means m * ldd elements
    prog_ref c;               // .arena NULL: none; else read with beta (may be d itself)
    float beta;
    prog_ref bias;            // [n] (grouped: per member, bias_member_bytes apart) or .arena NULL
    uint32_t bias_dtype;
    uint64_t bias_member_bytes;
    uint32_t count;           // grouped: members (>= 1)
    prog_ref row_offsets;     // u32 [count + 1], device
    prog_ref first_dims;      // u32 [count], device
    uint32_t tile;            // OP_GEMM_TILE_*; 0 (AUTO) unless forced
    uint32_t split_parts;     // split-K parts (gemm.h), 0 or 1 for none; dense only
    prog_ref workspace;       // split-K: f32 [split_parts][m][n] (op_gemm_workspace_bytes)
    // .arena NULL: none; else D's gradient-norm units (gemm.h), written with D: f32 [U] then
    // u32 [U], U = count x qt_gemm_norm_unit_count(m, n) for GEMM_GROUP_K (each member's D's),
    // else qt_gemm_norm_unit_count(m, n). Dense or K-grouped f32 D, no C, no bias.
    prog_ref norm_units;
    // .arena NULL: none; else D's maximum slot (gemm.h, gemm_args.d_max): u32, a step's amax
    // slot (zeroed before the GEMM). Dense only. A split GEMM or a skinny kernel leaves the slot
    // as it is (op_gemm_writes_d_max), which its reader takes as "no maximum".
    prog_ref d_max;
} op_gemm_desc;

// The operand for one stored copy of a quantized tensor of logical shape rows x cols (cols
// contiguous in the rowwise copy). rowwise: operand rows are the tensor's rows, k its columns;
// columnwise: operand rows are its columns, k its rows. scale_2d: fp8 block 128 x 128 scales.
op_gemm_operand op_gemm_operand_of(uint32_t format, uint32_t elem, uint32_t rows, uint32_t cols,
                                   bool columnwise, bool scale_2d, prog_ref data, prog_ref scale,
                                   prog_ref tensor_scale);

// A stacked weight: `members` tensors of member_rows x cols each, stored as one tensor of
// members x member_rows rows (the operand o as op_gemm_operand_of made it for that many rows),
// read as operand B of an M-grouped GEMM whose member i is member i of the stack: sets o's
// member strides for format f (scale_2d: FP8 block 128 x 128 scales) in the copy's direction.
// member_rows must be whole scaling blocks along the rows (qt_gemm_block_len), so that no block
// straddles two members. BF16 copies of any format take format GEMM_FORMAT_BF16.
void op_gemm_operand_stack(op_gemm_operand *o, uint32_t format, bool scale_2d, bool columnwise,
                           uint32_t member_rows, uint32_t cols);

// Split-K (gemm.h): the parts for a dense GEMM of this shape on a GPU of `sm_count` SMs, 1 when
// it is not split. A skinny kind M GEMM (op_gemm_skinny; a wgrad of at most 64 rows of D) gets
// about two of its 128-column blocks per SM, in parts of at least max(256, 16 m) rows (the moe8
// head's 16 x 2048 x 16384: 16 parts). Otherwise a pure function of (m, n, k, the portable tile
// op_gemm_tile picks, sm_count):
// with T tiles of that tile, a GEMM of T <= sm_count / 2 tiles and at least
// OP_GEMM_SPLIT_BLOCKS_MIN 128-wide K blocks (a shorter contraction ends before the reduction's
// launch would pay for itself: the 10 x 1024 x 256 head wgrad stays whole) gets
// min(sm_count / T, ceil(k / 128), GEMM_SPLIT_PARTS_MAX) parts of whole 128-wide K blocks each
// (fewer when the blocks do not spread evenly: no part is empty). Planners pass
// OP_GEMM_SPLIT_SMS, not the device's count, so that a program and its bits are the same on
// every GPU and on the reference backend. 256 x 1024 x 1024 (64 small tiles) gets 2 parts of
// 512; the 256 x 10 x 1024 head (4 tiles) 8 of 128. Such GEMMs have far fewer than the 32
// tiles the sm_90a tier takes (gemm_tier.c), so a split never moves a GEMM off that tier.
#define OP_GEMM_SPLIT_SMS OP_PLAN_SMS
#define OP_GEMM_SPLIT_BLOCKS_MIN 4u
uint32_t op_gemm_split_parts(const op_gemm_desc *g, uint32_t sm_count);
// k per part of a split into `parts` (a multiple of GEMM_SPLIT_K_ALIGN; parts > 1).
uint32_t op_gemm_split_k(uint32_t k, uint32_t parts);
// Bytes of the workspace of a split into `parts` parts (0 when parts <= 1).
uint64_t op_gemm_workspace_bytes(const op_gemm_desc *g, uint32_t parts);

// The skinny kernel that runs this GEMM (gemm.h "Skinny GEMMs": GEMM_SKINNY_N or _M), or
// GEMM_SKINNY_NONE for the format's portable kernel: dense BF16 GEMMs of the automatic tile with
// n (kind N: A and B K-major) or m (M: both outer-major) at most GEMM_SKINNY_MAX, whose streamed
// operands' rows are whole 16-byte pieces (op_gemm.c says why); a k of at most 64 stays on the
// tiers. A function of the descriptor alone; the kernels give the portable tier's bits.
uint32_t op_gemm_skinny(const op_gemm_desc *g);
// The kernel the GEMM's op names: the skinny kernel, else the format's portable kernel (which the
// GPU backend may hand to the sm_90a tier at launch, runtime/backend/gemm_tier.h).
kernel_id op_gemm_kernel(const op_gemm_desc *g);

// Whether the GEMM's op writes the slot g->d_max: one is given, and the GEMM is dense, unsplit
// and not skinny (op_gemm_kernel names a portable kernel, which the sm_90a tier may take).
bool op_gemm_writes_d_max(const op_gemm_desc *g);

// Appends the GEMM (split-K: the GEMM writing its parts, then qt_gemm_split_reduce, which
// op_gemm_act may fuse with an activation); nothing when m or n is 0. QT_ERR_INPUT when the
// launch would exceed the grid limits (more than 65535 row tiles or members).
qt_status op_gemm(program *p, const char *name, const op_gemm_desc *g);
launch_shape op_gemm_shape(const op_gemm_desc *g);

// The activation that reads a GEMM's D (a linear layer followed by ReLU, GELU or SiLU), for
// op_gemm_act. Forward: out = act(D + bias) (op_act_forward with x = D); backward: D is the
// gradient at the activation's output and out = dx from the saved pre-activation x
// (op_act_backward with dy = D). Tensors are [m][n] of the GEMM; amax as op_act_forward's.
typedef struct op_gemm_act_desc {
    const char *name;    // the activation's op ("gelu#1.y"), fused or not
    uint32_t act;        // QT_ACT_RELU | QT_ACT_GELU | QT_ACT_SILU
    bool backward;
    op_act_tensor x;     // backward: the saved pre-activation; forward: unused
    op_act_tensor bias;  // the activation's own bias [n], or OP_ACT_NONE
    op_act_tensor out;   // forward: y; backward: dx
    prog_ref amax;       // optional f32 [1], zeroed by the caller: max |out| merged in
} op_gemm_act_desc;

// Whether op_gemm_act fuses: a split GEMM (split_parts > 1, as the caller planned it) whose D
// is dense and contiguous (ldd = n).
bool op_gemm_act_fuses(const op_gemm_desc *g);
// Appends the GEMM, then the activation of its D. Unfused: op_gemm (split: the GEMM and
// qt_gemm_split_reduce), then op_act_forward or op_act_backward. Where op_gemm_act_fuses, the
// split GEMM's reduction and the activation are one op, qt_gemm_split_reduce_act_fwd or _bwd
// (ptx/act.h gemm_act_args), which takes the activation's name (no "<name>.sum" op), one launch
// fewer with the same bits in D and out. D is written in both forms. m, n >= 1.
qt_status op_gemm_act(program *p, const char *name, const op_gemm_desc *g,
                      const op_gemm_act_desc *act);

// GEMM_TILE_LARGE or GEMM_TILE_SMALL: the forced tile, else the large one unless its grid has
// fewer than OP_GEMM_SMALL_TILE_BELOW blocks of work. A function of the shape alone.
#define OP_GEMM_SMALL_TILE_BELOW 128u
uint32_t op_gemm_tile(const op_gemm_desc *g);

// The decode table of the emulated formats (gemm.h, GEMM_DECODE_*): out u16
// [256][GEMM_DECODE_TABLE_CODES(path)]; elem GEMM_ELEM_E4M3 or E5M2 for the MXFP8 paths; pieces
// of `piece` (16 or 8) elements.
qt_status op_gemm_decode_table(program *p, const char *name, uint32_t path, uint32_t elem,
                               uint32_t piece, prog_ref out);

// out[i][col] (f32, [max(count, 1)][cols]) = column sums of dy [rows][ld] (bf16 or f32) over all
// rows, or over member i's valid rows when count > 0 (row_offsets, first_dims as for op_gemm).
qt_status op_gemm_bias_grad(program *p, const char *name, prog_ref dy, uint32_t dtype,
                            uint32_t rows, uint32_t cols, uint32_t ld, uint32_t count,
                            prog_ref row_offsets, prog_ref first_dims, prog_ref out);

#endif  // QT_OP_GEMM_H
