/*
vla/report.cuh: what train_vla.cu prints before it trains, none of which the training reads: the
--memory table (activation and model memory per train mode, recompute level and batch, the largest
batch an 80 GB H100 fits, the FLOPs recomputation adds) and the config table rank 0 prints at the
start of a run. Both come from the allocation sizes (smolvla_act_bytes, smolvla_model_bytes) and the
FLOP counts of the model section; nothing here allocates on the GPU.

Included by train_vla.cu in its CLI section, after Run.
*/

// The memory an 80 GB H100 leaves to the model and its activations: the 81,559 MiB it reports, less
// 2 GiB for the CUDA context, cuBLASLt's workspace, the batches' buffers and the allocator's slack
// (an estimate: none of it is measured here). The 141 GB H200 the same way from the 143,771 MiB it
// reports.
static const double H100_80GB_MODEL_BYTES = (81559.0 - 2048.0) * 1024.0 * 1024.0;
static const double H200_141GB_MODEL_BYTES = (143771.0 - 2048.0) * 1024.0 * 1024.0;

// The largest batch per GPU whose model (ZeRO-1 over shard_world) and activations (mode, rc) fit in
// `budget` bytes; 0: none does
static int smolvla_largest_batch(const SmolVLAConfig* c, int mode, int rc, double budget, int shard_world = 1) {
    double model = (double)smolvla_model_bytes(c, mode, shard_world);
    int lo = 0, hi = 1;
    while (hi < (1 << 20) && model + (double)smolvla_act_bytes(c, mode, hi, rc) <= budget) { lo = hi; hi *= 2; }
    while (hi - lo > 1) {  // lo fits, hi does not
        int mid = lo + (hi - lo) / 2;
        if (model + (double)smolvla_act_bytes(c, mode, mid, rc) <= budget) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

// --memory's plan for several GPUs: per GPU at -b's batch in -t's mode, the model's parts and the
// activations at each --recompute level for 1, 2, 4 and 8 GPUs without and with ZeRO-1 (-z 1: the
// master weights and moments sharded, the gradients whole on every GPU); then the largest batch per
// GPU on an 80 GB H100 and a 141 GB H200 for every mode. From what smolvla_build and
// smolvla_set_batch allocate by.
static void print_memory_per_gpu(const SmolVLAConfig* c, int train_mode, int batch) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const int worlds[] = {1, 2, 4, 8};
    double act[RECOMPUTE_COUNT];
    for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_LAYER; rc++) { act[rc] = (double)smolvla_act_bytes(c, train_mode, batch, rc) / gib; }
    printf("\nper GPU, --train %s, batch %d per GPU (-b), GiB; activations and total by --recompute none / attn / layer\n",
           TRAIN_MODE_NAMES[train_mode], batch);
    printf("| GPUs | ZeRO-1 | weights | gradients | master | moments | activations           | total                 |\n"
           "|------|--------|---------|-----------|--------|---------|-----------------------|-----------------------|\n");
    for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
        for (int zero = 0; zero <= (worlds[w] > 1); zero++) {
            size_t parts[MEM_PARTS];
            smolvla_model_parts(c, train_mode, zero ? worlds[w] : 1, parts);
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
                    b[0][rc] = smolvla_largest_batch(c, mode, rc, H100_80GB_MODEL_BYTES, shards);
                    b[1][rc] = smolvla_largest_batch(c, mode, rc, H200_141GB_MODEL_BYTES, shards);
                }
                printf("| %-7s | %4d | %-6s | %4d / %4d / %4d | %4d / %4d / %4d |\n", TRAIN_MODE_NAMES[mode], worlds[w],
                       zero ? "on" : "off", b[0][0], b[0][1], b[0][2], b[1][0], b[1][1], b[1][2]);
            }
        }
    }
    printf("(without ZeRO-1 every GPU holds what one does; with it the master weights and moments are 1/GPUs each)\n");
}

