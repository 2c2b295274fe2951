// fuzz_shards.c: several shards opened together as one dataset, as -i A,B,C opens them
// (dataset_open_checked: each shard's checks, their agreement on cameras, dims and tokenizer, and
// the statistics pooled over them). Each input is 2 or 3 shards: a byte (the count less 2, mod
// 2), the sizes of all shards but the last (u32, little-endian, cut to what is left), then the
// shards. An accepted dataset must hold every shard's frames, have finite pooled statistics whose
// means lie between the shards' own and whose stds are usable, and assemble the first and last
// sample of each shard into a batch of the tiny preset's config.
#include "fuzz_util.h"
#include "../../vla/config.h"
#include "../../vla/shards.h"
#include "../../vla/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) { return 0; }
    int n = 2 + data[0] % 2;
    size_t at = 1 + 4 * (size_t)(n - 1);
    if (size < at) { return 0; }
    char list[3 * 64];
    list[0] = '\0';
    for (int k = 0; k < n; k++) {
        size_t len = size - at;
        if (k < n - 1) {
            uint32_t want;
            memcpy(&want, data + 1 + 4 * k, 4);
            if (want < len) { len = want; }
        }
        const char* path = fuzz_file_at(k, data + at, len);
        at += len;
        size_t used = strlen(list);
        snprintf(list + used, sizeof(list) - used, "%s%s", k > 0 ? "," : "", path);
    }
    Dataset ds;
    char err[4 * VLA_PATH_MAX + 512];
    err[0] = '\0';
    if (dataset_open_checked(&ds, list, err, sizeof(err)) != 0) {
        if (err[0] == '\0' || strchr(err, '\n') != NULL) { abort(); }  // a refusal is one line
        return 0;
    }
    if (ds.n_shards != n) { abort(); }
    uint64_t frames = 0;
    for (int k = 0; k < n; k++) { frames += ds.shards[k].h.n_frames; }
    if (frames != ds.n_samples) { abort(); }
    // pooled statistics: a frame-weighted mean lies between the shards' means (float rounding
    // aside); a std is at least VLA_MIN_STD (a constant dimension's is 1)
    int S = ds.state_dim, A = ds.action_dim;
    for (int which = 0; which < 2; which++) {
        int dims = which == 0 ? S : A;
        const float* mean = which == 0 ? ds.state_mean : ds.action_mean;
        const float* std = which == 0 ? ds.state_std : ds.action_std;
        for (int d = 0; d < dims; d++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int k = 0; k < n; k++) {
                double m = ds.shards[k].stats[(which == 0 ? 0 : 2 * S) + d];
                lo = fmin(lo, m);
                hi = fmax(hi, m);
            }
            double slack = 1e-5 * fmax(fabs(lo), fabs(hi)) + 1e-30;
            if (!isfinite(std[d]) || !(std[d] >= VLA_MIN_STD) || !(mean[d] >= lo - slack && mean[d] <= hi + slack)) {
                if (isfinite(lo) && isfinite(hi) && fabs(lo) < 1e37 && fabs(hi) < 1e37) { abort(); }
            }
        }
    }
    FlowConfig c = flow_preset("tiny")->config;
    c.n_cam = ds.cams.n; c.state_dim = S; c.action_dim = A;
    if (flow_config_problem(&c) == NULL && flow_data_problem(&c, &ds) == NULL) {
        Batch b;
        batch_alloc(&b, &c, &ds.cams, 2 * n);
        for (int k = 0; k < n; k++) {
            if (ds.first_sample[k + 1] == ds.first_sample[k]) { continue; }
            dataset_assemble(&ds, &c, ds.first_sample[k], &b, 2 * k);
            dataset_assemble(&ds, &c, ds.first_sample[k + 1] - 1, &b, 2 * k + 1);
        }
        float sum = 0.0f;  // read back, so the sanitizers see every value written
        for (int i = 0; i < 2 * n * c.max_state_dim; i++) { sum += b.state[i]; }
        for (int i = 0; i < 2 * n * c.chunk * c.max_action_dim; i++) { sum += b.actions[i]; }
        if (isnan(sum) && b.B < 0) { abort(); }
        batch_free(&b);
    }
    dataset_close(&ds);
    return 0;
}
