/*
test_vla.c: checks train_vla.c (SmolVLA) against LeRobot 0.6.1 (dev/lerobot's references) and the
PyTorch oracle (dev/model.py), and tests the plumbing around the model. Includes the production
code, the policy library's functions too, so what is tested is what runs.

  make test     builds everything, writes the fixtures (data/synthetic), the oracle's files and
                LeRobot's references, then runs ./test_vla build/test build/lerobot_ref

Families: the parameter table (closed-form counts per train mode, the packed optimizer domain);
SmolVLA against its oracle per train mode (batch, init, velocities, loss, every trainable
gradient, finite differences, sampling, 10 AdamW steps) and against LeRobot itself; the training
loop against the oracle's 5 steps; simulated ranks, gradient accumulation and ZeRO-1; the
multi-node bootstrap; the sampler, the loader and the augmentation; task-balanced sampling on a
1:10 imbalanced dataset (--balance tasks, --task-weights); checkpoints (moments of the
trainable domain per mode, frozen weights, bit-exact resume, refusals); --max-text; bad input and
untrusted files; shard versions; the policy library. Exits non-zero on any failure; the last line
is `N passed, M failed`.
*/
#define TESTING
#define VLA_LIBRARY  // (the policy library's functions, which test_policy checks)
#include "train_vla.c"
#include "vla/rng.h"
#include "vla/safetensors.h"
#include "vla/atomic_file.h"
#include "vla/shard_writer.h"
#include "vla/bootstrap.h"
#include "tests/util/test_util.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ifaddrs.h>

// Whether each of the n counters is exactly 1: a partition covered every element once
static int covered_once(const unsigned char* seen, size_t n) {
    int once = 1;
    for (size_t e = 0; e < n; e++) { once &= seen[e] == 1; }
    return once;
}

// A record by name, or NULL (debug_find fails on a missing one; frozen tensors have no grad/ record)
static const Record* debug_lookup(const DebugState* st, const char* name) {
    for (int i = 0; i < st->n; i++) {
        if (strcmp(st->recs[i].name, name) == 0) { return &st->recs[i]; }
    }
    return NULL;
}

// max |x - ref| over n floats (NaN counts as infinite)
static double max_abs_diff(const float* x, const float* ref, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)ref[i]);
        if (!(d <= worst)) { worst = isnan(d) ? INFINITY : d; }
    }
    return worst;
}

// Writes n bytes at offset into an existing file
static void patch_file(const char* path, long offset, const void* data, size_t n) {
    FILE* f = fopenCheck(path, "r+b");
    fseek(f, offset, SEEK_SET);
    if (fwrite(data, 1, n, f) != n) { vla_fail("cannot patch %s", path); }
    fclose(f);
}

// train_vla_cpu with bad input: exit 1 and one line naming the problem (needle)
static void expect_error(const char* dir, const char* what, const char* args, const char* needle) {
    expect_error_from(dir, "./train_vla_cpu", what, args, needle);
}

// The loss of one batch (LeRobot's mean over its valid entries), its gradient left for the backward
static float flow_loss_value(FlowVLA* m, const ModelInputs* in) {
    int entries;
    flow_forward_loss(m, in, 1, &entries);
    return m->loss;
}

// One optimizer step on one batch: forward, backward in `mode`, AdamW at the schedule's rate
static float test_train_step(FlowVLA* m, const ModelInputs* in, int mode, int step, const TrainArgs* args,
                             float* norm) {
    float loss = flow_loss_value(m, in);
    flow_backward(m, mode);
    *norm = flow_update(m, mode, lr_at_step(args, step), args->weight_decay, args->decay_on, args->grad_clip, step, 1);
    return loss;
}

// Two batches hold the same bytes: every camera's frames, tokens and mask, state, actions, pads, t, eps
static int batches_equal(const Batch* a, const Batch* b, const FlowConfig* c) {
    if (a->B != b->B || !cameras_equal(&a->cams, &b->cams)) { return 0; }
    size_t B = (size_t)a->B, HA = (size_t)c->chunk * c->max_action_dim;
    int same = memcmp(a->tokens, b->tokens, B * c->max_text * sizeof(int32_t)) == 0 &&
               memcmp(a->token_mask, b->token_mask, B * c->max_text * 4) == 0 &&
               memcmp(a->state, b->state, B * c->max_state_dim * 4) == 0 &&
               memcmp(a->actions, b->actions, B * HA * 4) == 0 &&
               memcmp(a->action_is_pad, b->action_is_pad, B * c->chunk * 4) == 0 && memcmp(a->t, b->t, B * 4) == 0 &&
               memcmp(a->eps, b->eps, B * HA * 4) == 0;
    for (int k = 0; k < a->cams.n; k++) {
        same &= memcmp(a->images[k], b->images[k], B * a->cams.height[k] * a->cams.width[k] * 3) == 0;
    }
    return same;
}

// Whether every camera image of sample i of `shifted` is that of `plain` shifted by at most k
// pixels (the border replicated); *moved counts the images that did move
static int batch_cameras_shifted(const Batch* plain, const Batch* shifted, int i, int k, int* moved) {
    int all = 1;
    for (int cam = 0; cam < plain->cams.n; cam++) {
        int h = (int)plain->cams.height[cam], w = (int)plain->cams.width[cam], found = 0;
        const uint8_t* a = batch_image(plain, cam, i);
        const uint8_t* b = batch_image(shifted, cam, i);
        for (int dy = -k; dy <= k && !found; dy++) {
            for (int dx = -k; dx <= k && !found; dx++) {
                int match = 1;
                for (int y = 0; y < h && match; y++) {
                    for (int x = 0; x < w && match; x++) {
                        int sy = y + dy < 0 ? 0 : (y + dy >= h ? h - 1 : y + dy);
                        int sx = x + dx < 0 ? 0 : (x + dx >= w ? w - 1 : x + dx);
                        match = memcmp(b + ((size_t)y * w + x) * 3, a + ((size_t)sy * w + sx) * 3, 3) == 0;
                    }
                }
                if (match) { found = 1; *moved += dx != 0 || dy != 0; }
            }
        }
        all &= found;
    }
    return all;
}

// ----------------------------------------------------------------------------
// the parameter table: counts against a closed form written from SmolVLA's architecture (not from
// the table), per train mode; the optimizer's packed domain; ZeRO-1's shards of it

// Elements of the model at config c that train in `mode` (TRAIN_MODE_COUNT: all of them), counted
// tower by tower as README.md's model section describes it: SmolVLA's, or pi0's (the projector's
// bias, the state token at the expert's width, the last VLM layer's norm and q/k/v training)
static size_t flow_closed_form(const FlowConfig* c, int mode) {
    size_t Cv = c->vis_width, Fv = c->vis_ff, Lv = c->vis_layers, G = (size_t)c->img / c->patch, s = c->scale_factor;
    size_t C = c->d_model, F = c->d_ff, L = c->n_layer, D = (size_t)c->n_head * c->head_dim;
    size_t KV = (size_t)c->n_kv_head * c->head_dim, Ce = c->d_expert, Fe = c->d_expert_ff;
    size_t joint = (L + c->self_attn_every - 1) / c->self_attn_every, cross = L - joint;
    size_t vision = Cv * 3 * c->patch * c->patch + Cv + G * G * Cv +
                    Lv * (4 * Cv + 4 * (Cv * Cv + Cv) + Fv * Cv + Fv + Cv * Fv + Cv) + 2 * Cv;
    size_t vlm_layer = C + D * C + 2 * KV * C + C * D + C + 3 * F * C;
    size_t pi0 = c->family == FAMILY_PI0, connector = C * Cv * s * s + pi0 * C;
    size_t vlm = connector + (size_t)c->vocab * C + L * vlm_layer + C;  // + the final norm
    size_t Cs = pi0 ? Ce : C, state = Cs * c->max_state_dim + Cs;
    size_t heads = Ce * c->max_action_dim + Ce + 2 * Ce * Ce + Ce + Ce * Ce + Ce + Ce + c->max_action_dim * Ce +
                   c->max_action_dim;  // action_in, time MLP in and out, the expert's norm, action_out
    size_t expert = L * (Ce + D * Ce + Ce * D + Ce + 3 * Fe * Ce) + joint * 2 * KV * Ce + cross * 2 * KV * KV;
    size_t always = state + heads + expert;
    if (mode == TRAIN_MODE_EXPERT) { return always; }
    // not the last layer (but pi0's norm and q/k/v of it), not the final norm
    size_t vlm_trained = connector + (size_t)c->vocab * C + (L - 1) * vlm_layer + pi0 * (C + D * C + 2 * KV * C);
    if (mode == TRAIN_MODE_VLM) { return always + vlm_trained; }
    if (mode == TRAIN_MODE_ALL) { return always + vlm_trained + vision; }
    return vision + vlm + state + heads + expert;
}

// gemm_part with every tile this CPU can run, on products of shapes that leave edges in both
// panels and take several blocks of k, each operand layout, and row strides wider than the
// matrix: every tile gives the first tile's bits, and those are the products to float rounding
// (against sums in double). The first tile also computes each product as a team of two threads
// (these shapes take each of gemm_plan's three ways of sharing the work, several with a short
// last k block, one with several blocks of rows and of columns, one with no k at all), and as a
// `set` product onto a bias row, over what C held: the same bits again.
static void test_gemm_tiles(void) {
    printf("\n== matrix-product tiles (gemm_part)\n");
    const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {13, 300, 37}, {50, 720, 64}, {97, 513, 65}, {12, 256, 32},
                             {74, 468, 56}, {130, 300, 200}, {200, 40, 530}, {7, 0, 9}};
    int n_kernels = 0;
    while (gemm_kernel_at(n_kernels) != NULL) { n_kernels++; }
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        for (int layout = 0; layout < 4; layout++) {
            int ta = layout & 1, tb = layout >> 1, pad = 3;  // (row strides pad wider than the rows)
            int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
            float* A = (float*)mallocCheck(na * sizeof(float));
            float* B = (float*)mallocCheck(nb * sizeof(float));
            float* C0 = (float*)mallocCheck(nc * sizeof(float));
            float* C = (float*)mallocCheck(nc * sizeof(float));
            float* bias = (float*)mallocCheck((size_t)N * sizeof(float));
            for (int j = 0; j < N; j++) { bias[j] = 0.25f; }
            uint32_t r = 12345u + (uint32_t)(s * 4 + layout);
            for (size_t i = 0; i < na + nb; i++) {  // uniform in [-1, 1)
                r = r * 1664525u + 1013904223u;
                float v = (float)(r >> 8) / 8388608.0f - 1.0f;
                if (i < na) { A[i] = v; } else { B[i - na] = v; }
            }
            double worst = 0.0;
            int same = 1, runs = n_kernels + 2;
            for (int k = 0; k < runs; k++) {  // every tile, then the first as a team of two, then as `set`
                const GemmKernel* g = gemm_kernel_at(k < n_kernels ? k : 0);
                float* out = k == 0 ? C0 : C;
                int set = k == n_kernels + 1, nt = k == n_kernels ? 2 : 1;
                for (int i = 0; i < M; i++) {  // (a `set` product overwrites what C holds)
                    for (int j = 0; j < ldc; j++) { out[(size_t)i * ldc + j] = set && j < N ? -3.0f : 0.25f; }
                }
                size_t bytes = (gemm_panel_floats(g, M, K, N, nt) * sizeof(float) + 64) / 64 * 64;  // (K = 0: none)
                float* panels = (float*)aligned_alloc(64, bytes);
                if (panels == NULL) { vla_fail_no_memory("out of memory for the tiles' test panels"); }
                #pragma omp parallel num_threads(nt) if (nt > 1)
                gemm_part(g, out, ldc, A, lda, ta, B, ldb, tb, M, K, N, set, set ? bias : NULL, panels,
                          omp_get_thread_num(), omp_get_num_threads());
                free(panels);
                if (k > 0 && memcmp(C, C0, nc * sizeof(float)) != 0) { same = 0; }
            }
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < N; j++) {
                    double want = 0.25, mag = 0.0;
                    for (int q = 0; q < K; q++) {
                        double a = ta ? A[(size_t)q * lda + i] : A[(size_t)i * lda + q];
                        double b = tb ? B[(size_t)j * ldb + q] : B[(size_t)q * ldb + j];
                        want += a * b;
                        mag += fabs(a * b);
                    }
                    double err = fabs((double)C0[(size_t)i * ldc + j] - want) / (mag + 1.0);
                    worst = err > worst ? err : worst;
                }
            }
            int pads_kept = 1;  // (the columns past N of each row are not written)
            for (int i = 0; i < M; i++) {
                for (int j = N; j < ldc; j++) { pads_kept &= C0[(size_t)i * ldc + j] == 0.25f; }
            }
            check(same && worst < 1e-6 && pads_kept,
                  "%d x %d x %d, %s A, %s B: %d tile(s) (%s first), 2 threads and a bias set give the same bits, "
                  "within %.1e of double sums, nothing past the rows written", M, K, N, ta ? "transposed" : "plain",
                  tb ? "transposed" : "plain", n_kernels, gemm_kernel_at(0)->name, worst);
            free(A); free(B); free(C0); free(C); free(bias);
        }
    }
}

static void test_param_table(void) {
    printf("\n== parameter table\n");
    for (int p = 0; p < FLOW_N_PRESETS; p++) {
        const FlowConfig* c = &FLOW_PRESETS[p].config;
        const char* name = FLOW_PRESETS[p].name;
        FlowParamTable t;
        flow_table_build(c, &t);
        size_t sum = 0;
        int contiguous = 1;
        for (int k = 0; k < FLOW_NUM_TENSORS; k++) {
            contiguous &= t.spec[k].offset == sum;
            sum += t.spec[k].numel;
        }
        size_t expected = flow_closed_form(c, TRAIN_MODE_COUNT);
        check(flow_config_problem(c) == NULL && contiguous && sum == t.total && t.total == expected,
              "preset %-9s: %zu parameters, table contiguous, the closed form's %zu", name, t.total, expected);
        for (int mode = 0; mode < TRAIN_MODE_COUNT; mode++) {
            FlowOptDomain d;
            flow_opt_domain(&t, mode, &d);
            size_t packed = 0;
            int prefixes = 1;
            for (int k = 0; k < FLOW_NUM_TENSORS; k++) {
                prefixes &= d.offset[k] == packed && d.numel[k] <= t.spec[k].numel;
                packed += d.numel[k];
            }
            size_t closed = flow_closed_form(c, mode);
            check(prefixes && packed == d.total && d.total == flow_trainable_count(&t, mode) && d.total == closed,
                  "preset %-9s --train %-6s: %zu trainable, packed in table order, the closed form's %zu", name,
                  TRAIN_MODE_NAMES[mode], d.total, closed);
        }
    }
    // the released model's sizes: LeRobot counts lerobot/smolvla_base (with lm_head, vocab x C, which
    // feeds nothing and is not in the table) as 450,046,176, of which 99,880,992 train by default
    FlowParamTable t;
    flow_table_build(&flow_preset("smolvla")->config, &t);
    size_t lm_head = 49280 * 960;
    check(t.total + lm_head == 450046176 && flow_trainable_count(&t, TRAIN_MODE_EXPERT) == 99880992,
          "preset smolvla: %zu + lm_head %zu = LeRobot's 450,046,176; %zu trainable = LeRobot's 99,880,992", t.total,
          lm_head, flow_trainable_count(&t, TRAIN_MODE_EXPERT));
    // pi0's released sizes: LeRobot's PI0Policy holds 4,028,019,472 parameters, of which the two
    // lm_heads (257152 x 2048 and x 1024), not in the table, feed nothing: 3,238,048,528 used
    flow_table_build(&flow_preset("pi0")->config, &t);
    size_t lm_heads = (size_t)257152 * (2048 + 1024);
    check(t.total == 3238048528ULL && t.total + lm_heads == 4028019472ULL,
          "preset pi0: %zu parameters = LeRobot's 3,238,048,528 used; + lm_heads %zu = its 4,028,019,472", t.total,
          lm_heads);
    // the trainable part of a tensor is a prefix: the VLM's stacks train all but their last layer
    flow_table_build(&flow_preset("tiny")->config, &t);
    const FlowParamSpec* wq = &t.spec[FLOWP_vlm_wq];
    size_t per_layer = wq->numel / (size_t)wq->shape[0];
    check(flow_trainable_numel(wq, TRAIN_MODE_EXPERT) == 0 &&
          flow_trainable_numel(wq, TRAIN_MODE_VLM) == wq->numel - per_layer &&
          flow_trainable_numel(&t.spec[FLOWP_vlm_norm], TRAIN_MODE_ALL) == 0 &&
          flow_trainable_numel(&t.spec[FLOWP_vis_wq], TRAIN_MODE_VLM) == 0 &&
          flow_trainable_numel(&t.spec[FLOWP_exp_wq], TRAIN_MODE_EXPERT) == t.spec[FLOWP_exp_wq].numel,
          "vlm_wq trains all but its last layer (%zu of %zu) in vlm and all; vlm_norm never; the vision tower in all "
          "only; the expert always", wq->numel - per_layer, wq->numel);
}

// ----------------------------------------------------------------------------
// SmolVLA against its oracle dev/model.py (float64), on shard data: for each training mode,
// the batch assembled from build/test/s.bin (two cameras of different sizes), the seeded init,
// velocities, loss, every trainable gradient, finite differences, sampling and 10 AdamW steps.

static void test_smolvla_oracle_mode(const char* dir, int mode) {
    const char* name = TRAIN_MODE_NAMES[mode];
    char path[1024];
    double t0 = wall_seconds();
    snprintf(path, sizeof(path), "%s/s_%s_state.bin", dir, name);
    printf("\n== SmolVLA vs dev/model.py: %s (train mode %s)\n", path, name);
    DebugState st;
    debug_state_read(&st, path);

    // the config, hyperparameters and seed of the oracle's run
    FlowConfig c;
    int32_t* values = (int32_t*)debug_get(&st, "config", 27);
    int f = 0;
#define FLOW_FROM_RECORD_(field) c.field = values[f++];
    FLOW_CONFIG_FIELDS(FLOW_FROM_RECORD_)
#undef FLOW_FROM_RECORD_
    free(values);
    const char* problem = flow_config_problem(&c);
    check(problem == NULL && f == 27, "%s: config record (%d fields) %s", name, f,
          problem != NULL ? problem : "is valid");
    if (problem != NULL) { free(st.recs); free(st.file); return; }
    float* hp = (float*)debug_get(&st, "hparams", 6);
    int32_t* seed_rec = (int32_t*)debug_get(&st, "seed", 1);
    int32_t* mode_rec = (int32_t*)debug_get(&st, "train_mode", 1);
    check(mode_rec[0] == mode, "%s: the state's train mode is %d", name, mode_rec[0]);
    TrainArgs args;
    memset(&args, 0, sizeof(args));
    args.lr = hp[0]; args.min_lr_frac = hp[1]; args.warmup = (int)hp[2]; args.steps = (int)hp[3];
    args.weight_decay = hp[4]; args.grad_clip = hp[5];
    uint64_t seed = (uint64_t)seed_rec[0];
    free(hp); free(seed_rec); free(mode_rec);

    // the batch: the sampler's samples of step 0 through batch_fill
    Dataset ds;
    snprintf(path, sizeof(path), "%s/s.bin", dir);
    dataset_open(&ds, path);
    int B = (int)debug_find(&st, "batch/indices")->numel, H = c.chunk, Am = c.max_action_dim, A = c.action_dim;
    int S = c.state_dim;
    float* stats = (float*)debug_get(&st, "stats", (size_t)2 * (S + A));
    int stats_ok = ds.state_dim == S && ds.action_dim == A;
    for (int d = 0; d < S && stats_ok; d++) {
        stats_ok &= ds.state_mean[d] == stats[d] && ds.state_std[d] == stats[S + d];
    }
    for (int d = 0; d < A && stats_ok; d++) {
        stats_ok &= ds.action_mean[d] == stats[2 * S + d] && ds.action_std[d] == stats[2 * S + A + d];
    }
    check(stats_ok, "%s: the dataset's normalization statistics equal the oracle's", name);
    free(stats);
    int32_t* ref_idx = (int32_t*)debug_get(&st, "batch/indices", B);
    Sampler sampler;
    sampler_init(&sampler, ds.n_samples, seed);
    uint64_t idx[B];
    sampler_rank_indices(&sampler, B, 0, idx);
    int idx_ok = 1;
    for (int i = 0; i < B; i++) { idx_ok &= idx[i] == (uint64_t)ref_idx[i]; }
    check(idx_ok, "%s: the sampler's %d samples of step 0 are the oracle's", name, B);
    Batch batch;
    batch_alloc(&batch, &c, &ds.cams, B);
    batch_fill(&batch, &ds, &c, idx, seed, 0, 0, 0);
    int frames_ok = 1;
    for (int k = 0; k < c.n_cam; k++) {
        char key[64];
        snprintf(key, sizeof(key), "batch/image%d", k);
        size_t n = (size_t)B * ds.cams.height[k] * ds.cams.width[k] * 3;
        uint8_t* ref = (uint8_t*)debug_get(&st, key, n);
        frames_ok &= memcmp(ref, batch.images[k], n) == 0;
        free(ref);
    }
    check(frames_ok, "%s: frames of %d cameras (%ux%u, %ux%u) equal the oracle's", name, c.n_cam, ds.cams.height[0],
          ds.cams.width[0], ds.cams.height[c.n_cam > 1], ds.cams.width[c.n_cam > 1]);
    int32_t* ref_tokens = (int32_t*)debug_get(&st, "batch/tokens", (size_t)B * c.max_text);
    check(memcmp(ref_tokens, batch.tokens, (size_t)B * c.max_text * sizeof(int32_t)) == 0,
          "%s: token ids (%d per sample) equal the oracle's", name, c.max_text);
    free(ref_tokens);
    // the float records are float32 computations of the same expressions (t and eps: doubles
    // rounded once): bit-equal in practice; 1e-7 absolute allows a different rounding of a normalization
    const double tol_batch = 1e-7;
    struct { const char* key; const float* ours; size_t n; } floats[] = {
        {"batch/token_mask", batch.token_mask, (size_t)B * c.max_text},
        {"batch/state", batch.state, (size_t)B * c.max_state_dim},
        {"batch/actions", batch.actions, (size_t)B * H * Am},
        {"batch/action_is_pad", batch.action_is_pad, (size_t)B * H},
        {"batch/t", batch.t, (size_t)B}, {"batch/eps", batch.eps, (size_t)B * H * Am},
    };
    for (size_t k = 0; k < sizeof(floats) / sizeof(floats[0]); k++) {
        float* ref = (float*)debug_get(&st, floats[k].key, floats[k].n);
        double e = max_abs_diff(floats[k].ours, ref, floats[k].n);
        check(e <= tol_batch, "%s: %s max abs diff %.1e%s (tol %.0e)", name, floats[k].key, e,
              e == 0.0 ? " (exact)" : "", tol_batch);
        free(ref);
    }

    // init from the seed: the same draws, rounded to float32 the same way: exact
    FlowVLA m;
    flow_build(&m, &c, mode);
    flow_param_init(m.params_memory, &m.table, &c, seed);
    int init_ok = 1;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &m.table.spec[i];
        char key[96];
        snprintf(key, sizeof(key), "param/%s", s->name);
        float* ref = (float*)debug_get(&st, key, s->numel);
        if (memcmp(ref, m.params_memory + s->offset, s->numel * sizeof(float)) != 0) {
            init_ok = 0;
            check(0, "%s: %s differs from the oracle's init", name, key);
        }
        free(ref);
    }
    check(init_ok, "%s: init from seed %llu equals the oracle's, all %d tensors bit for bit", name,
          (unsigned long long)seed, FLOW_NUM_TENSORS);

    // forward and backward: fp32 against float64, a few hundred dependent roundings of ~6e-8 each
    const double tol = 1e-5;
    ModelInputs in = model_inputs(&batch);
    float loss = flow_loss_value(&m, &in);
    size_t n_out = (size_t)B * H * Am, n_pix = (size_t)c.n_cam * B * 3 * c.img * c.img;
    float* ref_pix = (float*)debug_get(&st, "expect/pixels", n_pix);
    double ep = rel_error(m.acts.pixels, ref_pix, n_pix);
    check(ep <= tol, "%s: frames resized with padding to %d px rel err %.2e (tol %.0e)", name, c.img, ep, tol);
    free(ref_pix);
    float* ref_v = (float*)debug_get(&st, "expect/v", n_out);
    float* ref_loss = (float*)debug_get(&st, "expect/loss", 1);
    double ev = rel_error(m.acts.v_t, ref_v, n_out), el = rel_error(&loss, ref_loss, 1);
    check(ev <= tol, "%s: velocities rel err %.2e (tol %.0e)", name, ev, tol);
    check(el <= tol, "%s: loss %.7f vs %.7f rel err %.2e (tol %.0e)", name, loss, ref_loss[0], el, tol);
    free(ref_v); free(ref_loss);
    flow_backward(&m, mode);
    double worst = 0.0;
    const char* worst_name = "";
    int n_trained = 0, grads_ok = 1;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &m.table.spec[i];
        char key[96];
        snprintf(key, sizeof(key), "grad/%s", s->name);
        const Record* r = debug_lookup(&st, key);
        const float* ours = m.grads_memory + s->offset;
        if (flow_trainable_numel(s, mode) == 0) {
            int zero = 1;
            for (size_t j = 0; j < s->numel; j++) { zero &= ours[j] == 0.0f; }
            if (r != NULL || !zero) {
                grads_ok = 0;
                check(0, "%s: %s is frozen: the oracle has %s record, ours is %s", name, key, r ? "a" : "no",
                      zero ? "zero" : "NOT zero");
            }
            continue;
        }
        n_trained++;
        double e = INFINITY;
        if (r != NULL && r->numel == s->numel) {
            float* ref = (float*)debug_get(&st, key, s->numel);
            if (i == FLOWP_vis_bk) {
                // zero by symmetry (softmax ignores a shift of a row's scores): both are rounding
                // noise, each measured against the query bias's gradient instead of the other
                float* ref_q = (float*)debug_get(&st, "grad/vis_bq", s->numel);
                double scale = norm2(ref_q, s->numel), e_ours = norm2(ours, s->numel) / scale;
                double e_ref = norm2(ref, s->numel) / scale;
                check(e_ours <= tol && e_ref <= tol,
                      "%s: grad/vis_bk is zero by symmetry: |ours| %.1e, |oracle| %.1e of |grad/vis_bq| (tol %.0e)",
                      name, e_ours, e_ref, tol);
                e = 0.0;
                free(ref_q);
            } else {
                e = rel_error(ours, ref, s->numel);
            }
            free(ref);
        }
        if (!(e <= tol)) {
            grads_ok = 0;
            check(0, "%s: %s rel err %.2e (tol %.0e)%s", name, key, e, tol, r == NULL ? ": the oracle has none" : "");
        }
        if (!(e <= worst)) { worst = e; worst_name = s->name; }
    }
    check(grads_ok,
          "%s: %d trainable gradients (%zu elements): worst rel err %.2e (%s) (tol %.0e); the frozen ones zero", name,
          n_trained, flow_trainable_count(&m.table, mode), worst, worst_name, tol);

    // finite differences of the float64 loss at each tensor's largest gradient: independent of the
    // oracle's autograd. Central differences with h = 1e-5 are exact to ~1e-9 relative there; the
    // fp32 gradient to ~1e-6: 1e-5 bounds both
    const double tol_fd = 1e-5;
    int n_fd = (int)debug_find(&st, "fd/value")->numel;
    int32_t* fd_index = (int32_t*)debug_get(&st, "fd/index", (size_t)2 * n_fd);
    float* fd_value = (float*)debug_get(&st, "fd/value", n_fd);
    double worst_fd = 0.0;
    int fd_ok = n_fd > 0;
    for (int k = 0; k < n_fd; k++) {
        int i = fd_index[2 * k];
        const FlowParamSpec* s = i >= 0 && i < FLOW_NUM_TENSORS ? &m.table.spec[i] : NULL;
        double e = INFINITY;
        if (s != NULL && fd_index[2 * k + 1] >= 0 && (size_t)fd_index[2 * k + 1] < s->numel) {
            float g = m.grads_memory[s->offset + (size_t)fd_index[2 * k + 1]];
            e = fabs((double)g - fd_value[k]) / fabs((double)fd_value[k]);
        }
        if (!(e <= tol_fd)) {
            fd_ok = 0;
            check(0, "%s: finite difference %d (%s) rel err %.2e (tol %.0e)", name, k, s ? s->name : "?", e, tol_fd);
        }
        if (!(e <= worst_fd)) { worst_fd = e; }
    }
    check(fd_ok, "%s: %d finite differences agree with our gradients: worst rel err %.2e (tol %.0e)", name, n_fd,
          worst_fd, tol_fd);
    free(fd_index); free(fd_value);

    // sampling: 10 Euler steps from the batch's eps, then un-normalized
    float* chunk = (float*)mallocCheck(n_out * sizeof(float));
    float* actions = (float*)mallocCheck((size_t)B * H * A * sizeof(float));
    flow_sample(&m, &in, batch.eps, chunk);
    for (size_t r = 0; r < (size_t)B * H; r++) {
        for (int d = 0; d < A; d++) { actions[r * A + d] = chunk[r * Am + d] * ds.action_std[d] + ds.action_mean[d]; }
    }
    float* ref_sample = (float*)debug_get(&st, "expect/sample", n_out);
    float* ref_actions = (float*)debug_get(&st, "expect/sample_actions", (size_t)B * H * A);
    double es = rel_error(chunk, ref_sample, n_out), ea = rel_error(actions, ref_actions, (size_t)B * H * A);
    check(es <= tol, "%s: sampled chunk (%d Euler steps) rel err %.2e (tol %.0e)", name, FLOW_NUM_STEPS, es, tol);
    check(ea <= tol, "%s: sampled actions un-normalized rel err %.2e (tol %.0e)", name, ea, tol);
    free(chunk); free(actions); free(ref_sample); free(ref_actions);

    // 10 AdamW steps on this batch: the schedule, clipping and the moments of the trainable prefix
    float losses[10], norms[10];
    for (int step = 0; step < 10; step++) { losses[step] = test_train_step(&m, &in, mode, step, &args, &norms[step]); }
    float* ref_losses = (float*)debug_get(&st, "expect/losses", 10);
    float* ref_norms = (float*)debug_get(&st, "expect/norms", 10);
    double els = rel_error(losses, ref_losses, 10), ens = rel_error(norms, ref_norms, 10);
    check(els <= tol, "%s: 10 AdamW steps' losses %.6f .. %.6f rel err %.2e (tol %.0e)", name, losses[0], losses[9],
          els, tol);
    check(ens <= tol, "%s: their gradient norms %.6f .. %.6f rel err %.2e (tol %.0e)", name, norms[0], norms[9], ens,
          tol);
    check(m.opt.total == flow_trainable_count(&m.table, mode), "%s: AdamW's moments cover the %zu trainable elements "
          "only (of %zu)", name, m.opt.total, m.table.total);
    int frozen_still = 1;  // the frozen part of every tensor (past its trainable prefix) never moved
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &m.table.spec[i];
        size_t first = flow_trainable_numel(s, mode);
        char key[96];
        snprintf(key, sizeof(key), "param/%s", s->name);
        float* init = (float*)debug_get(&st, key, s->numel);
        frozen_still &=
            memcmp(init + first, m.params_memory + s->offset + first, (s->numel - first) * sizeof(float)) == 0;
        free(init);
    }
    check(frozen_still, "%s: the %zu frozen elements are bit for bit their init after the 10 steps", name,
          m.table.total - m.opt.total);
    free(ref_losses); free(ref_norms);
    printf("        (%s: %.0f ms)\n", name, 1000.0 * (wall_seconds() - t0));

    flow_free(&m);
    batch_free(&batch);
    sampler_free(&sampler);
    dataset_close(&ds);
    free(ref_idx);
    free(st.recs); free(st.file);
}

