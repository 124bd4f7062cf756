// program: an op table, the unit a backend runs, captures and replays.
//
// Owns its ops (kernel id, launch shape, args bytes, the arena regions each op reads and writes)
// for the life of the runtime; built once at start-up and never changed after prog_resolve.
//
//   build (PLAN)                          resolve (arenas FROZEN)          run
//   prog_append(kernel, shape, args) --> prog_use(op, field, region) --> prog_resolve --> backend
//        |                                    |                               |
//        |  args bytes with pointer fields    |  widens the region's          |  writes each
//        |  left zero                         |  lifetime to this op          |  region address
//        v                                    v                               v  into its field
//   ops[op_count]                         refs[] per op                   args ready to launch
//
// Op indices are global across programs (each program starts at its op_base), so transient
// regions of different modes never look simultaneously live to the planner, as the modes never
// run at the same time.
//
// The op table is the caller's memory (prog_storage_bytes for a given number of ops), sized
// from the model at planning: runtime/run/run.h builds every program once as a counting program (no
// table: each op is checked as it is built, then only counted) and then again into tables of
// exactly the counted size.
#ifndef QT_PROGRAM_H
#define QT_PROGRAM_H

#include "arena/arena.h"             // arena, arena_handle
#include "ptx/kernels.h"             // kernel_id, QT_ARGS_BYTES_MAX
#include "runtime/driver/modules.h"  // launch_shape

// Regions one op touches: a property of the op builders (grouped ops and the multi-tensor
// optimizer split beyond it), not of the model. 80 keeps the multi-tensor optimizer of the bench
// recipes' residual MLP in one launch when its nine MXFP8 weights declare six regions each
// (grad, master, m, v, and the codes and scales the update writes): a second launch would wait
// for the first one's tail.
#define PROG_OP_REFS_MAX 80
#define PROG_OP_NAME_MAX 48
#define PROG_ARGS_FIELD_NONE 0xFFFFu  // a region the op touches without an args field for it

// PROG_ADDRESS: the op takes the region's address (to store it in a table that a later op
// reads) and touches none of its bytes, so the use neither widens the region's lifetime nor
// orders the op against the region's users; the op that dereferences the stored address
// declares its own access.
typedef enum prog_access {
    PROG_ADDRESS = 0,
    PROG_READ = 1,
    PROG_WRITE = 2,
    PROG_READ_WRITE = 3
} prog_access;

// A byte position inside an arena region.
typedef struct prog_ref {
    arena *arena;
    arena_handle region;
    uint64_t offset;
} prog_ref;

typedef struct prog_op_ref {
    prog_ref ref;
    uint16_t args_offset;  // where the absolute address goes in args, or PROG_ARGS_FIELD_NONE
    uint8_t access;        // prog_access
} prog_op_ref;

typedef struct prog_op {
    kernel_id kernel;
    char name[PROG_OP_NAME_MAX];
    launch_shape shape;
    uint32_t args_bytes;
    _Alignas(16) uint8_t args[QT_ARGS_BYTES_MAX];
    uint32_t ref_count;
    prog_op_ref refs[PROG_OP_REFS_MAX];
    // Off the program's main line: an op whose results only later ops marked the same way and
    // the op that folds them read (the gradient norm's partial sums during the backward pass).
    // A captured graph gives these a stream of their own, so that no other op queues behind one
    // (runtime/backend/capture.h).
    bool beside;
} prog_op;

typedef struct program {
    char mode[16];          // "train", "eval", "infer", or a test's name
    int32_t op_base;        // global index of ops[0]
    uint32_t op_count;
    uint32_t op_capacity;   // entries of ops; 0: a counting program
    bool resolved;
    prog_op *ops;           // [op_capacity], the caller's (prog_init)
    uint32_t *op_scratch;   // [2 x op_capacity], in the same storage: working memory of one
                            // pass over the ops at a time (critical path, graph capture, profile)
    prog_op pending;        // a counting program's op being built
} program;

