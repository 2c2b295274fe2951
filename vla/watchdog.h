/*
vla/watchdog.h: the NCCL watchdog of train_vla's data parallelism. NCCL reports failures
asynchronously, and a rank that hangs or dies makes the others wait in their collectives forever.
So a thread per process polls every local communicator's asynchronous error and how long each rank
has been in its current step; on an error, or a step longer than --nccl-timeout, it aborts the
communicators, names the rank and ends the process with exit status 1. Checkpoints are written to a
temporary file and renamed, so the last one is intact, and -y 1 continues from it. Without NCCL
(MULTI_GPU undefined) only the ranks' step marks remain, read by no one. Host only: Watchdog,
watchdog_start, watchdog_stop. Needs common.h, cli.h and, with MULTI_GPU, nccl.h.
*/
#ifndef VLA_WATCHDOG_H
#define VLA_WATCHDOG_H

#include <errno.h>
#include <pthread.h>
#include <unistd.h>
#include "common.h"
#include "cli.h"
#if defined(MULTI_GPU)
#include <nccl.h>
#endif

// What the watchdog watches: this process's ranks (node `node`, local_ranks GPUs of world) and
// their step marks, which each rank's loop sets
typedef struct {
    int local_ranks, node, world;
    double timeout;               // --nccl-timeout, seconds
    const char* output;           // the run's folder, for the line on its checkpoints
    volatile int* aborting;       // set before the abort: the CUDA checks of the ranks then wait for the end
    volatile double* busy_since;  // (local_ranks) when its current step started, 0 between steps
    volatile int* step;           // (local_ranks) the step it is in
#if defined(MULTI_GPU)
    ncclComm_t* comms;            // (local_ranks) each rank's, once it has one
    volatile int done;
    pthread_t thread;
#endif
} Watchdog;

#if defined(MULTI_GPU)
static void watchdog_fault(Watchdog* w, const char* what) {
    *w->aborting = 1;
    char left[2 * VLA_PATH_MAX + 128];
    fprintf(stderr, "error: %s: aborting NCCL; %s (NCCL_DEBUG=INFO says more)\n", what,
            train_checkpoint_left(w->output, left, sizeof(left)));
    fflush(stderr);
    for (int r = 0; r < w->local_ranks; r++) {
        if (w->comms[r] != NULL) { ncclCommAbort(w->comms[r]); }
    }
    _exit(1);  // not exit(): the ranks' threads may still be waiting inside CUDA
}

static void* watchdog_main(void* arg) {
    Watchdog* w = (Watchdog*)arg;
    while (!w->done) {
        usleep(100000);
        double now = wall_seconds();
        char what[400];
        for (int r = 0; r < w->local_ranks; r++) {
            int rank = w->node * w->local_ranks + r;
            ncclResult_t err = ncclSuccess;
            if (w->comms[r] != NULL) { ncclCommGetAsyncError(w->comms[r], &err); }
            if (err != ncclSuccess && err != ncclInProgress) {
                snprintf(what, sizeof(what), "NCCL reported '%s' on rank %d (node %d, GPU %d) in step %d",
                         ncclGetErrorString(err), rank, w->node, r, w->step[r] + 1);
                watchdog_fault(w, what);
            }
        }
        // every rank of this node stuck past the timeout, named together with its step
        char stuck[300] = "";
        double longest = 0.0;
        for (int r = 0; r < w->local_ranks; r++) {
            double since = w->busy_since[r];
            if (since > 0.0 && now - since > w->timeout) {
                size_t len = strlen(stuck);
                snprintf(stuck + len, sizeof(stuck) - len, "%s%d (GPU %d, step %d)", len > 0 ? ", " : "",
                         w->node * w->local_ranks + r, r, w->step[r] + 1);
                if (now - since > longest) { longest = now - since; }
            }
        }
        if (stuck[0] != '\0') {
            snprintf(what, sizeof(what),
                     "rank(s) %s of node %d made no progress for %.0f s (--nccl-timeout): a rank of "
                     "the run is hung or gone",
                     stuck, w->node, longest);
            watchdog_fault(w, what);
        }
    }
    return NULL;
}
#endif  // MULTI_GPU

// Starts watching (a thread where NCCL is and the world has more than one rank)
static void watchdog_start(Watchdog* w, int local_ranks, int node, int world, double timeout, const char* output,
                           volatile int* aborting) {
    memset(w, 0, sizeof(*w));
    w->local_ranks = local_ranks; w->node = node; w->world = world;
    w->timeout = timeout; w->output = output; w->aborting = aborting;
    w->busy_since = (volatile double*)callocCheck(local_ranks, sizeof(double));
    w->step = (volatile int*)callocCheck(local_ranks, sizeof(int));
#if defined(MULTI_GPU)
    w->comms = (ncclComm_t*)callocCheck(local_ranks, sizeof(ncclComm_t));
    if (world > 1 && pthread_create(&w->thread, NULL, watchdog_main, w) != 0) {
        vla_fail("cannot start the NCCL watchdog thread: %s", strerror(errno));
    }
#endif
}

static void watchdog_stop(Watchdog* w) {
#if defined(MULTI_GPU)
    w->done = 1;
    if (w->world > 1) { pthread_join(w->thread, NULL); }
    free(w->comms);
#endif
    free((void*)w->busy_since);
    free((void*)w->step);
}

#endif  // VLA_WATCHDOG_H