static void test_smolvla_oracle(const char* dir) {
    double t0 = wall_seconds();
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) { test_smolvla_oracle_mode(dir, mode); }
    printf("        (SmolVLA vs its oracle: %.2f s)\n", wall_seconds() - t0);
}

// ----------------------------------------------------------------------------
// SmolVLA against LeRobot 0.6.1 itself (dev/lerobot): for each training mode's case folder
// (expert, vlm, all), LeRobot's weights load by name, its batch runs through train_vla.c's
// SmolVLA section from the raw uint8 frames and token ids, and the prepared images, velocities,
// loss, every trainable gradient and the 10-step sampled chunk are checked against what LeRobot
// computed. The config comes from CASE/c_config.txt (dev/smolvla.py --c-config, made by make test).


static void test_smolvla_case(const char* family, const char* ref_dir, int mode) {
    const char* name = TRAIN_MODE_NAMES[mode];
    char path[1024], err[512];
    double t0 = wall_seconds();
    printf("\n== %s vs LeRobot 0.6.1: %s/%s (train mode %s)\n", family, ref_dir, name, name);
    // fp32 against LeRobot's fp32: two roundings of the same few hundred dependent operations in
    // different orders (~1e-7 each); 1e-5 relative bounds their accumulated difference with margin
    const double tol = 1e-5;
    FlowConfig c;
    snprintf(path, sizeof(path), "%s/%s/c_config.txt", ref_dir, name);
    int rc = flow_config_read(path, &c, err, sizeof(err));
    check(rc == 0, "%s: config from %s%s%s", name, path, rc ? ": " : "", rc ? err : "");
    if (rc != 0) { return; }
    FlowVLA m;
    flow_build(&m, &c, mode);
    SafeTensors weights, ref;
    snprintf(path, sizeof(path), "%s/%s/policy/model.safetensors", ref_dir, name);
    rc = safetensors_open(&weights, path, err, sizeof(err)) ||
         flow_load_safetensors(&weights, &c, &m.table, m.params_memory, err, sizeof(err));
    check(rc == 0, "%s: LeRobot's weights load by name from %s%s%s", name, path, rc ? ": " : "", rc ? err : "");
    safetensors_close(&weights);
    snprintf(path, sizeof(path), "%s/%s/ref.safetensors", ref_dir, name);
    int rc_ref = safetensors_open(&ref, path, err, sizeof(err));
    check(rc_ref == 0, "%s: reference batch %s%s%s", name, path, rc_ref ? ": " : "", rc_ref ? err : "");
    if (rc != 0 || rc_ref != 0) { flow_free(&m); return; }

    // parameter counts: LeRobot's include the lm_heads (SmolVLA's vocab x C; pi0's also vocab x Ce),
    // which the table leaves out (they feed nothing). Trainable: SmolVLA's LeRobot freezes what gets
    // no gradient; pi0's does not (its never-gradient tensors are counted apart, as case.json has them)
    snprintf(path, sizeof(path), "%s/%s/case.json", ref_dir, name);
    char* info = read_text(path);
    long long total = json_int(info, "params_total"), trainable = json_int(info, "params_trainable");
    long long lm_heads = c.family == FAMILY_PI0 ? json_int(info, "params_lm_heads") : (long long)c.vocab * c.d_model;
    long long graded = trainable;
    if (c.family == FAMILY_PI0) {  // the elements of LeRobot's gradients
        graded = 0;
        for (int i = 0; i < ref.n; i++) {
            graded += strncmp(ref.tensors[i].name, "grad.", 5) == 0 ? (long long)ref.tensors[i].numel : 0;
        }
    }
    size_t ours = flow_trainable_count(&m.table, mode);
    check(total > 0 && lm_heads > 0 && m.table.total + (size_t)lm_heads == (size_t)total,
          "%s: %zu parameters + lm_heads %lld = LeRobot's %lld", name, m.table.total, lm_heads, total);
    check(graded > 0 && ours == (size_t)graded,
          "%s: %zu trainable, LeRobot's %lld with a gradient (%lld requires_grad)", name, ours, graded, trainable);

    // the batch, as LeRobot's pre-processor left it: raw frames, token ids, normalized state/actions
    char cams[VLA_MAX_CAM][64];
    int n_cams = json_strings(info, "camera_order", cams, VLA_MAX_CAM);
    int B = (int)json_int(info, "batch_size"), H = c.chunk, Am = c.max_action_dim;
    free(info);
    ModelInputs in;
    memset(&in, 0, sizeof(in));
    in.B = B;
    int have = n_cams == c.n_cam && B > 0;
    uint8_t* frames[VLA_MAX_CAM] = {NULL};
    for (int k = 0; k < n_cams && have; k++) {
        char key[128];
        snprintf(key, sizeof(key), "images_u8.%s", cams[k]);
        const SafeTensorInfo* t = safetensors_find(&ref, key);
        have = t != NULL && t->dtype == ST_U8 && t->ndim == 4 && t->shape[0] == B && t->shape[3] == 3;
        if (!have) { break; }
        frames[k] = (uint8_t*)mallocCheck(t->numel);
        memcpy(frames[k], ref.data + t->begin, t->numel);
        in.frames[k] = frames[k];
        in.frame_h[k] = (int)t->shape[1];
        in.frame_w[k] = (int)t->shape[2];
    }
    int32_t* tokens = ref_ints(&ref, "lang_tokens", (size_t)B * c.max_text);
    float* token_mask = ref_tensor(&ref, "lang_masks", (size_t)B * c.max_text);
    float* state = ref_tensor(&ref, "state_norm", (size_t)B * c.max_state_dim);
    float* actions = ref_tensor(&ref, "actions_norm", (size_t)B * H * Am);
    float* action_is_pad = ref_tensor(&ref, "action_is_pad", (size_t)B * H);
    float* t = ref_tensor(&ref, "time", (size_t)B);
    float* noise = ref_tensor(&ref, "noise", (size_t)B * H * Am);
    float* sample_noise = ref_tensor(&ref, "sample_noise", (size_t)B * H * Am);
    float* ref_v = ref_tensor(&ref, "v_t", (size_t)B * H * Am);
    float* ref_loss = ref_tensor(&ref, "loss", 1);
    float* ref_chunk = ref_tensor(&ref, "chunk_norm", (size_t)B * H * Am);
    have = have && tokens && token_mask && state && actions && action_is_pad && t && noise && sample_noise && ref_v &&
           ref_loss && ref_chunk;
    check(have, "%s: the batch (%d cameras, B %d, %d tokens) is in the reference file with the config's shapes", name,
          n_cams, B, c.max_text);
    if (have) {
        in.tokens = tokens; in.token_mask = token_mask; in.state = state; in.actions = actions;
        in.action_is_pad = action_is_pad; in.t = t; in.noise = noise;

        // forward: prepared images, velocities, loss
        float loss = flow_loss_value(&m, &in);
        size_t per_cam = (size_t)B * 3 * c.img * c.img;
        for (int k = 0; k < n_cams; k++) {
            char key[128];
            snprintf(key, sizeof(key), "images_prepped.%s", cams[k]);
            float* prepped = ref_tensor(&ref, key, per_cam);
            double e = prepped != NULL ? rel_error(m.acts.pixels + k * per_cam, prepped, per_cam) : INFINITY;
            check(e <= tol, "%s: %s (%dx%d frames resized with padding to %d) rel err %.2e (tol %.0e)", name, key,
                  in.frame_h[k], in.frame_w[k], c.img, e, tol);
            free(prepped);
        }
        double ev = rel_error(m.acts.v_t, ref_v, (size_t)B * H * Am), el = rel_error(&loss, ref_loss, 1);
        check(ev <= tol, "%s: v_t rel err %.2e (tol %.0e)", name, ev, tol);
        check(el <= tol, "%s: loss %.7f vs LeRobot %.7f rel err %.2e (tol %.0e)", name, loss, ref_loss[0], el, tol);

        // backward: every slice that trains in this mode against grad.<LeRobot name>, worst per tower;
        // frozen ones: LeRobot has no gradient, and ours is never written
        double t_bwd = wall_seconds();
        flow_backward(&m, mode);
        t_bwd = wall_seconds() - t_bwd;
        const char* tower_names[3] = {"vision", "vlm", "expert"};
        double worst[3] = {0, 0, 0};
        char worst_name[3][256] = {"", "", ""};
        int n_slices[3] = {0, 0, 0}, n_frozen = 0, frozen_ok = 1, n_ref_grads = 0;
        for (int i = 0; i < ref.n; i++) { n_ref_grads += strncmp(ref.tensors[i].name, "grad.", 5) == 0; }
        for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
            const FlowParamSpec* s = &m.table.spec[i];
            size_t n = flow_slices(s), per = flow_slice_numel(s);
            for (size_t k = 0; k < n; k++) {
                char lname[256], key[300];
                if (s->slices == SLICES_NONE) { snprintf(lname, sizeof(lname), "%s", s->lerobot); }
                else { snprintf(lname, sizeof(lname), s->lerobot, flow_slice_layer(&c, s, (int)k)); }
                snprintf(key, sizeof(key), "grad.%s", lname);
                const float* ours_g = m.grads_memory + s->offset + k * per;
                float* ref_g = ref_tensor(&ref, key, per);
                if (flow_grad(&m, mode, i, (int)k) == NULL) {
                    int zero = 1;
                    for (size_t e = 0; e < per; e++) { zero &= ours_g[e] == 0.0f; }
                    if (ref_g != NULL || !zero) {
                        frozen_ok = 0;
                        check(0, "%s: %s is frozen here: LeRobot has %s gradient, ours is %s", name, lname,
                              ref_g != NULL ? "a" : "no", zero ? "zero" : "NOT zero");
                    }
                    n_frozen++;
                    free(ref_g);
                    continue;
                }
                n_slices[s->tower]++;
                double e;
                if (ref_g == NULL) {
                    e = INFINITY;
                } else if (s->tower == TOWER_VISION && strstr(lname, "k_proj.bias") != NULL) {
                    // The key bias's gradient is exactly zero: adding b to every key adds q.b to every
                    // score of a query's row, and softmax ignores a shift (SigLIP has no mask). Both
                    // fp32 values are rounding noise, so each is measured against the same layer's
                    // q_proj.bias gradient instead of against the other.
                    char qkey[300];
                    snprintf(qkey, sizeof(qkey), "%s", key);
                    memcpy(strstr(qkey, "k_proj.bias"), "q", 1);
                    float* ref_q = ref_tensor(&ref, qkey, per);
                    double scale = ref_q != NULL ? norm2(ref_q, per) : 0.0;
                    double e_ours = norm2(ours_g, per) / scale, e_ref = norm2(ref_g, per) / scale;
                    check(e_ours <= tol && e_ref <= tol, "%s: %s is zero by symmetry: |ours| %.1e, |LeRobot| %.1e of "
                          "|grad q_proj.bias| (tol %.0e)", name, key, e_ours, e_ref, tol);
                    e = 0.0;
                    free(ref_q);
                } else {
                    e = rel_error(ours_g, ref_g, per);
                }
                if (!(e <= tol)) {
                    check(0, "%s: %s rel err %.2e (tol %.0e)%s", name, key, e, tol,
                          ref_g == NULL ? ": LeRobot has none" : "");
                }
                if (!(e <= worst[s->tower])) { worst[s->tower] = e; snprintf(worst_name[s->tower], 256, "%s", lname); }
                free(ref_g);
            }
        }
        for (int tw = 0; tw < 3; tw++) {
            if (n_slices[tw] == 0) { continue; }
            check(worst[tw] <= tol, "%s: %s gradients, %d tensors: worst rel err %.2e (%s) (tol %.0e)", name,
                  tower_names[tw], n_slices[tw], worst[tw], worst_name[tw], tol);
        }
        int n_trained = n_slices[0] + n_slices[1] + n_slices[2];
        check(frozen_ok && n_trained == n_ref_grads, "%s: %d frozen tensors have no gradient, in LeRobot and here "
              "(zero); LeRobot's %d gradients are the %d trained here", name, n_frozen, n_ref_grads, n_trained);

        // sampling: 10 Euler steps from sample_noise, the prefix computed once
        float* chunk = (float*)mallocCheck((size_t)B * H * Am * sizeof(float));
        double t_smp = wall_seconds();
        flow_sample(&m, &in, sample_noise, chunk);
        t_smp = wall_seconds() - t_smp;
        double ec = rel_error(chunk, ref_chunk, (size_t)B * H * Am);
        check(ec <= tol, "%s: chunk_norm (%d Euler steps) rel err %.2e (tol %.0e)", name, FLOW_NUM_STEPS, ec, tol);
        free(chunk);
        printf("        (%s: %.0f ms in all, backward %.1f ms, sampling %.1f ms)\n", name,
               1000.0 * (wall_seconds() - t0), 1000.0 * t_bwd, 1000.0 * t_smp);
    }
    for (int k = 0; k < n_cams; k++) { free(frames[k]); }
    free(tokens); free(token_mask); free(state); free(actions); free(action_is_pad); free(t); free(noise);
    free(sample_noise); free(ref_v); free(ref_loss); free(ref_chunk);
    safetensors_close(&ref);
    flow_free(&m);
}

// SmolVLA's references (dev/lerobot/make_ref.py) or pi0's (its --family pi0): the same checks
static void test_smolvla_lerobot(const char* family, const char* ref_dir) {
    double t0 = wall_seconds();
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) { test_smolvla_case(family, ref_dir, mode); }
    printf("        (%s vs LeRobot: %.2f s)\n", family, wall_seconds() - t0);
}

// ----------------------------------------------------------------------------
// the whole training loop against the oracle: 5 steps on shard data, each with its own samples,
// noise and learning rate (a_train.txt: dev/model.py, one rank of 4, float64). Two simulated
// ranks of 2 take the same step: the loss divides by the valid entries of the whole step.

static void test_training_loop(const char* dir) {
    printf("\n== training loop against the oracle\n");
    // fp32 against float64 over 5 steps: each step's loss within fp32 rounding of its inputs, which
    // the earlier steps' updates moved by fp32 rounding too: 1e-5
    check_training_loop(dir, "./train_vla_cpu -b 4 -t 1", 1e-5);
    check_training_loop(dir, "./train_vla_cpu -g 2 -b 2 -t 1", 1e-5);
}

// ----------------------------------------------------------------------------
// --decay-on all: AdamW's decay on every trainable tensor, biases and norms too, as LeRobot's torch
// AdamW puts it. 5 steps of pi0_tiny at -w 1, a decay large enough to show in a norm, against the
// oracle's run with --decay-on all (a_pi0_decay_all.bin: its weights after them; .txt: its losses)

static void test_decay_on(const char* dir) {
    printf("\n== --decay-on all against the oracle\n");
    const char* runs[2] = {"matrices", "all"};
    Checkpoint ck[2];
    int ok[2];
    float losses[2][5] = {{0}}, ref_losses[5] = {0};
    for (int k = 0; k < 2; k++) {
        char cmd[4096], path[1100], err[512];
        snprintf(cmd, sizeof(cmd), "rm -rf %s/run_decay_%s && ./train_vla_cpu -p pi0_tiny -b 4 -t 1 -n 5 -u 2 -l 1e-3 "
                 "-w 1 -c 0.5 -s 1337 --decay-on %s -i %s/a.bin -o %s/run_decay_%s > %s/run_decay_%s.txt 2>&1", dir,
                 runs[k], runs[k], dir, dir, runs[k], dir, runs[k]);
        int rc = run_command(cmd);
        snprintf(path, sizeof(path), "%s/run_decay_%s/log.jsonl", dir, runs[k]);
        int n = rc == 0 ? read_losses(path, 1, 5, losses[k]) : 0;
        snprintf(path, sizeof(path), "%s/run_decay_%s/ckpt_00000005.bin", dir, runs[k]);
        ok[k] = rc == 0 && n == 5 && checkpoint_read_checked(path, &ck[k], err, sizeof(err)) == 0;
        check(ok[k], "train_vla_cpu --decay-on %s: 5 steps and their checkpoint (exit %d)", runs[k], rc);
    }
    char path[1100];
    snprintf(path, sizeof(path), "%s/a_pi0_decay_all.txt", dir);
    int m = read_oracle_losses(path, ref_losses, 5);
    if (!ok[0] || !ok[1]) {
        for (int k = 0; k < 2; k++) { if (ok[k]) { checkpoint_free(&ck[k]); } }
        return;
    }
    snprintf(path, sizeof(path), "%s/a_pi0_decay_all.bin", dir);
    DebugState st;
    debug_state_read(&st, path);
    FlowParamTable t;
    flow_table_build(&ck[1].config, &t);
    float* ref = (float*)mallocCheck(t.total * sizeof(float));
    float* init = (float*)mallocCheck(t.total * sizeof(float));
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        char key[96];
        snprintf(key, sizeof(key), "param/%s", t.spec[i].name);
        float* p = (float*)debug_get(&st, key, t.spec[i].numel);
        memcpy(ref + t.spec[i].offset, p, t.spec[i].numel * sizeof(float));
        free(p);
    }
    flow_param_init(init, &t, &ck[1].config, ck[1].seed);
    int mode = TRAIN_MODE_ALL;
    // fp32 against float64 over 5 steps: the losses as in the training loop's check, 1e-5; the
    // updates within 1e-4 (AdamW's m / sqrt(v) divides out the gradient's scale, so elements
    // whose gradients are tiny carry fp32's rounding of them into steps of the full learning rate)
    double el = rel_error(losses[1], ref_losses, 5);
    double em = update_error(ck[1].params, ref, init, &t, mode, 1);
    double en = update_error(ck[1].params, ref, init, &t, mode, 0);
    check(m == 5 && el < 1e-5 && em < 1e-4 && en < 1e-4, "--decay-on all vs the oracle's: 5 losses rel err %.2e (tol "
          "1e-5), the matrices' updates %.2e, the biases' and norms' %.2e (tol 1e-4)", el, em, en);
    // the default leaves the biases and norms undecayed: their updates must stand far from the
    // oracle's (the decay is about as large as AdamW's step there), or the check above proves nothing
    double dn = update_error(ck[0].params, ref, init, &t, mode, 0);
    check(dn > 100 * 1e-4, "--decay-on matrices (the default) vs the oracle's --decay-on all: the biases' and norms' "
          "updates rel err %.2e (> 1e-2: the decay reaches them only with all)", dn);
    free(ref); free(init);
    free(st.recs); free(st.file);
    for (int k = 0; k < 2; k++) { checkpoint_free(&ck[k]); }
    expect_error_from(dir, "./train_vla_cpu", "--decay-on with another value", "--decay-on norms", "--decay-on norms");
}

// ----------------------------------------------------------------------------
// simulated ranks: -g 4 -b 2 takes the same samples and noise as -g 1 -b 8, and so does
// -g 2 -b 2 -d 8 (2 ranks, 2 micro-steps each): after 3 steps the parameters agree up to the
// order of fp32 summation

// Three optimizer steps of train_vla_cpu's loop on `ds` with `args` (from train_args_defaults and
// train_args_for_world): the losses into losses[3], the final parameters into a new array
static float* train_three_steps(Dataset* ds, const FlowConfig* c, const TrainArgs* args, float* losses) {
    FlowVLA m;
    flow_build(&m, c, args->train_mode);
    flow_param_init(m.params_memory, &m.table, c, args->seed);
    flow_opt_init(&m, args->train_mode);
    Loader loader;
    loader_start(&loader, ds, c, args->seed, 0, 0, args->batch, args->ranks * args->accum, 0, 2, 3);
    float* grad_sum = (float*)mallocCheck(m.opt.total * sizeof(float));
    for (int step = 0; step < 3; step++) {
        float norm;
        losses[step] = train_step(&FLOW_POLICY, &m, grad_sum, &loader, args, step, &norm, NULL, NULL, NULL);
    }
    loader_stop(&loader);
    float* params = (float*)mallocCheck(m.table.total * sizeof(float));
    memcpy(params, m.params_memory, m.table.total * sizeof(float));
    free(grad_sum);
    flow_free(&m);
    return params;
}

