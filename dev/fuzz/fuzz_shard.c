// fuzz_shard.c: the dataset reader on arbitrary bytes. Each input is one shard file: it is opened
// as the trainers open their data (dataset_open_checked: every check of the format), and when it
// is accepted, the batches of two optimizer steps are assembled as the trainers assemble them (the
// tiny preset's config for its shapes, the sampler, flow noise, image shifts, the loader). Any
// crash, sanitizer report or hang is a defect of the reader.
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_file(data, size);
    Dataset ds;
    char err[2 * VLA_PATH_MAX + 512];
    if (dataset_open_checked(&ds, path, err, sizeof(err)) != 0) { return 0; }
    VLAConfig c = vla_preset("tiny")->config;
    c.n_cam = ds.n_cam; c.img = ds.img; c.state_dim = ds.state_dim; c.action_dim = ds.action_dim;
    if (vla_config_problem(&c) == NULL) {  // (an image side the patch does not divide: the trainer says so)
        dataset_warn_text_collisions(&ds, c.max_text);
        int B = ds.n_samples < 4 ? (int)ds.n_samples : 4, W = 2;
        Loader loader;
        loader_start(&loader, &ds, &c, 1337, 0, 0, B, W, 2, 0, 2);
        for (int job = 0; job < 2 * W; job++) {
            Batch* b = loader_next(&loader);
            float sum = 0.0f;  // every assembled value is read, so the sanitizers see every access
            for (int i = 0; i < B * c.chunk * c.action_dim; i++) { sum += b->actions[i] + b->eps[i]; }
            for (int i = 0; i < B * c.state_dim; i++) { sum += b->state[i]; }
            if (isnan(sum) && b->B < 0) { abort(); }  // (keeps the sum from being optimized away)
            loader_release(&loader);
        }
        loader_stop(&loader);
    }
    dataset_close(&ds);
    return 0;
}
