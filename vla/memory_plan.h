/*
vla/memory_plan.h: train_vla --memory, the GPU memory a run takes, planned from a policy's allocation
sizes alone (no GPU, no dataset): activations by train mode, batch and --recompute level, the model's
parts per GPU with and without ZeRO-1, the largest batch an 80 GB H100 and a 141 GB H200 hold, and what
the recomputation adds to the FLOPs. Host only: MemPart (MEM_*), PolicySizes (the sizes a policy
reports), model_bytes, largest_batch, print_memory_table. Needs config.h.
*/
#ifndef VLA_MEMORY_PLAN_H
#define VLA_MEMORY_PLAN_H

#include <stdio.h>
#include "config.h"

// The parts of what a model holds on a GPU beside its activations: the weights (the compute copy of
// every tensor), the fp32 gradients of what trains (the whole domain on every rank), the fp32 master
// weights and AdamW's two moments (one ZeRO-1 shard each), and the rest (norm sums, tables, fp16's
// loss scale)
enum { MEM_WEIGHTS = 0, MEM_GRADS = 1, MEM_MASTER = 2, MEM_MOMENTS = 3, MEM_OTHER = 4, MEM_PARTS = 5 };

// What a policy's model allocates, computed from its config without allocating: what a build
// holds part by part (ZeRO-1 over shard_world ranks, 1: off), its activations for B samples at
// recompute level rc, its model FLOPs per sample and what rc adds to them
typedef struct {
    void (*model_parts)(const FlowConfig* c, int mode, int shard_world, size_t parts[MEM_PARTS]);
    size_t (*act_bytes)(const FlowConfig* c, int mode, int B, int rc);
    double (*flops_per_sample)(const FlowConfig* c, int mode);
    double (*recompute_flops)(const FlowConfig* c, int mode, int rc);
} PolicySizes;

// What a build holds in all: the sum of its model_parts
static inline size_t model_bytes(void (*model_parts)(const FlowConfig*, int, int, size_t*), const FlowConfig* c,
                                 int mode, int shard_world) {
    size_t parts[MEM_PARTS], total = 0;
    model_parts(c, mode, shard_world, parts);
    for (int k = 0; k < MEM_PARTS; k++) { total += parts[k]; }
    return total;
}

// The memory an 80 GB H100 leaves to the model and its activations: the 81,559 MiB it reports, less
// 2 GiB for the CUDA context, cuBLASLt's workspace, the batches' buffers and the allocator's slack
// (an estimate: none of it is measured here). The 141 GB H200 the same way from the 143,771 MiB it
// reports.
static const double H100_80GB_MODEL_BYTES = (81559.0 - 2048.0) * 1024.0 * 1024.0;
static const double H200_141GB_MODEL_BYTES = (143771.0 - 2048.0) * 1024.0 * 1024.0;