// Bytes of storage for a program of `capacity` ops (16-byte aligned memory).
uint64_t prog_storage_bytes(uint32_t capacity);
// Starts an empty program over `storage` (prog_storage_bytes(capacity) bytes, the caller's,
// outliving the program). storage NULL (capacity 0): a counting program, which checks every op
// and use as it comes (the regions' bounds when their arenas have tables), keeps only the last
// op, and counts.
void prog_init(program *p, const char *mode, int32_t op_base, void *storage, uint32_t capacity);
bool prog_counting(const program *p);
// The entry of op `op` (a counting program: the last op appended only).
prog_op *prog_op_at(program *p, uint32_t op);
// Appends an op; its args are copied now and patched by prog_resolve. QT_ERR_CAPACITY when the
// table is full (it holds the ops its plan counted).
qt_status prog_append(program *p, kernel_id kernel, const char *name, const launch_shape *shape,
                      const void *args, size_t args_bytes, uint32_t *op_out);
// Declares that op reads and/or writes ref; if args_offset is not PROG_ARGS_FIELD_NONE the
// region's absolute address (+ ref.offset) is written there by prog_resolve. Widens the region's
// lifetime to include the op.
qt_status prog_use(program *p, uint32_t op, uint32_t args_offset, prog_ref ref,
                   prog_access access);
// prog_use on an op appended earlier than the last one: an op whose regions are known only once
// later ops are built (the step's first op, which zeroes the amax slots that the step's
// producers take as they are built). A counting program, which keeps its last op only, checks
// the use, widens the lifetime and drops the entry. The builder keeps such an op below
// PROG_OP_REFS_MAX itself: the counting pass cannot count its refs.
qt_status prog_use_late(program *p, uint32_t op, uint32_t args_offset, prog_ref ref,
                        prog_access access);
// Writes `bytes` of op's args at args_offset (before prog_resolve): a value its builder learns
// once later ops are built. A counting program's earlier op is gone: nothing is written.
// Marks op (the one just appended) as off the main line (prog_op.beside).
void prog_set_beside(program *p, uint32_t op);
void prog_args_set(program *p, uint32_t op, uint32_t args_offset, const void *value,
                   size_t bytes);
// A prog_ref without an arena stands for an absent optional buffer: its args field stays 0, which
// the kernels read as "no such input or output".
static inline bool prog_ref_present(prog_ref ref) { return ref.arena != NULL; }
// Whether two refs point into the same region (at any offsets).
static inline bool prog_ref_same_region(prog_ref a, prog_ref b) {
    return a.arena != NULL && a.arena == b.arena && a.region == b.region;
}
// prog_use after asserting that the `bytes` the op reaches from ref.offset lie inside the region.
qt_status prog_use_span(program *p, uint32_t op, uint32_t args_offset, prog_ref ref,
                        uint64_t bytes, prog_access access);
// prog_use_span for an optional buffer: nothing when the ref is absent.
qt_status prog_use_optional(program *p, uint32_t op, uint32_t args_offset, prog_ref ref,
                            uint64_t bytes, prog_access access);
// Writes every region address into the ops' args; all arenas used must be FROZEN (not for a
// counting program).
void prog_resolve(program *p);
int32_t prog_op_index(const program *p, uint32_t op);  // global index of ops[op]

// Whether two ops must keep their program order when they may run concurrently (a captured
// graph's branches): some region one declares shares bytes with some region the other declares
// (same arena, packed offsets; a use covers its whole region, which is coarser than needed and
// never unsafe) and either access writes. Regions that share bytes at different lifetimes
// overlap here, which orders their users too. The arenas must be packed.
bool prog_ops_conflict(const prog_op *x, const prog_op *y);
// Ops on the longest chain of conflicting ops: the least number of kernels one after another
// that a graph of the program can have (the op count when nothing can overlap).
uint32_t prog_critical_path(const program *p);
// The same chain when only the ops' own buffers order them (a region and itself, or a part and
// its whole): what the program's data flow needs, without the orderings that the packing's
// reuse of freed bytes adds (arena.h pack_gap trades bytes for fewer of those).
uint32_t prog_critical_path_buffers(const program *p);
// The op table; after the arenas are packed, with the program's critical path.
void prog_print(const program *p, FILE *out);

#endif  // QT_PROGRAM_H
