/*
vla/buckets.h: the gradient buckets of data parallelism: the trainable domain's ranges grouped by the
layer whose backward makes them final, numbered in the order the backward pass finishes them, so
train_vla.cu's MULTI_GPU build sums each bucket over the ranks while the backward goes on (and the
config table counts them). Host only: Buckets, flow_bucket, flow_bucket_count,
flow_buckets_build, buckets_free.
*/
#ifndef VLA_BUCKETS_H
#define VLA_BUCKETS_H

#include "common.h"
#include "config.h"

// One layer's trainable ranges a bucket, in the backward's order
typedef struct {
    int n;           // buckets: flow_bucket_count
    int* first;      // (n + 1)
    size_t* offset;  // (ranges) into the trainable domain
    size_t* count;
} Buckets;

// The gradient bucket of layer `layer` of `tower` (-1: the tower's embeddings), numbered in the
// order the backward pass finishes them: the expert's layers top down (its head with the top
// layer), its input projections, the VLM's layers top down, the prefix's embeddings, the vision
// layers top down (the post-LayerNorm with the top one), the patch and position embeddings.
static inline int flow_bucket(const FlowConfig* c, int tower, int layer) {
    int L = c->n_layer, Lv = c->vis_layers;
    if (tower == TOWER_EXPERT) { return layer >= 0 ? L - 1 - layer : L; }
    if (tower == TOWER_VLM) { return layer >= 0 ? 2 * L - layer : 2 * L + 1; }
    return layer >= 0 ? 2 * L + 1 + Lv - layer : 2 * L + 2 + Lv;
}

static inline int flow_bucket_count(const FlowConfig* c) { return 2 * c->n_layer + 3 + c->vis_layers; }

// The bucket of slice k of tensor s: a layer's slice with its layer, a head with its tower's top
// layer (its gradient is final before that layer's), an input with its tower's embeddings
static inline int flow_slice_bucket(const FlowConfig* c, const FlowParamSpec* s, int k) {
    if (s->kind == KIND_LAYER) { return flow_bucket(c, s->tower, flow_slice_layer(c, s, k)); }
    if (s->kind == KIND_HEAD) {
        return flow_bucket(c, s->tower, (s->tower == TOWER_VISION ? c->vis_layers : c->n_layer) - 1);
    }
    return flow_bucket(c, s->tower, -1);
}

// Each bucket's ranges of the trainable domain d of table t: its trainable slices, neighbours
// merged. A frozen slice is in no bucket, so it is never communicated. (Host only: the banner
// counts them too.)
static inline void flow_buckets_build(Buckets* b, const FlowConfig* c, const FlowParamTable* t,
                                      const FlowOptDomain* d) {
    b->n = flow_bucket_count(c);
    size_t max_ranges = 0;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) { max_ranges += flow_slices(&t->spec[i]); }
    b->first = (int*)callocCheck(b->n + 1, sizeof(int));
    b->offset = (size_t*)mallocCheck(max_ranges * sizeof(size_t));
    b->count = (size_t*)mallocCheck(max_ranges * sizeof(size_t));
    int r = 0;
    for (int q = 0; q < b->n; q++) {
        b->first[q] = r;
        for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
            const FlowParamSpec* s = &t->spec[i];
            size_t per = flow_slice_numel(s);
            for (size_t k = 0; per > 0 && (k + 1) * per <= d->numel[i]; k++) {  // (per 0: a tensor the family lacks)
                if (flow_slice_bucket(c, s, (int)k) != q) { continue; }
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

static inline void buckets_free(Buckets* b) {
    free(b->first);
    free(b->offset);
    free(b->count);
}

#endif  // VLA_BUCKETS_H
