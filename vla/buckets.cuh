/*
vla/buckets.cuh: the gradient buckets of train_vla.cu: the trainable domain's ranges grouped by the
layer whose backward makes them final, numbered in the order the backward pass finishes them, so
the MULTI_GPU build sums each bucket over the ranks while the backward goes on. It owns
smolvla_bucket, smolvla_bucket_count and smolvla_buckets_build (host only: the config table counts them too).

Included by train_vla.cu at the start of its data-parallel section, after the model's parameter
table (SmolParamTable, SmolOptDomain, SmolBuckets).
*/

// The gradient bucket of layer `layer` of `tower` (-1: the tower's embeddings), numbered in the
// order the backward pass finishes them: the expert's layers top down (its head with the top
// layer), its input projections, the VLM's layers top down, the prefix's embeddings, the vision
// layers top down (the post-LayerNorm with the top one), the patch and position embeddings.
static int smolvla_bucket(const SmolVLAConfig* c, int tower, int layer) {
    int L = c->n_layer, Lv = c->vis_layers;
    if (tower == TOWER_EXPERT) { return layer >= 0 ? L - 1 - layer : L; }
    if (tower == TOWER_VLM) { return layer >= 0 ? 2 * L - layer : 2 * L + 1; }
    return layer >= 0 ? 2 * L + 1 + Lv - layer : 2 * L + 2 + Lv;
}

static int smolvla_bucket_count(const SmolVLAConfig* c) { return 2 * c->n_layer + 3 + c->vis_layers; }

// The bucket of slice k of tensor s: a layer's slice with its layer, a head with its tower's top
// layer (its gradient is final before that layer's), an input with its tower's embeddings
static int smolvla_slice_bucket(const SmolVLAConfig* c, const SmolParamSpec* s, int k) {
    if (s->kind == KIND_LAYER) { return smolvla_bucket(c, s->tower, smolvla_slice_layer(c, s, k)); }
    if (s->kind == KIND_HEAD) { return smolvla_bucket(c, s->tower, (s->tower == TOWER_VISION ? c->vis_layers : c->n_layer) - 1); }
    return smolvla_bucket(c, s->tower, -1);
}

// Each bucket's ranges of the trainable domain d of table t: its trainable slices, neighbours
// merged. A frozen slice is in no bucket, so it is never communicated. (Host only: the banner
// counts them too.)
static void smolvla_buckets_build(SmolBuckets* b, const SmolVLAConfig* c, const SmolParamTable* t, const SmolOptDomain* d) {
    b->n = smolvla_bucket_count(c);
    size_t max_ranges = 0;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) { max_ranges += smolvla_slices(&t->spec[i]); }
    b->first = (int*)callocCheck(b->n + 1, sizeof(int));
    b->offset = (size_t*)mallocCheck(max_ranges * sizeof(size_t));
    b->count = (size_t*)mallocCheck(max_ranges * sizeof(size_t));
    int r = 0;
    for (int q = 0; q < b->n; q++) {
        b->first[q] = r;
        for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
            const SmolParamSpec* s = &t->spec[i];
            size_t per = smolvla_slice_numel(s);
            for (size_t k = 0; per > 0 && (k + 1) * per <= d->numel[i]; k++) {  // (per 0: a tensor the family lacks)
                if (smolvla_slice_bucket(c, s, (int)k) != q) { continue; }
                size_t at = d->offset[i] + k * per;
                if (r > b->first[q] && b->offset[r - 1] + b->count[r - 1] == at) {
                    b->count[r - 1] += per;
                } else {
                    b->offset[r] = at;
                    b->count[r] = per;
                    r++;
                }
            }
        }
    }
    b->first[b->n] = r;
}