static void test_simulated_ranks(const char* dir, const char* preset) {
    printf("\n== simulated ranks and gradient accumulation (%s)\n", preset);
    char path[1024];
    snprintf(path, sizeof(path), "%s/s.bin", dir);
    Dataset ds;
    dataset_open(&ds, path);
    FlowConfig c = config_for_data(preset, 0, &ds);
    // the micro-batches of -g 4 -b 2 must differ in their valid entries somewhere, or a loss that
    // averaged the ranks' means would pass too
    Sampler s;
    sampler_init(&s, ds.n_samples, 1337);
    Batch b;
    batch_alloc(&b, &c, &ds.cams, 2);
    int uneven = 0;
    for (int step = 0; step < 3; step++) {
        int first = -1;
        for (int r = 0; r < 4; r++) {
            uint64_t idx[2];
            batch_fill_indices(idx, &s, 0, 0, (uint64_t)step, 2, 4, r);
            batch_fill(&b, &ds, &c, idx, 1337, (uint64_t)step, r, 0);
            int valid = 0;
            for (int k = 0; k < 2 * c.chunk; k++) { valid += b.action_is_pad[k] == 0.0f; }
            if (first < 0) { first = valid; }
            uneven += valid != first;
        }
    }
    batch_free(&b);
    sampler_free(&s);
    check(uneven > 0, "s.bin's micro-batches of -g 4 -b 2 differ in their valid chunk slots (%d of 12 differ from "
          "their step's first)", uneven);
    enum { RUNS = 3 };
    float losses[RUNS][3];
    float* final_params[RUNS];
    int ranks[RUNS] = {1, 4, 2}, batches[RUNS] = {8, 2, 2}, totals[RUNS] = {0, 0, 8};
    for (int run = 0; run < RUNS; run++) {
        TrainArgs args;
        train_args_defaults(&args);
        args.ranks = ranks[run]; args.batch = batches[run]; args.total_batch = totals[run];
        args.steps = 3; args.warmup = 1; args.lr_base = 1e-3f; args.seed = 1337;
        train_args_for_world(&args, args.ranks);
        final_params[run] = train_three_steps(&ds, &c, &args, losses[run]);
    }
    FlowParamTable t;
    flow_table_build(&c, &t);
    const char* names[RUNS] = {"", "-g 4 -b 2", "-g 2 -b 2 -d 8"};
    for (int run = 1; run < RUNS; run++) {
        // the same sums in other orders (per micro-batch, then across them): fp32 rounding, 1e-5
        double el = rel_error(losses[run], losses[0], 3), ep = rel_error(final_params[run], final_params[0], t.total);
        check(el < 1e-5, "%s vs -g 1 -b 8: 3 losses rel err %.2e (tol 1e-5)", names[run], el);
        check(ep < 1e-5, "%s vs -g 1 -b 8: parameters after 3 steps rel err %.2e (tol 1e-5)", names[run], ep);
    }
    check(losses[0][0] != losses[0][1] && losses[0][1] != losses[0][2],
          "each step trains on its own batch (losses %.6f %.6f %.6f)", losses[0][0], losses[0][1], losses[0][2]);
    for (int run = 0; run < RUNS; run++) { free(final_params[run]); }
    dataset_close(&ds);
}

// ZeRO-1 simulated: -z 1 -g 3 updates each rank's shard of the packed trainable domain on its own
// (tensors split where the shards fall) and follows -z 0 -g 3 up to the order of the norm's sums;
// the shards cover every trainable element exactly once. In the vlm mode, where the packed
// domain's offsets are not the table's (frozen tensors and the VLM's last layers sit between).
static void test_zero(const char* dir, const char* preset) {
    printf("\n== ZeRO-1 over simulated ranks (%s)\n", preset);
    char path[1024];
    snprintf(path, sizeof(path), "%s/b.bin", dir);
    Dataset ds;
    dataset_open(&ds, path);
    FlowConfig c = config_for_data(preset, 0, &ds);
    FlowParamTable t;
    flow_table_build(&c, &t);
    FlowOptDomain d;
    flow_opt_domain(&t, TRAIN_MODE_VLM, &d);
    const int W = 3;
    size_t S = zero_shard_size(d.total, W, 1);
    unsigned char* seen = (unsigned char*)callocCheck(d.total, 1);
    int split = 0;
    for (int r = 0; r < W; r++) {
        for (int k = 0; k < FLOW_NUM_TENSORS; k++) {
            size_t first, n = zero_part(d.offset[k], d.numel[k], (size_t)r * S, (size_t)(r + 1) * S, &first);
            for (size_t e = 0; e < n; e++) { seen[d.offset[k] + first + e]++; }
            split += n > 0 && n < d.numel[k];
        }
    }
    int once = covered_once(seen, d.total);
    free(seen);
    check(once && split > 0 && S * W >= d.total && d.total % (size_t)W != 0 && d.total < t.total,
          "%d shards of %zu cover the %zu trainable elements (of %zu) exactly once (%zu of padding in the last), %d "
          "tensor part(s) cut at a shard boundary", W, S, d.total, t.total, S * W - d.total, split);
    float* params[2];
    float losses[2][3];
    for (int z = 0; z < 2; z++) {
        TrainArgs args;
        train_args_defaults(&args);
        args.ranks = W; args.batch = 2; args.zero = z; args.steps = 3; args.warmup = 1; args.lr_base = 1e-3f;
        args.train_mode = TRAIN_MODE_VLM;
        train_args_for_world(&args, W);
        params[z] = train_three_steps(&ds, &c, &args, losses[z]);
    }
    // the same updates element by element; only the norm's double sums are grouped by shard: 1e-6
    double ep = rel_error(params[1], params[0], t.total);
    check(rel_error(losses[1], losses[0], 3) < 1e-6 && ep < 1e-6, "-z 1 -g 3 vs -z 0 -g 3 (--train vlm): parameters "
          "after 3 steps rel err %.2e (tol 1e-6)%s", ep, memcmp(params[0], params[1], t.total * sizeof(float)) == 0 ?
          ", identical" : "");
    float* init = (float*)mallocCheck(t.total * sizeof(float));
    flow_param_init(init, &t, &c, 1337);
    int frozen_still = 1, trained_moved = 1;
    for (int k = 0; k < FLOW_NUM_TENSORS; k++) {
        const FlowParamSpec* s = &t.spec[k];
        size_t n = d.numel[k];
        frozen_still &= memcmp(params[1] + s->offset + n, init + s->offset + n, (s->numel - n) * sizeof(float)) == 0;
        if (n > 0) { trained_moved &= memcmp(params[1] + s->offset, init + s->offset, n * sizeof(float)) != 0; }
    }
    check(frozen_still && trained_moved, "with ZeRO-1 the %zu frozen elements keep their init bit for bit, every "
          "trainable tensor moved", t.total - d.total);
    free(init); free(params[0]); free(params[1]);
    dataset_close(&ds);
}

// ----------------------------------------------------------------------------
// the multi-node bootstrap, between two processes on loopback

// SHA-256 and HMAC-SHA256 against Python's hashlib and hmac (FIPS 180-4's and RFC 4231's vectors,
// and lengths around the padding's block boundary)
static void test_boot_sha256(void) {
    printf("\n== SHA-256 and HMAC-SHA256 of the bootstrap's run token\n");
    static const struct { int n; const char* hex; } lengths[] = {
        {55, "16fa57a0a3423a715d594516339f36189d6b5f93754a9714fef202616a9fabfe"},
        {56, "c37b44e5f1b18554b36966f4f8e08bfbf3164c4b6c10374d12d89850892073c5"},
        {63, "bbba992d2c85af960fb2987a1fd05e0aa82a3db3c740dd8982a9e273b75e36a3"},
        {64, "66bd4633ed6f71c4ecfa4763bf7ba1c8ec7612de9aa6c0578a7b675207c71e0b"},
        {65, "9f7dc47107b750a1f3d35db5d9547f24ef40da5b731b9540d4f43710a154f6c9"},
        {119, "a3ed307b730fa77c07531300c6e4a282330011d4d4caf6bb7b63ae05950f4b66"},
        {120, "8e3b15d9fea7472655aa069620b7f8c2e55ee1499f763200a7515fe826e99d20"}};
    char hex[65];
    uint8_t d[32], buf[128];
#define BOOT_HEX_(digest) for (int i = 0; i < 32; i++) { snprintf(hex + 2 * i, 3, "%02x", (digest)[i]); }
    int ok = 1;
    for (int k = 0; k < 7; k++) {
        for (int i = 0; i < lengths[k].n; i++) { buf[i] = (uint8_t)(i * 7 + 1); }
        sha256(buf, (size_t)lengths[k].n, d);
        BOOT_HEX_(d);
        ok &= strcmp(hex, lengths[k].hex) == 0;
    }
    sha256("", 0, d);
    BOOT_HEX_(d);
    ok &= strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0;
    sha256("abc", 3, d);
    BOOT_HEX_(d);
    ok &= strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0;
    const char* two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha256(two_blocks, strlen(two_blocks), d);
    BOOT_HEX_(d);
    ok &= strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1") == 0;
    check(ok, "SHA-256 of '', 'abc', FIPS 180-4's 56-byte message and 55..120 bytes across the block boundary");
    Sha256 s;  // a million 'a' in pieces of 1000, 0 and 1 bytes: updates that split blocks anywhere
    memset(buf, 'a', sizeof(buf));
    sha256_init(&s);
    for (int done = 0, step = 0; done < 1000000; step++) {
        int take = step % 3 == 0 ? 117 : step % 3 == 1 ? 0 : 1;
        if (done + take > 1000000) { take = 1000000 - done; }
        sha256_update(&s, buf, (size_t)take);
        done += take;
    }
    sha256_final(&s, d);
    BOOT_HEX_(d);
    check(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
          "SHA-256 of a million 'a', fed in pieces of 117, 0 and 1 bytes: %s", hex);
    static const struct { const char* key; int key_n; int key_byte; const char* msg; const char* hex; } macs[] = {
        {NULL, 20, 0x0b, "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", 4, 0, "what do ya want for nothing?",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {NULL, 131, 0xaa, "Test Using Larger Than Block-Size Key - Hash Key First",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {"", 0, 0, "", "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"}};
    ok = 1;
    for (int k = 0; k < 4; k++) {
        uint8_t key[131];
        if (macs[k].key == NULL) {
            memset(key, macs[k].key_byte, (size_t)macs[k].key_n);
        } else {
            memcpy(key, macs[k].key, (size_t)macs[k].key_n);
        }
        HmacSha256 m;
        hmac_sha256_init(&m, key, (size_t)macs[k].key_n);
        hmac_sha256_update(&m, macs[k].msg, strlen(macs[k].msg));
        hmac_sha256_final(&m, d);
        BOOT_HEX_(d);
        ok &= strcmp(hex, macs[k].hex) == 0;
    }
#undef BOOT_HEX_
    check(ok, "HMAC-SHA256: RFC 4231's cases 1, 2 and 6 (a key past a block is hashed first), and the empty key");
    uint8_t a[32], b[32];
    memset(a, 7, 32);
    memcpy(b, a, 32);
    int same = boot_digest_equal(a, b);
    b[31] ^= 1;
    int last = boot_digest_equal(a, b);
    b[31] ^= 1;
    b[0] ^= 0x80;
    check(same && !last && !boot_digest_equal(a, b), "boot_digest_equal: equal digests, and a bit off at either end");
}

// A port nothing listens on right now (the kernel's pick)
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    bind(fd, (struct sockaddr*)&a, sizeof(a));
    getsockname(fd, (struct sockaddr*)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

typedef struct {
    int rc;
    char err[512];
    uint8_t payload[128];
} BootResult;

// Node `node` of 2 in a child process, with run token `token` (NULL: none): node 0 hands out
// payload_in, node 1 (payload_in NULL) receives into its result. The result comes back through
// a pipe whose read end goes to *result_fd; only the child holds the write end, so a child that
// dies reads as end of file. err_path: where the child's stderr goes (NULL: the test's own).
static pid_t boot_child(const char* master, const char* token, BootIdentity id, int node, const uint8_t* payload_in,
                        double timeout, const char* err_path, int* result_fd) {
    int fds[2];
    if (pipe(fds) != 0) { vla_fail("pipe failed: %s", strerror(errno)); }
    fflush(NULL);  // (what the parent has buffered must not be written twice)
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        if (err_path != NULL && freopen(err_path, "w", stderr) == NULL) { _exit(2); }
        BootResult r;
        memset(&r, 0, sizeof(r));
        if (payload_in != NULL) { memcpy(r.payload, payload_in, sizeof(r.payload)); }
        id.node_rank = node;
        r.rc =
            bootstrap_exchange(master, NULL, token, &id, r.payload, sizeof(r.payload), timeout, r.err, sizeof(r.err));
        if (write(fds[1], &r, sizeof(r)) != (ssize_t)sizeof(r)) { _exit(2); }
        _exit(0);
    }
    close(fds[1]);
    *result_fd = fds[0];
    return pid;
}

// The result of a boot_child (rc -1 if it died without one); closes the pipe
static BootResult boot_collect(pid_t pid, int result_fd) {
    BootResult r;
    memset(&r, 0, sizeof(r));
    if (read(result_fd, &r, sizeof(r)) != (ssize_t)sizeof(r)) { r.rc = -1; }
    close(result_fd);
    waitpid(pid, NULL, 0);
    return r;
}

// A connection to 127.0.0.1:port, retried until something listens there (at most 5 s); -1 if not
static int boot_connect_loopback(int port) {
    struct sockaddr_in to;
    memset(&to, 0, sizeof(to));
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (double give_up = wall_seconds() + 5.0; wall_seconds() < give_up;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr*)&to, sizeof(to)) == 0) { return fd; }
        close(fd);
        usleep(50000);
    }
    return -1;
}

// Whether a TCP connection to addr (network order, IPv4) and port is accepted within a second (a
// firewall that drops the packets must not hold the test for the kernel's minutes of retries)
static int boot_connects(uint32_t addr, int port) {
    struct sockaddr_in to;
    memset(&to, 0, sizeof(to));
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)port);
    to.sin_addr.s_addr = addr;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    int ok = connect(fd, (struct sockaddr*)&to, sizeof(to)) == 0;
    if (!ok && errno == EINPROGRESS) {
        struct pollfd pfd = {fd, POLLOUT, 0};
        int soerr = 1;
        socklen_t len = sizeof(soerr);
        ok = poll(&pfd, 1, 1000) > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0;
    }
    close(fd);
    return ok;
}

// train_args_parse of argv in a child, VLA_RUN_TOKEN set to env_token (NULL: unset): its exit
// status (0 when it parses) and its stderr into err
static int boot_parse_args(char** argv, int argc, const char* env_token, const char* err_path, char** err) {
    fflush(NULL);  // (the child exits through exit(), which writes out what it inherited buffered)
    pid_t pid = fork();
    if (pid == 0) {
        if (freopen(err_path, "w", stderr) == NULL || freopen("/dev/null", "w", stdout) == NULL) { _exit(2); }
        if (env_token != NULL) { setenv("VLA_RUN_TOKEN", env_token, 1); } else { unsetenv("VLA_RUN_TOKEN"); }
        TrainArgs a;
        train_args_parse(&a, argc, argv);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    *err = read_text(err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Node 0's reading of hellos, without sockets: what joins, what is a stranger (and why), what refuses
static void test_boot_hellos(const BootIdentity* id) {
    const char* token = "the run's token";
    uint8_t challenge[BOOT_NONCE];
    for (int i = 0; i < BOOT_NONCE; i++) { challenge[i] = (uint8_t)(i * 13 + 5); }
    int fds[2] = {-1, -1}, rank = -1;
    char why[320];
    BootHello h;
    memset(&h, 0, sizeof(h));
    h.id = *id;
    h.id.node_rank = 1;
    for (int i = 0; i < BOOT_NONCE; i++) { h.nonce[i] = (uint8_t)(i * 3); }
    boot_hello_proof(token, challenge, &h, h.proof);
    int joins = boot_hello_parse(id, token, challenge, &h, sizeof(h), fds, &rank, why, sizeof(why));
    check(joins == BOOT_HELLO_JOINS && rank == 1,
          "a hello that proves the token, agrees and names a free rank joins (rank %d)", rank);
    struct { const char* what; const char* want; int result; } cases[10];
    int n_cases = 0;
    char whys[10][320];
    BootHello bad = h;  // magic and version right, then random bytes (the example of a stranger)
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 8; i < sizeof(bad); i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ((uint8_t*)&bad)[i] = (uint8_t)(x >> 56);
    }
#define BOOT_CASE_(name, expect, tok, msg, n)                                                                  \
    cases[n_cases].what = name; cases[n_cases].want = expect;                                                  \
    cases[n_cases].result = boot_hello_parse(id, tok, challenge, msg, n, fds, &rank, whys[n_cases], sizeof(whys[0])); \
    n_cases++;
    BOOT_CASE_("random bytes after the header", "does not prove this run's token", token, &bad, sizeof(bad));
    char short_size[64];
    snprintf(short_size, sizeof(short_size), "%zu bytes, not a hello of %zu", sizeof(BootIdentity), sizeof(BootHello));
    BOOT_CASE_("an identity without the proof", short_size, token, &h, sizeof(BootIdentity));
    BootHello other = h;
    other.id.magic = 0x50545448u;  // "HTTP"
    BOOT_CASE_("another protocol", "not a train_vla hello: it begins 0x50545448", token, &other, sizeof(other));
    other = h;
    other.id.version = 5;
    BOOT_CASE_("bootstrap version 5", "a hello of bootstrap version 5, this train_vla's is 6", token, &other,
               sizeof(other));
    BOOT_CASE_("a node with another token", "does not prove this run's token", "another token", &h, sizeof(h));
    BOOT_CASE_("a node with a token, node 0 without", "not one of a run without a token", NULL, &h, sizeof(h));
    other = h;
    other.id.node_rank = -683427023;
    boot_hello_proof(token, challenge, &other, other.proof);
    BOOT_CASE_("a proven hello of rank -683427023", "node rank -683427023 out of range 1..1", token, &other,
               sizeof(other));
    uint8_t replayed[BOOT_NONCE];
    memcpy(replayed, challenge, BOOT_NONCE);
    replayed[0] ^= 1;  // a hello recorded on another connection (another challenge)
    cases[n_cases].what = "a hello replayed from another connection";
    cases[n_cases].want = "does not prove this run's token";
    cases[n_cases].result =
        boot_hello_parse(id, token, replayed, &h, sizeof(h), fds, &rank, whys[n_cases], sizeof(whys[0]));
    n_cases++;
    other = h;
    other.id.batch = 5;  // a disagreeing node without the proof: a stranger, it cannot stop the start
    BOOT_CASE_("a disagreeing hello with a stale proof", "does not prove this run's token", token, &other,
               sizeof(other));
    fds[1] = 7;
    BOOT_CASE_("rank 1 taken already", "node rank 1 has joined already", token, &h, sizeof(h));
    fds[1] = -1;
#undef BOOT_CASE_
    for (int k = 0; k < n_cases; k++) {
        check(cases[k].result == BOOT_HELLO_STRANGER && strstr(whys[k], cases[k].want) != NULL &&
              strchr(whys[k], '\n') == NULL, "a stranger: %s: '%s'", cases[k].what, whys[k]);
    }
    boot_hello_proof(token, challenge, &other, other.proof);
    int refused = boot_hello_parse(id, token, challenge, &other, sizeof(other), fds, &rank, why, sizeof(why));
    check(refused == BOOT_HELLO_REFUSED && strstr(why, "node 1 disagrees with node 0 on batch 8 vs 5") != NULL,
          "a proven hello that disagrees refuses the run: '%s'", why);
    boot_hello_proof(NULL, challenge, &other, other.proof);
    refused = boot_hello_parse(id, NULL, challenge, &other, sizeof(other), fds, &rank, why, sizeof(why));
    check(refused == BOOT_HELLO_REFUSED && strstr(why, "batch 8 vs 5") != NULL,
          "without a token, a hello that disagrees still refuses the run: '%s'", why);
    // node 0's reply: its proof covers the body; a refusal is printed with control bytes escaped
    BootReply reply = {0, 4};
    uint8_t proof[32], again[32];
    boot_reply_proof(token, h.nonce, challenge, &reply, "abcd", proof);
    boot_reply_proof(token, h.nonce, challenge, &reply, "abce", again);
    int body_covered = !boot_digest_equal(proof, again);
    boot_reply_proof("another token", h.nonce, challenge, &reply, "abcd", again);
    check(body_covered && !boot_digest_equal(proof, again), "a reply's proof changes with its body and with the token");
    char text[64];
    static const char raw[] = "bad\x1b[2J\n\\\xc2\x9b" "end";
    boot_refusal_text(raw, sizeof(raw) - 1, text, sizeof(text));
    check(strcmp(text, "bad\\x1b[2J\\x0a\\\\\\xc2\\x9bend") == 0,
          "a refusal's control and non-ASCII bytes are escaped: '%s'", text);
    boot_refusal_text("\x01\x02\x03", 3, text, 7);
    check(strcmp(text, "\\x01") == 0, "an escape that does not fit is left out whole: '%s'", text);
    // the warnings' rate: one per address every few seconds, a burst cap over all addresses
    BootWarnings w;
    memset(&w, 0, sizeof(w));
    w.burst_start = -1e30;
    int quiet = -1, first = boot_warn_due(&w, "10.0.0.5", 100.0, &quiet);
    int soon = boot_warn_due(&w, "10.0.0.5", 101.0, &quiet);
    soon += boot_warn_due(&w, "10.0.0.5", 102.0, &quiet);
    int later = boot_warn_due(&w, "10.0.0.5", 100.0 + BOOT_WARN_SECONDS + 1.0, &quiet), unnamed = quiet;
    int others = 0;
    for (int k = 0; k < 20; k++) {
        char host[32];
        snprintf(host, sizeof(host), "10.0.1.%d", k);
        others += boot_warn_due(&w, host, 107.0, &quiet);
    }
    check(first && soon == 0 && later && unnamed == 2 && others == BOOT_WARN_BURST - 1 &&
          w.quiet == 20 - (BOOT_WARN_BURST - 1),
          "warnings: one per address every %.0f s (the next says 2 went unnamed), at most %d per %.0f s over 21 "
          "addresses; %d counted for the summary", BOOT_WARN_SECONDS, BOOT_WARN_BURST, BOOT_WARN_SECONDS, w.quiet);
}

// Where node 0 listens: the address --master names (loopback alone for 127.0.0.1), --bind's,
// and one-line errors for an address that is not this machine's
static void test_boot_listen(void) {
    char where[300], err[512] = "", master[64];
    int port = free_port();
    snprintf(master, sizeof(master), "127.0.0.1:%d", port);
    int lfd = boot_listen(master, NULL, where, sizeof(where), err, sizeof(err));
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    int bound = lfd >= 0 && getsockname(lfd, (struct sockaddr*)&sa, &len) == 0 && sa.sin_family == AF_INET &&
                ntohl(sa.sin_addr.s_addr) == INADDR_LOOPBACK;
    // every address of 127/8 is this machine's: one that is not 127.0.0.1 must find the port closed
    int on_loopback = boot_connects(htonl(INADDR_LOOPBACK), port), on_other = boot_connects(htonl(0x7f000002u), port);
    // and so must this machine's network addresses, when it has one
    int network = 0, network_open = 0;
    struct ifaddrs* ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs* i = ifs; i != NULL; i = i->ifa_next) {
            if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || boot_is_loopback(i->ifa_addr)) { continue; }
            network++;
            network_open += boot_connects(((struct sockaddr_in*)i->ifa_addr)->sin_addr.s_addr, port);
        }
        freeifaddrs(ifs);
    }
    if (lfd >= 0) { close(lfd); }
    check(bound && strcmp(where, master) == 0 && on_loopback && !on_other && network_open == 0,
          "--master %s: node 0 listens on 127.0.0.1 alone (%s); 127.0.0.2 and %d network address(es) of this machine "
          "find the port closed", master, where, network);
    lfd = boot_listen(master, "0.0.0.0", where, sizeof(where), err, sizeof(err));
    int everywhere = lfd >= 0 && boot_connects(htonl(0x7f000002u), port);
    if (lfd >= 0) { close(lfd); }
    check(everywhere && strncmp(where, "0.0.0.0:", 8) == 0, "--bind 0.0.0.0: node 0 listens on every address (%s)",
          where);
    snprintf(master, sizeof(master), "localhost:%d", port);
    lfd = boot_listen(master, NULL, where, sizeof(where), err, sizeof(err));
    struct sockaddr_storage ss;
    len = sizeof(ss);
    int local =
        lfd >= 0 && getsockname(lfd, (struct sockaddr*)&ss, &len) == 0 && boot_is_loopback((struct sockaddr*)&ss);
    if (lfd >= 0) { close(lfd); }
    check(local, "--master localhost:PORT: node 0 listens on loopback (%s)", lfd >= 0 ? where : err);
    snprintf(master, sizeof(master), "192.0.2.7:%d", port);  // (TEST-NET-1: no machine's address)
    lfd = boot_listen(master, NULL, where, sizeof(where), err, sizeof(err));
    check(lfd < 0 && strstr(err, "node 0 cannot listen on 192.0.2.7 (") != NULL &&
          strstr(err, "give node 0's own address in --master, or the address to listen on with --bind") != NULL,
          "--master of another machine's address on node 0: '%s'", err);
    snprintf(master, sizeof(master), "127.0.0.1:%d", port);
    lfd = boot_listen(master, "192.0.2.7", where, sizeof(where), err, sizeof(err));
    int foreign = lfd < 0 && strstr(err, "--bind 192.0.2.7: node 0 cannot listen on 192.0.2.7:") != NULL;
    check(foreign, "--bind of an address not this machine's: '%s'", err);
    char me[256] = "";
    gethostname(me, sizeof(me) - 1);
    char longer[300];
    snprintf(longer, sizeof(longer), "x%s", me);
    check(me[0] == '\0' || (boot_is_own_name(me) && !boot_is_own_name(longer)),
          "this machine's own name (%s) is told from another", me);
}

