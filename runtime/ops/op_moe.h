// op_moe: builders that append the mixture-of-experts routing kernels (ptx/moe.cu) to a program:
// routing and the deterministic permutation of the assignments by expert, gather, combine, and
// the backward ops of the combine and the router.
//
// Owns nothing; each builder checks its arguments, picks the launch shape, fills the args struct
// and declares every region the op reads and writes. Shapes, orders and numerics: ptx/moe.h.
//
// One layer's routing (op_moe_route_and_permute appends all of it, six ops):
//
//   route      logits -> probs, expert, gate
//   count      expert -> chunk_counts             (u32 [op_moe_chunks(A)][E] workspace)
//   scan       chunk_counts -> chunk_base (their prefix over chunks), first_dims; amax := 0
//   offsets    first_dims -> row_offsets          (quant_group's kernel, padded to row_align)
//   permute    -> row_of [A], assign_of [capacity]
//
// The member counts stay on the device: every later op (grouped quantization, grouped GEMMs,
// gather, combine) reads them there, and no op's launch depends on them (kernels are launched
// for the capacity, op_moe_capacity, and skip the rows past the active end).
#ifndef QT_OP_MOE_H
#define QT_OP_MOE_H

#include "ptx/moe.h"
#include "runtime/ops/op_quant_group.h"  // op_group
#include "runtime/program/program.h"

// Rows of the permuted grouped tensors: every padded member size is a multiple of row_align and
// the sizes sum to tokens * topk, so the padded total is at most tokens * topk + experts *
// (row_align - 1), rounded down to a multiple of row_align. 0 when it would not fit 32 bits.
uint64_t op_moe_capacity(uint32_t tokens, uint32_t topk, uint32_t experts, uint32_t row_align);
uint32_t op_moe_chunks(uint32_t assignments);

// The load-balancing loss's factor (ptx/moe.h): alpha E / (T^2 K), rounded once to FP32.
float op_moe_aux_scale(float alpha, uint32_t experts, uint32_t tokens, uint32_t topk);

typedef struct op_moe_routing {
    uint32_t tokens, experts, topk;
    uint32_t row_align, capacity;
    prog_ref logits;        // f32 [tokens][experts], read
    prog_ref probs;         // f32 [tokens][experts]
    prog_ref expert;        // u32 [tokens * topk]
    prog_ref gate;          // f32 [tokens * topk]
    prog_ref chunk_counts;  // u32 [op_moe_chunks][experts] workspace: the counts
    prog_ref chunk_base;    // u32 [op_moe_chunks][experts] workspace: their prefix over chunks
    prog_ref row_of;        // u32 [tokens * topk]
    prog_ref assign_of;     // u32 [capacity]
    op_group group;         // experts members: row_offsets u32 [E + 1], first_dims u32 [E]
    // Optional (arena NULL: not written): u32 [E], each first_dims rounded up to whole 16-row
    // groups. An NVFP4 tensor with RHT keeps the transform of a member's last, partial group in
    // its padding positions (ptx/quant_nvfp4.h), so a weight-gradient GEMM of two such tensors
    // contracts over whole groups to let the transform cancel: it takes these as first_dims.
    prog_ref whole_dims;
    // Optional (arena NULL and amax_slots 0: none): f32 [amax_slots][E], zeroed by the scan: the
    // per-member amaxes that the layer's producers of grouped tensors (op_moe_gather,
    // op_moe_combine_backward, op_act_grouped) merge in for the current-scaling casts that read
    // them, so that none of them needs a zeroing op of its own.
    prog_ref amax;
    uint32_t amax_slots;
} op_moe_routing;

qt_status op_moe_route_and_permute(program *p, const char *name, const op_moe_routing *r);

// A tensor of the gather and combine ops: where, and BF16 or F32.
typedef struct op_moe_tensor {
    prog_ref ref;
    uint32_t dtype;
} op_moe_tensor;

// out [capacity][cols] = the permuted rows of x [tokens][cols] (a copy in x's dtype; padding
// rows zero). amax (optional, f32 [E], zeroed before: a slot of r->amax): each expert's max |x|
// over its rows is merged in.
qt_status op_moe_gather(program *p, const char *name, const op_moe_routing *r, op_moe_tensor x,
                        uint32_t cols, prog_ref out, prog_ref amax);

// A BF16 router's input gradient, folded into the un-permute: dlogits [tokens][experts] times
// the router's weight, BF16 [experts][weight_cols] (weight_cols >= the combine's cols; the
// experts are the routing's).
typedef struct op_moe_router_term {
    op_moe_tensor dlogits;
    prog_ref weight;
    uint32_t weight_cols;
} op_moe_router_term;

// out [tokens][cols] = addend + router term + sum over the choices of (gate or 1) src[row]; gate,
// addend (arena NULL) and router (NULL) optional.
qt_status op_moe_combine(program *p, const char *name, const op_moe_routing *r, uint32_t cols,
                         op_moe_tensor src, prog_ref gate, op_moe_tensor addend,
                         const op_moe_router_term *router, op_moe_tensor out);

// dyp [capacity][cols] and dgate f32 [tokens * topk] from dy [tokens][cols] and the experts'
// outputs yp [capacity][cols]. amax (optional, f32 [E], zeroed before): each expert's max |dyp|
// over its valid rows is merged in.
qt_status op_moe_combine_backward(program *p, const char *name, const op_moe_routing *r,
                                  uint32_t cols, op_moe_tensor dy, op_moe_tensor yp,
                                  op_moe_tensor dyp, prog_ref dgate, prog_ref amax);

// dlogits [tokens][experts] from probs, the choices, dgate and the counts (aux_scale: the
// load-balancing loss's factor, 0 for none).
qt_status op_moe_router_backward(program *p, const char *name, const op_moe_routing *r,
                                 prog_ref dgate, float aux_scale, op_moe_tensor dlogits);

// row_offsets [count + 1] and first_dims [count] of `count` members of `rows` rows back to back.
qt_status op_moe_uniform_group(program *p, const char *name, const op_group *g, uint32_t rows);

#endif  // QT_OP_MOE_H
