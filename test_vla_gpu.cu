/*
test_vla_gpu.cu: checks train_vla.cu against the PyTorch oracle (dev/model.py) and against the
CPU trainer. Includes the production code, so what is tested is what runs.

  ./test_vla_gpu FIXTURE_DIR TRAINER          e.g. ./test_vla_gpu build/test ./train_vla

TRAINER is the train_vla binary of the same precision as this test. make test builds and runs
it in both precisions: on the GPU when one is present, otherwise under the CPU emulation of
CUDA in dev/cuda/emu (same source, same checks).

Per debug state (fixtures a and b): velocities, loss and every parameter gradient by name from
the oracle's parameters and batch, the VLM's unused last-layer tensors at exactly zero, 10-step
sampling, the losses and gradient norms of 10 AdamW steps. Then through the binary: 5 training
steps on shard data against the oracle's, determinism (two runs, identical losses and
checkpoints), bit-exact resume, checkpoints that continue on train_vla_cpu and back, bad input.

Tolerances, relative error ||x - ref|| / ||ref|| against the float64 oracle:
- FP32: 1e-4 per tensor (SPEC section 5); fp32 rounding alone gives about 1e-6.
- BF16: bf16 keeps 8 significant bits, so every stored activation and weight is off by up to
  u = 2^-8 = 3.9e-3 of itself (u / sqrt(3) rms for round-to-nearest). Those errors are
  independent from stage to stage and add up like a random walk: a forward output that passes
  through k rounded stages is off by about sqrt(k) u / sqrt(3). The deepest forward path of the
  test configs has about 40 stages (embeddings, 2 layers of norm, q/k/v, attention, projection
  and MLP in two stacks, the head), hence sqrt(40) u / sqrt(3) = 1.4e-2: velocities and the loss
  pass at 2.5e-2, about twice that. Gradients run the backward pass on top (about 3x the stages
  and the products of two rounded factors): 8e-2. Sampling integrates 10 velocity evaluations
  with errors of the same size, which average over the Euler steps: 2.5e-2.
*/
#define TESTING
#include "train_vla.cu"
#include "dev/test_util.h"

#if defined(ENABLE_FP32)
static const double TOL_FWD = 1e-4, TOL_GRAD = 1e-4, TOL_SAMPLE = 1e-4, TOL_STEPS = 1e-4;
#else
static const double TOL_FWD = 2.5e-2, TOL_GRAD = 8e-2, TOL_SAMPLE = 2.5e-2, TOL_STEPS = 2.5e-2;
#endif

static const char* TRAINER = "./train_vla";

// A host batch from the oracle's step-0 batch records.
static void oracle_batch(const DebugState* st, const VLAConfig* c, int B, Batch* batch) {
    batch_alloc(batch, c, B);
    size_t HA = (size_t)c->chunk * c->action_dim;
    struct { const char* key; void* dst; size_t n, size; } fields[] = {
        {"batch/images", batch->images, (size_t)B * c->n_cam * c->img * c->img * 3, 1},
        {"batch/text", batch->text, (size_t)B * c->max_text, 1},
        {"batch/text_mask", batch->text_mask, (size_t)B * c->max_text, 4},
        {"batch/state", batch->state, (size_t)B * c->state_dim, 4},
        {"batch/actions", batch->actions, (size_t)B * HA, 4},
        {"batch/action_mask", batch->action_mask, (size_t)B * c->chunk, 4},
        {"batch/t", batch->t, (size_t)B, 4},
        {"batch/eps", batch->eps, (size_t)B * HA, 4},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        void* rec = debug_get(st, fields[i].key, fields[i].n);
        memcpy(fields[i].dst, rec, fields[i].n * fields[i].size);
        free(rec);
    }
}

// Every gradient tensor, copied to the host in checkpoint layout (n_params).
static float* read_grads(const Model* m) {
    float* device_layout = (float*)mallocCheck(m->padded_total * sizeof(float));
    cudaCheck(cudaMemcpy(device_layout, m->grads_memory, m->padded_total * sizeof(float), cudaMemcpyDeviceToHost));
    float* g = (float*)mallocCheck(m->table.total * sizeof(float));
    layout_to_checkpoint(m, g, device_layout);
    free(device_layout);
    return g;
}