static void test_bootstrap(const char* dir) {
    test_boot_sha256();
    printf("\n== multi-node bootstrap over loopback\n");
    char path[1024], err_path[1100];
    snprintf(path, sizeof(path), "%s/a.bin", dir);
    snprintf(err_path, sizeof(err_path), "%s/boot_node0_stderr.txt", dir);
    Dataset ds;
    dataset_open(&ds, path);
    FlowConfig c = config_for_data("tiny", 0, &ds);
    TrainArgs args;
    train_args_defaults(&args);
    args.ranks = 2;
    BootIdentity id = boot_identity(&args, &c, 0, 2, 0, ds.n_samples);
    test_boot_hellos(&id);
    test_boot_listen();
    const char* token = "test run token";
    char master[64];
    uint8_t secret[128];
    for (int i = 0; i < 128; i++) { secret[i] = (uint8_t)(i * 37 + 11); }
    // the same configuration without a token (node 0 warns); node 1 with another batch, with the
    // token and without
    for (int scenario = 0; scenario < 3; scenario++) {
        int port = free_port();
        snprintf(master, sizeof(master), "127.0.0.1:%d", port);
        const char* tok = scenario == 1 ? token : NULL;
        BootIdentity other = id;
        if (scenario > 0) { other.batch = 5; }
        int fd0, fd1;
        // node 1 first: it retries until node 0 listens
        pid_t p1 = boot_child(master, tok, other, 1, NULL, 10.0, NULL, &fd1);
        usleep(300000);
        pid_t p0 = boot_child(master, tok, id, 0, secret, 10.0, err_path, &fd0);
        BootResult r0 = boot_collect(p0, fd0), r1 = boot_collect(p1, fd1);
        char* err0 = read_text(err_path);
        if (scenario == 0) {
            char want[256];
            snprintf(want, sizeof(want), "warning: the multi-node bootstrap has no run token: any host that reaches "
                     "127.0.0.1:%d can join this run; pass the same --run-token (or VLA_RUN_TOKEN) to every node\n",
                     port);
            check(r0.rc == 0 && r1.rc == 0 && memcmp(r1.payload, secret, sizeof(secret)) == 0,
                  "node 1 (started first) receives node 0's 128-byte id over TCP (%s)", master);
            check(strcmp(err0, want) == 0, "without a token node 0 warns once, naming where it listens: '%.*s'",
                  (int)strcspn(err0, "\n"), err0);
        } else {
            check(r0.rc == 1 && strstr(r0.err, "node 1 disagrees with node 0 on batch 8 vs 5") != NULL && r1.rc == 1 &&
                  strstr(r1.err, "refused node 1") != NULL,
                  "nodes that disagree both stop (%s): node 0 says '%s'; node 1 '%s'",
                  tok != NULL ? "the same token" : "no token", r0.err, r1.err);
        }
        if (scenario == 1) { check(strstr(err0, "no run token") == NULL, "with a token node 0 does not warn of none"); }
        free(err0);
    }
    // strangers reach node 0 while the real node joins: one sends the header then random bytes, one
    // a short hello and hangs up, a node with another token retries until its timeout; node 0
    // drops each, names the first (the others from the same address are counted) and starts
    int port = free_port();
    snprintf(master, sizeof(master), "127.0.0.1:%d", port);
    int fd0, fd1, fdw;
    double t0 = wall_seconds();
    pid_t p0 = boot_child(master, token, id, 0, secret, 10.0, err_path, &fd0);
    int random_hello = boot_connect_loopback(port), short_hello = -1, challenged = 0;
    char stranger[64] = "";
    if (random_hello >= 0) {
        struct sockaddr_in me;
        socklen_t len = sizeof(me);
        getsockname(random_hello, (struct sockaddr*)&me, &len);
        snprintf(stranger, sizeof(stranger), "127.0.0.1:%d", ntohs(me.sin_port));
        BootChallenge ch;
        challenged = boot_io(random_hello, &ch, sizeof(ch), 0, wall_seconds() + 5.0) == 0 && ch.magic == BOOT_MAGIC &&
                     ch.version == BOOT_VERSION;
        BootHello junk;
        uint64_t x = 42;
        for (size_t i = 0; i < sizeof(junk); i++) {
            x = x * 6364136223846793005ull + 1;
            ((uint8_t*)&junk)[i] = (uint8_t)(x >> 56);
        }
        junk.id.magic = BOOT_MAGIC;
        junk.id.version = BOOT_VERSION;
        boot_io(random_hello, &junk, sizeof(junk), 1, wall_seconds() + 5.0);
        short_hello = boot_connect_loopback(port);
        if (short_hello >= 0) {
            boot_io(short_hello, &junk, 100, 1, wall_seconds() + 5.0);
            shutdown(short_hello, SHUT_WR);
        }
    }
    pid_t pw = boot_child(master, "another token", id, 1, NULL, 1.0, NULL, &fdw);
    BootResult rw = boot_collect(pw, fdw);  // (node 0 is still waiting: the real node 1 has not started)
    pid_t p1 = boot_child(master, token, id, 1, NULL, 10.0, NULL, &fd1);
    BootResult r0 = boot_collect(p0, fd0), r1 = boot_collect(p1, fd1);
    double took = wall_seconds() - t0;
    if (random_hello >= 0) { close(random_hello); }
    if (short_hello >= 0) { close(short_hello); }
    char* err0 = read_text(err_path);
    char named[256];
    snprintf(named, sizeof(named), "warning: bootstrap: dropped a connection from %s that is not a node of this run "
             "(its hello does not prove this run's token: another --run-token, or none): waiting for the real nodes\n",
             stranger);
    check(challenged && r0.rc == 0 && r1.rc == 0 && memcmp(r1.payload, secret, sizeof(secret)) == 0 && took < 5.0,
          "strangers ahead of node 1 neither stop nor hold up the start: node 1 joins in %.1f s (node 0 '%s')", took,
          r0.err);
    check(strncmp(err0, named, strlen(named)) == 0 &&
          strstr(err0, " more connection(s) that were not nodes of this run, not each named") != NULL &&
          strstr(err0, "no run token") == NULL,
          "node 0 names the first stranger by its address, counts the rest: '%.*s'", (int)strcspn(err0, "\n"), err0);
    check(rw.rc == 1 && strstr(rw.err, "dropped node 1's hello") != NULL &&
          strstr(rw.err, "check that every node got the same --run-token (or VLA_RUN_TOKEN)") != NULL,
          "a node with another token is dropped and gives up at its timeout: '%s'", rw.err);
    free(err0);
    // a connection that never says hello reaches node 0 before node 1: node 1 joins at once
    snprintf(master, sizeof(master), "127.0.0.1:%d", free_port());
    p0 = boot_child(master, token, id, 0, secret, 10.0, NULL, &fd0);
    int silent = boot_connect_loopback(atoi(strchr(master, ':') + 1));
    p1 = boot_child(master, token, id, 1, NULL, 10.0, NULL, &fd1);
    r0 = boot_collect(p0, fd0);
    r1 = boot_collect(p1, fd1);
    if (silent >= 0) { close(silent); }
    check(silent >= 0 && r0.rc == 0 && r1.rc == 0 && memcmp(r1.payload, secret, sizeof(secret)) == 0,
          "a silent connection ahead of node 1 does not hold node 0 up: node 1 joins (node 0 '%s'; node 1 '%s')",
          r0.err, r1.err);
    // the port in use: someone else listens on it
    port = free_port();
    int busy = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    int bound = bind(busy, (struct sockaddr*)&a, sizeof(a)) == 0 && listen(busy, 1) == 0;
    snprintf(master, sizeof(master), "127.0.0.1:%d", port);
    char err[512] = "";
    uint8_t payload[128];
    int rc = bootstrap_exchange(master, NULL, token, &id, payload, sizeof(payload), 2.0, err, sizeof(err));
    check(bound && rc == 1 && strstr(err, "the port is in use, pick another") != NULL, "node 0 on a port in use: '%s'",
          err);
    close(busy);
    // the master unreachable within the timeout
    snprintf(master, sizeof(master), "127.0.0.1:%d", free_port());
    BootIdentity node1 = id;
    node1.node_rank = 1;
    t0 = wall_seconds();
    rc = bootstrap_exchange(master, NULL, token, &node1, payload, sizeof(payload), 1.0, err, sizeof(err));
    double waited = wall_seconds() - t0;
    check(rc == 1 && strstr(err, "could not reach the master") != NULL && waited >= 0.9 && waited < 5.0,
          "node 1 gives up on an unreachable master after its timeout (%.1f s): '%s'", waited, err);
    rc = bootstrap_exchange("nohost", NULL, token, &id, payload, sizeof(payload), 1.0, err, sizeof(err));
    check(rc == 1 && strstr(err, "expected host:port") != NULL, "a --master without a port: '%s'", err);
    static const char* const bad_ports[] = {"127.0.0.1:0", "127.0.0.1:70000"};
    for (int k = 0; k < 2; k++) {
        rc = bootstrap_exchange(bad_ports[k], NULL, token, &id, payload, sizeof(payload), 1.0, err, sizeof(err));
        check(rc == 1 && strstr(err, "port is out of range: pick one from 1 to 65535") != NULL,
              "a --master port outside 1..65535: '%s'", err);
    }
    // --run-token and VLA_RUN_TOKEN: the option wins; empty or too long is refused without echoing it
    char long_token[VLA_MAX_RUN_TOKEN + 2];
    memset(long_token, 'k', sizeof(long_token) - 1);
    long_token[sizeof(long_token) - 1] = '\0';
    char prog[] = "train_vla", opt[] = "--run-token", empty[] = "", given[] = "from the flag";
    char* argv_flag[] = {prog, opt, given, NULL};
    char* argv_empty[] = {prog, opt, empty, NULL};
    char* argv_long[] = {prog, opt, long_token, NULL};
    char nodes_opt[] = "--nodes", two[] = "2", rank_opt[] = "--node-rank", one[] = "1", master_opt[] = "--master",
         master_at[] = "h:1";
    char* argv_none[] = {prog, nodes_opt, two, rank_opt, one, master_opt, master_at, NULL};
    char* argv_single[] = {prog, NULL};
    char* msg_empty = NULL, *msg_long = NULL, *msg_env = NULL, *msg_ok = NULL;
    // (the flag wins over a bad VLA_RUN_TOKEN)
    int rc_ok = boot_parse_args(argv_flag, 3, long_token, err_path, &msg_ok);
    int rc_empty = boot_parse_args(argv_empty, 3, NULL, err_path, &msg_empty);
    int rc_long = boot_parse_args(argv_long, 3, NULL, err_path, &msg_long);
    int rc_env = boot_parse_args(argv_none, 7, "", err_path, &msg_env);
    char* msg_single = NULL;  // one node reads no token: an empty one in its environment is no concern of its
    int rc_single = boot_parse_args(argv_single, 1, "", err_path, &msg_single);
    check(rc_ok == 0 && rc_empty == 1 && strstr(msg_empty, "--run-token is empty") != NULL && rc_long == 1 &&
          strstr(msg_long, "--run-token is too long") != NULL && strstr(msg_long, long_token) == NULL && rc_env == 1 &&
          strstr(msg_env, "VLA_RUN_TOKEN is empty") != NULL && rc_single == 0,
          "--run-token wins over VLA_RUN_TOKEN; an empty or a %d-byte token is refused in one line, not echoed, and "
          "a one-node run ignores VLA_RUN_TOKEN: '%.*s'", VLA_MAX_RUN_TOKEN + 1, (int)strcspn(msg_long, "\n"),
          msg_long);
    free(msg_ok); free(msg_empty); free(msg_long); free(msg_env); free(msg_single);
    // --min-lr-frac, --augment-shift and --train are part of the identity: nodes that differ in them disagree
    TrainArgs changed = args;
    changed.min_lr_frac = 0.5f;
    BootIdentity a_id = boot_identity(&changed, &c, 1, 2, 0, ds.n_samples);
    changed = args;
    changed.augment = 4;
    BootIdentity b_id = boot_identity(&changed, &c, 1, 2, 0, ds.n_samples);
    changed = args;
    changed.train_mode = TRAIN_MODE_EXPERT;
    BootIdentity c_id = boot_identity(&changed, &c, 1, 2, 0, ds.n_samples);
    FlowConfig longer = c;
    longer.max_text = c.max_text + 1;
    BootIdentity d_id = boot_identity(&args, &longer, 1, 2, 0, ds.n_samples);
    char diff_a[192], diff_b[192], diff_c[192], diff_d[192];
    int differ_a = boot_identity_diff(&id, &a_id, diff_a, sizeof(diff_a));
    int differ_b = boot_identity_diff(&id, &b_id, diff_b, sizeof(diff_b));
    int differ_c = boot_identity_diff(&id, &c_id, diff_c, sizeof(diff_c));
    int differ_d = boot_identity_diff(&id, &d_id, diff_d, sizeof(diff_d));
    check(differ_a && strstr(diff_a, "min_lr_frac_bits") != NULL && differ_b &&
          strstr(diff_b, "augment 0 vs 4") != NULL,
          "nodes that differ in --min-lr-frac or --augment-shift disagree: '%s'; '%s'", diff_a, diff_b);
    check(differ_c && strstr(diff_c, "train_mode 2 vs 0") != NULL && differ_d &&
          strstr(diff_d, "model max_text 16 vs 17") != NULL,
          "nodes that differ in --train or in the model's config disagree: '%s'; '%s'", diff_c, diff_d);
    check(!boot_identity_diff(&id, &id, diff_a, sizeof(diff_a)), "a node agrees with itself");
    dataset_close(&ds);
}

// The progress line's ETA: the mean step after the process's first, not the last step's time
static void test_logger_eta(const char* dir) {
    char out[VLA_PATH_MAX];
    snprintf(out, sizeof(out), "%s/eta_log", dir);
    char cmd[VLA_PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", out);
    run_command(cmd);
    Logger lg;
    logger_open(&lg, out, 0);
    const double ms[4] = {5000.0, 100.0, 300.0, 20.0};  // a slow first step, then 100, 300, 20
    double eta[4];
    for (int k = 0; k < 4; k++) {
        logger_step(&lg, k, 10, 1.0f, 1e-4f, 1.0f, ms[k], 1.0, NAN, NAN, 0);
        eta[k] = logger_eta(&lg, ms[k], k, 10);
    }
    logger_close(&lg);
    // 9 steps left at the first's 5 s; then 8 at 100 ms; 7 at (100 + 300) / 2; 6 at (100 + 300 + 20) / 3
    check(fabs(eta[0] - 45.0) < 1e-9 && fabs(eta[1] - 0.8) < 1e-9 && fabs(eta[2] - 1.4) < 1e-9 &&
              fabs(eta[3] - 0.84) < 1e-9,
          "the ETA goes by the mean step after the first: %.2f %.2f %.2f %.2f s (45, 0.8, 1.4, 0.84)", eta[0], eta[1],
          eta[2], eta[3]);
}

// -d and --lr-scale: what a world size does to the micro-steps and the learning rate
static void test_world_args(void) {
    printf("\n== total batch and learning-rate scaling\n");
    TrainArgs a;
    train_args_defaults(&a);
    a.batch = 4; a.total_batch = 64; a.lr_base = 1e-3f; a.lr_scale = LR_SCALE_LINEAR;
    train_args_for_world(&a, 4);
    check(a.accum == 4 && train_global_batch(&a, 4) == 64 && fabsf(a.lr - 4e-3f) < 1e-9f,
          "-b 4 -d 64 on 4 ranks: 4 micro-steps, effective batch 64, linear scaling lr x4 (lr %g)", a.lr);
    a.lr_scale = LR_SCALE_SQRT;
    train_args_for_world(&a, 4);
    check(fabsf(a.lr - 2e-3f) < 1e-9f, "--lr-scale sqrt on 4 ranks: lr x2 (lr %g)", a.lr);
    a.total_batch = 0; a.lr_scale = LR_SCALE_NONE;
    train_args_for_world(&a, 4);
    check(a.accum == 1 && a.lr == a.lr_base, "no -d, no scaling: one micro-step, the lr as given");
}

// ----------------------------------------------------------------------------
// the sampler

static void test_sampler(void) {
    printf("\n== sampler\n");
    const uint64_t n = 103;
    const int W = 4, B = 5;
    Sampler s;
    sampler_init(&s, n, 42);
    // one epoch of global batches: ranks disjoint, every sample exactly once
    int seen[103] = {0}, overlap = 0;
    uint64_t steps_per_epoch = n / (uint64_t)(W * B);
    for (uint64_t step = 0; step < steps_per_epoch; step++) {
        int mine[103] = {0};
        for (int r = 0; r < W; r++) {
            uint64_t idx[B];
            sampler_rank_indices(&s, B, r, idx);
            for (int i = 0; i < B; i++) { overlap += mine[idx[i]]++ > 0; seen[idx[i]]++; }
        }
        sampler_advance(&s, B, W);
    }
    for (uint64_t pos = s.pos; pos < n; pos++) { seen[sampler_at(&s, pos)]++; }  // the epoch's tail
    int all_once = 1;
    for (uint64_t i = 0; i < n; i++) { all_once &= seen[i] == 1; }
    check(overlap == 0, "ranks take disjoint samples in every global batch");
    check(all_once, "an epoch covers every sample exactly once");
    // same (seed, epoch) -> same order; another epoch or seed -> another order
    uint32_t* p1 = (uint32_t*)mallocCheck(n * 4);
    uint32_t* p2 = (uint32_t*)mallocCheck(n * 4);
    uint32_t* p3 = (uint32_t*)mallocCheck(n * 4);
    uint32_t* p4 = (uint32_t*)mallocCheck(n * 4);
    sampler_permutation(p1, n, 42, 3);
    sampler_permutation(p2, n, 42, 3);
    sampler_permutation(p3, n, 42, 4);
    sampler_permutation(p4, n, 43, 3);
    check(memcmp(p1, p2, n * 4) == 0, "same (seed, epoch) gives the same order");
    check(memcmp(p1, p3, n * 4) != 0 && memcmp(p1, p4, n * 4) != 0, "another epoch or seed gives another order");
    // resume mid-epoch: a fresh sampler with the saved position continues identically
    Sampler a, b;
    sampler_init(&a, n, 42);
    for (int k = 0; k < 7; k++) { sampler_advance(&a, B, W); }
    sampler_init(&b, n, 42);
    b.pos = a.pos;
    int same = 1;
    for (int k = 0; k < 10; k++) {
        uint64_t ia[B], ib[B];
        sampler_rank_indices(&a, B, 1, ia);
        sampler_rank_indices(&b, B, 1, ib);
        for (int i = 0; i < B; i++) { same &= ia[i] == ib[i]; }
        sampler_advance(&a, B, W);
        sampler_advance(&b, B, W);
    }
    check(same, "a sampler restored from its position continues identically (across an epoch boundary)");
    free(p1); free(p2); free(p3); free(p4);
    sampler_free(&s); sampler_free(&a); sampler_free(&b);
}

// ----------------------------------------------------------------------------
// task-balanced sampling (--balance tasks) on the 1:10 imbalanced dataset of write_imbalanced
// (tests/util/test_util.h)

static int read_checkpoint_file(const char* path, Checkpoint* ck);

// Counts the tasks of positions [first, first + G) of a balanced sampler into count (T); returns
// how many positions repeat a sample of an earlier one in that window.
static int balanced_window(Sampler* s, const TaskBalance* tb, const Dataset* ds, uint64_t first, int G, int* count) {
    int repeats = 0;
    uint64_t idx[64];
    for (int t = 0; t < tb->n_tasks; t++) { count[t] = 0; }
    for (int i = 0; i < G; i++) {
        idx[i] = sampler_at(s, first + (uint64_t)i);
        count[task_balance_task_of(tb, ds, idx[i])]++;
        for (int j = 0; j < i; j++) { repeats += idx[j] == idx[i]; }
    }
    return repeats;
}

static void test_balance(const char* dir) {
    printf("\n== task-balanced sampling (--balance tasks)\n");
    char spec[2300];
    write_imbalanced(dir, spec, sizeof(spec));
    Dataset ds;
    dataset_open(&ds, spec);
    TaskBalance tb;
    task_balance_build(&tb, &ds, NULL);
    uint64_t n0 = tb.task_first[1] - tb.task_first[0], n1 = tb.task_first[2] - tb.task_first[1];
    check(tb.n_tasks == 2 && n0 == 80 && n1 == 8 && tb.period == 2,
          "two shards' task tables make 2 tasks by text, of 80 and 8 samples (1:10), period 2 (%d tasks, %llu, %llu)",
          tb.n_tasks, (unsigned long long)n0, (unsigned long long)n1);
    // equal weights, G = 4 (-g 2 -b 2): every global batch 2 + 2, no sample twice in one, 200
    // steps (task 1 drawn 400 times: 50 passes over its 8 samples)
    Sampler s;
    sampler_init(&s, ds.n_samples, 1337);
    sampler_set_balance(&s, &tb);
    int exact = 1, repeats = 0, count[2];
    for (uint64_t step = 0; step < 200; step++) {
        repeats += balanced_window(&s, &tb, &ds, step * 4, 4, count);
        exact &= count[0] == 2 && count[1] == 2;
    }
    check(exact && repeats == 0, "equal weights, G 4: every one of 200 global batches holds 2 samples of each task, "
          "none twice (%d repeats)", repeats);
    // each task's draws go through all its samples once per pass
    int seen0[200] = {0}, seen1[200] = {0}, passes_ok = 1;
    for (uint64_t p = 0; p < 160; p++) {
        uint64_t i = sampler_at(&s, p);
        if (task_balance_task_of(&tb, &ds, i) == 0) { seen0[i]++; } else if (p < 16) { seen1[i]++; }
    }
    for (uint64_t i = 0; i < ds.n_samples; i++) {
        int task = task_balance_task_of(&tb, &ds, i);
        passes_ok &= task == 0 ? seen0[i] == 1 : seen1[i] == 1;
    }
    check(passes_ok, "task 0's first 80 draws are its 80 samples, task 1's first 8 its 8: each once per pass");
    // G not a multiple of T: floor or ceil of G / T each
    int ceil_floor = 1;
    for (uint64_t step = 0; step < 50; step++) {
        balanced_window(&s, &tb, &ds, step * 3, 3, count);
        ceil_floor &= (count[0] == 1 || count[0] == 2) && count[0] + count[1] == 3;
    }
    check(ceil_floor, "equal weights, G 3: each task 1 or 2 times in every global batch");
    // deterministic from (seed, position): a fresh sampler at a mid-run position continues the
    // sequence; another seed gives another
    Sampler a, b;
    sampler_init(&a, ds.n_samples, 1337);
    sampler_set_balance(&a, &tb);
    sampler_init(&b, ds.n_samples, 1338);
    sampler_set_balance(&b, &tb);
    int same = 1, differ = 0;
    for (uint64_t p = 0; p < 400; p++) { differ += sampler_at(&b, p) != sampler_at(&s, p); }
    for (uint64_t p = 357; p < 757; p++) { same &= sampler_at(&a, p) == sampler_at(&s, p); }  // a starts mid-run
    check(same,
          "a balanced sampler started at position 357 gives the uninterrupted sequence (resume needs the position)");
    check(differ > 0, "another seed draws another sequence (%d of 400 positions differ)", differ);
    // ranks: -g 2 -b 2 slices are disjoint and together the -g 1 -b 4 batch
    int ranks_ok = 1;
    for (uint64_t step = 0; step < 20; step++) {
        uint64_t one[4], two[2][2];
        batch_fill_indices(one, &s, 100, 0, step, 4, 1, 0);
        for (int r = 0; r < 2; r++) { batch_fill_indices(two[r], &a, 100, 0, step, 2, 2, r); }
        ranks_ok &= memcmp(one, two[0], sizeof(two[0])) == 0 && memcmp(one + 2, two[1], sizeof(two[1])) == 0;
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < 2; j++) { ranks_ok &= two[0][i] != two[1][j]; }
        }
    }
    check(ranks_ok, "-g 2 -b 2: the ranks' samples are disjoint and together the -g 1 -b 4 batch, 20 steps");
    // --task-weights 1,3 (and 2,6, the same after the gcd): 1 + 3 per batch of 4, 2 + 6 of 8
    TaskBalance w13, w26;
    task_balance_build(&w13, &ds, "1,3");
    task_balance_build(&w26, &ds, "2,6");
    Sampler sw;
    sampler_init(&sw, ds.n_samples, 1337);
    sampler_set_balance(&sw, &w13);
    int ratio = 1;
    for (uint64_t step = 0; step < 100; step++) {
        balanced_window(&sw, &w13, &ds, step * 4, 4, count);
        ratio &= count[0] == 1 && count[1] == 3;
        balanced_window(&sw, &w13, &ds, step * 8, 8, count);
        ratio &= count[0] == 2 && count[1] == 6;
    }
    check(ratio && w13.period == 4 && w26.period == 4 && w13.fingerprint == w26.fingerprint &&
          w13.fingerprint != tb.fingerprint, "--task-weights 1,3: every batch of 4 holds 1 + 3, of 8 2 + 6; 2,6 is the "
          "same schedule, equal weights another");
    sampler_free(&s); sampler_free(&a); sampler_free(&b); sampler_free(&sw);
    task_balance_free(&w13); task_balance_free(&w26);

    // through the binary: -g 2 -b 2 balanced, 6 steps straight vs 3 + resumed 3 (-y 1)
    char cmd[8192], p1[1100], p2[1100];
    const char* common = "./train_vla_cpu -p tiny -g 2 -b 2 -u 3 -t 1 --workers 1 --balance tasks";
    snprintf(cmd, sizeof(cmd), "rm -rf %s/bal_full %s/bal_res && "
             "%s -n 6 -k 3 -i %s -o %s/bal_full > %s/bal_full.txt 2>&1 && "
             "%s -n 3 -i %s -o %s/bal_res > %s/bal_r1.txt 2>&1 && "
             "%s -n 6 -y 1 -i %s -o %s/bal_res > %s/bal_r2.txt 2>&1",
             dir, dir, common, spec, dir, dir, common, spec, dir, dir, common, spec, dir, dir);
    int rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/bal_full/ckpt_00000006.bin", dir);
    snprintf(p2, sizeof(p2), "%s/bal_res/ckpt_00000006.bin", dir);
    check(rc == 0 && files_equal(p1, p2), "--balance tasks -g 2: resumed at step 3 (mid-epoch), step 6's checkpoint is "
          "the uninterrupted run's byte for byte (rc %d)", rc);
    Checkpoint ck;
    int read = read_checkpoint_file(p1, &ck);
    check(read && ck.balance == BALANCE_TASKS && ck.balance_id == tb.fingerprint && ck.sampler_pos == 24,
          "the checkpoint records --balance tasks, the weights' fingerprint and sampler position 24");
    if (read) { checkpoint_free(&ck); }
    // the log: every step's task_loss holds both tasks, the step's loss between them
    snprintf(p1, sizeof(p1), "%s/bal_full/log.jsonl", dir);
    check_task_loss_log(p1, 6, "train_vla_cpu");
    // plain runs log no task_loss and record no balance
    snprintf(cmd, sizeof(cmd), "rm -rf %s/bal_plain && ./train_vla_cpu -p tiny -b 4 -n 1 -t 1 -i %s -o %s/bal_plain > "
             "%s/bal_plain.txt 2>&1", dir, spec, dir, dir);
    rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/bal_plain/log.jsonl", dir);
    char* text = read_text(p1);
    snprintf(p2, sizeof(p2), "%s/bal_plain/ckpt_00000001.bin", dir);
    read = read_checkpoint_file(p2, &ck);
    check(rc == 0 && strstr(text, "\"step\": 1") != NULL && strstr(text, "task_loss") == NULL && read &&
          ck.balance == BALANCE_NONE && ck.balance_id == 0, "without --balance: no task_loss in the log, balance 0 in "
          "the checkpoint (the reserved bytes of before)");
    free(text);
    if (read) { checkpoint_free(&ck); }
    // refusals: another mode or other weights to resume; bad weights
    char args[4096];
    snprintf(args, sizeof(args), "-p tiny -g 2 -b 2 -n 8 -t 1 -i %s -o %s/bal_full -y 1 --balance none", spec, dir);
    expect_error(dir, "resuming a balanced run with --balance none", args,
                 "trained with --balance tasks, this run with --balance none");
    // without --balance, -y 1 takes the run's own from its run.json and goes on balanced
    snprintf(cmd, sizeof(cmd), "./train_vla_cpu -n 9 -y 1 -o %s/bal_full > %s/bal_more.txt 2>&1", dir, dir);
    rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/bal_full/log.jsonl", dir);
    text = read_text(p1);
    const char* ninth = text != NULL ? strstr(text, "{\"step\": 9,") : NULL;
    check(rc == 0 && ninth != NULL && strstr(ninth, "task_loss") != NULL,
          "resuming a balanced run with -y 1 -n 9 alone: its -i, --balance tasks and -g 2 from run.json (step 9 "
          "logs task_loss; exit %d)", rc);
    free(text);
    snprintf(args, sizeof(args),
             "-p tiny -g 2 -b 2 -n 8 -t 1 -i %s -o %s/bal_full -y 1 --balance tasks --task-weights 1,3", spec, dir);
    expect_error(dir, "resuming a balanced run with other --task-weights", args, "balanced other task weights");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 8 -t 1 -i %s -o %s/bal_plain -y 1 --balance tasks", spec, dir);
    expect_error(dir, "resuming a plain run with --balance tasks", args,
                 "trained with --balance none, this run with --balance tasks");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s -o %s/bal_bad --balance tasks --task-weights 1,2,3", spec,
             dir);
    expect_error(dir, "--task-weights with 3 weights for 2 tasks", args, "3 weights for the dataset's 2 tasks");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s -o %s/bal_bad --balance tasks --task-weights 1,-1", spec,
             dir);
    expect_error(dir, "--task-weights with a negative weight", args, "weights are whole numbers from 0");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s -o %s/bal_bad --balance tasks --task-weights 0,0", spec, dir);
    expect_error(dir, "--task-weights summing to 0", args, "the weights sum to 0");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s -o %s/bal_bad --task-weights 1,3", spec, dir);
    expect_error(dir, "--task-weights without --balance tasks", args, "add --balance tasks");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s -o %s/bal_bad --balance episodes", spec, dir);
    expect_error(dir, "--balance episodes", args, "use none or tasks");
    // a.bin's task table names 4 instructions, 2 of them in no episode: equal weights skip those,
    // an explicit weight on one is refused
    char a_bin[1100];
    snprintf(a_bin, sizeof(a_bin), "%s/a.bin", dir);
    Dataset da;
    dataset_open(&da, a_bin);
    TaskBalance ta;
    task_balance_build(&ta, &da, NULL);
    int skipped = ta.n_tasks == 4 && ta.period == 2;
    for (int t = 0; t < ta.n_tasks && skipped; t++) {
        skipped = ta.weight[t] == (ta.task_first[t + 1] > ta.task_first[t] ? 1u : 0u);
    }
    check(skipped, "equal weights: weight 1 for each of a.bin's 2 tasks with samples, 0 for its 2 without (%d tasks, "
          "period %u)", ta.n_tasks, ta.period);
    task_balance_free(&ta);
    dataset_close(&da);
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s -o %s/bal_bad --balance tasks --task-weights 1,1,1,1", a_bin,
             dir);
    expect_error(dir, "--task-weights giving a task without samples a weight", args, "has no samples");
    task_balance_free(&tb);
    dataset_close(&ds);
}

