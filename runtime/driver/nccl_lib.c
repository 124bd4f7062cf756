#include "runtime/driver/nccl_lib.h"

#include <dirent.h>   // opendir: the Python installations' folders
#include <dlfcn.h>    // dlopen, dlsym
#include <pthread.h>  // pthread_once
#include <stdio.h>
#include <stdlib.h>   // getenv
#include <string.h>

// Written by the one nccl_load_once of the process, read-only afterwards (nccl_lib.h).
nccl_table nccl;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static qt_status nccl_status;
static char nccl_message[QT_ERROR_MESSAGE_MAX];

#define QT_NCCL_LIBRARY "libnccl.so.2"

// The places tried so far, for the message when none loads; and where the search stands.
typedef struct nccl_search {
    void *library;
    char path[4096];   // the library that loaded
    char tried[2048];  // the places tried, ", "-separated, cut at the buffer's end
} nccl_search;

// The search of the one nccl_load_once (too large for a thread's stack; read-only afterwards).
static nccl_search nccl_found;

static void nccl_try(nccl_search *s, const char *path) {
    if (s->library) return;
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library) {
        s->library = library;
        snprintf(s->path, sizeof s->path, "%s", path);
        return;
    }
    size_t used = strlen(s->tried);
    snprintf(s->tried + used, sizeof s->tried - used, "%s%s", used ? ", " : "", path);
}

static void nccl_try_in(nccl_search *s, const char *folder) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/" QT_NCCL_LIBRARY, folder) < (int)sizeof path) {
        nccl_try(s, path);
    }
}

// <prefix>/lib/python3.*/{site,dist}-packages/nvidia/nccl/lib, the folders in directory order.
static void nccl_try_python(nccl_search *s, const char *prefix) {
    if (!prefix || !prefix[0] || s->library) return;
    char lib[2048];
    if (snprintf(lib, sizeof lib, "%s/lib", prefix) >= (int)sizeof lib) return;
    DIR *dir = opendir(lib);
    if (!dir) return;
    for (struct dirent *e = readdir(dir); e && !s->library; e = readdir(dir)) {
        if (strncmp(e->d_name, "python3", 7) != 0) continue;
        static const char *const kinds[] = {"site-packages", "dist-packages"};
        for (int k = 0; k < 2; k++) {
            char folder[3072];
            if (snprintf(folder, sizeof folder, "%s/%s/%s/nvidia/nccl/lib", lib, e->d_name,
                         kinds[k]) >= (int)sizeof folder) {
                continue;
            }
            DIR *probe = opendir(folder);  // only folders that exist enter the message
            if (!probe) continue;
            closedir(probe);
            nccl_try_in(s, folder);
        }
    }
    closedir(dir);
}

static void nccl_find(nccl_search *s) {
    const char *given = getenv("QTRAIN_NCCL");
    if (given && given[0]) {
        DIR *dir = opendir(given);
        if (dir) {
            closedir(dir);
            nccl_try_in(s, given);
        } else {
            nccl_try(s, given);
        }
    }
    nccl_try(s, QT_NCCL_LIBRARY);
    const char *cuda_home = getenv("CUDA_HOME");
    if (cuda_home && cuda_home[0]) {
        char folder[2048];
        if (snprintf(folder, sizeof folder, "%s/lib64", cuda_home) < (int)sizeof folder) {
            nccl_try_in(s, folder);
        }
    }
    nccl_try_in(s, "/usr/local/cuda/lib64");
    nccl_try_python(s, getenv("VIRTUAL_ENV"));
    nccl_try_python(s, getenv("CONDA_PREFIX"));
    const char *home = getenv("HOME");
    if (home && home[0]) {
        char local[2048];
        if (snprintf(local, sizeof local, "%s/.local", home) < (int)sizeof local) {
            nccl_try_python(s, local);
        }
    }
    nccl_try_python(s, "/usr/local");
    nccl_try_python(s, "/usr");
}

typedef struct nccl_entry {
    const char *name;
    void **slot;
} nccl_entry;

#define QT_NCCL_ENTRY(name) {#name, (void **)&nccl.name}
static const nccl_entry nccl_entries[] = {
    QT_NCCL_ENTRY(ncclGetVersion),    QT_NCCL_ENTRY(ncclGetUniqueId),
    QT_NCCL_ENTRY(ncclCommInitRank),  QT_NCCL_ENTRY(ncclCommDestroy),
    QT_NCCL_ENTRY(ncclCommAbort),     QT_NCCL_ENTRY(ncclGetErrorString),
    QT_NCCL_ENTRY(ncclGroupStart),    QT_NCCL_ENTRY(ncclGroupEnd),
    QT_NCCL_ENTRY(ncclAllReduce),     QT_NCCL_ENTRY(ncclReduce),
    QT_NCCL_ENTRY(ncclBroadcast),     QT_NCCL_ENTRY(ncclAllGather),
    QT_NCCL_ENTRY(ncclReduceScatter),
};
#undef QT_NCCL_ENTRY

static qt_status nccl_load_now(void) {
    nccl_search *s = &nccl_found;
    nccl_find(s);
    if (!s->library) {
        return qt_fail(QT_ERR_NO_DRIVER,
                       "no NCCL: cannot load " QT_NCCL_LIBRARY " (tried %s); a run on several "
                       "GPUs needs NCCL 2.10 or newer: install it (the CUDA toolkit's or "
                       "PyTorch's nvidia-nccl wheel) or set QTRAIN_NCCL to the library or its "
                       "folder", s->tried);
    }
    size_t count = sizeof nccl_entries / sizeof nccl_entries[0];
    for (size_t i = 0; i < count; i++) {
        *nccl_entries[i].slot = dlsym(s->library, nccl_entries[i].name);
        if (!*nccl_entries[i].slot) {
            return qt_fail(QT_ERR_NO_DRIVER, "%s has no entry point %s; install NCCL 2.10 or "
                           "newer (or point QTRAIN_NCCL at it)", s->path, nccl_entries[i].name);
        }
    }
    // Only the wide communicator needs these (dp_comm_open_gpu says so when they are missing).
    *(void **)&nccl.ncclCommInitRankConfig = dlsym(s->library, "ncclCommInitRankConfig");
    *(void **)&nccl.ncclCommSplit = dlsym(s->library, "ncclCommSplit");
    int version = 0;
    if (nccl.ncclGetVersion(&version) != ncclSuccess || version < QT_NCCL_VERSION_MIN) {
        return qt_fail(QT_ERR_NO_DRIVER, "%s is NCCL version code %d; qtrain needs 2.10 "
                       "(21000) or newer (or point QTRAIN_NCCL at one)", s->path, version);
    }
    return QT_OK;
}

static void nccl_load_once(void) {
    nccl_status = nccl_load_now();
    if (nccl_status != QT_OK) {
        snprintf(nccl_message, sizeof nccl_message, "%s", qt_error_message());
    }
}

qt_status nccl_load(void) {
    pthread_once(&nccl_once, nccl_load_once);
    if (nccl_status != QT_OK) return qt_fail(nccl_status, "%s", nccl_message);
    return QT_OK;
}

const char *nccl_loaded_path(void) { return nccl_status == QT_OK ? nccl_found.path : ""; }

qt_status nccl_fail(ncclResult_t result, const char *call, const char *file, int line) {
    const char *text = nccl.ncclGetErrorString ? nccl.ncclGetErrorString(result) : "?";
    return qt_fail(QT_ERR_DRIVER, "%s:%d: %s failed: NCCL error %d: %s", file, line, call,
                   (int)result, text);
}
