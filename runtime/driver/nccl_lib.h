// nccl_lib: the NCCL library, loaded at run time like the CUDA driver (runtime/driver/driver.h).
//
// Owns the process-wide table of NCCL entry points, filled once by nccl_load() (under
// pthread_once) and read-only from then until exit. The binaries link no NCCL and need no nccl.h
// to build: the few types and entry points qtrain calls are declared here with the ABI of NCCL
// 2.x (ncclUniqueId is 128 bytes; the enums' values are NCCL's), so qtrain starts anywhere and
// only a data-parallel run (`--gpus N`, N > 1) asks for the library.
//
// Where libnccl.so.2 is looked for, in order (the first that loads is taken):
//   1. $QTRAIN_NCCL: the library file itself, or a folder that holds libnccl.so.2
//   2. the dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache): dlopen("libnccl.so.2")
//   3. the CUDA toolkit: $CUDA_HOME/lib64, then /usr/local/cuda/lib64
//   4. a Python installation's NVIDIA wheel (PyTorch installs one):
//      <prefix>/lib/python3.*/{site,dist}-packages/nvidia/nccl/lib for the prefixes
//      $VIRTUAL_ENV, $CONDA_PREFIX, $HOME/.local, /usr/local and /usr
// When none loads, QT_ERR_NO_DRIVER names every place tried and the fix.
#ifndef QT_NCCL_LIB_H
#define QT_NCCL_LIB_H

#include <stddef.h>  // size_t

#include "runtime/driver/driver.h"  // CUstream; QT_ERR_*

typedef struct ncclComm *ncclComm_t;
#define QT_NCCL_UNIQUE_ID_BYTES 128
typedef struct ncclUniqueId {
    char internal[QT_NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef enum ncclResult_t {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;
typedef enum ncclDataType_t {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9
} ncclDataType_t;
typedef enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 }
    ncclRedOp_t;

// A communicator's configuration as NCCL 2.17 laid it out (ncclConfig_v21700): NCCL reads `size`
// bytes of it and takes its defaults for every later field, so the prefix stays valid in newer
// releases. magic and version as NCCL_CONFIG_INITIALIZER sets them; an unset int field is
// QT_NCCL_CONFIG_UNSET (NCCL_CONFIG_UNDEF_INT), an unset pointer NULL.
#define QT_NCCL_CONFIG_MAGIC 0xcafebeefu
#define QT_NCCL_CONFIG_VERSION 21700u
#define QT_NCCL_CONFIG_UNSET (-2147483647 - 1)
typedef struct nccl_config {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cga_cluster_size;
    int min_ctas;
    int max_ctas;
    const char *net_name;
} nccl_config;

// The entry points qtrain calls, with NCCL's prototypes (a cudaStream_t is a CUstream).
typedef struct nccl_table {
    ncclResult_t (*ncclGetVersion)(int *version);
    ncclResult_t (*ncclGetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*ncclCommInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
    ncclResult_t (*ncclCommDestroy)(ncclComm_t comm);
    ncclResult_t (*ncclCommAbort)(ncclComm_t comm);
    const char *(*ncclGetErrorString)(ncclResult_t result);
    ncclResult_t (*ncclGroupStart)(void);
    ncclResult_t (*ncclGroupEnd)(void);
    ncclResult_t (*ncclAllReduce)(const void *send, void *recv, size_t count,
                                  ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                  CUstream stream);
    ncclResult_t (*ncclReduce)(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, int root, ncclComm_t comm, CUstream stream);
    ncclResult_t (*ncclBroadcast)(const void *send, void *recv, size_t count,
                                  ncclDataType_t type, int root, ncclComm_t comm,
                                  CUstream stream);
    ncclResult_t (*ncclAllGather)(const void *send, void *recv, size_t count,
                                  ncclDataType_t type, ncclComm_t comm, CUstream stream);
    ncclResult_t (*ncclReduceScatter)(const void *send, void *recv, size_t count,
                                      ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                      CUstream stream);
    // Optional (NULL when the library lacks them): 2.14 and 2.18 respectively.
    ncclResult_t (*ncclCommInitRankConfig)(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                           int rank, nccl_config *config);
    ncclResult_t (*ncclCommSplit)(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  nccl_config *config);
} nccl_table;

extern nccl_table nccl;

// The oldest NCCL whose entry points all match the prototypes above (ncclAvg, ncclBfloat16 and
// stream capture of every collective): 2.10.
#define QT_NCCL_VERSION_MIN 21000

// Loads libnccl.so.2 from the places above and resolves every entry point, once per process
// (every later call returns the first one's result, with its message). QT_ERR_NO_DRIVER with
// the places tried when no library loads, or when one lacks an entry point or is too old.
qt_status nccl_load(void);
// The path the library was loaded from ("" before a successful nccl_load).
const char *nccl_loaded_path(void);

// Formats a failed NCCL call into the status message and returns QT_ERR_DRIVER.
qt_status nccl_fail(ncclResult_t result, const char *call, const char *file, int line);

// Checks one NCCL call, like QT_CU.
#define QT_NCCL(call)                                                              \
    do {                                                                           \
        ncclResult_t qt_nccl_result_ = nccl.call;                                  \
        if (qt_nccl_result_ != ncclSuccess)                                        \
            return nccl_fail(qt_nccl_result_, #call, __FILE__, __LINE__);          \
    } while (0)

#endif  // QT_NCCL_LIB_H
