/*
bench_loader.c: how many samples per second the data loader assembles from shards, with the
trainer doing nothing but taking batches, so the figure is the loader's own throughput.

  make dev/bench_loader && dev/bench_loader.sh     (writes the benchmark shards, then runs this)
  dev/bench_loader SHARDS PRESET [BATCH] [WORKERS] [SECONDS] [AUGMENT]

A sample is what the trainer reads (a Batch row): every camera's frame at its stored size,
instruction token ids and mask, the normalized state padded to max_state_dim, the normalized action
chunk padded to max_action_dim with its pad flags, flow time and noise (H x max_action_dim).
WORKERS 0 assembles in the calling thread; 1 is one loader thread (one core).
*/
#include "../vla/common.h"
#include "../vla/config.h"
#include "../vla/shards.h"
#include "../vla/dataset.h"
#include "../vla/loader.h"
#include "../vla/cli.h"
#include "../vla/runs.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SHARDS PRESET [BATCH 16] [WORKERS 1] [SECONDS 3] [AUGMENT 0]\n", argv[0]);
        return 2;
    }
    if (flow_preset(argv[2]) == NULL) { vla_fail("unknown preset '%s': use tiny, small or smolvla", argv[2]); }
    int B = argc > 3 ? (int)parse_int_arg("batch", argv[3], 1, 4096) : 16;
    int workers = argc > 4 ? (int)parse_int_arg("workers", argv[4], 0, 64) : 1;
    double seconds = argc > 5 ? parse_float_arg("seconds", argv[5], 0.1f, 600.0f) : 3.0;
    int augment = argc > 6 ? (int)parse_int_arg("augment", argv[6], 0, 64) : 0;
    Dataset ds;
    dataset_open(&ds, argv[1]);
    FlowConfig c = config_for_data(argv[2], 0, &ds);
    Loader L;
    loader_start(&L, &ds, &c, 1, 0, 0, B, 1, augment, workers, 4);
    // warm-up: one pass over the data brings the shards into the page cache
    uint64_t warm_batches = ds.n_samples / (uint64_t)B + 1, batches = 0;
    for (uint64_t k = 0; k < warm_batches; k++) { loader_next(&L); loader_release(&L); }
    double t0 = wall_seconds(), wait0 = L.wait_seconds;
    while (wall_seconds() - t0 < seconds) {
        Batch* b = loader_next(&L);
        if (b->t[0] <= 0.0f) { vla_fail("flow time out of range: the loader is broken"); }
        loader_release(&L);
        batches++;
    }
    double dt = wall_seconds() - t0;
    double bytes = (double)L.slots[0].bytes / B;  // one sample's share of the batch's one block
    char waited[64], cams[128];
    if (workers > 0) { snprintf(waited, sizeof(waited), "the taker waited %.0f%% of the time", 100.0 * (L.wait_seconds - wait0) / dt); }
    else { snprintf(waited, sizeof(waited), "assembled in the taker's thread"); }
    printf("%-7s cameras %s, S %2d/%d, A %2d/%d, H %2d, batch %2d, workers %d, augment %d: %9.0f samples/s "
           "(%.0f MB/s of batch data; %s)\n", argv[2], cameras_describe(&ds.cams, cams, sizeof(cams)), c.state_dim,
           c.max_state_dim, c.action_dim, c.max_action_dim, c.chunk, B, workers, augment, batches * B / dt,
           batches * B * bytes / dt / 1e6, waited);
    loader_stop(&L);
    dataset_close(&ds);
    return 0;
}