// --memory: the activation memory of config c for every train mode and recompute level at a few
// batch sizes, the model's other bytes, the largest batch that fits an 80 GB H100 and the FLOPs the
// recomputation adds; from smolvla_act_bytes and smolvla_model_bytes, what the trainer allocates by.
// Allocates nothing: it runs where there is no GPU (the emulated build).
static void print_memory_table(const SmolVLAConfig* c, const char* preset, int train_mode, int batch) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const int batches[] = {8, 16, 32, 64};
    printf("activation memory of preset %s (%d cameras at %d px, %s), GiB per GPU, by --recompute\n", preset, c->n_cam,
           c->img, PRECISION_NAME);
    printf("| --train | batch | none    | attn    | layer   |\n|---------|-------|---------|---------|---------|\n");
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        for (size_t k = 0; k < sizeof(batches) / sizeof(batches[0]); k++) {
            printf("| %-7s | %5d |", TRAIN_MODE_NAMES[mode], batches[k]);
            for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_LAYER; rc++) {
                printf(" %7.2f |", (double)smolvla_act_bytes(c, mode, batches[k], rc) / gib);
            }
            printf("\n");
        }
    }
    printf("\nthe largest batch on an 80 GB H100 (%.1f GiB for the model and its activations), and the cost\n",
           H100_80GB_MODEL_BYTES / gib);
    printf("| --train | model GiB | none | attn | layer | GFLOP/sample | +attn | +layer |\n"
           "|---------|-----------|------|------|-------|--------------|-------|--------|\n");
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        double flops = smolvla_flops_per_sample(c, mode);
        printf("| %-7s | %9.2f |", TRAIN_MODE_NAMES[mode], (double)smolvla_model_bytes(c, mode) / gib);
        for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_LAYER; rc++) {
            printf(" %*d |", rc == RECOMPUTE_LAYER ? 5 : 4, smolvla_largest_batch(c, mode, rc, H100_80GB_MODEL_BYTES));
        }
        printf(" %12.1f | %4.1f%% | %5.1f%% |\n", flops / 1e9,
               100.0 * smolvla_recompute_flops_per_sample(c, mode, RECOMPUTE_ATTN) / flops,
               100.0 * smolvla_recompute_flops_per_sample(c, mode, RECOMPUTE_LAYER) / flops);
    }
    printf("(model: weights, fp32 gradients, master weights and AdamW moments of what trains; estimated from the\n"
           "allocation sizes, not measured; +attn, +layer: the FLOPs the recomputation adds to the model's)\n");
    print_memory_per_gpu(c, train_mode, batch);
}