// ----------------------------------------------------------------------------
// the prefetching loader and the augmentation, on s.bin (two cameras of different sizes)

static void test_loader(const char* dir) {
    printf("\n== loader\n");
    char path[1024];
    snprintf(path, sizeof(path), "%s/s.bin", dir);
    Dataset ds;
    dataset_open(&ds, path);
    FlowConfig c = config_for_data("tiny", 0, &ds);
    const int B = 3, W = 2, steps = 12;  // 72 samples: more than an epoch of the fixture
    const uint64_t seed = 5, first_pos = 17, first_step = 40;
    Sampler s;
    sampler_init(&s, ds.n_samples, seed);
    Batch ref;
    batch_alloc(&ref, &c, &ds.cams, B);
    int threads_list[3] = {0, 1, 3}, all_same = 1;
    for (int k = 0; k < 3; k++) {
        Loader L;
        loader_start(&L, &ds, &c, seed, first_pos, first_step, B, W, 2, threads_list[k], 3);
        for (int step = 0; step < steps; step++) {
            for (int r = 0; r < W; r++) {
                uint64_t idx[B];
                batch_fill_indices(idx, &s, first_pos, first_step, first_step + step, B, W, r);
                batch_fill(&ref, &ds, &c, idx, seed, first_step + step, r, 2);
                Batch* got = loader_next(&L);
                all_same &= batches_equal(got, &ref, &c);
                loader_release(&L);
            }
        }
        loader_stop(&L);
    }
    check(all_same && ds.n_samples < (uint64_t)(B * W * steps), "loader with 0, 1 and 3 worker threads gives the "
          "batches of direct assembly, bit for bit, over %d steps x %d ranks across epoch ends (%llu samples)", steps,
          W, (unsigned long long)ds.n_samples);
    // a rank's own loader (every W-th job from its rank) gives that rank's batches
    int rank_same = 1;
    for (int r = 0; r < W; r++) {
        Loader L;
        loader_start_strided(&L, &ds, &c, seed, first_pos, first_step, B, W, 2, 1, 3, W, r);
        for (int step = 0; step < steps; step++) {
            uint64_t idx[B];
            batch_fill_indices(idx, &s, first_pos, first_step, first_step + step, B, W, r);
            batch_fill(&ref, &ds, &c, idx, seed, first_step + step, r, 2);
            Batch* got = loader_next(&L);
            rank_same &= batches_equal(got, &ref, &c);
            loader_release(&L);
        }
        loader_stop(&L);
    }
    check(rank_same,
          "a rank's strided loader (every %d-th job from its rank) gives that rank's batches, bit for bit", W);

    // the batch: what dataset_assemble reads, checked here against the shard directly
    uint64_t idx[B];
    batch_fill_indices(idx, &s, 0, 0, 0, B, 1, 0);
    Batch plain, shifted, again;
    batch_alloc(&plain, &c, &ds.cams, B); batch_alloc(&shifted, &c, &ds.cams, B);
    batch_alloc(&again, &c, &ds.cams, B);
    batch_fill(&plain, &ds, &c, idx, seed, 3, 0, 0);
    const Shard* sh = &ds.shards[0];
    int S = c.state_dim, A = c.action_dim, Smax = c.max_state_dim, Amax = c.max_action_dim, H = c.chunk, layout_ok = 1;
    for (int i = 0; i < B; i++) {
        uint64_t f = idx[i];
        const ShardEpisode* ep = &sh->episodes[sh->frame_episode[f]];
        for (int d = 0; d < Smax; d++) {
            float want = d < S ? (sh->state[f * S + d] - ds.state_mean[d]) / ds.state_std[d] : 0.0f;
            layout_ok &= plain.state[i * Smax + d] == want;
        }
        for (int h = 0; h < H; h++) {
            uint64_t g = f + h, last = ep->first_frame + ep->length - 1;
            int pad = g > last;
            layout_ok &= plain.action_is_pad[i * H + h] == (pad ? 1.0f : 0.0f);
            for (int d = 0; d < Amax; d++) {
                float want =
                    d < A ? (sh->action[(pad ? last : g) * A + d] - ds.action_mean[d]) / ds.action_std[d] : 0.0f;
                layout_ok &= plain.actions[((size_t)i * H + h) * Amax + d] == want;
            }
        }
        float t;
        float* eps = (float*)mallocCheck((size_t)H * Amax * sizeof(float));
        flow_noise_width(H, Amax, seed, 3, (uint64_t)i, &t, eps);
        layout_ok &= t == plain.t[i] && memcmp(eps, plain.eps + (size_t)i * H * Amax, (size_t)H * Amax * 4) == 0;
        free(eps);
    }
    check(layout_ok, "a Batch holds the normalized state zero-padded to %d, the chunk padded to %d dims with its last "
          "action repeated and marked past the episode's end, and the flow noise of each sample's global index",
          Smax, Amax);

    // augmentation: off is the identity; on is a shift of every camera by at most k pixels
    batch_fill(&shifted, &ds, &c, idx, seed, 3, 0, 2);
    batch_fill(&again, &ds, &c, idx, seed, 3, 0, 2);
    check(batches_equal(&shifted, &again, &c), "augmentation is deterministic in (seed, step, sample)");
    int all_shifts = 1, moved = 0;
    for (int i = 0; i < B; i++) { all_shifts &= batch_cameras_shifted(&plain, &shifted, i, 2, &moved); }
    check(all_shifts && moved > 0,
          "--augment-shift 2 shifts each camera image (%ux%u and %ux%u) by at most 2 pixels (%d of %d moved)",
          ds.cams.height[0], ds.cams.width[0], ds.cams.height[1], ds.cams.width[1], moved, B * c.n_cam);
    memcpy(shifted.images[0], plain.images[0], (size_t)B * ds.cams.height[0] * ds.cams.width[0] * 3);
    memcpy(shifted.images[1], plain.images[1], (size_t)B * ds.cams.height[1] * ds.cams.width[1] * 3);
    check(batches_equal(&plain, &shifted, &c), "augmentation changes only the images");
    batch_fill(&again, &ds, &c, idx, seed, 4, 0, 2);
    int other = 0;
    for (int i = 0; i < B; i++) {
        other |= memcmp(batch_image(&again, 0, i), batch_image(&plain, 0, i), ds.cams.height[0] * ds.cams.width[0] * 3);
    }
    check(other != 0, "another step draws other shifts");
    batch_free(&plain); batch_free(&shifted); batch_free(&again); batch_free(&ref);
    sampler_free(&s);
    dataset_close(&ds);
}

// ----------------------------------------------------------------------------
// checkpoints: the moments of the trainable domain per mode, frozen weights, bit-exact resume and
// --init, refusals

// The weights, moments, step, seed and sampler position of a checkpoint file as it was written
static int read_checkpoint_file(const char* path, Checkpoint* ck) {
    char err[VLA_PATH_MAX + 512];
    int rc = checkpoint_read_checked(path, ck, err, sizeof(err));
    if (rc != 0) { printf("        (%s)\n", err); }
    return rc == 0;
}

// --init FILE --weights-only (fine-tuning): a checkpoint's weights at step 0 with fresh moments,
// this run's seed and the dataset's statistics, its sizes on data of other cameras and dims, and
// resumable with -y 1 without -p (the sizes come from the checkpoint)
static void test_weights_only(const char* dir) {
    printf("\n== --init --weights-only: fine-tuning from a checkpoint's weights\n");
    char cmd[4096], a[1024], b[1024], p1[1200], p2[1200], args[3000];
    snprintf(a, sizeof(a), "%s/a.bin", dir);
    snprintf(b, sizeof(b), "%s/b.bin", dir);
    const char* trainer = "./train_vla_cpu -b 4 -u 3 -t 1 --log-every 100";
    // step 1 at learning rate 0 leaves the weights at the init of seed 21: a checkpoint of that init
    snprintf(cmd, sizeof(cmd), "rm -rf %s/wo_zero %s/wo_seed %s/wo_init && "
             "%s -p tiny -n 1 -l 0 -s 21 -i %s -o %s/wo_zero > /dev/null 2>&1 && "
             "%s -p tiny -n 3 -l 1e-3 -s 21 -i %s -o %s/wo_seed > /dev/null 2>&1 && "
             "%s -n 3 -l 1e-3 -s 21 -i %s --init %s/wo_zero/ckpt_00000001.bin --weights-only -o %s/wo_init "
             "> %s/wo_init.txt 2>&1",
             dir, dir, dir, trainer, a, dir, trainer, a, dir, trainer, a, dir, dir, dir);
    int rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/wo_seed/ckpt_00000003.bin", dir);
    snprintf(p2, sizeof(p2), "%s/wo_init/ckpt_00000003.bin", dir);
    check(rc == 0 && files_equal(p1, p2), "--weights-only from a checkpoint of seed 21's init (no -p: its sizes) "
          "trains as the run from seed 21 itself: step 0, fresh moments, the same checkpoint at step 3 byte for byte "
          "(exit %d)", rc);
    snprintf(p1, sizeof(p1), "%s/wo_init.txt", dir);
    char* text = read_text(p1);
    check(text != NULL && strstr(text, "| start                  | weights  ") != NULL &&
          strstr(text, "fine-tuning the weights of") != NULL,
          "the config table says the run starts from the checkpoint's weights");
    free(text);

    // on other data (2 cameras, state 3, action 2): the checkpoint's sizes, the dataset's dims and
    // statistics; --train expert leaves everything else at the checkpoint's weights
    snprintf(cmd, sizeof(cmd), "rm -rf %s/wo_b %s/wo_b2 && "
             "%s -n 3 -s 5 --train expert -i %s --init %s/wo_zero/ckpt_00000001.bin --weights-only -o %s/wo_b "
             "> /dev/null 2>&1 && %s -n 2 -k 1 -s 5 --train expert -i %s --init %s/wo_zero/ckpt_00000001.bin "
             "--weights-only -o %s/wo_b2 > /dev/null 2>&1 && %s -n 3 -s 5 -y 1 --train expert -i %s -o %s/wo_b2 "
             "> /dev/null 2>&1", dir, dir, trainer, b, dir, dir, trainer, b, dir, dir, trainer, b, dir);
    rc = run_command(cmd);
    Checkpoint from, tuned;
    Dataset ds;
    dataset_open(&ds, b);
    snprintf(p1, sizeof(p1), "%s/wo_zero/ckpt_00000001.bin", dir);
    snprintf(p2, sizeof(p2), "%s/wo_b/ckpt_00000003.bin", dir);
    if (rc == 0 && read_checkpoint_file(p1, &from) && read_checkpoint_file(p2, &tuned)) {
        const FlowConfig* c = &tuned.config;
        FlowConfig sizes = from.config;
        sizes.n_cam = c->n_cam; sizes.state_dim = c->state_dim; sizes.action_dim = c->action_dim;
        int S = c->state_dim, A = c->action_dim;
        int stats_ok = memcmp(tuned.stats, ds.state_mean, S * 4) == 0 &&
                       memcmp(tuned.stats + S, ds.state_std, S * 4) == 0 &&
                       memcmp(tuned.stats + 2 * S, ds.action_mean, A * 4) == 0 &&
                       memcmp(tuned.stats + 2 * S + A, ds.action_std, A * 4) == 0;
        check(flow_config_diff(&sizes, c) == NULL && c->n_cam == 2 && S == 3 && A == 2 && tuned.step == 3 &&
              tuned.seed == 5 && tuned.train_mode == TRAIN_MODE_EXPERT && stats_ok,
              "a tiny checkpoint of 1 camera and 4/4 dims fine-tunes on 2 cameras and 3/2 dims: its sizes, the data's "
              "dims and statistics, step 3, this run's seed and --train expert in the header");
        FlowParamTable t;
        flow_table_build(c, &t);
        int frozen_same = 1, trained_moved = 1;
        for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
            const FlowParamSpec* s = &t.spec[i];
            size_t n = flow_trainable_numel(s, TRAIN_MODE_EXPERT);
            frozen_same &= memcmp(tuned.params + s->offset + n, from.params + s->offset + n, (s->numel - n) * 4) == 0;
            if (n > 0) { trained_moved &= memcmp(tuned.params + s->offset, from.params + s->offset, n * 4) != 0; }
        }
        check(frozen_same && trained_moved, "--train expert: every frozen weight is the checkpoint's bit for bit, "
              "every trainable tensor moved");
        checkpoint_free(&from);
        checkpoint_free(&tuned);
    } else {
        check(0, "fine-tuning on other data ran and wrote its checkpoints (exit %d)", rc);
    }
    dataset_close(&ds);
    snprintf(p1, sizeof(p1), "%s/wo_b2/ckpt_00000003.bin", dir);
    check(rc == 0 && files_equal(p1, p2), "-y 1 (no -p, no --init) continues the fine-tuning run from its step 2 "
          "to the straight run's step 3, byte for byte");

    // refusals, each one line
    expect_error(dir, "--weights-only without --init", "--weights-only -n 1",
                 "--weights-only takes the weights of --init FILE");
    snprintf(args, sizeof(args),
             "-p small -n 1 -i %s --init %s/wo_zero/ckpt_00000001.bin --weights-only -o %s/bad_out", a, dir, dir);
    expect_error(dir, "--weights-only with -p of other sizes", args, "has other sizes than preset small (img 32 vs 64");
    char bad[1200], tokenizer[64] = "tokenizer.json:0123456789abcdef";
    snprintf(bad, sizeof(bad), "%s/ckpt_wo_bad.bin", dir);
    snprintf(p1, sizeof(p1), "%s/wo_zero/ckpt_00000001.bin", dir);
    corrupt_copy_sealed(p1, bad, offsetof(CheckpointHeader, tokenizer), tokenizer, sizeof(tokenizer));
    snprintf(args, sizeof(args), "-n 1 -i %s --init %s --weights-only -o %s/bad_out", b, bad, dir);
    expect_error(dir, "--weights-only of another tokenizer", args, "was trained on token ids of tokenizer "
                 "tokenizer.json:0123456789abcdef, the dataset's are of bytes");
}

static void test_checkpoints(const char* dir) {
    printf("\n== checkpoints and resume\n");
    char cmd[4096], p1[1024], p2[1024], path[1100];
    snprintf(p1, sizeof(p1), "%s/a.bin", dir);
    Dataset ds;
    dataset_open(&ds, p1);
    FlowConfig c = config_for_data("tiny", 0, &ds);
    // in-process round trip, in the vlm mode (its moments a packed subset of the weights)
    {
        FlowVLA m;
        flow_build(&m, &c, TRAIN_MODE_VLM);
        flow_param_init(m.params_memory, &m.table, &c, 7);
        flow_opt_init(&m, TRAIN_MODE_VLM);
        for (size_t i = 0; i < m.opt.total; i++) {
            m.m_memory[i] = 0.5f * m.params_memory[i];
            m.v_memory[i] = (float)i;
        }
        TrainArgs args;
        train_args_defaults(&args);
        snprintf(p2, sizeof(p2), "%s/ckpt_roundtrip", dir);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", p2);
        run_command(cmd);
        args.output = p2; args.seed = 7; args.keep = 6; args.train_mode = TRAIN_MODE_VLM;
        for (int step = 1; step <= 6; step++) { flow_save(&m, &ds, &args, step, 1000 + step); }
        uint64_t newest[1];
        check(checkpoint_list(p2, newest, 1) == 1 && newest[0] == 6,
              "asked for one, the checkpoint list gives the newest");
        run_command(cmd);  // empty the folder again
        args.keep = 2;
        for (int step = 1; step <= 3; step++) { flow_save(&m, &ds, &args, step, 1000 + step); }
        FlowVLA m2;
        flow_build(&m2, &c, TRAIN_MODE_VLM);
        checkpoint_path(path, sizeof(path), p2, 3);
        Checkpoint back;
        run_checkpoint_load(path, &c, &args, &ds, &back);
        flow_set_params(&m2, back.params, back.m, back.v);
        int step = (int)back.step;
        uint64_t seed = back.seed, pos = back.sampler_pos;
        checkpoint_free(&back);
        check(step == 3 && seed == 7 && pos == 1003 && m2.opt.mode == TRAIN_MODE_VLM && m2.opt.total == m.opt.total &&
              memcmp(m.params_memory, m2.params_memory, m.table.total * 4) == 0 &&
              memcmp(m.m_memory, m2.m_memory, m.opt.total * 4) == 0 &&
              memcmp(m.v_memory, m2.v_memory, m.opt.total * 4) == 0,
              "checkpoint round trip restores every weight, the packed moments, step, seed, "
              "sampler position bit for bit");
        uint64_t steps[8];
        int n = checkpoint_list(p2, steps, 8);
        check(n == 2 && steps[0] == 3 && steps[1] == 2, "only the newest --keep 2 checkpoints remain (found %d)", n);
        // an incomplete newest file is skipped by resume
        checkpoint_path(path, sizeof(path), p2, 9);
        snprintf(cmd, sizeof(cmd), "head -c 1000 %s/ckpt_00000003.bin > %s", p2, path);
        run_command(cmd);
        n = checkpoint_list(p2, steps, 8);
        check(n == 2 && steps[0] == 3, "a truncated newest checkpoint is skipped when picking one to resume");
        flow_free(&m); flow_free(&m2);
    }
    // through the binary, per train mode: the file holds every weight and the moments of the
    // trainable elements only (counts from the closed form, the size from the layout); its weights
    // and packed moments are those of the same 2 steps taken here in-process; frozen ones are
    // their init bit for bit
    size_t total = flow_closed_form(&c, TRAIN_MODE_COUNT);
    for (int mode = 0; mode < TRAIN_MODE_COUNT; mode++) {
        const char* name = TRAIN_MODE_NAMES[mode];
        snprintf(p2, sizeof(p2), "%s/ck_%s", dir, name);
        snprintf(cmd, sizeof(cmd), "rm -rf %s && ./train_vla_cpu -p tiny -b 2 -n 2 -t 1 --workers 0 --train %s -i %s "
                 "-o %s > %s.txt 2>&1", p2, name, p1, p2, p2);
        int rc = run_command(cmd);
        checkpoint_path(path, sizeof(path), p2, 2);
        Checkpoint ck;
        int read = rc == 0 && read_checkpoint_file(path, &ck);
        struct stat st;
        size_t trainable = flow_closed_form(&c, mode);
        uint64_t size =
            CKPT_HEADER_BYTES + 2 * 4 * (uint64_t)(c.state_dim + c.action_dim) + 4 * total + 2 * 4 * trainable;
        check(read && ck.train_mode == mode && ck.n_params == total && ck.n_trainable == trainable &&
              stat(path, &st) == 0 && (uint64_t)st.st_size == size && strcmp(ck.tokenizer, "bytes") == 0,
              "--train %s: the checkpoint holds %zu weights and %zu moments each of m and v (%llu bytes), mode %s, "
              "tokenizer bytes", name, total, trainable, (unsigned long long)size, name);
        if (!read) { continue; }
        TrainArgs args;
        train_args_defaults(&args);
        args.batch = 2; args.steps = 2; args.train_mode = mode;
        train_args_for_world(&args, 1);
        FlowVLA m;
        flow_build(&m, &c, mode);
        flow_param_init(m.params_memory, &m.table, &c, args.seed);
        float* init = (float*)mallocCheck(m.table.total * sizeof(float));
        memcpy(init, m.params_memory, m.table.total * sizeof(float));
        flow_opt_init(&m, mode);
        Loader loader;
        loader_start(&loader, &ds, &c, args.seed, 0, 0, args.batch, 1, 0, 0, 1);
        float* grad_sum = (float*)mallocCheck(m.opt.total * sizeof(float));
        for (int step = 0; step < 2; step++) {
            float norm;
            train_step(&FLOW_POLICY, &m, grad_sum, &loader, &args, step, &norm, NULL, NULL, NULL);
        }
        loader_stop(&loader);
        check(memcmp(ck.params, m.params_memory, total * 4) == 0 && memcmp(ck.m, m.m_memory, trainable * 4) == 0 &&
              memcmp(ck.v, m.v_memory, trainable * 4) == 0 && ck.step == 2 && ck.sampler_pos == 4,
              "--train %s: its weights and packed moments are those of the same 2 steps in-process, bit for bit", name);
        int frozen_still = 1, moved = 1, v_positive = 1;
        for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
            const FlowParamSpec* s = &m.table.spec[i];
            size_t n = m.opt.numel[i];
            frozen_still &= memcmp(ck.params + s->offset + n, init + s->offset + n, (s->numel - n) * 4) == 0;
            if (n > 0) { moved &= memcmp(ck.params + s->offset, init + s->offset, n * 4) != 0; }
            for (size_t j = 0; j < n; j++) { v_positive &= ck.v[m.opt.offset[i] + j] >= 0.0f; }
        }
        check(frozen_still && moved && v_positive, "--train %s: the %zu frozen elements are their init bit for bit, "
              "every trainable tensor moved, second moments >= 0", name, total - trainable);
        free(grad_sum); free(init);
        flow_free(&m);
        checkpoint_free(&ck);
    }
    // bit-exact resume, in the default mode and in the expert mode over 2 simulated ranks with ZeRO-1
    const char* trainer = "./train_vla_cpu -p tiny -b 4 -u 3 -t 1 --log-every 100";
    check_resume_bit_exact(dir, trainer, "train_vla_cpu");
    // --init continues exactly as -y 1 does: from the first leg's checkpoint of step 3 to step 6
    snprintf(cmd, sizeof(cmd), "rm -rf %s/run_init && %s -n 6 -i %s --init %s/run_resumed/ckpt_00000003.bin "
             "-o %s/run_init > %s/run_init.txt 2>&1", dir, trainer, p1, dir, dir, dir);
    int rc = run_command(cmd);
    snprintf(p2, sizeof(p2), "%s/run_init/ckpt_00000006.bin", dir);
    snprintf(path, sizeof(path), "%s/run_full/ckpt_00000006.bin", dir);
    check(rc == 0 && files_equal(p2, path), "--init of step 3's checkpoint reaches step 6 with the uninterrupted run's "
          "checkpoint, byte for byte (exit %d)", rc);
    char src[1100], bad[1100], args[3000];
    snprintf(src, sizeof(src), "%s/ckpt_all.bin", dir);  // --train all (tiny's default), for the refusals below
    snprintf(cmd, sizeof(cmd), "cp %s %s", path, src);
    run_command(cmd);
    check_resume_bit_exact(dir, "./train_vla_cpu -p tiny -b 2 -g 2 -z 1 --train expert -u 3 -t 1 --log-every 100",
                           "train_vla_cpu --train expert -g 2 -z 1");
    // refusals, each one line: a version-1 checkpoint, another train mode, another tokenizer, truncation
    snprintf(bad, sizeof(bad), "%s/ckpt_bad.bin", dir);
    const char* run = "-p tiny -b 2 -n 8 -t 1";
    uint32_t version = 1;
    corrupt_copy(src, bad, offsetof(CheckpointHeader, version), &version, 4, -1);
    snprintf(args, sizeof(args), "%s -i %s --init %s -o %s/bad_out", run, p1, bad, dir);
    expect_error(dir, "a version-1 checkpoint", args,
                 "has version 1: it holds the model train_vla trained before SmolVLA");
    snprintf(args, sizeof(args), "%s --train expert -i %s --init %s -o %s/bad_out", run, p1, src, dir);
    expect_error(dir, "another train mode", args,
                 "trained with --train all, this run with --train expert: pass --train all");
    char tokenizer[64] = "tokenizer.json:0123456789abcdef";
    corrupt_copy_sealed(src, bad, offsetof(CheckpointHeader, tokenizer), tokenizer, sizeof(tokenizer));
    snprintf(args, sizeof(args), "%s -i %s --init %s -o %s/bad_out", run, p1, bad, dir);
    expect_error(dir, "another tokenizer", args, "was trained on token ids of tokenizer "
                 "tokenizer.json:0123456789abcdef, the dataset's are of bytes");
    struct stat st;
    long full = stat(src, &st) == 0 ? (long)st.st_size : 0;
    corrupt_copy(src, bad, 0, NULL, 0, full - 4);
    expect_error(dir, "a checkpoint 4 bytes short", args, "its header implies");
    corrupt_copy(src, bad, 0, NULL, 0, 300);
    expect_error(dir, "a checkpoint cut inside its header", args, "shorter than its header: it is truncated");
    snprintf(args, sizeof(args), "%s -i %s -y 1 -o %s/run_full -n 7 --train vlm", run, p1, dir);
    expect_error(dir, "-y 1 in another train mode", args,
                 "trained with --train expert, this run with --train vlm: pass --train expert");
    dataset_close(&ds);
    // pi0's test preset: resume in its default mode (all) and over 2 simulated ranks with ZeRO-1
    check_resume_bit_exact(dir, "./train_vla_cpu -p pi0_tiny -b 4 -u 3 -t 1 --log-every 100",
                           "train_vla_cpu -p pi0_tiny");
    check_resume_bit_exact(dir, "./train_vla_cpu -p pi0_tiny -b 2 -g 2 -z 1 --train vlm -u 3 -t 1 --log-every 100",
                           "train_vla_cpu -p pi0_tiny --train vlm -g 2 -z 1");
    {  // its checkpoint says pi0 where older files hold padding, and a SmolVLA preset does not take it
        Checkpoint ck;
        snprintf(path, sizeof(path), "%s/run_full/ckpt_00000006.bin", dir);
        int read_ok = read_checkpoint_file(path, &ck);
        int32_t stored = -1;
        FILE* f = fopen(path, "rb");
        if (f != NULL) {
            if (fseek(f, (long)offsetof(CheckpointHeader, family), SEEK_SET) != 0 || fread(&stored, 4, 1, f) != 1) {
                stored = -1;
            }
            fclose(f);
        }
        check(read_ok && ck.config.family == FAMILY_PI0 && stored == FAMILY_PI0 &&
              offsetof(CheckpointHeader, family) == 116 && offsetof(CheckpointHeader, train_mode) == 112,
              "a pi0_tiny checkpoint holds family %d at byte 116 (after the train mode at 112, where files from before "
              "pi0 hold zero padding: SmolVLA)", stored);
        if (read_ok) { checkpoint_free(&ck); }
        snprintf(args, sizeof(args), "-p tiny -b 2 -n 8 -t 1 -i %s --init %s --weights-only -o %s/bad_out", p1, path,
                 dir);
        expect_error(dir, "a pi0 checkpoint as the tiny preset's weights", args, "has other sizes than preset tiny");
        // across world sizes: 2 steps on -g 2 -b 2 with ZeRO-1, then on -g 1 -b 4: the losses of a
        // straight -g 1 -b 4 run (the same samples in other sums: fp32 rounding)
        const char* flags = "-p pi0_tiny -u 3 -t 1 --log-every 100";
        snprintf(cmd, sizeof(cmd), "rm -rf %s/pw_straight %s/pw_split && "
                 "./train_vla_cpu %s -b 4 -n 4 -i %s -o %s/pw_straight > %s/pw_straight.txt 2>&1 && "
                 "./train_vla_cpu %s -g 2 -b 2 -z 1 -n 2 -i %s -o %s/pw_split > %s/pw_a.txt 2>&1 && "
                 "./train_vla_cpu %s -g 1 -b 4 -n 4 -i %s -o %s/pw_split -y 1 > %s/pw_b.txt 2>&1",
                 dir, dir, flags, p1, dir, dir, flags, p1, dir, dir, flags, p1, dir, dir);
        int rc_w = run_command(cmd);
        float straight[4] = {0}, split[4] = {0};
        snprintf(path, sizeof(path), "%s/pw_straight/log.jsonl", dir);
        int n1 = read_losses(path, 1, 4, straight);
        snprintf(path, sizeof(path), "%s/pw_split/log.jsonl", dir);
        int n2 = read_losses(path, 1, 4, split);
        double e = rel_error(split, straight, 4);
        check(rc_w == 0 && n1 == 4 && n2 == 4 && e < 1e-5, "pi0_tiny: 2 steps on -g 2 -z 1, "
              "resumed on -g 1 for 2 more: the losses of a straight -g 1 run, rel err %.2e (tol 1e-5)", e);
    }
}

