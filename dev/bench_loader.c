/*
bench_loader.c: how many samples per second the data loader assembles from shards, with the
trainer doing nothing but taking batches, so the figure is the loader's own throughput.

  make dev/bench_loader && dev/bench_loader.sh     (writes the benchmark shards, then runs this)
  dev/bench_loader SHARDS PRESET [BATCH] [WORKERS] [SECONDS] [AUGMENT]

A sample is what the trainer reads: every camera image, instruction bytes and mask, normalized
state, the normalized action chunk with its pad mask, flow time and noise. WORKERS 0 assembles in
the calling thread; 1 is one loader thread (one core).
*/
#include "../vla.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SHARDS PRESET [BATCH 16] [WORKERS 1] [SECONDS 3] [AUGMENT 0]\n", argv[0]);
        return 2;
    }
    const VLAPreset* preset = vla_preset(argv[2]);
    if (preset == NULL) { vla_fail("unknown preset '%s': use tiny, small or base", argv[2]); }
    int B = argc > 3 ? (int)parse_int_arg("batch", argv[3], 1, 4096) : 16;
    int workers = argc > 4 ? (int)parse_int_arg("workers", argv[4], 0, 64) : 1;
    double seconds = argc > 5 ? parse_float_arg("seconds", argv[5], 0.1f, 600.0f) : 3.0;
    int augment = argc > 6 ? (int)parse_int_arg("augment", argv[6], 0, 64) : 0;
    Dataset ds;
    dataset_open(&ds, argv[1]);
    VLAConfig c = preset->config;
    c.n_cam = ds.n_cam; c.img = ds.img; c.state_dim = ds.state_dim; c.action_dim = ds.action_dim;
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
    double bytes = (double)c.n_cam * c.img * c.img * 3 + c.max_text * 5.0 + 4.0 * (c.state_dim + 2 * c.chunk * c.action_dim + c.chunk + 1);
    char waited[64];
    if (workers > 0) { snprintf(waited, sizeof(waited), "the taker waited %.0f%% of the time", 100.0 * (L.wait_seconds - wait0) / dt); }
    else { snprintf(waited, sizeof(waited), "assembled in the taker's thread"); }
    printf("%-6s %d cam x %3d px, S %2d, A %2d, H %2d, batch %2d, workers %d, augment %d: %9.0f samples/s "
           "(%.0f MB/s of batch data; %s)\n", argv[2], c.n_cam, c.img, c.state_dim, c.action_dim, c.chunk, B, workers,
           augment, batches * B / dt, batches * B * bytes / dt / 1e6, waited);
    loader_stop(&L);
    dataset_close(&ds);
    return 0;
}