static void print_config(const Run* run, const cudaDeviceProp* prop, double flops, double peak) {
    const TrainArgs* args = &run->args;
    const SmolVLAConfig* c = &run->config;
    SmolParamTable t;
    smolvla_table_build(c, &t);
    size_t trainable = smolvla_trainable_count(&t, args->train_mode);
    char split[96];
    printf("+------------------------+--------------------------------------+\n");
    printf("| train_vla              | %-36s |\n", args->preset);
    printf("+------------------------+--------------------------------------+\n");
    smolvla_config_print(c);
    printf("| parameters             | %-36zu |\n", t.total);
    snprintf(split, sizeof(split), "%zu (%.1f%%)", trainable, 100.0 * (double)trainable / (double)t.total);
    printf("| trainable              | %-36s |\n", split);
    printf("| train mode (--train)   | %-36s |\n", TRAIN_MODE_NAMES[args->train_mode]);
    printf("| start                  | %-36s |\n", run_start_kind(args, run->from));
    if (run->from != NULL) { printf("| from                   | %-36s |\n", run->from); }
    SmolOptDomain domain;
    SmolBuckets buckets;
    smolvla_opt_domain(&t, args->train_mode, &domain);
    smolvla_buckets_build(&buckets, c, &t, &domain);
    snprintf(split, sizeof(split), "%d buckets, %d ranges", buckets.n, buckets.first[buckets.n]);
    printf("| gradient all-reduce    | %-36s |\n", split);
    free(buckets.first); free(buckets.offset); free(buckets.count);
    printf("| dataset samples        | %-36llu |\n", (unsigned long long)run->ds.n_samples);
    printf("| shards                 | %-36d |\n", run->ds.n_shards);
    snprintf(split, sizeof(split), "%d x %d x %d", run->world, args->batch, args->accum);
    printf("| GPUs x batch x accum   | %-36s |\n", split);
    printf("| effective batch        | %-36lld |\n", (long long)train_global_batch(args, run->world));
    snprintf(split, sizeof(split), "%g (--lr-scale %s)", args->lr, LR_SCALE_NAMES[args->lr_scale]);
    printf("| peak learning rate     | %-36s |\n", split);
    snprintf(split, sizeof(split), "%g on %s (--decay-on)", args->weight_decay, DECAY_ON_NAMES[args->decay_on]);
    printf("| weight decay           | %-36s |\n", split);
    printf("| optimizer state        | %-36s |\n", args->zero && run->world > 1 ? "sharded over the GPUs (ZeRO-1)" : "on every GPU");
    // per GPU, for its micro-batch: a frozen vision tower keeps one layer's (smolvla_vis_kept)
    double gib = 1024.0 * 1024.0 * 1024.0;
    size_t kept_all = smolvla_act_bytes(c, args->train_mode, args->batch);
    size_t kept = smolvla_act_bytes(c, args->train_mode, args->batch, args->recompute);
    printf("| activations (GiB)      | %-36.2f |\n", (double)kept / gib);
    char saved[32];
    snprintf(split, sizeof(split), "%s: saves %s", RECOMPUTE_NAMES[args->recompute],
             format_bytes(saved, sizeof(saved), (double)(kept_all - kept)));
    printf("| recompute              | %-36s |\n", split);
    if (args->recompute != RECOMPUTE_NONE) {  // MFU counts the model's FLOPs alone
        snprintf(split, sizeof(split), "%.2f (+%.1f%%, not in MFU)",
                 smolvla_recompute_flops_per_sample(c, args->train_mode, args->recompute) / 1e9,
                 100.0 * smolvla_recompute_flops_per_sample(c, args->train_mode, args->recompute) / flops);
        printf("| recompute GFLOP/sample | %-36s |\n", split);
    }
    printf("| vision attention       | %-36s |\n", attention_version_name(c->vis_width / c->vis_heads));
    printf("| masked attention       | %-36s |\n", attention_version_name(c->head_dim));
    printf("| device                 | %-36.36s |\n", prop->name);
    printf("| precision              | %-36s |\n", PRECISION_NAME);
    printf("| model GFLOP per sample | %-36.2f |\n", flops / 1e9);
    const char* peak_kind = LOSS_SCALING ? "fp16" : "bf16";
    if (peak > 0.0) { printf("| peak %s TFLOP/s      | %-36.1f |\n", peak_kind, peak / 1e12); }
    else { printf("| peak %s TFLOP/s      | %-36s |\n", peak_kind, "unknown for this device: no MFU"); }
    if (LOSS_SCALING) {
        snprintf(split, sizeof(split), "%g, x2 after %d clean steps", (double)run->loss_scale.scale,
                 args->loss_scale_window);
        printf("| loss scale (dynamic)   | %-36s |\n", split);
    }
    printf("| loader threads         | %-36d |\n", args->workers);
    printf("| augment shift (px)     | %-36d |\n", args->augment);
    printf("| balance                | %-36s |\n", BALANCE_NAMES[args->balance]);
    if (run->balance != NULL) { task_balance_print(run->balance, &run->ds); }
    printf("+------------------------+--------------------------------------+\n");
    fflush(stdout);
}
