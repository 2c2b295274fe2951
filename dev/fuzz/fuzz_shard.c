// fuzz_shard.c: the dataset reader on arbitrary bytes. Each input is one shard file, of version 1
// or 2: it is opened as the trainers open their data (dataset_open_checked: every check of the
// format), and when it is accepted, the batches of two optimizer steps are assembled as the
// trainers assemble them (the tiny preset's config for its shapes, the sampler, flow noise, image
// shifts, the loader, with the shard's cameras at their own sizes). Any crash, sanitizer report
// or hang is a defect of the reader.
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_file(data, size);
    Dataset ds;
    char err[2 * VLA_PATH_MAX + 512];
    if (dataset_open_checked(&ds, path, err, sizeof(err)) != 0) { return 0; }
    VLAConfig c = vla_preset("tiny")->config;
    c.n_cam = ds.n_cam; c.state_dim = ds.state_dim; c.action_dim = ds.action_dim;
    if (ds.img > 0) { c.img = ds.img; }  // (the loader lays batches out by the shard's cameras, whatever their sizes)
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
            for (int i = 0; i < B * c.max_text; i++) { sum += (float)b->tokens[i] * b->text_mask[i]; }
            size_t image_bytes = (size_t)B * cameras_frame_bytes(&b->cams);
            for (size_t i = 0; i < image_bytes; i += 61) { sum += b->images[i]; }
            if (isnan(sum) && b->B < 0) { abort(); }  // (keeps the sum from being optimized away)
            loader_release(&loader);
        }
        loader_stop(&loader);
    }
    dataset_close(&ds);
    return 0;
}