// The lines a command printed: its stdout and stderr, together, in `text` (freed by the caller).
// Returns the exit status.
static int run_capture(const char* dir, const char* cmd, char** text) {
    char full[4400], path[1100];
    snprintf(path, sizeof(path), "%s/capture.txt", dir);
    snprintf(full, sizeof(full), "%s > %s 2>&1", cmd, path);
    int rc = run_command(full);
    *text = read_text(path);
    return rc;
}

// The number of lines of text that hold needle.
static int lines_holding(const char* text, const char* needle) {
    int n = 0;
    for (const char* line = text; line != NULL && *line != '\0';) {
        const char* end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        char* copy = (char*)mallocCheck(len + 1);
        memcpy(copy, line, len);
        copy[len] = '\0';
        n += strstr(copy, needle) != NULL;
        free(copy);
        line = end != NULL ? end + 1 : NULL;
    }
    return n;
}

// Checkpoints that cannot be trusted, and resumes that change what the run was: two bytes flipped
// in the weights (-y 1 falls back to the previous checkpoint and says so; --init and the policy's
// reader refuse it), a file without a checksum (it loads, with a note), another batch (said),
// another dataset (refused unless --weights-only), non-finite weights (refused naming the tensor),
// and a run that diverges before its first checkpoint (says there is none)
static void test_checkpoint_integrity(const char* dir) {
    printf("\n== checkpoint checksums and resume changes\n");
    char cmd[4096], data[1100], other[1100], path[1200], bad[1200], args[3000];
    snprintf(data, sizeof(data), "%s/a.bin", dir);
    const char* trainer = "./train_vla_cpu -p tiny -b 2 -t 1 --workers 1 --log-every 100";
    // the crc of "123456789" is CRC-32's check value, and a sum split in two is the sum whole
    uint8_t bytes[1000];
    for (int i = 0; i < 1000; i++) { bytes[i] = (uint8_t)(i * 37 + (i >> 3)); }
    check(crc32_update(0, "123456789", 9) == 0xCBF43926u &&
          crc32_update(crc32_update(0, bytes, 333), bytes + 333, 667) == crc32_update(0, bytes, 1000),
          "CRC-32 of \"123456789\" is 0xcbf43926 (zlib.crc32's), and in two parts the same as whole");

    // a file being written is the writer's own: NAME.PID.tmp until it is renamed to NAME
    {
        AtomicFile out;
        char name[1100], tmp[1200];
        snprintf(name, sizeof(name), "%s/ci_atomic.bin", dir);
        snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", name, (long)getpid());
        unlink(name);
        atomic_file_open(&out, name, 9);
        atomic_file_write(&out, "123456789", 1, 9);
        int pending = access(tmp, F_OK) == 0 && access(name, F_OK) != 0 && out.crc == 0xCBF43926u;
        atomic_file_commit(&out);
        check(pending && access(tmp, F_OK) != 0 && access(name, F_OK) == 0, "a file is written as NAME.<pid>.tmp (its "
              "CRC-32 accumulating as it goes), then renamed to NAME");
    }
    // a run of 3 steps checkpointing each; its newest file gets two bytes flipped in the weights
    snprintf(cmd, sizeof(cmd), "rm -rf %s/ci_full %s/ci_run && "
             "%s -i %s -n 4 -k 1 --keep 9 -o %s/ci_full > /dev/null 2>&1 && "
             "%s -i %s -n 3 -k 1 --keep 9 -o %s/ci_run > /dev/null 2>&1",
             dir, dir, trainer, data, dir, trainer, data, dir);
    int rc = run_command(cmd);
    check(rc == 0, "two runs to corrupt and compare (exit %d)", rc);
    snprintf(path, sizeof(path), "%s/ci_run/ckpt_00000003.bin", dir);
    snprintf(bad, sizeof(bad), "%s/ci_flipped.bin", dir);
    uint8_t flip[2];
    FILE* f = fopenCheck(path, "rb");
    long at = CKPT_HEADER_BYTES + 4096;  // (past the statistics: inside the weights)
    fseek(f, at, SEEK_SET);
    if (fread(flip, 1, 2, f) != 2) { vla_fail("reading %s failed", path); }
    fclose(f);
    flip[0] ^= 0x10; flip[1] ^= 0x01;
    corrupt_copy(path, bad, at, flip, 2, -1);
    snprintf(cmd, sizeof(cmd), "cp %s %s", bad, path);
    run_command(cmd);
    char* text;
    snprintf(cmd, sizeof(cmd), "%s -i %s -n 4 -k 1 --keep 9 -y 1 -o %s/ci_run", trainer, data, dir);
    rc = run_capture(dir, cmd, &text);
    char want[1400], full[1200];
    snprintf(want, sizeof(want), "warning: skipping checkpoint %s: checksum mismatch: the file is corrupt", path);
    snprintf(full, sizeof(full), "%s/ci_full/ckpt_00000004.bin", dir);
    snprintf(path, sizeof(path), "%s/ci_run/ckpt_00000004.bin", dir);
    check(rc == 0 && lines_holding(text, want) == 1 && lines_holding(text, "falling back to the one before it") == 1 &&
          lines_holding(text, "resumed from") == 1 && strstr(text, "/ci_run/ckpt_00000002.bin at step 2") != NULL &&
          files_equal(path, full), "-y 1 with two bytes flipped in the newest checkpoint's weights: one line names it "
          "(checksum mismatch) and the run resumes from step 2, ending on the uninterrupted run's step 4 byte for byte "
          "(exit %d)", rc);
    free(text);
    snprintf(args, sizeof(args), "-p tiny -b 2 -t 1 -n 5 -i %s --init %s -o %s/bad_out", data, bad, dir);
    expect_error(dir, "--init of a checkpoint with two bytes flipped", args,
                 "ci_flipped.bin: checksum mismatch: the file is corrupt");
    Checkpoint ck;
    char err[VLA_PATH_MAX + 512];
    rc = checkpoint_read_checked(bad, &ck, err, sizeof(err));
    check(rc == 1 && ck.params == NULL && strstr(err, "checksum mismatch: the file is corrupt") != NULL,
          "the reader the policy library and the trainers share refuses it: %s", err);
    // every checkpoint of the folder corrupt: -y 1 refuses rather than start anew
    snprintf(cmd, sizeof(cmd), "rm -rf %s/ci_all && mkdir -p %s/ci_all && cp %s %s/ci_all/ckpt_00000003.bin", dir,
             dir, bad, dir);
    run_command(cmd);
    snprintf(cmd, sizeof(cmd), "%s -i %s -n 4 -y 1 -o %s/ci_all", trainer, data, dir);
    rc = run_capture(dir, cmd, &text);
    check(rc == 1 && lines_holding(text, "checksum mismatch") == 1 &&
          lines_holding(text, "there is no older one") == 1 &&
          lines_holding(text, "error: no intact checkpoint in") == 1,
          "-y 1 in a folder whose only checkpoint is corrupt: names it, then refuses in one line (exit %d)", rc);
    free(text);

    // a checkpoint from before checksums (flags, crc and the run's record all 0): loads with notes
    snprintf(path, sizeof(path), "%s/ci_full/ckpt_00000002.bin", dir);
    snprintf(bad, sizeof(bad), "%s/ci_old.bin", dir);
    uint8_t zeros[32] = {0};
    corrupt_copy(path, bad, offsetof(CheckpointHeader, flags), zeros, 32, -1);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/ci_old && %s -i %s -n 4 --init %s -o %s/ci_old", dir, trainer, data, bad,
             dir);
    rc = run_capture(dir, cmd, &text);
    snprintf(path, sizeof(path), "%s/ci_old/ckpt_00000004.bin", dir);
    check(rc == 0 && lines_holding(text, "carries no checksum (an older train_vla's): it loaded unverified") == 1 &&
          lines_holding(text, "records no batch size, world size or dataset") == 1 &&
          read_checkpoint_file(path, &ck) && ck.has_crc && ck.run.batch == 2 && ck.run.world == 1 &&
          ck.run.total_batch == 2, "--init of a checkpoint without a checksum: one note each for the checksum and the "
          "run it does not record, and it continues (exit %d); its continuation's checkpoints carry both", rc);
    if (ck.params != NULL) { checkpoint_free(&ck); }
    free(text);

    // another batch: said in one line; the run goes on
    snprintf(path, sizeof(path), "%s/ci_full/ckpt_00000002.bin", dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/ci_b4 && ./train_vla_cpu -p tiny -b 4 -t 1 --workers 1 -i %s -n 3 --init %s "
             "-o %s/ci_b4", dir, data, path, dir);
    rc = run_capture(dir, cmd, &text);
    check(rc == 0 && lines_holding(text, "resuming with -b 4 on 1 rank(s), 4 samples per step (the checkpoint's "
                                         "run: -b 2 on 1, 2): the sampler continues from sample 4; the loss curve's "
                                         "steps change size") == 1,
          "--init with -b 4 of a -b 2 run's checkpoint says so in one line (exit %d)", rc);
    free(text);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/ci_r2 && ./train_vla_cpu -p tiny -b 1 -g 2 -t 1 --workers 1 -i %s -n 3 "
             "--init %s -o %s/ci_r2", dir, data, path, dir);
    rc = run_capture(dir, cmd, &text);
    check(rc == 0 && lines_holding(text, "resuming with -b 1 on 2 rank(s), 2 samples per step (the checkpoint's "
                                         "run: -b 2 on 1, 2)") == 1 &&
          lines_holding(text, "steps keep their size") == 1,
          "--init with -b 1 on 2 ranks: the same samples per step, said in one line (exit %d)", rc);
    free(text);
    // another dataset of the same shapes: refused, unless from its weights alone
    snprintf(other, sizeof(other), "%s/ci_other.bin", dir);
    snprintf(cmd, sizeof(cmd), "./data/synthetic -o %s --cams 1 --img 32 --state 4 --action 4 --episodes 6 --min-len 6 "
             "--max-len 12 --seed 99 > /dev/null", other);
    run_command(cmd);
    snprintf(args, sizeof(args), "-p tiny -b 2 -t 1 -n 3 -i %s --init %s -o %s/bad_out", other, path, dir);
    expect_error(dir, "--init on another dataset", args, "trained on another dataset");
    snprintf(args, sizeof(args), "-p tiny -b 2 -t 1 -n 3 -i %s -y 1 -o %s/ci_full", other, dir);
    snprintf(want, sizeof(want), "start from its weights alone with --init %s/ci_full/ckpt_00000004.bin --weights-only",
             dir);
    expect_error(dir, "-y 1 on another dataset, saying how to start from its weights", args, want);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/ci_wo && %s -i %s -n 2 --init %s --weights-only -o %s/ci_wo > /dev/null 2>&1",
             dir, trainer, other, path, dir);
    rc = run_command(cmd);
    check(rc == 0, "--init --weights-only of it on the other dataset trains (exit %d)", rc);

    // non-finite weights (a checksum that matches: as a diverged run would have written them)
    read_checkpoint_file(path, &ck);
    FlowParamTable t;
    flow_table_build(&ck.config, &t);
    int tensor = -1;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        if (strcmp(t.spec[i].name, "exp_wq") == 0) { tensor = i; }
    }
    ck.params[t.spec[tensor].offset + 5] = NAN;
    snprintf(bad, sizeof(bad), "%s/ci_nan.bin", dir);
    checkpoint_write(bad, &ck);
    snprintf(args, sizeof(args), "-p tiny -b 2 -t 1 -n 3 -i %s --init %s -o %s/bad_out", data, bad, dir);
    snprintf(want, sizeof(want), "weight 5 of exp_wq (%zu elements) is nan: its weights are not finite",
             t.spec[tensor].numel);
    expect_error(dir, "--init of a checkpoint holding a NaN weight names the tensor", args, want);
    // huge but finite weights: the first step's loss is not finite, and the folder holds no checkpoint
    for (size_t k = 0; k < t.spec[tensor].numel; k++) { ck.params[t.spec[tensor].offset + k] = 3e38f; }
    snprintf(bad, sizeof(bad), "%s/ci_huge.bin", dir);
    checkpoint_write(bad, &ck);
    checkpoint_free(&ck);
    snprintf(args, sizeof(args), "-p tiny -b 2 -t 1 --workers 1 -n 3 -k 100 -i %s --init %s -o %s/ci_diverged", data,
             bad, dir);
    snprintf(want, sizeof(want), "%s/ci_diverged holds no checkpoint to continue from", dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/ci_diverged", dir);
    run_command(cmd);
    expect_error(dir, "a loss that is not finite before any checkpoint of the run: says the folder holds none", args,
                 want);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/ci_div2 && mkdir -p %s/ci_div2 && cp %s %s/ci_div2/ckpt_00000002.bin", dir,
             dir, bad, dir);
    run_command(cmd);
    snprintf(args, sizeof(args), "-p tiny -b 2 -t 1 --workers 1 -n 3 -k 100 -i %s -y 1 -o %s/ci_div2", data, dir);
    snprintf(want, sizeof(want), "the last checkpoint in %s/ci_div2 (step 2) is intact, continue with -y 1", dir);
    expect_error(dir, "and in a folder that holds one: names it", args, want);
}

// --max-text and the warning for instructions that read the same once cut: a shard of two tasks whose
// instructions share their first 17 bytes (MT10's window-open and window-close), 8 frames each
static void test_max_text(const char* dir) {
    printf("\n== instructions and --max-text\n");
    enum { FRAMES = 16, IMG = 8 };
    static const char* const tasks[] = {"slide the window open", "slide the window closed"};
    uint8_t* images = (uint8_t*)callocCheck((size_t)FRAMES * IMG * IMG * 3, 1);
    float state[FRAMES * 4], action[FRAMES * 4], stats[16];
    for (int i = 0; i < FRAMES * 4; i++) { state[i] = 0.01f * (float)i; action[i] = 0.02f * (float)(i % 7); }
    for (int i = 0; i < FRAMES * IMG * IMG * 3; i++) { images[i] = (uint8_t)(i * 13); }
    ShardEpisode eps[2] = {{0, 8, 0}, {8, 8, 1}};
    shard_compute_stats(FRAMES, state, 4, action, 4, stats);
    char path[1024], cmd[4096], out[1100];
    snprintf(path, sizeof(path), "%s/window.bin", dir);
    Cameras cams = cameras_square(1, IMG);
    shard_write(path, &cams, 4, 4, FRAMES, images, state, action, 2, eps, 2, tasks, stats);
    free(images);
    Dataset ds;
    dataset_open(&ds, path);
    int cut = dataset_warn_text_collisions(&ds, 16), full = dataset_warn_text_collisions(&ds, 18);
    int prefix = dataset_warn_text_collisions(&ds, 17);  // "slide the window " both: still one text
    check(cut == 1 && prefix == 1 && full == 0, "two instructions equal in their first 17 bytes collide at 16 and 17 "
          "bytes, not at 18 (%d, %d, %d)", cut, prefix, full);
    FlowConfig c = config_for_data("tiny", 18, &ds);
    check(c.max_text == 18 && flow_preset("tiny")->config.max_text == 16, "--max-text 18 overrides the preset's 16");
    // a batch row as LeRobot's tokenizer makes it (padding_side "right", its pad id): the ids, then
    // pad_token, mask 1 on the ids only; cut at max_text
    int pad_ok = 1;
    for (int max_text = 24; max_text >= 16; max_text -= 8) {
        FlowConfig pc = config_for_data("tiny", max_text, &ds);
        pc.pad_token = 7;
        Batch b;
        batch_alloc(&b, &pc, &ds.cams, 1);
        dataset_assemble(&ds, &pc, 0, &b, 0);  // task 0, 21 bytes
        for (int k = 0; k < max_text; k++) {
            int valid = k < 21;
            pad_ok &= b.tokens[k] == (valid ? (int32_t)(uint8_t)tasks[0][k] : 7) &&
                      b.token_mask[k] == (valid ? 1.0f : 0.0f);
        }
        batch_free(&b);
    }
    check(pad_ok, "a batch's text row: the instruction's ids cut to max_text (16, 24), right-padded with pad_token, "
          "mask 1 on the ids");
    dataset_close(&ds);
    // through the binary: the warning names both and the --max-text that separates them
    const char* base = "./train_vla_cpu -p tiny -b 2 -n 1 -u 1 -t 1 --workers 0";
    snprintf(out, sizeof(out), "%s/window_run.txt", dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/window_run && %s -i %s -o %s/window_run > %s 2>&1", dir, base, path, dir,
             out);
    int rc = run_command(cmd);
    char* text = read_text(out);
    check(rc == 0 && strstr(text, "warning: these instructions are the same in their first 16 bytes") != NULL &&
          strstr(text, "\"slide the window open\", \"slide the window closed\"") != NULL &&
          strstr(text, "--max-text 18 keeps every instruction distinct") != NULL,
          "the trainer warns, naming both instructions and --max-text 18");
    free(text);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/window_run && %s --max-text 18 -i %s -o %s/window_run > %s 2>&1", dir, base,
             path, dir, out);
    rc = run_command(cmd);
    text = read_text(out);
    check(rc == 0 && strstr(text, "warning") == NULL && strstr(text, "| max_text               | 18") != NULL,
          "with --max-text 18 it trains without a warning and reads 18 bytes");
    free(text);
    // the checkpoint carries max_text: resuming with another is a one-line error that says so; without
    // the flag, the run's own (run.json) goes on
    snprintf(cmd, sizeof(cmd), "%s -n 2 -y 1 --max-text 16 -i %s -o %s/window_run > %s 2>&1", base, path, dir, out);
    rc = run_command(cmd);
    text = read_text(out);
    check(rc == 1 && strstr(text, "max_text 18 vs 16") != NULL && strstr(text, "--max-text") != NULL,
          "resuming it with --max-text 16 names the field: %s",
          strstr(text, "error:") ? strstr(text, "error:") : text);
    free(text);
    snprintf(cmd, sizeof(cmd), "%s -n 2 -y 1 -i %s -o %s/window_run > %s 2>&1", base, path, dir, out);
    rc = run_command(cmd);
    text = read_text(out);
    check(rc == 0 && strstr(text, "the same in their first") == NULL && strstr(text, "resumed from") != NULL,
          "resuming it without --max-text: run.json's 18 goes on, no warning of instructions read as one (exit %d)",
          rc);
    free(text);

    // 32,000 instructions in 3,200 groups of 10 equal in their first 16 bytes: found by sorting, not
    // pair by pair (which took seconds), and said in 10 lines and a count
    enum { MANY = 32000 };
    char** many = (char**)mallocCheck(MANY * sizeof(char*));
    ShardEpisode* many_eps = (ShardEpisode*)mallocCheck(MANY * sizeof(ShardEpisode));
    float* many_values = (float*)mallocCheck((size_t)MANY * 4 * sizeof(float));
    uint8_t* tiny_images = (uint8_t*)callocCheck((size_t)MANY * 4 * 4 * 3, 1);
    for (int i = 0; i < MANY; i++) {
        many[i] = (char*)mallocCheck(32);
        snprintf(many[i], 32, "task %05d variant %d", i / 10, i);
        ShardEpisode e = {(uint64_t)i, 1, (uint32_t)i};
        many_eps[i] = e;
        for (int d = 0; d < 4; d++) { many_values[(size_t)i * 4 + d] = (float)((i * 7 + d * 13) % 101) / 50.0f; }
    }
    float many_stats[16];
    shard_compute_stats(MANY, many_values, 4, many_values, 4, many_stats);
    Cameras small_cam = cameras_square(1, 4);
    snprintf(path, sizeof(path), "%s/many_tasks.bin", dir);
    shard_write(path, &small_cam, 4, 4, MANY, tiny_images, many_values, many_values, MANY, many_eps, MANY,
                (const char* const*)many, many_stats);
    for (int i = 0; i < MANY; i++) { free(many[i]); }
    free(many); free(many_eps); free(many_values); free(tiny_images);
    dataset_open(&ds, path);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO), devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, STDOUT_FILENO);
    double t0 = wall_seconds();
    int collisions = dataset_warn_text_collisions(&ds, 16);
    double seconds = wall_seconds() - t0;
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved); close(devnull);
    dataset_close(&ds);
    // the bound: pair by pair took 7.5 s; sorted, 0.02 s on a 2-core machine
    check(collisions == 28800 && seconds < 2.0, "32,000 instructions in groups of 10: %d collide with an earlier one "
          "(28,800), found in %.3f s (< 2)", collisions, seconds);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/many_run && %s --no-checkpoint -i %s -o %s/many_run > %s 2>&1", dir, base,
             path, dir, out);
    rc = run_command(cmd);
    text = read_text(out);
    int lines = 0;
    for (const char* p = strstr(text, "warning: "); p != NULL; p = strstr(p + 1, "warning: ")) { lines++; }
    check(rc == 0 && lines == 11 && strstr(text, "\"task 00000 variant 0\", \"task 00000 variant 1\"") != NULL &&
          strstr(text, "warning: and 3190 more groups of instructions the same in their first 16 bytes: 28800 of the "
                 "32000 distinct instructions read as another "
                 "(--max-text 24 keeps every instruction distinct)") != NULL,
          "the trainer says the first 10 groups and how many more, in %d warning lines (11)", lines);
    free(text);
}

