/*
vla/flops.h: the FLOPs train_vla.cu's MFU is measured against: the model FLOPs of one training
sample in each train mode (SmolVLA and pi0), what --recompute adds on top, and the bf16
tensor-core peaks of the GPUs we know. Host only; needs config.h.
*/
#ifndef VLA_FLOPS_H
#define VLA_FLOPS_H

#include <string.h>
#include "config.h"

// Model FLOPs of one training sample in train mode `mode`: the forward everywhere (matrix products
// and attention), and the backward (2x the forward: input and weight gradients) only where
// gradients flow: the expert and its projections always; in expert mode SmolVLA's VLM state rows
// alone (1/Np of its forward; pi0's state token is the expert's, so nothing goes into its VLM); in
// vlm mode the VLM and the connector; in all mode the vision tower too.
// The expert runs over the suffix, S rows: the chunk, and pi0's state token before it; the action
// projections and the time MLP over the chunk's H rows; state_proj over one row, at the width of
// the stack that reads it (flow_state_width). Attention is counted dense: SmolVLA's causal
// actions and pi0's state row, which sees itself alone of the suffix, count every key. SwiGLU and
// GeGLU are the same three products. pi0 has no cross layers (self_attn_every 1); its last VLM
// layer, like SmolVLA's, feeds only its keys and values to the expert.
// What the model needs, not what the kernels happen to do; sampling's passes are not counted.
// dev/lerobot/bench_lerobot.py's pi0_train_flops counts the same (tests/bench/test_lerobot_bench.sh).
static double flow_flops_per_sample(const FlowConfig* c, int mode) {
    double cams = c->n_cam, G = flow_grid(c), Nv = G * G, Cv = c->vis_width, Fv = c->vis_ff, Lv = c->vis_layers;
    double NI = flow_image_tokens(c), s2 = (double)c->scale_factor * c->scale_factor;
    double Np = flow_n_prefix(c), C = c->d_model, F = c->d_ff, D = flow_d_attn(c), KV = flow_d_kv(c);
    double L = c->n_layer, H = c->chunk, S = flow_n_suffix(c), Ce = c->d_expert, Fe = c->d_expert_ff;
    double vision = cams * (2.0 * Nv * flow_patch_dim(c) * Cv +
                            Lv * (2.0 * Nv * (4.0 * Cv * Cv + 2.0 * Cv * Fv) + 4.0 * Nv * Nv * Cv));
    double state = 2.0 * c->max_state_dim * flow_state_width(c);  // state_proj, one token
    double connector = cams * 2.0 * NI * s2 * Cv * C;
    double vlm = (L - 1.0) * (2.0 * Np * (2.0 * C * D + 2.0 * C * KV + 3.0 * C * F) + 4.0 * Np * Np * D) +
                 2.0 * Np * 2.0 * C * KV;  // the last layer: its keys and values
    double expert = 2.0 * H * (c->max_action_dim * Ce + 3.0 * Ce * Ce) + 2.0 * H * Ce * c->max_action_dim;
    for (int l = 0; l < c->n_layer; l++) {
        expert += 2.0 * S * (2.0 * Ce * D + 3.0 * Ce * Fe);
        if (flow_layer_is_cross(c, l)) {
            expert += 2.0 * Np * 2.0 * KV * KV + 4.0 * S * Np * D;  // the prefix's K/V re-projected, attended
        } else {
            expert += 2.0 * S * 2.0 * Ce * KV + 4.0 * S * (Np + S) * D;
        }
    }
    if (flow_state_in_suffix(c)) { expert += state; } else { connector += state; }
    double forward = vision + connector + vlm + expert;
    double backward = 2.0 * expert;
    if (mode == TRAIN_MODE_EXPERT && !flow_state_in_suffix(c)) { backward += 2.0 * vlm / Np; }
    if (mode >= TRAIN_MODE_VLM) { backward += 2.0 * (vlm + connector); }
    if (mode == TRAIN_MODE_ALL) { backward += 2.0 * vision; }
    return forward + backward;
}

// FLOPs that recompute level rc adds to one training sample in `mode`: the forward of what it drops,
// once more in the backward (smolvla_*_layer_forward's redo), counted as flow_flops_per_sample
// counts: the expert's layers over the suffix (attn: q, its own k/v, attention; layer: also o_proj
// and gate/up, not down_proj, whose output is kept), the VLM's on every prefix row wherever the
// backward enters the VLM (also in SmolVLA's expert mode, where only the state rows go back: the
// recomputation runs the forward's kernels; not in pi0's expert mode, where nothing goes back into
// it) but its last layer (ln1 alone, no products), and the vision tower's in all mode. Not model
// FLOPs: MFU leaves them out.
static double flow_recompute_flops_per_sample(const FlowConfig* c, int mode, int rc) {
    if (rc == RECOMPUTE_NONE) { return 0.0; }
    double cams = c->n_cam, G = flow_grid(c), Nv = G * G, Cv = c->vis_width, Fv = c->vis_ff, Lv = c->vis_layers;
    double Np = flow_n_prefix(c), C = c->d_model, F = c->d_ff, D = flow_d_attn(c), KV = flow_d_kv(c);
    double L = c->n_layer, H = flow_n_suffix(c), Ce = c->d_expert, Fe = c->d_expert_ff;
    int into_vlm = mode != TRAIN_MODE_EXPERT || !flow_state_in_suffix(c);
    int layer = rc == RECOMPUTE_LAYER;
    double vision = cams * Lv * (2.0 * Nv * 3.0 * Cv * Cv + 4.0 * Nv * Nv * Cv);
    if (layer) { vision += cams * Lv * 2.0 * Nv * (Cv * Cv + Cv * Fv); }
    double vlm = (L - 1.0) * (2.0 * Np * C * D + 4.0 * Np * Np * D);
    if (layer) { vlm += (L - 1.0) * 2.0 * Np * (D * C + 2.0 * C * F); }
    double expert = 0.0;
    for (int l = 0; l < c->n_layer; l++) {
        expert += 2.0 * H * Ce * D;
        if (flow_layer_is_cross(c, l)) { expert += 4.0 * H * Np * D; }
        else { expert += 2.0 * H * 2.0 * Ce * KV + 4.0 * H * (Np + H) * D; }
        if (layer) { expert += 2.0 * H * (D * Ce + 2.0 * Ce * Fe); }
    }
    return expert + (into_vlm ? vlm : 0.0) + (mode == TRAIN_MODE_ALL ? vision : 0.0);
}

// bf16 dense tensor-core peak of the GPUs we know, in FLOP/s; 0 for the others
static double device_peak_flops(const char* name) {
    static const struct { const char* match; double tflops; } peaks[] = {
        {"H200", 989.4}, {"GH200", 989.4}, {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.4},
        {"A100", 312.0}, {"L40S", 362.0}, {"A10G", 70.0}, {"RTX 4090", 165.2},
        {"V100", 125.0}, {"T4", 65.0},  // fp16 (they have no bf16): the figure fp16 builds' MFU uses there
    };
    for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]); i++) {
        if (strstr(name, peaks[i].match) != NULL) { return peaks[i].tflops * 1e12; }
    }
    return 0.0;
}

#endif  // VLA_FLOPS_H
