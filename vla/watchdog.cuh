/*
vla/watchdog.cuh: the NCCL fault watchdog of train_vla.cu's MULTI_GPU build. NCCL reports failures
asynchronously, and a rank that hangs or dies makes the others wait in their collectives forever.
So a watchdog thread per process polls every local communicator's asynchronous error and how long
each rank has been in its current step; on an error, or a step longer than --nccl-timeout, it
aborts the communicators, names the rank and ends the process with exit status 1. Checkpoints are
written to a temporary file and renamed, so the last one is intact, and -y 1 continues from it.
(The build without NCCL has a stand-in in vla/single_gpu.cuh.)

It owns Watchdog, watchdog_start and watchdog_stop. Included by train_vla.cu's MULTI_GPU section,
after Run; it uses run_aborting, train_checkpoint_left, wall_seconds and callocCheck.
*/

typedef struct {
    const Run* run;
    ncclComm_t* comms;           // (local_ranks) each rank's, once it has one
    volatile double* busy_since; // (local_ranks) when its current step started, 0 between steps
    volatile int* step;          // (local_ranks) the step it is in
    volatile int done;
    pthread_t thread;
} Watchdog;

static void watchdog_fault(Watchdog* w, const char* what) {
    run_aborting = 1;
    char left[2 * VLA_PATH_MAX + 128];
    fprintf(stderr, "error: %s: aborting NCCL; %s (NCCL_DEBUG=INFO says more)\n", what,
            train_checkpoint_left(w->run->args.output, left, sizeof(left)));
    fflush(stderr);
    for (int r = 0; r < w->run->local_ranks; r++) {
        if (w->comms[r] != NULL) { ncclCommAbort(w->comms[r]); }
    }
    _exit(1);  // not exit(): the ranks' threads may still be waiting inside CUDA
}

static void* watchdog_main(void* arg) {
    Watchdog* w = (Watchdog*)arg;
    const Run* run = w->run;
    while (!w->done) {
        usleep(100000);
        double now = wall_seconds();
        char what[400];
        for (int r = 0; r < run->local_ranks; r++) {
            int rank = run->node * run->local_ranks + r;
            ncclResult_t err = ncclSuccess;
            if (w->comms[r] != NULL) { ncclCommGetAsyncError(w->comms[r], &err); }
            if (err != ncclSuccess && err != ncclInProgress) {
                snprintf(what, sizeof(what), "NCCL reported '%s' on rank %d (node %d, GPU %d) in step %d",
                         ncclGetErrorString(err), rank, run->node, r, w->step[r] + 1);
                watchdog_fault(w, what);
            }
        }
        // every rank of this node stuck past the timeout, named together with its step
        char stuck[300] = "";
        double longest = 0.0;
        for (int r = 0; r < run->local_ranks; r++) {
            double since = w->busy_since[r];
            if (since > 0.0 && now - since > run->args.nccl_timeout) {
                size_t len = strlen(stuck);
                snprintf(stuck + len, sizeof(stuck) - len, "%s%d (GPU %d, step %d)", len > 0 ? ", " : "",
                         run->node * run->local_ranks + r, r, w->step[r] + 1);
                if (now - since > longest) { longest = now - since; }
            }
        }
        if (stuck[0] != '\0') {
            snprintf(what, sizeof(what), "rank(s) %s of node %d made no progress for %.0f s (--nccl-timeout): a rank of "
                     "the run is hung or gone", stuck, run->node, longest);
            watchdog_fault(w, what);
        }
    }
    return NULL;
}

static void watchdog_start(Watchdog* w, const Run* run) {
    memset(w, 0, sizeof(*w));
    w->run = run;
    w->busy_since = (volatile double*)callocCheck(run->local_ranks, sizeof(double));
    w->step = (volatile int*)callocCheck(run->local_ranks, sizeof(int));
    w->comms = (ncclComm_t*)callocCheck(run->local_ranks, sizeof(ncclComm_t));
    if (run->world > 1 && pthread_create(&w->thread, NULL, watchdog_main, w) != 0) {
        vla_fail("cannot start the NCCL watchdog thread: %s", strerror(errno));
    }
}

static void watchdog_stop(Watchdog* w) {
    w->done = 1;
    if (w->run->world > 1) { pthread_join(w->thread, NULL); }
    free(w->comms);
    free((void*)w->busy_since);
    free((void*)w->step);
}