static void test_against_oracle(const char* dir, const char* name) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s_state.bin", dir, name);
    printf("\n== %s (%s): %s\n", name, PRECISION_NAME, path);
    DebugState st;
    debug_state_read(&st, path);
    VLAConfig cfg;
    int32_t* raw = (int32_t*)debug_get(&st, "config", 15);
    memcpy(&cfg, raw, sizeof(VLAConfig));
    free(raw);
    const VLAConfig* c = &cfg;
    float* hp = (float*)debug_get(&st, "hparams", 6);  // lr, min_lr_frac, warmup, steps, weight_decay, clip
    int B = (int)debug_find(&st, "batch/t")->numel, HA = c->chunk * c->action_dim, S = c->state_dim, A = c->action_dim;

    Model m;
    model_build(&m, c);
    float* params = (float*)mallocCheck(m.table.total * sizeof(float));
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        char key[96];
        snprintf(key, sizeof(key), "param/%s", m.table.spec[i].name);
        float* ref = (float*)debug_get(&st, key, m.table.spec[i].numel);
        memcpy(params + m.table.spec[i].offset, ref, m.table.spec[i].numel * sizeof(float));
        free(ref);
    }
    model_set_params(&m, params, NULL, NULL);
    Batch host, dev;
    oracle_batch(&st, c, B, &host);
    device_batch_alloc(&m, &dev, c, B);
    cudaCheck(cudaMemcpy(dev.memory, host.memory, host.bytes, cudaMemcpyHostToDevice));

    // forward and backward
    model_forward(&m, &dev, 0, 1);
    model_backward(&m, &dev, 1);
    float loss;
    model_read_scalars(&m, &loss, NULL);
    float* v = from_device_x(m.acts.v_pred, (size_t)B * HA);
    check_forward_against(&st, name, v, (size_t)B * HA, loss, TOL_FWD);
    free(v);
    float* grads = read_grads(&m);
    check_grads_against(&st, name, c, &m.table, grads, TOL_GRAD);
    free(grads);

    // inference: 10 Euler steps from the batch's noise, un-normalized with the oracle's statistics
    float* stats = (float*)debug_get(&st, "stats", 2 * (size_t)(S + A));
    float* sampled = (float*)mallocCheck((size_t)B * HA * sizeof(float));
    model_sample_actions(&m, &dev, dev.eps, stats + 2 * S, stats + 2 * S + A, sampled);
    float* ref_sample = (float*)debug_get(&st, "expect/sample", (size_t)B * HA);
    double es = rel_error(sampled, ref_sample, (size_t)B * HA);
    check(es < TOL_SAMPLE, "%s 10-step sampled actions rel err %.2e (tol %.1e)", name, es, TOL_SAMPLE);
    free(stats); free(sampled); free(ref_sample);

    // ten AdamW steps on the same batch: the loss before each update and the gradient norm
    TrainArgs args;
    train_args_defaults(&args);
    args.lr = hp[0]; args.min_lr_frac = hp[1]; args.warmup = (int)hp[2]; args.steps = (int)hp[3];
    args.weight_decay = hp[4]; args.grad_clip = hp[5];
    float* ref_losses = (float*)debug_get(&st, "expect/losses", 10);
    float* ref_norms = (float*)debug_get(&st, "expect/norms", 10);
    float losses[10], norms[10];
    for (int step = 0; step < 10; step++) {
        model_forward(&m, &dev, 0, 1);
        model_backward(&m, &dev, 1);
        model_update(&m, lr_at_step(&args, step), args.weight_decay, args.grad_clip, step);
        model_read_scalars(&m, &losses[step], &norms[step]);
    }
    double e_losses = rel_error(losses, ref_losses, 10), e_norms = rel_error(norms, ref_norms, 10);
    check(e_losses < TOL_STEPS, "%s 10 optimizer steps: losses %.6f -> %.6f, rel err %.2e (tol %.1e)", name, losses[0],
          losses[9], e_losses, TOL_STEPS);
    check(e_norms < TOL_GRAD, "%s 10 optimizer steps: grad norms rel err %.2e (tol %.1e)", name, e_norms, TOL_GRAD);
    check(losses[9] < losses[0], "%s loss decreases over 10 steps on one batch", name);
    free(ref_losses); free(ref_norms); free(hp);

    cudaCheck(cudaFree(dev.memory));
    batch_free(&host);
    free(params);
    model_free(&m);
    free(st.recs); free(st.file);
}

