/*
vla/single_gpu.cuh: the stand-ins of train_vla.cu's data-parallel calls for the build without NCCL,
which trains one GPU alone: nothing to sum over ranks, gather or watch, so each call does nothing
(or its one rank's part), and the trainer's loop reads the same with or without MULTI_GPU. It owns
the single-GPU Dist and Watchdog, and the refusal of -g or --nodes above 1.

Included by train_vla.cu in the #else of its MULTI_GPU section, after Run.
*/

typedef struct Dist {
    int sync;  // (set by the training loop, read by no one: no buckets to sum)
} Dist;

static void dist_sum(Dist* d, float* x, size_t n) {}
static void smolvla_bucket_done(SmolVLA* m, int b) {}
static void dist_step_sums(SmolVLA* m) {}
static void zero_sum_squares(SmolVLA* m) {}
static void zero_gather_params(SmolVLA* m) {}
static const float* zero_gather_state(SmolVLA* m, float* gathered, const float* shard) { return shard; }

#if !defined(TESTING) && !defined(VLA_LIBRARY)
// More than one GPU, here or on other nodes, takes NCCL
static void dist_check_args(const TrainArgs* args) {
    if (args->ranks > 1) {
        vla_fail("-g %d: this train_vla was built without NCCL and trains on one GPU; run -g 1, or rebuild where NCCL "
                 "is installed (make train_vla finds it)", args->ranks);
    }
    if (args->nodes > 1) { vla_fail("--nodes %d: this train_vla was built without NCCL: rebuild where NCCL is installed", args->nodes); }
}

static void dist_share_id(const Run* run) {}

// No communicator to watch: the ranks' step marks are kept, and read by no one
typedef struct {
    volatile double* busy_since;
    volatile int* step;
} Watchdog;

static void watchdog_start(Watchdog* w, const Run* run) {
    w->busy_since = (volatile double*)callocCheck(run->local_ranks, sizeof(double));
    w->step = (volatile int*)callocCheck(run->local_ranks, sizeof(int));
}

static void watchdog_stop(Watchdog* w) {
    free((void*)w->busy_since);
    free((void*)w->step);
}

static void dist_init(Dist* d, SmolVLA* m, const Run* run, int rank, Watchdog* w, int local) { memset(d, 0, sizeof(*d)); }
static void dist_free(Dist* d, const SmolVLA* m, Watchdog* w, int local) {}
static void dist_barrier(void) {}
static void dist_step_begin(Dist* d) {}
static double dist_wait_ms(Dist* d) { return 0.0; }
static void dist_print_waits(double wait_ms, int steps, double step_ms, int world) {}
static int run_ranks(Run* run, Watchdog* w, int (*train)(Run*, Watchdog*, int)) { return train(run, w, 0); }
#endif  // the trainer's side