static void test_bad_input(const char* dir) {
    printf("\n== bad input\n");
    char src[1024], bad[1024], args[3000];
    snprintf(src, sizeof(src), "%s/a.bin", dir);
    snprintf(bad, sizeof(bad), "%s/bad.bin", dir);
    const char* run = "-p tiny -b 2 -n 1 -t 1";
    uint32_t u32;
    uint64_t u64;
    ShardHeader h;
    FILE* f = fopenCheck(src, "rb");
    if (fread(&h, sizeof(h), 1, f) != 1) { vla_fail("cannot read %s", src); }
    fclose(f);

    u32 = 0x12345678u;
    corrupt_copy(src, bad, offsetof(ShardHeader, magic), &u32, 4, -1);
    snprintf(args, sizeof(args), "%s -i %s -o %s/bad_out", run, bad, dir);
    expect_error(dir, "wrong magic", args, "bad magic");
    u32 = 99;
    corrupt_copy(src, bad, offsetof(ShardHeader, version), &u32, 4, -1);
    expect_error(dir, "wrong version", args, "version 99");
    corrupt_copy(src, bad, 0, NULL, 0, (long)h.file_size - 100);
    expect_error(dir, "truncated shard", args, "truncated");
    corrupt_copy(src, bad, 0, NULL, 0, 100);
    expect_error(dir, "shard shorter than its header", args, "shorter than a shard header");
    u64 = h.n_frames * 2;  // more frames than the file holds, file_size consistent with the length
    corrupt_copy(src, bad, offsetof(ShardHeader, n_frames), &u64, 8, -1);
    expect_error(dir, "sizes that disagree with the file length", args, "does not fit");
    u64 = h.off_stats + 4096;
    corrupt_copy(src, bad, offsetof(ShardHeader, off_stats), &u64, 8, -1);
    expect_error(dir, "section offset past the end", args, "does not fit");
    u32 = 0;
    corrupt_copy(src, bad, offsetof(ShardHeader, n_cam), &u32, 4, -1);
    expect_error(dir, "zero cameras", args, "out of range");
    u32 = 1u << 30;  // an episode pointing at another task
    corrupt_copy(src, bad, (long)h.off_episodes + 12, &u32, 4, -1);
    expect_error(dir, "episode with a task out of range", args, "out of range");
    snprintf(args, sizeof(args), "%s -i %s/does_not_exist.bin", run, dir);
    expect_error(dir, "missing dataset", args, "does_not_exist.bin");
    // one shard twice (by one name, by two names of the file); an image shift past half the frames
    char twice[2200];
    snprintf(args, sizeof(args), "%s -i %s,%s -o %s/bad_out", run, src, src, dir);
    snprintf(twice, sizeof(twice), "-i names the shard %s twice (as %s and as %s): name each shard once", src, src,
             src);
    expect_error(dir, "a shard named twice in -i", args, twice);
    snprintf(args, sizeof(args), "ln -sf a.bin %s/a_again.bin", dir);
    run_command(args);
    snprintf(args, sizeof(args), "%s -i %s,%s/a_again.bin -o %s/bad_out", run, src, dir, dir);
    expect_error(dir, "a shard under a second name (a link) in -i", args, "a_again.bin): name each shard once");
    snprintf(args, sizeof(args), "%s -i %s --augment-shift 1000 -o %s/bad_out", run, src, dir);
    expect_error(dir, "--augment-shift 1000 on 32 px frames", args,
                 "--augment-shift 1000 is past half of camera 0's 32x32 frames in");
    snprintf(args, sizeof(args), "%s -i %s --augment-shift 16 -o %s/bad_out", run, src, dir);
    expect_error(dir, "--augment-shift 16 on 32 px frames", args, "pass at most 15 (or 0, off)");

    // checkpoints: another config, truncated
    char out[1100];
    snprintf(out, sizeof(out), "%s/bad_ckpt", dir);
    snprintf(args, sizeof(args), "rm -rf %s && ./train_vla_cpu -p tiny -b 2 -n 1 -t 1 -i %s -o %s > /dev/null", out,
             src, out);
    run_command(args);
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 2 -t 1 -i %s/b.bin --init %s/ckpt_00000001.bin -o %s/bad_out", dir,
             out, dir);
    expect_error(dir, "checkpoint for another config", args, "written for another model");
    snprintf(bad, sizeof(bad), "%s/ckpt_00000001.bin", out);
    snprintf(src, sizeof(src), "%s/truncated.bin", dir);
    corrupt_copy(bad, src, 0, NULL, 0, 5000);
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 2 -t 1 -i %s/a.bin --init %s -o %s/bad_out", dir, src, dir);
    expect_error(dir, "truncated checkpoint", args, "truncated");

    // flags
    static const struct { const char *what, *flags, *needle; } flag_cases[] = {
        {"unknown long flag", "--frobnicate 3", "unknown option --frobnicate"},
        {"unknown short flag", "-Q", "unknown option -Q"},
        {"-b 0", "-b 0", "--batch 0"},
        {"-b eight", "-b eight", "--batch eight"},
        {"unknown preset", "-p huge", "unknown preset 'huge'"},
        {"flag without its value", "-b", "needs a value"},
        {"-y 1 with --init", "-y 1 --init x.bin", "use one of them"},
        {"negative loader threads", "--workers -1", "--workers -1"},
        {"-d not a multiple of -b x ranks", "-b 3 -g 2 -d 8", "not a multiple of -b 3 x 2"},
        {"unknown --lr-scale", "--lr-scale cubic", "--lr-scale cubic"},
        {"-z 2", "-z 2", "--zero 2"},
        {"--nodes without --master", "--nodes 2 --node-rank 1", "needs --master"},
        {"--node-rank past --nodes", "--nodes 2 --node-rank 2 --master h:1", "node ranks go from 0 to 1"},
        {"several nodes on the CPU trainer", "--nodes 2 --node-rank 0 --master h:1", "runs on one machine"},
        {"--master port 0", "--nodes 2 --node-rank 1 --master h:0", "--master h:0: the port is out of range: pick one"},
        {"--master port 70000", "--nodes 2 --node-rank 1 --master h:70000", "from 1 to 65535"},
        {"--master without a port", "--nodes 2 --node-rank 1 --master h", "--master h: expected host:port"},
        {"--max-text past 1024", "--max-text 5000", "--max-text 5000: expected an integer in [0, 1024]"},
        {"an unknown train mode", "--train everything", "--train everything: use expert, vlm or all"},
        {"an unknown --recompute", "--recompute sometimes", "--recompute sometimes: use none, attn or layer"},
        {"--recompute on the CPU trainer (the reference)", "--recompute layer", "train_vla_cpu keeps every activation"},
        {"--memory on the CPU trainer", "--memory", "--memory prints train_vla's GPU memory"},
        {"the preset of the old model", "-p base",
         "unknown preset 'base': use tiny, small, smolvla, pi0_tiny, pi0_small or pi0"},
    };
    for (size_t k = 0; k < sizeof(flag_cases) / sizeof(flag_cases[0]); k++) {
        snprintf(args, sizeof(args), "-i %s/a.bin %s", dir, flag_cases[k].flags);
        expect_error(dir, flag_cases[k].what, args, flag_cases[k].needle);
    }
    char help[1100];
    snprintf(help, sizeof(help), "./train_vla_cpu -h > %s/help.txt", dir);
    int rc = run_command(help);
    snprintf(help, sizeof(help), "%s/help.txt", dir);
    char* text = read_text(help);
    check(rc == 0 && strstr(text, "--batch") && strstr(text, "--resume") && strstr(text, "--preset"),
          "-h lists the options and exits 0");
    free(text);
}