// The largest batch per GPU whose model (ZeRO-1 over shard_world) and activations (mode, rc) fit in
// `budget` bytes; 0: none does
static int largest_batch(const PolicySizes* p, const FlowConfig* c, int mode, int rc, double budget, int shard_world) {
    double model = (double)model_bytes(p->model_parts, c, mode, shard_world);
    int lo = 0, hi = 1;
    while (hi < (1 << 20) && model + (double)p->act_bytes(c, mode, hi, rc) <= budget) { lo = hi; hi *= 2; }
    while (hi - lo > 1) {  // lo fits, hi does not
        int mid = lo + (hi - lo) / 2;
        if (model + (double)p->act_bytes(c, mode, mid, rc) <= budget) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

// --memory's plan for several GPUs: per GPU at -b's batch in -t's mode, the model's parts and the
// activations at each --recompute level for 1, 2, 4 and 8 GPUs without and with ZeRO-1 (-z 1: the
// master weights and moments sharded, the gradients whole on every GPU); then the largest batch per
// GPU on an 80 GB H100 and a 141 GB H200 for every mode.
static void print_memory_per_gpu(const PolicySizes* p, const FlowConfig* c, int train_mode, int batch) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const int worlds[] = {1, 2, 4, 8};
    double act[RECOMPUTE_COUNT];
    for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_LAYER; rc++) {
        act[rc] = (double)p->act_bytes(c, train_mode, batch, rc) / gib;
    }
    printf(
        "\nper GPU, --train %s, batch %d per GPU (-b), GiB; activations and total by --recompute none / attn / layer\n",
        TRAIN_MODE_NAMES[train_mode], batch);
    printf(
        "| GPUs | ZeRO-1 | weights | gradients | master | moments | activations           | total                 |\n"
        "|------|--------|---------|-----------|--------|---------|-----------------------|-----------------------|\n");
    for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
        for (int zero = 0; zero <= (worlds[w] > 1); zero++) {
            size_t parts[MEM_PARTS];
            p->model_parts(c, train_mode, zero ? worlds[w] : 1, parts);
            double model = 0.0;
            for (int k = 0; k < MEM_PARTS; k++) { model += (double)parts[k] / gib; }
            printf("| %4d | %-6s | %7.2f | %9.2f | %6.2f | %7.2f | %6.2f / %5.2f / %5.2f | %6.2f / %5.2f / %5.2f |\n",
                   worlds[w], zero ? "on" : "off", parts[MEM_WEIGHTS] / gib, parts[MEM_GRADS] / gib,
                   parts[MEM_MASTER] / gib, parts[MEM_MOMENTS] / gib, act[0], act[1], act[2], model + act[0],
                   model + act[1], model + act[2]);
        }
    }
    printf("\nthe largest batch per GPU (0: the model alone does not fit), by --recompute none / attn / layer\n");
    printf("| --train | GPUs | ZeRO-1 | 80 GB H100         | 141 GB H200        |\n"
           "|---------|------|--------|--------------------|--------------------|\n");
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
            for (int zero = 0; zero <= (worlds[w] > 1); zero++) {
                int shards = zero ? worlds[w] : 1, b[2][RECOMPUTE_COUNT];
                for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_LAYER; rc++) {
                    b[0][rc] = largest_batch(p, c, mode, rc, H100_80GB_MODEL_BYTES, shards);
                    b[1][rc] = largest_batch(p, c, mode, rc, H200_141GB_MODEL_BYTES, shards);
                }
                printf("| %-7s | %4d | %-6s | %4d / %4d / %4d | %4d / %4d / %4d |\n", TRAIN_MODE_NAMES[mode], worlds[w],
                       zero ? "on" : "off", b[0][0], b[0][1], b[0][2], b[1][0], b[1][1], b[1][2]);
            }
        }
    }
    printf("(without ZeRO-1 every GPU holds what one does; with it the master weights and moments are 1/GPUs each)\n");
}

// --memory: the activation memory of config c (preset `preset`, built for `precision`) for every
// train mode and recompute level at a few batch sizes, the model's other bytes, the largest batch
// that fits an 80 GB H100 and the FLOPs the recomputation adds; then the plan per GPU.
static void print_memory_table(const PolicySizes* p, const FlowConfig* c, const char* preset, const char* precision,
                               int train_mode, int batch) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const int batches[] = {8, 16, 32, 64};
    printf("activation memory of preset %s (%d cameras at %d px, %s), GiB per GPU, by --recompute\n", preset, c->n_cam,
           c->img, precision);
    printf("| --train | batch | none    | attn    | layer   |\n|---------|-------|---------|---------|---------|\n");
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        for (size_t k = 0; k < sizeof(batches) / sizeof(batches[0]); k++) {
            printf("| %-7s | %5d |", TRAIN_MODE_NAMES[mode], batches[k]);
            for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_LAYER; rc++) {
                printf(" %7.2f |", (double)p->act_bytes(c, mode, batches[k], rc) / gib);
            }
            printf("\n");
        }
    }
    printf("\nthe largest batch on an 80 GB H100 (%.1f GiB for the model and its activations), and the cost\n",
           H100_80GB_MODEL_BYTES / gib);
    printf("| --train | model GiB | none | attn | layer | GFLOP/sample | +attn | +layer |\n"
           "|---------|-----------|------|------|-------|--------------|-------|--------|\n");
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        double flops = p->flops_per_sample(c, mode);
        printf("| %-7s | %9.2f |", TRAIN_MODE_NAMES[mode], (double)model_bytes(p->model_parts, c, mode, 1) / gib);
        for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_LAYER; rc++) {
            printf(" %*d |", rc == RECOMPUTE_LAYER ? 5 : 4, largest_batch(p, c, mode, rc, H100_80GB_MODEL_BYTES, 1));
        }
        printf(" %12.1f | %4.1f%% | %5.1f%% |\n", flops / 1e9,
               100.0 * p->recompute_flops(c, mode, RECOMPUTE_ATTN) / flops,
               100.0 * p->recompute_flops(c, mode, RECOMPUTE_LAYER) / flops);
    }
    printf("(model: weights, fp32 gradients, master weights and AdamW moments of what trains; estimated from the\n"
           "allocation sizes, not measured; +attn, +layer: the FLOPs the recomputation adds to the model's)\n");
    print_memory_per_gpu(p, c, train_mode, batch);
}

#endif  // VLA_MEMORY_PLAN_H