// The whole loop through the binary: 5 steps on shard data, each its own samples, noise and
// learning rate, against the oracle's --train run.
static void test_training_loop(const char* dir) {
    printf("\n== training loop against the oracle\n");
    char trainer[1100];
    snprintf(trainer, sizeof(trainer), "%s -b 4", TRAINER);
    check_training_loop(dir, trainer, TOL_STEPS);
}

// Runs `command -o dir/out` into an empty output folder (what it prints in dir/out.txt) and reads
// the losses of its steps 1-4 from the log; returns its exit status, *n how many losses it read
static int run_four_steps(const char* dir, const char* out, const char* command, float* losses, int* n) {
    char cmd[4096], path[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s/%s && %s -o %s/%s > %s/%s.txt 2>&1", dir, out, command, dir, out, dir, out);
    int rc = run_command(cmd);
    snprintf(path, sizeof(path), "%s/%s/log.jsonl", dir, out);
    *n = read_losses(path, 1, 4, losses);
    return rc;
}

// Two identical runs give identical losses and checkpoints: no atomics, fixed reduction orders.
static void test_determinism(const char* dir) {
    printf("\n== determinism\n");
    char command[2048], p1[1100], p2[1100];
    float l1[4] = {0}, l2[4] = {0};
    int n1, n2;
    snprintf(command, sizeof(command), "%s -p tiny -b 3 -n 4 -u 2 -i %s/b.bin", TRAINER, dir);
    run_four_steps(dir, "gpu_det0", command, l1, &n1);
    run_four_steps(dir, "gpu_det1", command, l2, &n2);
    check(n1 == 4 && n2 == 4 && memcmp(l1, l2, sizeof(l1)) == 0, "two runs, identical losses bit for bit (%.7f .. %.7f)",
          l1[0], l1[3]);
    snprintf(p1, sizeof(p1), "%s/gpu_det0/ckpt_00000004.bin", dir);
    snprintf(p2, sizeof(p2), "%s/gpu_det1/ckpt_00000004.bin", dir);
    check(files_equal(p1, p2), "two runs, identical checkpoints");
}

// Gradient accumulation: -b 8 -d 16 takes the samples and noise of -b 16 in two micro-steps, so
// its losses follow -b 16's within the precision's tolerance (the sums run in another order)
static void test_accumulation(const char* dir) {
    printf("\n== gradient accumulation\n");
    const char* splits[2] = {"-b 16", "-b 8 -d 16"};
    float losses[2][4] = {{0}};
    int n[2];
    for (int k = 0; k < 2; k++) {
        char command[2048], out[32];
        snprintf(command, sizeof(command), "%s -p tiny %s -n 4 -u 2 -l 1e-3 -i %s/b.bin", TRAINER, splits[k], dir);
        snprintf(out, sizeof(out), "gpu_acc%d", k);
        run_four_steps(dir, out, command, losses[k], &n[k]);
    }
    double e = rel_error(losses[1], losses[0], 4);
    check(n[0] == 4 && n[1] == 4 && e < TOL_STEPS, "-b 8 -d 16 (2 micro-steps) vs -b 16: 4 losses rel err %.2e (tol %.1e)",
          e, TOL_STEPS);
}

// The MULTI_GPU trainer at world size 1 runs its NCCL path (the gradient buckets and the loss
// averaged over one rank, the time waited on them measured): its losses are those of the same
// trainer built without NCCL (`single`, make's train_vla_single_gpu_*)
static void test_single_gpu_build(const char* dir, const char* single) {
    printf("\n== world size 1 through NCCL vs the build without it\n");
    const char* trainers[2] = {TRAINER, single};
    float losses[2][4] = {{0}};
    int n[2], rc[2];
    for (int k = 0; k < 2; k++) {
        char command[2048], out[32];
        snprintf(command, sizeof(command), "%s -p tiny -g 1 -b 4 -n 4 -u 2 -l 1e-3 -i %s/b.bin", trainers[k], dir);
        snprintf(out, sizeof(out), "gpu_one%d", k);
        rc[k] = run_four_steps(dir, out, command, losses[k], &n[k]);
    }
    char path[1100];
    snprintf(path, sizeof(path), "%s/gpu_one0.txt", dir);
    char* out = read_text(path);
    const char* comm = strstr(out, "communication: ");
    char line[200] = "";
    if (comm != NULL) { snprintf(line, sizeof(line), "%.*s", (int)strcspn(comm, "\n"), comm); }
    check(rc[0] == 0 && comm != NULL, "%s -g 1 went through NCCL: '%s'", TRAINER, line);
    free(out);
    double e = rel_error(losses[0], losses[1], 4);
    check(rc[0] == 0 && rc[1] == 0 && n[0] == 4 && n[1] == 4 && e < TOL_STEPS, "its 4 losses vs %s's: rel err %.2e "
          "(tol %.1e)%s", single, e, TOL_STEPS, memcmp(losses[0], losses[1], sizeof(losses[0])) == 0 ? ", bit for bit" : "");
}

// Several GPUs (MULTI_GPU): -g 2 -b 2 takes the samples and noise of -g 1 -b 4, its gradients
// averaged by NCCL, so its losses follow -g 1's; so do -g 2 -b 1 -d 4 (two micro-steps per rank)
// and -g 2 -z 1 (ZeRO-1: reduce-scatter, sharded AdamW, all-gather). Checkpoints continue on
// another world size or without ZeRO. Under the emulation CUDA_EMU_DEVICES=2 provides the GPUs;
// on a machine with one GPU these checks are skipped (and said so).
static void test_multi_gpu(const char* dir) {
    printf("\n== several GPUs\n");
    int visible = 0;
    cudaGetDeviceCount(&visible);
    if (visible < 2) {
        printf("(skipped: %d GPU visible, the data-parallel checks need 2)\n", visible);
        return;
    }
    enum { RUNS = 6 };
    const char* runs[RUNS] = {"-g 1 -b 4 -n 4", "-g 2 -b 2 -n 4", "-g 2 -b 1 -d 4 -n 4", "-g 2 -b 2 -n 4 -z 1",
                              "-g 2 -b 2 -n 2", "-g 2 -b 2 -n 2 -z 1"};
    float losses[RUNS][4] = {{0}};
    int n[RUNS], rc[RUNS];
    for (int k = 0; k < RUNS; k++) {
        char command[2048], out[32];
        snprintf(command, sizeof(command), "%s -p tiny %s -u 2 -l 1e-3 -i %s/b.bin", TRAINER, runs[k], dir);
        snprintf(out, sizeof(out), "gpu_dp%d", k);
        rc[k] = run_four_steps(dir, out, command, losses[k], &n[k]);
    }
    for (int k = 1; k < 4; k++) {
        double e = rel_error(losses[k], losses[0], 4);
        check(rc[k] == 0 && n[k] == 4 && e < TOL_STEPS, "%s vs -g 1 -b 4: 4 losses rel err %.2e (tol %.1e)", runs[k], e,
              TOL_STEPS);
    }
    // checkpoints do not depend on the world size nor on ZeRO: the 2-step -g 2 run continues on one
    // GPU (-b 4), the 2-step -g 2 -z 1 run on -g 2 without ZeRO
    const char* continuations[2] = {"-g 1 -b 4", "-g 2 -b 2 -z 0"};
    for (int k = 0; k < 2; k++) {
        char cmd[4096], path[1100];
        snprintf(cmd, sizeof(cmd), "%s -p tiny %s -n 4 -u 2 -l 1e-3 -i %s/b.bin -o %s/gpu_dp%d -y 1 > %s/gpu_dp%db.txt 2>&1",
                 TRAINER, continuations[k], dir, dir, 4 + k, dir, 4 + k);
        int rc2 = run_command(cmd);
        float resumed[4] = {0};
        snprintf(path, sizeof(path), "%s/gpu_dp%d/log.jsonl", dir, 4 + k);
        int nr = read_losses(path, 1, 4, resumed);
        double e = rel_error(resumed + 2, losses[1] + 2, 2);
        check(rc[4 + k] == 0 && rc2 == 0 && nr == 4 && e < TOL_STEPS, "a %s checkpoint continues on %s: steps 3-4 follow "
              "the -g 2 run, rel err %.2e (tol %.1e)", runs[4 + k], continuations[k], e, TOL_STEPS);
    }
}

// Faults (MULTI_GPU): an NCCL error on one rank, or a rank that hangs in a collective, ends the run
// with one line naming the rank and exit status 1; the checkpoints written before stay whole and
// -y 1 continues. The emulation injects them (CUDA_EMU_NCCL_FAULT=rank:call:kind; a tiny step
// makes 52 collective calls, so call 114 falls in step 3, after checkpoints 1 and 2).
static void test_faults(const char* dir) {
    printf("\n== faults between GPUs\n");
    int visible = 0;
    cudaGetDeviceCount(&visible);
    if (visible < 2 || strstr(TRAINER, "emu") == NULL) {
        printf("(skipped: faults are injected through the CPU emulation of NCCL)\n");
        return;
    }
    const char* kinds[2] = {"error", "hang"};
    const char* needles[2] = {"NCCL reported", "made no progress"};
    // the hang is found by --nccl-timeout: well above an emulated step (1-3 s), so no false alarm
    const int timeouts[2] = {60, 15};
    for (int k = 0; k < 2; k++) {
        char out[1100], cmd[4096], errpath[1100];
        snprintf(out, sizeof(out), "%s/gpu_fault%d", dir, k);
        snprintf(errpath, sizeof(errpath), "%s/gpu_fault%d.err", dir, k);
        snprintf(cmd, sizeof(cmd), "rm -rf %s && CUDA_EMU_NCCL_FAULT=1:114:%s %s -p tiny -g 2 -b 2 -n 6 -k 1 --nccl-timeout %d "
                 "-i %s/b.bin -o %s > /dev/null 2> %s", out, kinds[k], TRAINER, timeouts[k], dir, out, errpath);
        double t0 = wall_seconds();
        int rc = run_command(cmd);
        double took = wall_seconds() - t0;
        char* err = read_text(errpath);
        int lines = 0;
        for (char* p = err; *p; p++) { lines += *p == '\n'; }
        uint64_t steps[4];
        int n = checkpoint_list(out, steps, 4);
        char* nl = strchr(err, '\n');
        if (nl) { *nl = 0; }
        check(rc == 1 && lines == 1 && strstr(err, needles[k]) != NULL && strstr(err, "rank") != NULL && n >= 1 &&
              steps[0] == 2 && took < 60.0, "an injected NCCL %s: exit %d after %.0f s, newest checkpoint step %d, '%s'",
              kinds[k], rc, took, n >= 1 ? (int)steps[0] : -1, err);
        free(err);
        snprintf(cmd, sizeof(cmd), "%s -p tiny -g 2 -b 2 -n 6 -k 1 -i %s/b.bin -o %s -y 1 > %s/gpu_fault%d.txt 2>&1", TRAINER,
                 dir, out, dir, k);
        rc = run_command(cmd);
        n = checkpoint_list(out, steps, 4);
        check(rc == 0 && n >= 1 && steps[0] == 6, "-y 1 after the %s continues from step 2 to the end", kinds[k]);
    }
}

// A run that starts on one trainer and continues on the other (-y 1 on the other's checkpoint)
// follows the run that stayed on the first within the precision's tolerance.
static void test_cross_trainer(const char* dir) {
    printf("\n== checkpoints across train_vla and train_vla_cpu\n");
    const char* flags = "-p tiny -b 4 -u 2 -l 1e-3 --log-every 100";
    const char* trainers[2] = {TRAINER, "./train_vla_cpu -t 1"};
    for (int first = 0; first < 2; first++) {
        const char* a = trainers[first];
        const char* b = trainers[1 - first];
        char cmd[4096], path[1100];
        snprintf(cmd, sizeof(cmd), "rm -rf %s/x_full %s/x_split && %s %s -n 6 -i %s/a.bin -o %s/x_full > %s/x_full.txt 2>&1 && "
                 "%s %s -n 3 -i %s/a.bin -o %s/x_split > %s/x_1.txt 2>&1 && "
                 "%s %s -n 6 -i %s/a.bin -o %s/x_split -y 1 > %s/x_2.txt 2>&1",
                 dir, dir, a, flags, dir, dir, dir, a, flags, dir, dir, dir, b, flags, dir, dir, dir);
        int rc = run_command(cmd);
        float full[6] = {0}, split[6] = {0};
        snprintf(path, sizeof(path), "%s/x_full/log.jsonl", dir);
        int nf = read_losses(path, 1, 6, full);
        snprintf(path, sizeof(path), "%s/x_split/log.jsonl", dir);
        int ns = read_losses(path, 1, 6, split);
        double e = rel_error(split + 3, full + 3, 3);
        check(rc == 0 && nf == 6 && ns == 6 && e < TOL_STEPS, "3 steps on %s, 3 more on %s from its checkpoint: steps 4-6 "
              "losses %.6f %.6f %.6f vs %.6f %.6f %.6f straight, rel err %.2e (tol %.1e)", a, b, split[3], split[4],
              split[5], full[3], full[4], full[5], e, TOL_STEPS);
    }
}

static void test_bad_input(const char* dir) {
    printf("\n== bad input\n");
    char args[2048];
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s/a.bin -o %s/bad_out -g 64", dir, dir);
    expect_error_from(dir, TRAINER, "more GPUs asked than visible", args, "more GPUs than the");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s/missing.bin -o %s/bad_out", dir, dir);
    expect_error_from(dir, TRAINER, "missing dataset", args, "missing.bin");
    snprintf(args, sizeof(args), "-p tiny -b 0 -i %s/a.bin", dir);
    expect_error_from(dir, TRAINER, "-b 0", args, "--batch 0");
    // a truncated checkpoint given to --init
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "rm -rf %s/gpu_trunc && %s -p tiny -b 2 -n 1 -i %s/a.bin -o %s/gpu_trunc > /dev/null 2>&1 && "
             "head -c 3000 %s/gpu_trunc/ckpt_00000001.bin > %s/gpu_trunc/short.bin", dir, TRAINER, dir, dir, dir, dir);
    run_command(cmd);
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 2 -i %s/a.bin -o %s/bad_out --init %s/gpu_trunc/short.bin", dir, dir, dir);
    expect_error_from(dir, TRAINER, "truncated checkpoint", args, "truncated");
}

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s FIXTURE_DIR TRAINER [TRAINER_WITHOUT_NCCL]   (make test writes the fixtures and "
                "runs this)\n", argv[0]);
        return 2;
    }
    const char* dir = argv[1];
    TRAINER = argv[2];
    setenv("CUDA_EMU_DEVICES", "2", 0);  // under the CPU emulation: two GPUs (a real machine ignores it)
    cudaDeviceProp prop;
    gpu_check_visible(1);
    gpu_init(0, &prop);
    printf("device: %s, precision %s, trainer %s\n", prop.name, PRECISION_NAME, TRAINER);
    test_against_oracle(dir, "a");
    test_against_oracle(dir, "b");
    test_training_loop(dir);
    test_determinism(dir);
    test_accumulation(dir);
#if defined(MULTI_GPU)
    if (argc == 4) { test_single_gpu_build(dir, argv[3]); }
#else
    printf("\n(world size 1 through NCCL: skipped, this build has no NCCL)\n");
#endif
    test_multi_gpu(dir);
    test_faults(dir);
    char trainer[1100];
    snprintf(trainer, sizeof(trainer), "%s -p tiny -b 4 -u 3 --log-every 100", TRAINER);
    printf("\n== bit-exact resume\n");
    check_resume_bit_exact(dir, trainer, TRAINER);
    test_cross_trainer(dir);
    test_bad_input(dir);
    gpu_shutdown();
    printf("\n%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