// The defects that a file or a flag can provoke in the reader (tests/runs/test_hardening.sh
// runs the ones that need a full disk, a kill, a long path or a sanitizer).
static void test_untrusted_files(const char* dir) {
    printf("\n== untrusted files\n");
    char src[1024], bad[1024], args[3000], ck[1024];
    snprintf(src, sizeof(src), "%s/a.bin", dir);
    snprintf(bad, sizeof(bad), "%s/bad.bin", dir);
    const char* run = "-p tiny -b 2 -n 1 -t 1";
    ShardHeader h;
    FILE* f = fopenCheck(src, "rb");
    if (fread(&h, sizeof(h), 1, f) != 1) { vla_fail("cannot read %s", src); }
    fclose(f);

    // shards that disagree in shape: the message names both files (it printed a freed name)
    snprintf(args, sizeof(args), "%s -i %s,%s/b.bin -o %s/bad_out", run, src, dir, dir);
    char needle[2100];
    snprintf(needle, sizeof(needle), "%s/b.bin has cameras/img/state/action 2/24/3/2 but %s has 1/32/4/4", dir, src);
    expect_error(dir, "shards of two shapes name both files", args, needle);

    // non-finite values in the data, and sections at offsets the format does not allow
    float x = NAN;
    corrupt_copy(src, bad, (long)(h.off_state + (3 * h.state_dim + 1) * 4), &x, 4, -1);
    snprintf(args, sizeof(args), "%s -i %s -o %s/bad_out", run, bad, dir);
    expect_error(dir, "NaN in the state", args, "bad.bin: frame 3, state column 1 is NaN");
    x = -INFINITY;
    corrupt_copy(src, bad, (long)(h.off_action + (7 * h.action_dim + 2) * 4), &x, 4, -1);
    expect_error(dir, "-Inf in an action", args, "bad.bin: frame 7, action column 2 is -Inf");

    // statistics that do not describe the frames: refused naming the column, alone or pooled with a good shard
    x = 1e30f;
    corrupt_copy(src, bad, (long)(h.off_stats + 2 * 4), &x, 4, -1);
    expect_error(dir, "a state mean of 1e30", args, "bad.bin: state column 2: the stored mean 1e+30 is");
    x = 1e-5f;
    corrupt_copy(src, bad, (long)(h.off_stats + (2 * h.state_dim + h.action_dim + 1) * 4), &x, 4, -1);
    expect_error(dir, "an action std of 1e-5 on a varying column", args,
                 "bad.bin: action column 1: the stored std 1e-05 is");
    x = 40.0f;  // 55 times the frames' std (0.73)
    corrupt_copy(src, bad, (long)(h.off_stats + (h.state_dim + 3) * 4), &x, 4, -1);
    snprintf(args, sizeof(args), "%s -i %s,%s -o %s/bad_out", run, src, bad, dir);
    expect_error(dir, "a state std 10x too large in the second of two shards", args,
                 "bad.bin: state column 3: the stored std 40 is");
    snprintf(args, sizeof(args), "%s -i %s -o %s/bad_out", run, bad, dir);
    uint64_t u64 = h.off_episodes + 4;
    corrupt_copy(src, bad, offsetof(ShardHeader, off_episodes), &u64, 8, -1);
    expect_error(dir, "an unaligned section offset", args, "section episodes starts at offset");
    Shard shard;
    char err[VLA_PATH_MAX + 512];
    int rc = shard_open_checked(&shard, bad, err, sizeof(err));
    check(rc == 1 && shard.map == NULL && strstr(err, "not a multiple of 64") != NULL,
          "the reader returns the error and keeps nothing mapped: %s", err);
    // offset tables whose ends are right but whose middle points far past the section: every entry
    // is checked before one is used (the token loop read 1e9 ids past its copy)
    check(h.version == 2 && h.n_tasks >= 2, "a.bin is a version-2 shard of several tasks (%u, %llu)", h.version,
          (unsigned long long)h.n_tasks);
    const struct { const char* what; uint64_t at; const char* needle; } tables[] = {
        {"a token offset of 1e9 between right ends", h.off_token_offsets + 8,
         "token offset 1 (1000000000) breaks the table"},
        {"a task offset of 1e9 between right ends", h.off_task_offsets + 8,
         "task offset 1 (1000000000) breaks the table"},
    };
    for (int k = 0; k < 2; k++) {
        u64 = 1000000000ULL;
        corrupt_copy(src, bad, (long)tables[k].at, &u64, 8, -1);
        expect_error(dir, tables[k].what, args, tables[k].needle);
    }

    // safetensors as the format requires: names unique, tensors end to end over the whole data
    // section (overlapping tensors and a name given twice once loaded as other weights)
    static const struct { const char* what; const char* header; size_t data; const char* needle; } st_cases[] = {
        {"two tensors end to end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, NULL},
        {"an empty tensor among them", "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
         "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, NULL},
        {"overlapping data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         "tensor b [4, 8) overlaps tensor a [0, 8): the tensors must lie end to end over the data section"},
        {"a name given twice", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "tensor a is named twice in the header"},
        {"a gap before the first tensor", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         "its first tensor a starts at byte 4, not 0"},
        {"a gap between tensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
         "tensor b [8, 12) leaves a gap after tensor a"},
        {"bytes past the last tensor", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
         "its tensors end at byte 4 of the 8-byte data section"},
        {"a tensor's dtype given twice", "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F64\",\"shape\":[1],"
         "\"data_offsets\":[0,4]}}", 4, "tensor a gives its dtype twice"},
        {"__metadata__ twice", "{\"__metadata__\":{},\"__metadata__\":{},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
         "\"data_offsets\":[0,4]}}", 4, "__metadata__ is given twice"},
        {"__metadata__ as a string", "{\"__metadata__\":\"pt\",\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
         "\"data_offsets\":[0,4]}}", 4, "a malformed __metadata__"},
        {"bytes after the header's object", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}xx", 4,
         "bytes follow the header's JSON object"},
        {"a name holding DEL", "{\"a\x7f\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "a malformed header entry"},
    };
    for (size_t k = 0; k < sizeof(st_cases) / sizeof(st_cases[0]); k++) {
        char st_path[1100];
        snprintf(st_path, sizeof(st_path), "%s/case.safetensors", dir);
        uint64_t hlen = strlen(st_cases[k].header);
        uint8_t zeros[16] = {0};
        FILE* sf = fopenCheck(st_path, "wb");
        fwrite(&hlen, 8, 1, sf);
        fwrite(st_cases[k].header, 1, hlen, sf);
        fwrite(zeros, 1, st_cases[k].data, sf);
        fclose(sf);
        SafeTensors st;
        int st_rc = safetensors_open(&st, st_path, err, sizeof(err));
        if (st_cases[k].needle == NULL) {
            check(st_rc == 0 && st.n >= 2, "safetensors with %s: read (%d tensors)%s%s", st_cases[k].what, st.n,
                  st_rc ? ": " : "", st_rc ? err : "");
            if (st_rc == 0) { safetensors_close(&st); }
        } else {
            check(st_rc == 1 && st.map == NULL && st.tensors == NULL && strstr(err, st_cases[k].needle) != NULL &&
                  strchr(err, '\n') == NULL,
                  "safetensors with %s: refused in one line, nothing kept: %s", st_cases[k].what, err);
        }
    }
    // a name quoted from a file, and a path, as messages show them: escaped, shortened, the reason kept
    char shown[VLA_SAID_BYTES];
    text_escaped("ckpt\nerror: forged\x1b[2J\\", SIZE_MAX, shown, sizeof(shown));
    check(strcmp(shown, "ckpt\\nerror: forged\\x1b[2J\\\\") == 0, "control bytes are quoted escaped: %s", shown);
    text_escaped("abcdefgh", SIZE_MAX, shown, 7);
    check(strcmp(shown, "abc...") == 0, "an escaped text cut to its buffer says so: %s", shown);
    char far[5001];
    memset(far, 'p', 5000);
    far[0] = '/';
    far[5000] = '\0';
    path_said(far, shown);
    check(strlen(shown) < 600 && strncmp(shown, "/ppp", 4) == 0 && strstr(shown, "ppp...ppp") != NULL &&
              strstr(shown, "ppp (a path of 5000 bytes)") != NULL,
          "a path of 5000 bytes is quoted as %zu bytes", strlen(shown));

    // configs: every field bounded, sizes computed in checked 64-bit arithmetic
    FlowConfig c = flow_preset("tiny")->config;
    check(flow_config_problem(&c) == NULL, "the tiny preset is a valid config");
    FlowConfig big = c;
    // vlm_gate alone: 2^42 elements
    big.n_layer = VLA_MAX_LAYER; big.d_ff = VLA_MAX_WIDTH; big.d_model = VLA_MAX_WIDTH;
    const char* problem = flow_config_problem(&big);
    check(problem != NULL && strstr(problem, "the parameter count is past the bound 2^36") != NULL,
          "every field within its bound, the count past 2^36 (%.3g elements in vlm_gate): %s",
          (double)big.n_layer * big.d_ff * big.d_model, problem ? problem : "(accepted)");
    static const struct { size_t offset; int32_t value; const char* needle; } cases[] = {
        {offsetof(FlowConfig, chunk), 5000, "chunk 5000 is past its bound 1024"},
        {offsetof(FlowConfig, max_text), 1 << 30, "max_text 1073741824 is past its bound"},
        {offsetof(FlowConfig, patch), 64, "patch 64 is past its bound 32"},
        {offsetof(FlowConfig, n_head), 70000, "n_head 70000 is past its bound"},
        {offsetof(FlowConfig, n_cam), 17, "n_cam 17 is past its bound 16"},
        {offsetof(FlowConfig, img), 1 << 20, "img 1048576 is past its bound"},
        {offsetof(FlowConfig, n_kv_head), 3, "n_head 4 is not a multiple of n_kv_head 3"},
        {offsetof(FlowConfig, scale_factor), 3, "scale_factor 3 divides"},
        {offsetof(FlowConfig, pad_token), 256, "pad_token 256 is past its bound 255"},
        {offsetof(FlowConfig, head_dim), 0, "head_dim must be positive"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        FlowConfig b = c;
        memcpy((char*)&b + cases[k].offset, &cases[k].value, 4);
        problem = flow_config_problem(&b);
        check(problem != NULL && strstr(problem, cases[k].needle) != NULL, "config field at byte %zu = %d: %s",
              cases[k].offset, cases[k].value, problem ? problem : "(accepted)");
    }
    FlowConfig many = c;
    many.n_cam = 16; many.img = 1024; many.patch = 8;  // 16 x 4096 image tokens
    problem = flow_config_problem(&many);
    check(problem != NULL && strstr(problem, "tokens") != NULL, "too many tokens: %s",
          problem ? problem : "(accepted)");

    // checkpoints: fields that do not change the file's size, a step out of range
    snprintf(ck, sizeof(ck), "%s/bad_ckpt/ckpt_00000001.bin", dir);  // test_bad_input's run wrote it
    struct { long offset; uint64_t value; int bytes; const char* what; const char* needle; } fields[] = {
        {offsetof(CheckpointHeader, config) + offsetof(FlowConfig, chunk), 5000, 4, "chunk 5000",
         "chunk 5000 is past its bound"},
        {offsetof(CheckpointHeader, config) + offsetof(FlowConfig, max_text), 100000, 4, "max_text 100000",
         "max_text 100000 is past its bound"},
        {offsetof(CheckpointHeader, config) + offsetof(FlowConfig, n_layer), 0x7fffffff, 4, "n_layer 2^31 - 1",
         "n_layer 2147483647 is past its bound"},
        {offsetof(CheckpointHeader, config) + offsetof(FlowConfig, d_model), 47, 4, "d_model 47 (another size)",
         "its header implies"},
        {offsetof(CheckpointHeader, train_mode), 7, 4, "train mode 7", "holds train mode 7, not one of 0 (expert)"},
        {offsetof(CheckpointHeader, train_mode), TRAIN_MODE_EXPERT, 4, "another train mode's moment count",
         "its header implies"},
        {offsetof(CheckpointHeader, n_trainable), 5, 8, "a moment count its config does not imply",
         "its header implies"},
        {offsetof(CheckpointHeader, tokenizer), 0, 1, "no tokenizer", "names no tokenizer"},
        {offsetof(CheckpointHeader, tokenizer) + 1, '\n', 1, "a newline in the tokenizer's name",
         "not printable ASCII"},
        {offsetof(CheckpointHeader, step), UINT64_MAX, 8, "step -1 as signed", "says step 18446744073709551615"},
        {offsetof(CheckpointHeader, step), (1ULL << 32) + 1, 8, "step past 32 bits", "says step 4294967297"},
        {offsetof(CheckpointHeader, sampler_pos), 0, 8, "fewer samples than steps", "after 0 samples, out of range"},
        {CKPT_HEADER_BYTES, 0x7fc00000, 4, "a NaN mean in the statistics", "normalization statistic 0 is nan"},
        {CKPT_HEADER_BYTES + 4 * 4, 0, 4, "a zero std in the statistics", "normalization statistic 4 is 0"},
    };
    for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
        corrupt_copy(ck, bad, fields[k].offset, &fields[k].value, (size_t)fields[k].bytes, -1);
        snprintf(args, sizeof(args), "%s -i %s --init %s -n 5 -o %s/bad_out", run, src, bad, dir);
        expect_error(dir, fields[k].what, args, fields[k].needle);
        Checkpoint loaded;
        rc = checkpoint_read_checked(bad, &loaded, err, sizeof(err));
        check(rc == 1 && loaded.params == NULL && loaded.stats == NULL, "  and the reader returns it, holding nothing");
    }
    snprintf(args, sizeof(args), "%s -i %s -y 1 -n 1 -o %s/bad_ckpt", run, src, dir);
    rc = run_command(strcat(strcpy(needle, "./train_vla_cpu "), args));  // step 1 of 1: done, not an error
    check(rc == 0, "a checkpoint at the run's last step: nothing to do, exit %d", rc);
    corrupt_copy(ck, bad, 0, NULL, 0, -1);
    u64 = 7;  // step 7 after 56 samples: a run of -n 7 or more wrote it
    corrupt_copy(ck, bad, offsetof(CheckpointHeader, step), &u64, 8, -1);
    u64 = 56;
    f = fopenCheck(bad, "r+b");
    fseek(f, offsetof(CheckpointHeader, sampler_pos), SEEK_SET);
    fwrite(&u64, 8, 1, f);
    fclose(f);
    checkpoint_reseal(bad);
    snprintf(args, sizeof(args), "%s -i %s --init %s -n 5 -o %s/bad_out", run, src, bad, dir);
    expect_error(dir, "a checkpoint past the run's end", args,
                 "is at step 7, past this run's end (-n 5): pass -n above 7");

    // --init of something that is not a checkpoint file
    snprintf(args, sizeof(args), "%s -i %s --init %s -o %s/bad_out", run, src, dir, dir);
    expect_error(dir, "--init of a folder", args, "is a folder, not a checkpoint file: pass a ckpt_*.bin file");
    snprintf(args, sizeof(args), "%s -i %s --init /dev/zero -o %s/bad_out", run, src, dir);
    expect_error(dir, "--init of a device", args, "/dev/zero is a device, pipe or socket, not a checkpoint file");
    snprintf(args, sizeof(args), "%s -i /dev/zero -o %s/bad_out", run, dir);
    expect_error(dir, "-i of a device", args, "dataset shard /dev/zero is not a regular file");
}

// ----------------------------------------------------------------------------
// shard format version 2 (token ids, cameras of their own sizes) and version 1 read as the same

static void test_shard_versions(const char* dir) {
    printf("\n== shard versions: 1 and 2 read the same, token ids, cameras of their own sizes\n");
    char v2[1024], v1[1024], bad[1024], path[1024], args[3000], cmd[4096], err[VLA_PATH_MAX + 512];
    snprintf(v2, sizeof(v2), "%s/b.bin", dir);  // data/synthetic writes version 2: 2 cameras of 24 px
    snprintf(v1, sizeof(v1), "%s/b_v1.bin", dir);
    Shard s2, s1;
    shard_open(&s2, v2);
    shard_write_v1(v1, &s2);
    shard_open(&s1, v1);
    uint64_t sizes[SHARD_SECTIONS];
    shard_section_sizes(&s2.h, v2, sizes);
    int same = s1.h.n_cam == s2.h.n_cam && s1.h.img == s2.h.img && s1.h.n_tasks == s2.h.n_tasks &&
               s1.h.n_tokens == s2.h.n_tokens && s1.h.vocab == s2.h.vocab &&
               strcmp(s1.h.tokenizer, s2.h.tokenizer) == 0 &&
               memcmp(s1.h.cam_height, s2.h.cam_height, sizeof(s1.h.cam_height)) == 0 &&
               memcmp(s1.h.cam_width, s2.h.cam_width, sizeof(s1.h.cam_width)) == 0 &&
               memcmp(s1.token_offsets, s2.token_offsets, (s2.h.n_tasks + 1) * 8) == 0 &&
               memcmp(s1.tokens, s2.tokens, s2.h.n_tokens * 4) == 0 && memcmp(s1.images, s2.images, sizes[0]) == 0;
    check(s2.h.version == 2 && s1.h.version == 1 && strcmp(s2.h.tokenizer, "bytes") == 0 && s2.h.vocab == 256 && same,
          "a version-1 copy of b.bin reads as the same view: cameras %ux%u, tokenizer \"%s\" (vocabulary %u), %llu "
          "token ids, images", s1.h.cam_height[0], s1.h.cam_width[0], s1.h.tokenizer, s1.h.vocab,
          (unsigned long long)s1.h.n_tokens);
    check(s1.images >= s1.map && s1.images + sizes[0] <= s1.map + s1.map_size && s1.owned_tokens != NULL &&
          s2.owned_tokens == NULL,
          "version 1's frames are read in place from the mapped file (only its tokens are made)");
    shard_close(&s1);
    shard_close(&s2);
    Dataset d1, d2;
    dataset_open(&d1, v1);
    dataset_open(&d2, v2);
    FlowConfig c = config_for_data("tiny", 0, &d2);
    const int B = 4, steps = 6;
    Batch b1, b2;
    batch_alloc(&b1, &c, &d1.cams, B);
    batch_alloc(&b2, &c, &d2.cams, B);
    Sampler s;
    sampler_init(&s, d2.n_samples, 9);
    int batches_same = 1;
    for (int step = 0; step < steps; step++) {
        uint64_t idx[B];
        batch_fill_indices(idx, &s, 0, 0, (uint64_t)step, B, 1, 0);
        batch_fill(&b1, &d1, &c, idx, 9, (uint64_t)step, 0, 2);
        batch_fill(&b2, &d2, &c, idx, 9, (uint64_t)step, 0, 2);
        batches_same &= batches_equal(&b1, &b2, &c);
    }
    check(batches_same,
          "versions 1 and 2 of the same data give identical batches (%d steps of %d, shifted images)", steps, B);
    batch_free(&b1); batch_free(&b2);
    sampler_free(&s);
    dataset_close(&d1); dataset_close(&d2);
    // and identical training through the binary: the losses and the checkpoint
    const char* base = "./train_vla_cpu -p tiny -b 4 -n 3 -k 3 -t 1 --workers 1 --augment-shift 2";
    snprintf(cmd, sizeof(cmd), "rm -rf %s/run_v1 %s/run_v2 && %s -i %s -o %s/run_v1 > /dev/null 2>&1 && "
             "%s -i %s -o %s/run_v2 > /dev/null 2>&1", dir, dir, base, v1, dir, base, v2, dir);
    int rc = run_command(cmd);
    float l1[3] = {0}, l2[3] = {0};
    snprintf(path, sizeof(path), "%s/run_v1/log.jsonl", dir);
    int n1 = read_losses(path, 1, 3, l1);
    snprintf(path, sizeof(path), "%s/run_v2/log.jsonl", dir);
    int n2 = read_losses(path, 1, 3, l2);
    char p1[1100], p2[1100];
    snprintf(p1, sizeof(p1), "%s/run_v1/ckpt_00000003.bin", dir);
    snprintf(p2, sizeof(p2), "%s/run_v2/ckpt_00000003.bin", dir);
    check(rc == 0 && n1 == 3 && n2 == 3 && memcmp(l1, l2, sizeof(l1)) == 0 && files_equal(p1, p2),
          "train_vla_cpu on versions 1 and 2: identical losses (%.6f %.6f %.6f) and identical checkpoints",
          l2[0], l2[1], l2[2]);
    // the shipped data (data/metaworld_mt10.bin.xz) is version 1
    Shard mt10;
    rc = shard_open_checked(&mt10, "data/default/metaworld_mt10_000.bin", err, sizeof(err));
    check(rc == 0 && mt10.h.version == 1 && mt10.h.n_cam == 1 && mt10.h.cam_height[0] == 64 &&
          mt10.h.cam_width[0] == 64 && mt10.h.n_tasks == 10 && mt10.h.n_tokens == mt10.h.task_bytes &&
          strcmp(mt10.h.tokenizer, "bytes") == 0,
          "the shipped MT10 shard (version 1) reads: one 64x64 camera, 10 tasks as byte tokens%s%s", rc ? ": " : "",
          rc ? err : "");
    if (rc == 0) { shard_close(&mt10); }

    // a round trip through the writer: two cameras of different sizes, non-ASCII instructions
    enum { FRAMES = 6 };
    Cameras cams = {2, {16, 8}, {16, 12}};
    size_t frame = cameras_frame_bytes(&cams);
    uint8_t* images = (uint8_t*)mallocCheck(FRAMES * frame);
    for (size_t i = 0; i < FRAMES * frame; i++) { images[i] = (uint8_t)(i * 7 + i / 97); }
    float state[FRAMES * 3], action[FRAMES * 2], stats[10];
    for (int i = 0; i < FRAMES * 3; i++) { state[i] = 0.1f * (float)i; }
    for (int i = 0; i < FRAMES * 2; i++) { action[i] = 0.3f * (float)(i % 5); }
    shard_compute_stats(FRAMES, state, 3, action, 2, stats);
    ShardEpisode eps[2] = {{0, 4, 1}, {4, 2, 0}};
    static const char* const tasks[] = {"Schublade öffnen", "打开抽屉"};
    snprintf(path, sizeof(path), "%s/two_sizes.bin", dir);
    shard_write(path, &cams, 3, 2, FRAMES, images, state, action, 2, eps, 2, tasks, stats);
    Shard t;
    rc = shard_open_checked(&t, path, err, sizeof(err));
    int text_ok = rc == 0, images_ok = rc == 0;
    for (int k = 0; k < 2 && text_ok; k++) {
        uint64_t t0 = t.token_offsets[k], n = t.token_offsets[k + 1] - t0, len = strlen(tasks[k]);
        text_ok = n == len && t.task_offsets[k + 1] - t.task_offsets[k] == len &&
                  memcmp(t.task_text + t.task_offsets[k], tasks[k], len) == 0;
        for (uint64_t j = 0; j < n && text_ok; j++) { text_ok = t.tokens[t0 + j] == (int32_t)(uint8_t)tasks[k][j]; }
    }
    for (int f = 0; f < FRAMES && images_ok; f++) {  // camera by camera, where the helper says they are
        for (int cam = 0; cam < 2; cam++) {
            size_t at = (size_t)f * frame + camera_offset(&cams, cam),
                   bytes = (size_t)cams.height[cam] * cams.width[cam] * 3;
            images_ok &= memcmp(t.images + at, images + at, bytes) == 0;
        }
    }
    check(rc == 0 && t.h.version == 2 && t.h.img == 0 && t.h.cam_height[1] == 8 && t.h.cam_width[1] == 12 &&
          camera_offset(&cams, 1) == 16 * 16 * 3 && frame == 16 * 16 * 3 + 8 * 12 * 3 && images_ok && text_ok &&
          memcmp(t.state, state, sizeof(state)) == 0 && memcmp(t.action, action, sizeof(action)) == 0 &&
          memcmp(t.stats, stats, sizeof(stats)) == 0 && t.episodes[0].task == 1 && t.episodes[1].length == 2,
          "C writer and reader: two cameras of 16x16 and 8x12 read back byte for byte, the instructions' UTF-8 as byte "
          "tokens%s%s", rc ? ": " : "", rc ? err : "");
    if (rc == 0) { shard_close(&t); }
    // the loader and the image shifts lay the batch out by the same helper
    Dataset ds;
    dataset_open(&ds, path);
    FlowConfig any = config_for_data("tiny", 0, &ds);
    Batch plain, shifted;
    batch_alloc(&plain, &any, &ds.cams, FRAMES);
    batch_alloc(&shifted, &any, &ds.cams, FRAMES);
    uint64_t idx[FRAMES] = {0, 1, 2, 3, 4, 5};
    batch_fill(&plain, &ds, &any, idx, 3, 1, 0, 0);
    batch_fill(&shifted, &ds, &any, idx, 3, 1, 0, 2);
    int all_shifted = 1, moved = 0;
    int frames_ok = 1;
    for (int i = 0; i < FRAMES; i++) {
        all_shifted &= batch_cameras_shifted(&plain, &shifted, i, 2, &moved);
        for (int cam = 0; cam < 2; cam++) {
            size_t at = (size_t)i * frame + camera_offset(&cams, cam),
                   bytes = (size_t)cams.height[cam] * cams.width[cam] * 3;
            frames_ok &= memcmp(batch_image(&plain, cam, i), images + at, bytes) == 0;
        }
    }
    check(frames_ok && plain.tokens[0] == (int32_t)(uint8_t)tasks[1][0] &&
          plain.token_mask[11] == 1.0f && plain.token_mask[12] == 0.0f && plain.tokens[12] == 0 &&
          plain.tokens[4 * any.max_text] == 'S' && plain.token_mask[5 * any.max_text - 1] == 1.0f && all_shifted &&
          moved > 0,
          "its batches hold the frames as written, the tokens of each task, and --augment-shift 2 shifts each camera "
          "within its own size (%d of %d moved)", moved, FRAMES * 2);
    batch_free(&plain); batch_free(&shifted);
    dataset_close(&ds);
    free(images);
    // SmolVLA resizes every camera with padding: cameras of their own sizes, square or not, train
    snprintf(cmd, sizeof(cmd), "rm -rf %s/sizes_run && ./train_vla_cpu -p tiny -b 2 -n 2 -t 1 --workers 0 -i %s "
             "-o %s/sizes_run > %s/sizes_run.txt 2>&1", dir, path, dir, dir);
    rc = run_command(cmd);
    snprintf(path, sizeof(path), "%s/sizes_run.txt", dir);
    char* text = read_text(path);
    check(rc == 0 && strstr(text, "| cameras (h x w)        | 16x16, 8x12") != NULL &&
          strstr(text, "step     2/2") != NULL,
          "train_vla_cpu trains on two cameras of 16x16 and 8x12 (exit %d)", rc);
    free(text);
    snprintf(cmd, sizeof(cmd), "./data/synthetic -o %s/square_sizes.bin --cam-size 16x16 --cam-size 8x8 --episodes 2 "
             "--min-len 2 --max-len 3 > /dev/null && rm -rf %s/sizes_run && ./train_vla_cpu -p tiny -b 2 -n 1 -t 1 "
             "--workers 0 -i %s/square_sizes.bin -o %s/sizes_run > /dev/null 2>&1", dir, dir, dir, dir);
    rc = run_command(cmd);
    check(rc == 0, "data/synthetic --cam-size 16x16 --cam-size 8x8 writes cameras of two sizes, and train_vla_cpu "
          "trains on them (exit %d)", rc);

    // corrupt version-2 fields: each a one-line error naming the problem
    ShardHeader h;
    FILE* f = fopenCheck(v2, "rb");
    if (fread(&h, sizeof(h), 1, f) != 1) { vla_fail("cannot read %s", v2); }
    fclose(f);
    snprintf(bad, sizeof(bad), "%s/bad_v2.bin", dir);
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -t 1 -i %s -o %s/bad_out", bad, dir);
    uint32_t u32 = 0;
    corrupt_copy(v2, bad, offsetof(ShardHeader, vocab), &u32, 4, -1);
    expect_error(dir, "vocabulary 0", args, "vocabulary size 0 of tokenizer bytes is outside 1 to 16777216");
    int32_t id = 256;
    corrupt_copy(v2, bad, (long)h.off_tokens + 4, &id, 4, -1);
    expect_error(dir, "a token id past the vocabulary", args, "has token id 256, outside the vocabulary [0, 256)");
    id = -1;
    corrupt_copy(v2, bad, (long)h.off_tokens, &id, 4, -1);
    expect_error(dir, "a negative token id", args, "has token id -1, outside the vocabulary");
    id = 'x';
    corrupt_copy(v2, bad, (long)h.off_tokens, &id, 4, -1);
    expect_error(dir, "byte tokens that are not the text's bytes", args, "are not the bytes of its text");
    char name[64];
    memset(name, 'x', sizeof(name));
    corrupt_copy(v2, bad, offsetof(ShardHeader, tokenizer), name, sizeof(name), -1);
    expect_error(dir, "a tokenizer name without its NUL", args,
                 "the tokenizer name is not NUL-terminated within its 64 bytes");
    u32 = 23;  // camera 0 of 23x24 and img 0: the cameras no longer add up to the images section
    corrupt_copy(v2, bad, offsetof(ShardHeader, cam_height), &u32, 4, -1);
    u32 = 0;
    patch_file(bad, offsetof(ShardHeader, img), &u32, 4);
    char needle[256];
    snprintf(needle, sizeof(needle),
             "the camera sizes (23x24, 24x24, height x width) make %llu frames %llu bytes of images",
             (unsigned long long)h.n_frames, (unsigned long long)h.n_frames * (23 * 24 + 24 * 24) * 3);
    expect_error(dir, "camera sizes that do not add up to the images section", args, needle);
    u32 = 25;
    corrupt_copy(v2, bad, offsetof(ShardHeader, cam_height), &u32, 4, -1);
    expect_error(dir, "img that disagrees with the camera sizes", args,
                 "img 24 disagrees with the camera sizes (25x24, 24x24");
    u32 = 0;
    corrupt_copy(v2, bad, offsetof(ShardHeader, cam_width) + 4, &u32, 4, -1);
    expect_error(dir, "a camera 0 pixels wide", args, "camera 1 is 24x0 pixels (height x width), outside 1 to 4096");
    u32 = 24;
    corrupt_copy(v2, bad, offsetof(ShardHeader, cam_width) + 8, &u32, 4, -1);
    expect_error(dir, "a size for a camera the shard does not have", args,
                 "camera 2 has a size (0x24) but the shard has 2");
    corrupt_copy(v2, bad, 0, NULL, 0, 400);
    expect_error(dir, "a version-2 header cut short", args, "shorter than a version-2 shard header (512)");
    // another tokenizer: the reader takes it, today's model refuses a vocabulary past its 256-row table
    char other[64] = "tokenizer.json:0123456789abcdef";
    corrupt_copy(v2, bad, offsetof(ShardHeader, tokenizer), other, sizeof(other), -1);
    u32 = 49280;
    patch_file(bad, offsetof(ShardHeader, vocab), &u32, 4);
    Dataset big;
    rc = dataset_open_checked(&big, bad, err, sizeof(err));
    check(rc == 0 && big.vocab == 49280 && strcmp(big.tokenizer, other) == 0, "a shard of another tokenizer reads (%s, "
          "vocabulary %u)%s%s", rc == 0 ? big.tokenizer : "-", rc == 0 ? big.vocab : 0, rc ? ": " : "", rc ? err : "");
    if (rc == 0) { dataset_close(&big); }
    expect_error(dir, "a vocabulary past the model's text table", args, "a vocabulary of 49280, but preset tiny's text "
                 "table has 256 rows");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -t 1 -i %s,%s -o %s/bad_out", v2, bad, dir);
    expect_error(dir, "shards of two tokenizers", args,
                 "has the token ids of tokenizer tokenizer.json:0123456789abcdef (vocabulary 49280) but");
}

// ----------------------------------------------------------------------------
// the policy library (libvla.so's C API, compiled in here): a checkpoint answers raw observations
// with the actions the trainer's own sampling gives on the same data

static void test_policy(const char* dir) {
    printf("\n== policy library\n");
    char path[1024], err[VLA_PATH_MAX + 512];
    snprintf(path, sizeof(path), "%s/s.bin", dir);  // two cameras of 24x32 and 20x20, S 3, A 2
    Dataset ds;
    dataset_open(&ds, path);
    FlowConfig c = config_for_data("tiny", 0, &ds);
    FlowVLA m;
    flow_build(&m, &c, TRAIN_MODE_ALL);
    flow_param_init(m.params_memory, &m.table, &c, 21);
    TrainArgs args;
    train_args_defaults(&args);
    char out[1100], cmd[2200];
    snprintf(out, sizeof(out), "%s/policy_ckpt", dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", out);
    run_command(cmd);
    args.output = out; args.train_mode = TRAIN_MODE_EXPERT;
    flow_save(&m, &ds, &args, 5, 40);
    checkpoint_path(path, sizeof(path), args.output, 5);
    VLAPolicy* p = vla_policy_load(path, 0, err, (int)sizeof(err));
    check(p != NULL, "vla_policy_load reads the checkpoint%s%s", p ? "" : ": ", p ? "" : err);
    if (p == NULL) { flow_free(&m); dataset_close(&ds); return; }
    int32_t config[FLOW_CONFIG_STORED + 2];
    vla_policy_config(p, config);
    int i = 0, config_ok = 1;
#define CONFIG_FIELD_(f) if (i < FLOW_CONFIG_STORED) { config_ok &= config[i] == c.f; } i++;
    FLOW_CONFIG_FIELDS(CONFIG_FIELD_)
#undef CONFIG_FIELD_
    config_ok &= config[FLOW_CONFIG_STORED + 1] == c.family;
    check(config_ok && i == 27 && config[26] == TRAIN_MODE_EXPERT && strcmp(vla_policy_tokenizer(p), "bytes") == 0 &&
          strstr(vla_policy_device(p), "CPU") != NULL,
          "vla_policy_config: the config fields, train mode %d and family %d; tokenizer \"%s\"; device \"%s\"",
          config[26], config[27], vla_policy_tokenizer(p), vla_policy_device(p));

    // B observations of the dataset, raw: frames as stored, the instruction's text, the state in data units
    enum { B = 3 };
    const Shard* sh = &ds.shards[0];
    uint64_t frames[B] = {0, 5, 11};
    int H = c.chunk, A = c.action_dim, Amax = c.max_action_dim, S = c.state_dim;
    Batch batch;
    batch_alloc(&batch, &c, &ds.cams, B);
    uint8_t* images[2];
    char* texts[B];
    float state[B * 3];
    int32_t cam_hw[4];
    for (int k = 0; k < 2; k++) {
        images[k] = (uint8_t*)mallocCheck((size_t)B * ds.cams.height[k] * ds.cams.width[k] * 3);
        cam_hw[2 * k] = (int32_t)ds.cams.height[k];
        cam_hw[2 * k + 1] = (int32_t)ds.cams.width[k];
    }
    float* noise = (float*)mallocCheck((size_t)B * H * Amax * sizeof(float));
    for (int b = 0; b < B; b++) {
        dataset_assemble(&ds, &c, frames[b], &batch, b);
        flow_noise_width(H, Amax, 99, 0, (uint64_t)b, &batch.t[b], batch.eps + (size_t)b * H * Amax);
        memcpy(noise + (size_t)b * H * Amax, batch.eps + (size_t)b * H * Amax, (size_t)H * Amax * sizeof(float));
        const uint8_t* frame = sh->images + frames[b] * cameras_frame_bytes(&ds.cams);
        for (int k = 0; k < 2; k++) {
            size_t bytes = (size_t)ds.cams.height[k] * ds.cams.width[k] * 3;
            memcpy(images[k] + b * bytes, frame + camera_offset(&ds.cams, k), bytes);
        }
        uint32_t task = sh->episodes[sh->frame_episode[frames[b]]].task;
        uint64_t len = sh->task_offsets[task + 1] - sh->task_offsets[task];
        texts[b] = (char*)callocCheck(len + 1, 1);
        memcpy(texts[b], sh->task_text + sh->task_offsets[task], len);
        for (int d = 0; d < S; d++) { state[b * S + d] = sh->state[frames[b] * S + d]; }
    }
    size_t n_out = (size_t)B * H * A;
    float* ours = (float*)mallocCheck(n_out * sizeof(float));
    float* want = (float*)mallocCheck(n_out * sizeof(float));
    sample_actions(&FLOW_POLICY, &m, &m.config, &batch, ds.action_mean, ds.action_std, want);
    int rc =
        vla_policy_act(p, B, cam_hw, (const uint8_t* const*)images, (const char* const*)texts, state, noise, 0, ours);
    // the state goes through (x - mean) / std on both sides and the same sampling: equal up to the
    // rounding of a normalization that reads float32 statistics from the checkpoint (the same values)
    double e = rel_error(ours, want, n_out);
    check(rc == 0 && e <= 1e-6, "vla_policy_act on %d raw observations (cameras %dx%d and %dx%d, the shard's text and "
          "state) gives the trainer's 10-step actions, data units: rel err %.2e (tol 1e-6)", B, cam_hw[0], cam_hw[1],
          cam_hw[2], cam_hw[3], e);
    // noise from the seed: deterministic, and as flow_noise_width draws it
    float* again = (float*)mallocCheck(n_out * sizeof(float));
    vla_policy_act(p, B, cam_hw, (const uint8_t* const*)images, (const char* const*)texts, state, NULL, 99, ours);
    vla_policy_act(p, B, cam_hw, (const uint8_t* const*)images, (const char* const*)texts, state, NULL, 99, again);
    double e_seed = rel_error(ours, want, n_out);
    vla_policy_act(p, B, cam_hw, (const uint8_t* const*)images, (const char* const*)texts, state, NULL, 100, again);
    check(e_seed <= 1e-6 && rel_error(again, want, n_out) > 1e-3, "noise NULL draws flow_noise_width(seed): "
          "seed 99 gives the same actions (rel err %.2e), seed 100 others", e_seed);
    // frames of other sizes than the dataset's: resized with padding, the same path
    int32_t other_hw[4] = {40, 30, 17, 64};
    uint8_t* other[2];
    for (int k = 0; k < 2; k++) {
        size_t bytes = (size_t)B * other_hw[2 * k] * other_hw[2 * k + 1] * 3;
        other[k] = (uint8_t*)mallocCheck(bytes);
        for (size_t j = 0; j < bytes; j++) { other[k][j] = (uint8_t)(j * 31 + k); }
    }
    rc = vla_policy_act(p, B, other_hw, (const uint8_t* const*)other, (const char* const*)texts, state, NULL, 1, again);
    int finite = 1;
    for (size_t j = 0; j < n_out; j++) { finite &= isfinite(again[j]); }
    check(rc == 0 && finite, "frames of 40x30 and 17x64 (other sizes than trained on): actions, all finite");
    int32_t bad_hw[4][4] = {{0, 30, 17, 64}, {40, 30, 17, VLA_MAX_IMG + 1}, {1, 4096, 17, 64}, {40, 30, -3, 64}};
    int refused = 1;
    for (int k = 0; k < 4; k++) {
        refused &= vla_policy_act(p, B, bad_hw[k], (const uint8_t* const*)other, (const char* const*)texts, state, NULL,
                                  1, again) == 2;
    }
    check(refused && vla_policy_act(p, 0, cam_hw, (const uint8_t* const*)images, (const char* const*)texts, state,
                                    NULL, 1, again) == 1,
          "refusals: 2 for a camera of 0 rows, past %d, resizing to nothing (1x4096) or negative; 1 for B = 0",
          VLA_MAX_IMG);
    // instructions as token ids: the shard's ids give the strings' actions; bad ids and counts refused
    int32_t ids[3 * 64], n_ids[B], n_all = 0;
    for (int b = 0; b < B; b++) {
        uint32_t task = sh->episodes[sh->frame_episode[frames[b]]].task;
        uint64_t t0 = sh->token_offsets[task], n = sh->token_offsets[task + 1] - t0;
        n_ids[b] = (int32_t)n;
        for (uint64_t k = 0; k < n && n_all < 3 * 64; k++) { ids[n_all++] = sh->tokens[t0 + k]; }
    }
    rc = vla_policy_act_tokens(p, B, cam_hw, (const uint8_t* const*)images, ids, n_ids, state, noise, 0, again);
    vla_policy_act(p, B, cam_hw, (const uint8_t* const*)images, (const char* const*)texts, state, noise, 0, ours);
    check(rc == POLICY_OK && memcmp(ours, again, n_out * sizeof(float)) == 0, "vla_policy_act_tokens with the shard's "
          "token ids gives vla_policy_act's actions on the strings, bit for bit");
    int32_t saved = ids[0];
    ids[0] = c.vocab;
    int bad_id = vla_policy_act_tokens(p, B, cam_hw, (const uint8_t* const*)images, ids, n_ids, state, noise, 0, again);
    ids[0] = saved;
    int32_t count1 = n_ids[1];
    n_ids[1] = -1;
    int bad_count =
        vla_policy_act_tokens(p, B, cam_hw, (const uint8_t* const*)images, ids, n_ids, state, noise, 0, again);
    n_ids[1] = count1;
    check(bad_id == POLICY_BAD_TOKENS && bad_count == POLICY_BAD_TOKENS,
          "refusals: %d for an id equal to the vocabulary, %d for a negative count", bad_id, bad_count);
    vla_policy_free(p);
    // a checkpoint trained on a tokenizer.json's ids: strings are refused, ids act
    Checkpoint ck;
    checkpoint_read_checked(path, &ck, err, sizeof(err));
    snprintf(ck.tokenizer, sizeof(ck.tokenizer), "tokenizer.json:0123456789abcdef");
    char renamed[1100];
    snprintf(renamed, sizeof(renamed), "%s/policy_tokenizer_json.bin", dir);
    checkpoint_write(renamed, &ck);
    checkpoint_free(&ck);
    p = vla_policy_load(renamed, 0, err, (int)sizeof(err));
    int strings = p ? vla_policy_act(p, B, cam_hw, (const uint8_t* const*)images, (const char* const*)texts, state,
                                     noise, 0, again) : -1;
    int tokens = p ? vla_policy_act_tokens(p, B, cam_hw, (const uint8_t* const*)images, ids, n_ids, state, noise,
                                           0, again) : -1;
    check(p != NULL && strings == POLICY_NOT_BYTES && tokens == POLICY_OK &&
          memcmp(ours, again, n_out * sizeof(float)) == 0,
          "a checkpoint of tokenizer %s: vla_policy_act refuses strings (%d), not silent byte ids; its ids act (%d)",
          p ? vla_policy_tokenizer(p) : "?", strings, tokens);
    vla_policy_free(p);
    // a checkpoint it cannot use: NULL and the reason
    char bad[1100];
    snprintf(bad, sizeof(bad), "%s/policy_truncated.bin", dir);
    corrupt_copy(path, bad, 0, NULL, 0, 2000);
    p = vla_policy_load(bad, 0, err, (int)sizeof(err));
    check(p == NULL && strstr(err, "truncated") != NULL, "a truncated checkpoint: NULL and '%s'", err);
    for (int k = 0; k < 2; k++) { free(images[k]); free(other[k]); }
    for (int b = 0; b < B; b++) { free(texts[b]); }
    free(noise); free(ours); free(want); free(again);
    batch_free(&batch);
    flow_free(&m);
    dataset_close(&ds);
}

int main(int argc, char** argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s FIXTURE_DIR [LEROBOT_REF_DIR [LEROBOT_PI0_REF_DIR]]   (make test writes them and "
                "runs this; the second adds the SmolVLA checks against LeRobot, the third pi0's)\n", argv[0]);
        return 2;
    }
    const char* dir = argv[1];
    test_gemm_tiles();
    test_param_table();
    test_smolvla_oracle(dir);
    if (argc >= 3) { test_smolvla_lerobot("SmolVLA", argv[2]); }
    if (argc == 4) { test_smolvla_lerobot("pi0", argv[3]); }
    test_training_loop(dir);
    test_decay_on(dir);
    test_simulated_ranks(dir, "tiny");
    test_simulated_ranks(dir, "pi0_tiny");
    test_world_args();
    test_logger_eta(dir);
    test_zero(dir, "tiny");
    test_zero(dir, "pi0_tiny");
    test_bootstrap(dir);
    test_sampler();
    test_loader(dir);
    test_balance(dir);
    test_checkpoints(dir);
    test_checkpoint_integrity(dir);
    test_weights_only(dir);
    test_max_text(dir);
    test_bad_input(dir);
    test_untrusted_files(dir);
    test_shard_versions(dir);
    test_policy(dir);
    printf("\n%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
