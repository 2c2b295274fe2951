// fuzz_shard.c: the dataset reader on arbitrary bytes. Each input is one shard file, of version 1
// or 2: it is opened as the trainers open their data (dataset_open_checked: every check of the
// format), and when it is accepted, the batches of two optimizer steps are assembled as the
// trainers assemble them (the tiny preset's config with the shard's cameras and dims, as
// config_for_data makes it; the sampler, flow noise, image shifts, the loader, every camera at
// its own size). Any crash, sanitizer report or hang is a defect of the reader.
#include "fuzz_util.h"
#include "../../vla/config.h"
#include "../../vla/dataset.h"
#include "../../vla/loader.h"
#include "../../vla/runs.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_file(data, size);
    Dataset ds;
    char err[2 * VLA_PATH_MAX + 512];
    if (dataset_open_checked(&ds, path, err, sizeof(err)) != 0) { return 0; }
    FlowConfig c = flow_preset("tiny")->config;
    c.n_cam = ds.cams.n; c.state_dim = (int32_t)ds.state_dim; c.action_dim = (int32_t)ds.action_dim;
    // (dims past the padded widths: config_for_data refuses them, as flow_config_problem does)
    if (flow_config_problem(&c) == NULL && flow_data_problem(&c, &ds) == NULL) {
        dataset_warn_text_collisions(&ds, c.max_text);
        int B = ds.n_samples < 4 ? (int)ds.n_samples : 4, W = 2;
        Loader loader;
        loader_start(&loader, &ds, &c, 1337, 0, 0, B, W, 2, 0, 2);
        for (int job = 0; job < 2 * W; job++) {
            Batch* b = loader_next(&loader);
            float sum = 0.0f;  // every assembled value is read, so the sanitizers see every access
            for (int i = 0; i < B * c.chunk * c.max_action_dim; i++) { sum += b->actions[i] + b->eps[i]; }
            for (int i = 0; i < B * c.chunk; i++) { sum += b->action_is_pad[i]; }
            for (int i = 0; i < B * c.max_state_dim; i++) { sum += b->state[i]; }
            for (int i = 0; i < B * c.max_text; i++) { sum += (float)b->tokens[i] * b->token_mask[i]; }
            for (int k = 0; k < b->cams.n; k++) {
                size_t image_bytes = (size_t)B * b->cams.height[k] * b->cams.width[k] * 3;
                for (size_t i = 0; i < image_bytes; i += 61) { sum += b->images[k][i]; }
            }
            if (isnan(sum) && b->B < 0) { abort(); }  // (keeps the sum from being optimized away)
            loader_release(&loader);
        }
        loader_stop(&loader);
    }
    dataset_close(&ds);
    return 0;
}
