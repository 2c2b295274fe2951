/*
test_vla_gpu.cu: checks train_vla.cu (SmolVLA) against LeRobot's own references, against the
PyTorch oracle (dev/model.py) and against the CPU trainer. Includes the production code, so what
is tested is what runs.

  ./test_vla_gpu FIXTURE_DIR TRAINER [TRAINER_WITHOUT_NCCL] [--smolvla LEROBOT_REF_DIR] [--pi0 LEROBOT_PI0_REF_DIR]
  e.g. ./test_vla_gpu build/test ./train_vla build/gpu/train_vla_single_gpu_bf16 --smolvla build/lerobot_ref
       --pi0 build/lerobot_ref_pi0

TRAINER is the train_vla binary of the same precision as this test. make test builds and runs
it in fp32 and bf16, and in fp16 the groups oracle:all and fp16 (its loss scaling): on the GPU
when one is present, otherwise under the CPU emulation of CUDA in dev/cuda/emu (same source, same
checks; CUDA_EMU_DEVICES=4 gives it four GPUs).

With --smolvla: the model against LeRobot 0.6.1's own references (dev/lerobot), per training mode
(expert, vlm, all): prepared images, velocities, loss, every trainable gradient by LeRobot's name,
none for the frozen tensors, the 10-step sampled chunk. Per oracle debug state (s_<mode>_state.bin,
dev/model.py --debug-state per training mode): the same from its config, parameters and batch,
and 10 AdamW steps on the trainable elements alone. Then through the binary: 5 training steps on
shard data against the oracle's (a_train.txt), determinism, gradient accumulation, world sizes 1,
2 and 4 (plain and ZeRO-1, every train mode) against one GPU with the same global batch, their
checkpoints continued on other world sizes, the NCCL build at -g 1 against the build without
NCCL, injected NCCL faults, bit-exact resume, checkpoints continued by train_vla_cpu and back,
bad input, activation recomputation (bit-identical to none in every train mode). Tolerances are
stated where they are defined.
*/
#define TESTING
#include "train_vla.cu"
#include "vla/rng.h"
#include "vla/safetensors.h"
#include "tests/util/test_util.h"

// Runs of the trainer binary against each other (the same model, data, noise and schedule; only
// the order of summation differs, over ranks and micro-steps): fp32 rounding of sums in another
// order is about 1e-7 per step and grows over a few steps to 1e-6 (measured: 1e-7 to 9e-7 in
// both precisions, the master weights and moments being fp32 either way), so 1e-4 in fp32. In
// bf16 a different last bit of a master weight can flip the rounding of its bf16 copy, which moves
// the next loss by up to u = 3.9e-3 of that weight's share: 1e-3. Against the CPU trainer (fp32)
// a bf16 build is a bf16 forward against an fp32 one: the forward's tolerance of the SmolVLA checks
// below (FLOW_TOL_FWD; measured 1.5e-4), as against the float64 oracle (5 steps on shard data).
// In fp16 the same argument at its unit roundoff u = 2^-11 = 4.9e-4, 8x finer than bf16's: 1.25e-4.
#if defined(ENABLE_FP32)
static const double TOL_RUNS = 1e-4;
#elif defined(ENABLE_FP16)
static const double TOL_RUNS = 1.25e-4;
#else
static const double TOL_RUNS = 1e-3;
#endif

static const char* TRAINER = "./train_vla";

// One optimizer step (0-based `step`) of one rank alone over micro-batches in[0 .. n_micro-1]: the
// calls train_rank makes, without the uploads and NCCL. Nothing waits: flow_read_scalars does.
static void flow_train_step(FlowVLA* m, const ModelInputs* in, int n_micro, int step, const TrainArgs* args) {
    for (int micro = 0; micro < n_micro; micro++) {
        flow_forward(m, &in[micro], micro);
        flow_backward(m, micro == 0);
    }
    flow_grads_finish(m, 0);
    flow_update(m, lr_at_step(args, step), args->weight_decay, args->decay_on, args->grad_clip, step);
}

// n bytes of host memory in a fresh device allocation (freed with cudaFree)
static void* upload(const void* host, size_t bytes) {
    void* d;
    cudaCheck(cudaMalloc(&d, bytes > 0 ? bytes : 1));
    cudaCheck(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

// ----------------------------------------------------------------------------
// SmolVLA against LeRobot 0.6.1 itself (dev/lerobot's references, --smolvla REF_DIR): per
// training mode's case folder (expert, vlm, all), the config dev/smolvla.py --c-config wrote
// (CASE/c_config.txt), LeRobot's weights loaded by name, LeRobot's batch on the device (raw uint8
// frames of three sizes, token ids, normalized state and actions, noise, time) through the
// SmolVLA section of train_vla.cu: the prepared images, v_t, the loss, every trainable tensor's
// gradient per layer slice by LeRobot's name, no gradient for the frozen ones, and the 10-step
// sampled chunk from sample_noise.

// Tolerances against LeRobot's float32 (the references are fp32; the oracle's float32 run meets
// them to 1e-5, so the precision of this build is what the tolerance measures):
// - FP32: 1e-4 per tensor; fp32 rounding alone gives about 1e-6.
// - BF16: u = 2^-8 per stored value, u / sqrt(3) = 2.3e-3 rms (round to nearest), independent
//   from stage to stage, so k rounded stages leave about sqrt(k) u / sqrt(3), like a random
//   walk. The prepared images are one rounding: 1e-2. SmolVLA's deepest forward path has
//   about 100 stages (the tiny case's 2 SigLIP layers of 8, patch and position embedding, post
//   norm, connector, prefix; 4 VLM and 4 expert layers of 9-10; the cross re-projection, the time
//   MLP, the final norm and the head): sqrt(100) u / sqrt(3) = 2.3e-2, so v_t, the loss and the
//   sampled chunk pass at 5e-2, twice that. Gradients run the backward on top (about 3x the
//   stages, products of two rounded factors, P and dS rounded to bf16 inside attention): 5.7x the
//   forward's estimate, measured on the model train_vla trained before, 5.7 x 2.3e-2 = 1.3e-1. The vision key bias's
//   gradient, exactly zero in exact arithmetic, is bf16 rounding of dS summed over a row: measured
//   against the q_proj.bias gradient it is of the order of u, so 2u = 7.8e-3 in bf16 builds.
// - FP16: the same stages, each rounded to fp16's 10 fraction bits: u = 2^-11 = 4.9e-4, 8x finer
//   than bf16's 2^-8, so every bf16 tolerance divided by 8 (images 1.25e-3, forward 6.25e-3,
//   gradients 1.6e-2, the zero gradient 2u = 9.8e-4). Dynamic loss scaling rounds nothing more:
//   the gradients are scaled and unscaled by powers of two (loss_scale_begin_kernel), and the
//   scale keeps them inside fp16's range, where its rounding is relative (no subnormals).
#if defined(ENABLE_FP32)
static const double FLOW_TOL_IMAGES = 1e-4, FLOW_TOL_FWD = 1e-4, FLOW_TOL_GRAD = 1e-4, FLOW_TOL_ZERO = 1e-4;
#elif defined(ENABLE_FP16)
static const double FLOW_TOL_IMAGES = 1.25e-3, FLOW_TOL_FWD = 6.25e-3, FLOW_TOL_GRAD = 1.6e-2, FLOW_TOL_ZERO = 9.8e-4;
#else
static const double FLOW_TOL_IMAGES = 1e-2, FLOW_TOL_FWD = 5e-2, FLOW_TOL_GRAD = 1.3e-1, FLOW_TOL_ZERO = 7.8e-3;
#endif

// fp16 builds: the loss scale the SmolVLA checks run at. A training run starts at --loss-scale
// (65536) and skips its way down to what the model holds (the tiny models' backward overflows fp16
// at 65536 times their per-sample gradient, which training would skip and halve: the fp16 group);
// a single forward and backward compared with a reference cannot skip, so it starts where it fits.
static void set_test_loss_scale(FlowVLA* m) {
    LossScaleState st = {1024.0f, 0, 0};
    flow_set_loss_scale(m, &st, VLA_LOSS_SCALE_WINDOW_DEFAULT);
}

static void test_smolvla_case(const char* family, const char* ref_dir, int mode) {
    const char* name = TRAIN_MODE_NAMES[mode];
    char path[1200], err[512];
    double t0 = wall_seconds();
    printf("\n== %s vs LeRobot 0.6.1 (%s): %s/%s (train mode %s)\n", family, PRECISION_NAME, ref_dir, name, name);
    FlowConfig c;
    snprintf(path, sizeof(path), "%s/%s/c_config.txt", ref_dir, name);
    int rc = flow_config_read(path, &c, err, sizeof(err));
    check(rc == 0, "%s: config from %s%s%s", name, path, rc ? ": " : "", rc ? err : "");
    if (rc != 0) { return; }
    FlowParamTable table;
    flow_table_build(&c, &table);
    float* params = (float*)mallocCheck(table.total * sizeof(float));
    SafeTensors weights, ref;
    snprintf(path, sizeof(path), "%s/%s/policy/model.safetensors", ref_dir, name);
    rc = safetensors_open(&weights, path, err, sizeof(err)) ||
         flow_load_safetensors(&weights, &c, &table, params, err, sizeof(err));
    check(rc == 0, "%s: LeRobot's weights load by name from %s%s%s", name, path, rc ? ": " : "", rc ? err : "");
    safetensors_close(&weights);
    snprintf(path, sizeof(path), "%s/%s/ref.safetensors", ref_dir, name);
    int rc_ref = safetensors_open(&ref, path, err, sizeof(err));
    check(rc_ref == 0, "%s: reference batch %s%s%s", name, path, rc_ref ? ": " : "", rc_ref ? err : "");
    snprintf(path, sizeof(path), "%s/%s/case.json", ref_dir, name);
    char* info = rc_ref == 0 ? read_text(path) : NULL;
    if (rc != 0 || rc_ref != 0 || info == NULL) {
        free(params);
        free(info);
        if (rc_ref == 0) { safetensors_close(&ref); }
        return;
    }
    FlowVLA m;
    flow_build(&m, &c, mode);
    flow_set_params(&m, params);
    set_test_loss_scale(&m);
    free(params);

    // the batch as LeRobot's pre-processor left it (raw frames, token ids, normalized state and
    // actions), each in its own device allocation
    char cams[VLA_MAX_CAM][64];
    int n_cams = json_strings(info, "camera_order", cams, VLA_MAX_CAM);
    int B = (int)json_int(info, "batch_size"), H = c.chunk, Am = c.max_action_dim;
    free(info);
    size_t n_act = (size_t)B * H * Am;
    ModelInputs in;
    memset(&in, 0, sizeof(in));
    in.B = B;
    int have = n_cams == c.n_cam && B > 0;
    for (int k = 0; k < n_cams && have; k++) {
        char key[128];
        snprintf(key, sizeof(key), "images_u8.%s", cams[k]);
        const SafeTensorInfo* t = safetensors_find(&ref, key);
        have = t != NULL && t->dtype == ST_U8 && t->ndim == 4 && t->shape[0] == B && t->shape[3] == 3;
        if (!have) { break; }
        in.frames[k] = (const uint8_t*)upload(ref.data + t->begin, t->numel);
        in.frame_h[k] = (int)t->shape[1];
        in.frame_w[k] = (int)t->shape[2];
    }
    int32_t* tokens = ref_ints(&ref, "lang_tokens", (size_t)B * c.max_text);
    float* token_mask = ref_tensor(&ref, "lang_masks", (size_t)B * c.max_text);
    float* state = ref_tensor(&ref, "state_norm", (size_t)B * c.max_state_dim);
    float* actions = ref_tensor(&ref, "actions_norm", n_act);
    float* action_is_pad = ref_tensor(&ref, "action_is_pad", (size_t)B * H);
    float* t = ref_tensor(&ref, "time", (size_t)B);
    float* noise = ref_tensor(&ref, "noise", n_act);
    float* sample_noise = ref_tensor(&ref, "sample_noise", n_act);
    float* ref_v = ref_tensor(&ref, "v_t", n_act);
    float* ref_loss = ref_tensor(&ref, "loss", 1);
    float* ref_chunk = ref_tensor(&ref, "chunk_norm", n_act);
    have = have && tokens && token_mask && state && actions && action_is_pad && t && noise && sample_noise && ref_v &&
           ref_loss && ref_chunk;
    check(have, "%s: the batch (%d cameras, B %d, %d tokens) is in the reference file with the config's shapes", name,
          n_cams, B, c.max_text);
    float* d_sample_noise = NULL;
    if (have) {
        in.tokens = (const int32_t*)upload(tokens, (size_t)B * c.max_text * sizeof(int32_t));
        in.token_mask = (const float*)upload(token_mask, (size_t)B * c.max_text * sizeof(float));
        in.state = (const float*)upload(state, (size_t)B * c.max_state_dim * sizeof(float));
        in.actions = (const float*)upload(actions, n_act * sizeof(float));
        in.action_is_pad = (const float*)upload(action_is_pad, (size_t)B * H * sizeof(float));
        in.t = (const float*)upload(t, B * sizeof(float));
        in.noise = (const float*)upload(noise, n_act * sizeof(float));
        d_sample_noise = (float*)upload(sample_noise, n_act * sizeof(float));

        // forward and backward, as one training micro-step
        double t_step = wall_seconds();
        flow_forward(&m, &in, 0);
        flow_backward(&m, 1);
        flow_grads_finish(&m, 0);
        float loss;
        flow_read_scalars(&m, &loss, NULL);
        t_step = wall_seconds() - t_step;

        // the prepared images (camera-major: camera k's B images in a row), v_t, the loss
        size_t per_cam = (size_t)B * 3 * c.img * c.img;
        for (int k = 0; k < n_cams; k++) {
            char key[128];
            snprintf(key, sizeof(key), "images_prepped.%s", cams[k]);
            float* prepped = ref_tensor(&ref, key, per_cam);
            float* ours = from_device_x(m.acts.pixels + k * per_cam, per_cam);
            double e = prepped != NULL ? rel_error(ours, prepped, per_cam) : INFINITY;
            check(e <= FLOW_TOL_IMAGES, "%s: %s (%dx%d frames resized with padding to %d) rel err %.2e (tol %.0e)",
                  name, key, in.frame_h[k], in.frame_w[k], c.img, e, FLOW_TOL_IMAGES);
            free(prepped);
            free(ours);
        }
        float* v = (float*)mallocCheck(n_act * sizeof(float));
        cudaCheck(cudaMemcpy(v, m.acts.v_t, n_act * sizeof(float), cudaMemcpyDeviceToHost));
        double ev = rel_error(v, ref_v, n_act), el = rel_error(&loss, ref_loss, 1);
        check(ev <= FLOW_TOL_FWD, "%s: v_t rel err %.2e (tol %.0e)", name, ev, FLOW_TOL_FWD);
        check(el <= FLOW_TOL_FWD, "%s: loss %.7f vs LeRobot %.7f rel err %.2e (tol %.0e)", name, loss, ref_loss[0], el,
              FLOW_TOL_FWD);
        free(v);

        // gradients: every slice that trains in this mode against grad.<LeRobot name>, worst per
        // tower; a frozen slice has no gradient memory here, and LeRobot has no gradient for it
        float* grads = (float*)mallocCheck(m.n_train * sizeof(float));
        cudaCheck(cudaMemcpy(grads, m.grads_memory, m.n_train * sizeof(float), cudaMemcpyDeviceToHost));
        const char* tower_names[3] = {"vision", "vlm", "expert"};
        double worst[3] = {0.0, 0.0, 0.0};
        char worst_name[3][256] = {"", "", ""};
        int n_trained[3] = {0, 0, 0}, n_frozen = 0, n_ref_grads = 0, frozen_ok = 1;
        size_t trainable = 0;
        for (int i = 0; i < ref.n; i++) { n_ref_grads += strncmp(ref.tensors[i].name, "grad.", 5) == 0; }
        for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
            const FlowParamSpec* s = &m.table.spec[i];
            size_t n_slices = flow_slices(s), per = flow_slice_numel(s);
            trainable += flow_trainable_numel(s, mode);
            for (size_t k = 0; k < n_slices; k++) {
                char lname[256], key[300];
                if (s->slices == SLICES_NONE) { snprintf(lname, sizeof(lname), "%s", s->lerobot); }
                else { snprintf(lname, sizeof(lname), s->lerobot, flow_slice_layer(&c, s, (int)k)); }
                snprintf(key, sizeof(key), "grad.%s", lname);
                float* ref_g = ref_tensor(&ref, key, per);
                if (flow_grad(&m, i, (int)k) == NULL) {
                    n_frozen++;
                    if (ref_g != NULL) {
                        frozen_ok = 0;
                        check(0, "%s: %s is frozen here, but LeRobot has a gradient for it", name, lname);
                    }
                    free(ref_g);
                    continue;
                }
                n_trained[s->tower]++;
                const float* ours = grads + m.domain.offset[i] + k * per;
                double e;
                if (ref_g == NULL) {
                    e = INFINITY;
                } else if (s->tower == TOWER_VISION && strstr(lname, "self_attn.k_proj.bias") != NULL) {
                    // Zero in exact arithmetic: adding b to every key adds q.b to every score of a
                    // query's row, which softmax ignores (SigLIP has no mask). LeRobot's value and
                    // ours are rounding noise, so both are measured against the same layer's
                    // q_proj.bias gradient (tests/model/test_smolvla.py does the same).
                    char qkey[300];
                    snprintf(qkey, sizeof(qkey), "%s", key);
                    memcpy(strstr(qkey, "k_proj.bias"), "q", 1);
                    float* ref_q = ref_tensor(&ref, qkey, per);
                    double scale = ref_q != NULL ? norm2(ref_q, per) : 0.0;
                    double e_ours = norm2(ours, per) / scale, e_ref = norm2(ref_g, per) / scale;
                    check(e_ours <= FLOW_TOL_ZERO && e_ref <= 1e-5,
                          "%s: %s is zero by symmetry: |ours| %.1e, |LeRobot| %.1e of |grad q_proj.bias| "
                          "(tol %.1e, LeRobot's 1e-5)", name, key, e_ours, e_ref, FLOW_TOL_ZERO);
                    e = 0.0;
                    free(ref_q);
                } else {
                    e = rel_error(ours, ref_g, per);
                }
                if (!(e <= FLOW_TOL_GRAD)) {
                    check(0, "%s: %s rel err %.2e (tol %.1e)%s", name, key, e, FLOW_TOL_GRAD,
                          ref_g == NULL ? ": LeRobot has none" : "");
                }
                if (!(e <= worst[s->tower])) {
                    worst[s->tower] = e;
                    snprintf(worst_name[s->tower], sizeof(worst_name[s->tower]), "%s", lname);
                }
                free(ref_g);
            }
        }
        for (int tw = 0; tw < 3; tw++) {
            if (n_trained[tw] == 0) { continue; }
            check(worst[tw] <= FLOW_TOL_GRAD, "%s: %s gradients, %d tensors: worst rel err %.2e (%s) (tol %.1e)", name,
                  tower_names[tw], n_trained[tw], worst[tw], worst_name[tw], FLOW_TOL_GRAD);
        }
        int trained = n_trained[0] + n_trained[1] + n_trained[2];
        check(frozen_ok && trained == n_ref_grads && trainable == flow_trainable_count(&m.table, mode),
              "%s: LeRobot's %d gradients are the %d tensors trained here (%zu values); the %d frozen have none", name,
              n_ref_grads, trained, trainable, n_frozen);

        // a second step on the same batch gives the same bits (no atomics, fixed reduction orders)
        flow_forward(&m, &in, 0);
        flow_backward(&m, 1);
        flow_grads_finish(&m, 0);
        float loss2;
        flow_read_scalars(&m, &loss2, NULL);
        float* grads2 = (float*)mallocCheck(m.n_train * sizeof(float));
        cudaCheck(cudaMemcpy(grads2, m.grads_memory, m.n_train * sizeof(float), cudaMemcpyDeviceToHost));
        check(memcmp(&loss, &loss2, sizeof(loss)) == 0 && memcmp(grads, grads2, m.n_train * sizeof(float)) == 0,
              "%s: a second forward and backward: the same loss and gradients, bit for bit", name);
        free(grads);
        free(grads2);

        // sampling: 10 Euler steps from sample_noise, the prefix computed once
        float* chunk = (float*)mallocCheck(n_act * sizeof(float));
        double t_sample = wall_seconds();
        flow_sample(&m, &in, d_sample_noise, chunk);
        t_sample = wall_seconds() - t_sample;
        double ec = rel_error(chunk, ref_chunk, n_act);
        check(ec <= FLOW_TOL_FWD, "%s: chunk_norm (10 Euler steps) rel err %.2e (tol %.0e)", name, ec, FLOW_TOL_FWD);
        free(chunk);
        printf("        (%s: forward and backward %.0f ms, sampling %.0f ms, %.1f s in all)\n", name, 1000.0 * t_step,
               1000.0 * t_sample, wall_seconds() - t0);
    }
    for (int k = 0; k < n_cams; k++) { cudaCheck(cudaFree((void*)in.frames[k])); }
    cudaCheck(cudaFree((void*)in.tokens)); cudaCheck(cudaFree((void*)in.token_mask));
    cudaCheck(cudaFree((void*)in.state)); cudaCheck(cudaFree((void*)in.actions));
    cudaCheck(cudaFree((void*)in.action_is_pad)); cudaCheck(cudaFree((void*)in.t));
    cudaCheck(cudaFree((void*)in.noise)); cudaCheck(cudaFree(d_sample_noise));
    free(tokens); free(token_mask); free(state); free(actions); free(action_is_pad); free(t); free(noise);
    free(sample_noise); free(ref_v); free(ref_loss); free(ref_chunk);
    safetensors_close(&ref);
    flow_free(&m);
}

static int wanted_mode(const char* group, int mode);

// SmolVLA's references (--smolvla) or pi0's (--pi0, dev/lerobot/make_ref.py --family pi0): the same checks
static void test_smolvla_lerobot(const char* family, const char* ref_dir) {
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        if (wanted_mode("lerobot", mode)) { test_smolvla_case(family, ref_dir, mode); }
    }
}

// ----------------------------------------------------------------------------
// SmolVLA against its own oracle (dev/model.py --debug-state, one file per training mode:
// FIXTURE_DIR/s_<mode>_state.bin, checked when present): the oracle's config, parameters and batch
// (frames of two stored sizes, tokens, state, actions, pads, t, eps) through the SmolVLA section:
// velocities, loss, every trainable gradient slice, the 10-step sample from eps, then 10 AdamW
// steps on the same batch (the loss and gradient norm of each), the optimizer state allocated for
// the trainable elements alone, and the frozen elements unmoved by the steps. Tolerances: the
// FLOW_TOL_* above (the oracle is float64, so the margin only grows); the losses of the steps as
// the forward, their gradient norms as the gradients.

// A record of a debug state, NULL when it has none of that name
static const Record* debug_lookup(const DebugState* st, const char* name) {
    for (int i = 0; i < st->n; i++) {
        if (strcmp(st->recs[i].name, name) == 0) { return &st->recs[i]; }
    }
    return NULL;
}

static int wanted(const char* group);

// A device array's bytes, on the host (freed by the caller)
static void* download(const void* d, size_t bytes) {
    void* h = mallocCheck(bytes > 0 ? bytes : 1);
    cudaCheck(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

// fp16 builds: an Inf injected into the gradients after the backward. The step is skipped: the
// compute copy, the master weights and both moments keep every bit; the skip is counted, the scale
// halved, the clean steps reset. The next step trains again: finite loss and norm, weights moving,
// the scale kept and one clean step counted.
static void check_fp16_skip(FlowVLA* m, const ModelInputs* in, const TrainArgs* args) {
    LossScaleState st = {1024.0f, 5, 0};
    flow_set_loss_scale(m, &st, 2000);
    size_t shard = m->shard_hi - m->shard_lo;
    void* p0 = download(m->params_memory, m->n_params * sizeof(floatX));
    void* w0 = download(m->master, shard * sizeof(float));
    void* m0 = download(m->m_memory, shard * sizeof(float));
    void* v0 = download(m->v_memory, shard * sizeof(float));
    flow_forward(m, in, 0);
    flow_backward(m, 1);
    float inf = INFINITY;
    cudaCheck(cudaMemcpy(m->grads_memory + m->n_opt / 2, &inf, sizeof(float), cudaMemcpyHostToDevice));
    flow_grads_finish(m, 0);
    flow_update(m, lr_at_step(args, 10), args->weight_decay, args->decay_on, args->grad_clip, 10);
    float loss, norm, used;
    flow_read_scalars(m, &loss, &norm);
    int skipped = flow_read_loss_scale(m, &st, &used);
    void* p1 = download(m->params_memory, m->n_params * sizeof(floatX));
    void* w1 = download(m->master, shard * sizeof(float));
    void* m1 = download(m->m_memory, shard * sizeof(float));
    void* v1 = download(m->v_memory, shard * sizeof(float));
    int same = memcmp(p0, p1, m->n_params * sizeof(floatX)) == 0 && memcmp(w0, w1, shard * sizeof(float)) == 0 &&
               memcmp(m0, m1, shard * sizeof(float)) == 0 && memcmp(v0, v1, shard * sizeof(float)) == 0;
    check(skipped && !isfinite(norm) && same && st.skipped == 1 && st.scale == 512.0f && st.clean == 0 &&
              used == 1024.0f,
          "fp16: an Inf in the gradients skips the step: weights, master weights and moments keep every bit, 1 skip "
          "counted, scale 1024 -> %g, clean steps 5 -> %u (norm %g)", (double)st.scale, st.clean, (double)norm);
    flow_train_step(m, in, 1, 11, args);
    flow_read_scalars(m, &loss, &norm);
    skipped = flow_read_loss_scale(m, &st, &used);
    void* w2 = download(m->master, shard * sizeof(float));
    check(!skipped && isfinite(loss) && isfinite(norm) && memcmp(w1, w2, shard * sizeof(float)) != 0 &&
          st.scale == 512.0f && st.clean == 1 && st.skipped == 1, "fp16: the next step trains (loss %.6f, norm %.4f, "
          "scale %g, 1 clean step)", loss, norm, (double)st.scale);
    free(p0); free(w0); free(m0); free(v0); free(p1); free(w1); free(m1); free(v1); free(w2);
}

static void test_smolvla_oracle(const char* dir, int mode) {
    const char* name = TRAIN_MODE_NAMES[mode];
    char path[1200], key[160];
    snprintf(path, sizeof(path), "%s/s_%s_state.bin", dir, name);
    if (access(path, R_OK) != 0) {
        printf("\n(SmolVLA %s against its oracle: skipped, no %s: make test writes it)\n", name, path);
        return;
    }
    double t0 = wall_seconds();
    printf("\n== SmolVLA vs its oracle (%s): %s (train mode %s)\n", PRECISION_NAME, path, name);
    DebugState st;
    debug_state_read(&st, path);
    FlowConfig c;
    int32_t* raw = (int32_t*)debug_get(&st, "config", sizeof(FlowConfig) / sizeof(int32_t));
    memcpy(&c, raw, sizeof(c));
    free(raw);
    int32_t* st_mode = (int32_t*)debug_get(&st, "train_mode", 1);
    check(*st_mode == mode, "%s: the debug state was written for train mode %d", name, *st_mode);
    free(st_mode);
    float* hp = (float*)debug_get(&st, "hparams", 6);  // lr, min_lr_frac, warmup, steps, weight_decay, clip
    int B = (int)debug_find(&st, "batch/t")->numel, H = c.chunk, Am = c.max_action_dim;
    size_t n_act = (size_t)B * H * Am;

    FlowVLA m;
    flow_build(&m, &c, mode);
    float* params = (float*)mallocCheck(m.table.total * sizeof(float));
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &m.table.spec[i];
        snprintf(key, sizeof(key), "param/%s", s->name);
        float* p = (float*)debug_get(&st, key, s->numel);
        memcpy(params + s->offset, p, s->numel * sizeof(float));
        free(p);
    }
    flow_set_params(&m, params);
    set_test_loss_scale(&m);
    free(params);

    // optimizer state: fp32 master weights and two moments for exactly the trainable elements
    size_t count = flow_trainable_count(&m.table, mode);
    check(m.n_opt == count && m.n_train - count < 16 && m.opt_bytes == 3 * m.n_train * sizeof(float) &&
          count < m.table.total, "%s: fp32 master weights and moments for the %zu trainable elements alone (%.1f%% of "
          "%zu; padded to %zu), %zu bytes", name, m.n_opt, 100.0 * count / m.table.total, m.table.total, m.n_train,
          m.opt_bytes);

    // the batch, each field in its own device allocation; frames at their stored sizes
    ModelInputs in;
    memset(&in, 0, sizeof(in));
    in.B = B;
    int frames_ok = 1;
    for (int k = 0; k < c.n_cam; k++) {
        snprintf(key, sizeof(key), "batch/image%d", k);
        const Record* r = debug_find(&st, key);
        frames_ok = frames_ok && r->dtype == DT_U8 && r->ndim == 4 && r->shape[0] == (uint64_t)B && r->shape[3] == 3;
        in.frames[k] = (const uint8_t*)upload(r->data, r->numel);
        in.frame_h[k] = (int)r->shape[1];
        in.frame_w[k] = (int)r->shape[2];
    }
    check(frames_ok, "%s: batch/image<k> are (B, h, w, 3) uint8 frames", name);
    int32_t* tokens = (int32_t*)debug_get(&st, "batch/tokens", (size_t)B * c.max_text);
    float* token_mask = (float*)debug_get(&st, "batch/token_mask", (size_t)B * c.max_text);
    float* state = (float*)debug_get(&st, "batch/state", (size_t)B * c.max_state_dim);
    float* actions = (float*)debug_get(&st, "batch/actions", n_act);
    float* action_is_pad = (float*)debug_get(&st, "batch/action_is_pad", (size_t)B * H);
    float* t = (float*)debug_get(&st, "batch/t", B);
    float* eps = (float*)debug_get(&st, "batch/eps", n_act);
    in.tokens = (const int32_t*)upload(tokens, (size_t)B * c.max_text * sizeof(int32_t));
    in.token_mask = (const float*)upload(token_mask, (size_t)B * c.max_text * sizeof(float));
    in.state = (const float*)upload(state, (size_t)B * c.max_state_dim * sizeof(float));
    in.actions = (const float*)upload(actions, n_act * sizeof(float));
    in.action_is_pad = (const float*)upload(action_is_pad, (size_t)B * H * sizeof(float));
    in.t = (const float*)upload(t, B * sizeof(float));
    in.noise = (const float*)upload(eps, n_act * sizeof(float));
    free(tokens); free(token_mask); free(state); free(actions); free(action_is_pad); free(t); free(eps);

    // velocities and loss
    flow_forward(&m, &in, 0);
    flow_backward(&m, 1);
    flow_grads_finish(&m, 0);
    float loss;
    flow_read_scalars(&m, &loss, NULL);
    float* v = (float*)mallocCheck(n_act * sizeof(float));
    cudaCheck(cudaMemcpy(v, m.acts.v_t, n_act * sizeof(float), cudaMemcpyDeviceToHost));
    float* ref_v = (float*)debug_get(&st, "expect/v", n_act);
    float* ref_loss = (float*)debug_get(&st, "expect/loss", 1);
    double ev = rel_error(v, ref_v, n_act), el = rel_error(&loss, ref_loss, 1);
    check(ev <= FLOW_TOL_FWD, "%s: velocities rel err %.2e (tol %.0e)", name, ev, FLOW_TOL_FWD);
    check(el <= FLOW_TOL_FWD, "%s: loss %.7f vs %.7f rel err %.2e (tol %.0e)", name, loss, ref_loss[0], el,
          FLOW_TOL_FWD);
    free(v); free(ref_v); free(ref_loss);

    // gradients: every trainable slice against grad/<name>, whose frozen part must be zero; a
    // tensor with nothing trainable has no record (and no gradient memory here)
    float* grads = (float*)mallocCheck(m.n_train * sizeof(float));
    cudaCheck(cudaMemcpy(grads, m.grads_memory, m.n_train * sizeof(float), cudaMemcpyDeviceToHost));
    const char* tower_names[3] = {"vision", "vlm", "expert"};
    double worst[3] = {0.0, 0.0, 0.0};
    char worst_name[3][96] = {"", "", ""};
    int n_slices_checked[3] = {0, 0, 0}, records_ok = 1;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &m.table.spec[i];
        size_t n_train = flow_trainable_numel(s, mode), per = flow_slice_numel(s);
        snprintf(key, sizeof(key), "grad/%s", s->name);
        const Record* r = debug_lookup(&st, key);
        if (n_train == 0 || r == NULL) {
            if ((n_train == 0) != (r == NULL)) {
                records_ok = 0;
                check(0, "%s: %s trains %zu elements here, the oracle %s a gradient", name, s->name, n_train,
                      r == NULL ? "has no" : "has");
            }
            continue;
        }
        float* ref = (float*)debug_get(&st, key, s->numel);
        for (size_t j = n_train; j < s->numel; j++) { records_ok = records_ok && ref[j] == 0.0f; }
        for (size_t k = 0; per > 0 && (k + 1) * per <= n_train; k++) {
            const float* ours = grads + m.domain.offset[i] + k * per;
            double e;
            if (strcmp(s->name, "vis_bk") == 0) {
                // zero in exact arithmetic (softmax ignores a shift of a row's scores): both sides
                // are rounding noise, so the error is measured against the same layer's q bias
                // gradient, at the gradients' tolerance. (Not FLOW_TOL_ZERO: that ratio depends on
                // the config, as |grad vis_bq| does; 16 patches per image here, 64 in LeRobot's
                // case, and bf16 measures 1.5e-2 here.)
                float* ref_q = (float*)debug_get(&st, "grad/vis_bq", s->numel);
                double scale = norm2(ref_q + k * per, per);
                double e_ours = norm2(ours, per) / scale, e_ref = norm2(ref + k * per, per) / scale;
                check(e_ours <= FLOW_TOL_GRAD && e_ref <= 1e-5, "%s: vis_bk[%zu] is zero by symmetry: |ours| %.1e, "
                      "|oracle| %.1e of |grad vis_bq| (tol %.1e, the oracle's 1e-5)", name, k, e_ours, e_ref,
                      FLOW_TOL_GRAD);
                free(ref_q);
                e = 0.0;
            } else {
                e = rel_error(ours, ref + k * per, per);
            }
            if (!(e <= FLOW_TOL_GRAD)) {
                check(0, "%s: grad %s[%zu] rel err %.2e (tol %.1e)", name, s->name, k, e, FLOW_TOL_GRAD);
            }
            if (!(e <= worst[s->tower])) {
                worst[s->tower] = e;
                snprintf(worst_name[s->tower], sizeof(worst_name[s->tower]), "%s[%zu]", s->name, k);
            }
            n_slices_checked[s->tower]++;
        }
        free(ref);
    }
    for (int tw = 0; tw < 3; tw++) {
        if (n_slices_checked[tw] == 0) { continue; }
        check(worst[tw] <= FLOW_TOL_GRAD, "%s: %s gradients, %d slices: worst rel err %.2e (%s) (tol %.1e)", name,
              tower_names[tw], n_slices_checked[tw], worst[tw], worst_name[tw], FLOW_TOL_GRAD);
    }
    check(records_ok, "%s: the oracle has a gradient exactly for the tensors that train here, zero past their "
          "trainable prefix", name);
    free(grads);

    // 10 Euler steps from eps
    float* sample = (float*)mallocCheck(n_act * sizeof(float));
    flow_sample(&m, &in, in.noise, sample);
    float* ref_sample = (float*)debug_get(&st, "expect/sample", n_act);
    double es = rel_error(sample, ref_sample, n_act);
    check(es <= FLOW_TOL_FWD, "%s: 10-step sample rel err %.2e (tol %.0e)", name, es, FLOW_TOL_FWD);
    free(sample); free(ref_sample);

    // ten AdamW steps on the same batch: the loss before each update and the gradient norm
    // before clipping; the frozen elements' floatX copy keeps its bits, the trainable ones move
    floatX* before = (floatX*)mallocCheck(m.n_params * sizeof(floatX));
    floatX* after = (floatX*)mallocCheck(m.n_params * sizeof(floatX));
    cudaCheck(cudaMemcpy(before, m.params_memory, m.n_params * sizeof(floatX), cudaMemcpyDeviceToHost));
    TrainArgs args;
    train_args_defaults(&args);
    args.lr = hp[0]; args.min_lr_frac = hp[1]; args.warmup = (int)hp[2]; args.steps = (int)hp[3];
    args.weight_decay = hp[4]; args.grad_clip = hp[5];
    float losses[10], norms[10];
    double t_steps = wall_seconds();
    for (int step = 0; step < 10; step++) {
        flow_train_step(&m, &in, 1, step, &args);
        flow_read_scalars(&m, &losses[step], &norms[step]);
    }
    t_steps = wall_seconds() - t_steps;
    float* ref_losses = (float*)debug_get(&st, "expect/losses", 10);
    float* ref_norms = (float*)debug_get(&st, "expect/norms", 10);
    double e_losses = rel_error(losses, ref_losses, 10), e_norms = rel_error(norms, ref_norms, 10);
    check(e_losses <= FLOW_TOL_FWD, "%s: 10 AdamW steps: losses %.6f -> %.6f (oracle %.6f -> %.6f), rel err %.2e "
          "(tol %.0e)", name, losses[0], losses[9], ref_losses[0], ref_losses[9], e_losses, FLOW_TOL_FWD);
    check(e_norms <= FLOW_TOL_GRAD, "%s: 10 AdamW steps: gradient norms %.4f -> %.4f, rel err %.2e (tol %.1e)", name,
          norms[0], norms[9], e_norms, FLOW_TOL_GRAD);
    check(losses[9] < losses[0], "%s: the loss decreases over 10 steps on one batch", name);
    free(ref_losses); free(ref_norms);
    cudaCheck(cudaMemcpy(after, m.params_memory, m.n_params * sizeof(floatX), cudaMemcpyDeviceToHost));
    size_t frozen_moved = 0, trained_moved = 0;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &m.table.spec[i];
        size_t per = flow_slice_numel(s);
        for (int k = 0; k < (int)flow_slices(s); k++) {
            size_t at = (size_t)(flow_param(&m, i, k) - m.params_memory);
            int trains = flow_grad(&m, i, k) != NULL;
            for (size_t j = at; j < at + per; j++) {
                int moved = memcmp(&after[j], &before[j], sizeof(floatX)) != 0;
                if (trains) { trained_moved += moved; } else { frozen_moved += moved; }
            }
        }
    }
    check(frozen_moved == 0 && trained_moved > 0, "%s: after the steps %zu of %zu trainable values moved, "
          "%zu frozen ones", name, trained_moved, count, frozen_moved);
    free(before); free(after);
    printf("        (%s: 10 AdamW steps %.0f ms, %.1f s in all)\n", name, 1000.0 * t_steps, wall_seconds() - t0);
    static int skip_checked = 0;  // once, on the first mode that runs
    if (LOSS_SCALING && wanted("fp16") && !skip_checked) { check_fp16_skip(&m, &in, &args); skip_checked = 1; }

    for (int k = 0; k < c.n_cam; k++) { cudaCheck(cudaFree((void*)in.frames[k])); }
    cudaCheck(cudaFree((void*)in.tokens)); cudaCheck(cudaFree((void*)in.token_mask));
    cudaCheck(cudaFree((void*)in.state)); cudaCheck(cudaFree((void*)in.actions));
    cudaCheck(cudaFree((void*)in.action_is_pad)); cudaCheck(cudaFree((void*)in.t));
    cudaCheck(cudaFree((void*)in.noise));
    free(hp);
    flow_free(&m);
    free(st.recs); free(st.file);
}

// ----------------------------------------------------------------------------
// the trainer binary

// The whole loop through the binary: 5 steps on shard data, each its own samples, noise and
// learning rate, against the oracle's --train run (one rank of 4, train mode all).
static void test_training_loop(const char* dir) {
    printf("\n== training loop against the oracle\n");
    char trainer[1100];
    snprintf(trainer, sizeof(trainer), "%s -b 4 --train all", TRAINER);
    check_training_loop(dir, trainer, FLOW_TOL_FWD);
}

// Runs `command -o dir/out` into an empty output folder (what it prints in dir/out.txt) and reads
// the losses of its steps 1..n from the log; returns its exit status, *got how many losses it read
static int run_steps(const char* dir, const char* out, const char* command, int n, float* losses, int* got) {
    char cmd[4096], path[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s/%s && %s -o %s/%s > %s/%s.txt 2>&1", dir, out, command, dir, out, dir, out);
    int rc = run_command(cmd);
    snprintf(path, sizeof(path), "%s/%s/log.jsonl", dir, out);
    *got = read_losses(path, 1, n, losses);
    return rc;
}

// How far the training in checkpoint b is from checkpoint a's: the relative error of b's weight
// updates (weights minus the seed's initial ones, which every run here starts from) and of its
// AdamW moments against a's. INFINITY when either cannot be read or they differ in shape.
static double ckpt_training_error(const char* a, const char* b) {
    Checkpoint x, y;
    char err[512];
    if (checkpoint_read_checked(a, &x, err, sizeof(err)) != 0) { return INFINITY; }
    if (checkpoint_read_checked(b, &y, err, sizeof(err)) != 0) { checkpoint_free(&x); return INFINITY; }
    double e = INFINITY;
    if (x.n_params == y.n_params && x.n_trainable == y.n_trainable && x.n_trainable > 0 && x.seed == y.seed) {
        FlowParamTable t;
        flow_table_build(&x.config, &t);
        float* init = (float*)mallocCheck(t.total * sizeof(float));
        flow_param_init(init, &t, &x.config, x.seed);
        for (size_t i = 0; i < t.total; i++) { x.params[i] -= init[i]; y.params[i] -= init[i]; }
        double ep = rel_error(y.params, x.params, t.total), em = rel_error(y.m, x.m, x.n_trainable);
        double ev = rel_error(y.v, x.v, x.n_trainable);
        e = ep > em ? (ep > ev ? ep : ev) : (em > ev ? em : ev);
        free(init);
    }
    checkpoint_free(&x);
    checkpoint_free(&y);
    return e;
}

// update_error of checkpoint b's weights against checkpoint a's (both from the same seed's init),
// over the tensors whose decay column is `decay`; INFINITY when either cannot be read
static double ckpt_update_error(const char* a, const char* b, int decay) {
    Checkpoint x, y;
    char err[512];
    if (checkpoint_read_checked(a, &x, err, sizeof(err)) != 0) { return INFINITY; }
    if (checkpoint_read_checked(b, &y, err, sizeof(err)) != 0) { checkpoint_free(&x); return INFINITY; }
    double e = INFINITY;
    if (x.n_params == y.n_params && x.seed == y.seed && x.train_mode == y.train_mode) {
        FlowParamTable t;
        flow_table_build(&x.config, &t);
        float* init = (float*)mallocCheck(t.total * sizeof(float));
        flow_param_init(init, &t, &x.config, x.seed);
        e = update_error(y.params, x.params, init, &t, (int)x.train_mode, decay);
        free(init);
    }
    checkpoint_free(&x);
    checkpoint_free(&y);
    return e;
}

// Two identical runs give identical losses and checkpoints: no atomics, fixed reduction orders.
static void test_determinism(const char* dir) {
    printf("\n== determinism\n");
    char command[2048], p1[1100], p2[1100];
    float l1[4] = {0}, l2[4] = {0};
    int n1, n2;
    snprintf(command, sizeof(command), "%s -p tiny -b 3 -n 4 -u 2 -i %s/b.bin", TRAINER, dir);
    run_steps(dir, "gpu_det0", command, 4, l1, &n1);
    run_steps(dir, "gpu_det1", command, 4, l2, &n2);
    check(n1 == 4 && n2 == 4 && memcmp(l1, l2, sizeof(l1)) == 0,
          "two runs, identical losses bit for bit (%.7f .. %.7f)", l1[0], l1[3]);
    snprintf(p1, sizeof(p1), "%s/gpu_det0/ckpt_00000004.bin", dir);
    snprintf(p2, sizeof(p2), "%s/gpu_det1/ckpt_00000004.bin", dir);
    check(files_equal(p1, p2), "two runs, identical checkpoints");
}

// Gradient accumulation: -b 8 -d 16 takes the samples and noise of -b 16 in two micro-steps, and
// the loss is the mean over the step's valid entries either way, so its losses and weights follow
// -b 16's up to the order of summation
static void test_accumulation(const char* dir) {
    printf("\n== gradient accumulation\n");
    const char* splits[2] = {"-b 16", "-b 8 -d 16"};
    float losses[2][4] = {{0}};
    int n[2], rc[2];
    for (int k = 0; k < 2; k++) {
        char command[2048], out[32];
        snprintf(command, sizeof(command), "%s -p tiny %s -n 4 -u 2 -l 1e-3 -i %s/b.bin", TRAINER, splits[k], dir);
        snprintf(out, sizeof(out), "gpu_acc%d", k);
        rc[k] = run_steps(dir, out, command, 4, losses[k], &n[k]);
    }
    double e = rel_error(losses[1], losses[0], 4);
    char a[1100], b[1100];
    snprintf(a, sizeof(a), "%s/gpu_acc0/ckpt_00000004.bin", dir);
    snprintf(b, sizeof(b), "%s/gpu_acc1/ckpt_00000004.bin", dir);
    double ew = ckpt_training_error(a, b);
    check(rc[0] == 0 && rc[1] == 0 && n[0] == 4 && n[1] == 4 && e < TOL_RUNS && ew < TOL_RUNS,
          "-b 8 -d 16 (2 micro-steps) vs -b 16: 4 losses rel err %.2e, weight updates and moments %.2e (tol %.1e)",
          e, ew, TOL_RUNS);
}

// The MULTI_GPU trainer at world size 1 runs its NCCL path (the gradient buckets and the loss's
// sums over one rank, the time waited on them measured): its losses are those of the same trainer
// built without NCCL (`single`, make's train_vla_single_gpu_*)
static void test_single_gpu_build(const char* dir, const char* single) {
    printf("\n== world size 1 through NCCL vs the build without it\n");
    const char* trainers[2] = {TRAINER, single};
    float losses[2][4] = {{0}};
    int n[2], rc[2];
    for (int k = 0; k < 2; k++) {
        char command[2048], out[32];
        snprintf(command, sizeof(command), "%s -p tiny -g 1 -b 4 -n 4 -u 2 -l 1e-3 -i %s/b.bin", trainers[k], dir);
        snprintf(out, sizeof(out), "gpu_one%d", k);
        rc[k] = run_steps(dir, out, command, 4, losses[k], &n[k]);
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
    check(rc[0] == 0 && rc[1] == 0 && n[0] == 4 && n[1] == 4 && e < TOL_RUNS, "its 4 losses vs %s's: rel err %.2e "
          "(tol %.1e)%s", single, e, TOL_RUNS,
          memcmp(losses[0], losses[1], sizeof(losses[0])) == 0 ? ", bit for bit" : "");
}

// Several GPUs (MULTI_GPU): world sizes 2 and 4 with the global batch of -g 1 -b 4 take its samples
// and noise, their gradients summed by NCCL (in buckets during the backward pass, or with ZeRO-1
// reduce-scattered to the shards, updated there and all-gathered), so their losses, weights and
// moments follow -g 1's: plain, with accumulation, with ZeRO-1, in every train mode. Checkpoints
// continue on another world size, with or without ZeRO. Under the emulation CUDA_EMU_DEVICES=4
// provides the GPUs; with fewer visible the runs that need more are skipped (and said so).
static void test_multi_gpu(const char* dir) {
    printf("\n== several GPUs\n");
    int visible = 0;
    cudaGetDeviceCount(&visible);
    if (visible < 2) {
        printf("(skipped: %d GPU visible, the data-parallel checks need 2)\n", visible);
        return;
    }
    // {reference run, run}: the same global batch of 4 per step, 3 steps
    const char* pairs[][2] = {
        {"-g 1 -b 4", "-g 2 -b 2"},
        {"-g 1 -b 4", "-g 4 -b 1"},
        {"-g 1 -b 4", "-g 2 -b 1 -d 4"},
        {"-g 2 -b 2", "-g 2 -b 2 -z 1"},
        {"-g 1 -b 4", "-g 4 -b 1 -z 1"},
        {"-g 1 -b 4 --train expert", "-g 2 -b 2 -z 1 --train expert"},
        {"-g 1 -b 4 --train vlm", "-g 4 -b 1 --train vlm"},
        {"-g 1 -b 4 --train vlm", "-g 2 -b 2 -z 1 --train vlm"},
    };
    int n_pairs = (int)(sizeof(pairs) / sizeof(pairs[0]));
    int ref_ran[sizeof(pairs) / sizeof(pairs[0])] = {0};  // pair k ran its reference (gpu_dp<k>_0) ...
    int ref_rc[sizeof(pairs) / sizeof(pairs[0])] = {0};   // ... with this exit status
    for (int k = 0; k < n_pairs; k++) {
        if (visible < 4 && strstr(pairs[k][1], "-g 4") != NULL) {
            printf("(skipped %s: %d GPUs visible)\n", pairs[k][1], visible);
            continue;
        }
        float losses[2][3] = {{0}};
        int n[2], rc[2];
        char ckpt[2][1100];
        for (int j = 0; j < 2; j++) {
            char command[2048], out[32];
            int same = -1;  // a reference run an earlier pair made already is read again, not rerun
            for (int e = 0; e < k && j == 0 && same < 0; e++) {
                if (ref_ran[e] && strcmp(pairs[e][0], pairs[k][0]) == 0) { same = e; }
            }
            if (same >= 0) {
                char log[1100];
                snprintf(out, sizeof(out), "gpu_dp%d_0", same);
                snprintf(log, sizeof(log), "%s/%s/log.jsonl", dir, out);
                n[j] = read_losses(log, 1, 3, losses[j]);
                rc[j] = ref_rc[same];
            } else {
                snprintf(command, sizeof(command), "%s -p tiny %s -n 3 -u 2 -l 1e-3 -i %s/b.bin", TRAINER, pairs[k][j],
                         dir);
                snprintf(out, sizeof(out), "gpu_dp%d_%d", k, j);
                rc[j] = run_steps(dir, out, command, 3, losses[j], &n[j]);
                if (j == 0) { ref_ran[k] = 1; ref_rc[k] = rc[j]; }
            }
            snprintf(ckpt[j], sizeof(ckpt[j]), "%s/%s/ckpt_00000003.bin", dir, out);
        }
        double e = rel_error(losses[1], losses[0], 3), ew = ckpt_training_error(ckpt[0], ckpt[1]);
        check(rc[0] == 0 && rc[1] == 0 && n[0] == 3 && n[1] == 3 && e < TOL_RUNS && ew < TOL_RUNS,
              "%s vs %s: 3 losses rel err %.2e, weight updates and moments %.2e (tol %.1e)", pairs[k][1], pairs[k][0],
              e, ew, TOL_RUNS);
    }
    // checkpoints do not depend on the world size nor on ZeRO: 2 steps on one, the third on another,
    // against 3 steps on one GPU
    const char* legs[][2] = {{"-g 2 -b 2", "-g 1 -b 4"}, {"-g 2 -b 2 -z 1", "-g 4 -b 1 -z 0"},
                             {"-g 1 -b 4", "-g 2 -b 2 -z 1"}};
    for (int k = 0; k < 3; k++) {
        if (visible < 4 && (strstr(legs[k][0], "-g 4") != NULL || strstr(legs[k][1], "-g 4") != NULL)) {
            printf("(skipped %s then %s: %d GPUs visible)\n", legs[k][0], legs[k][1], visible);
            continue;
        }
        char cmd[4096], a[1100], b[1100];
        snprintf(cmd, sizeof(cmd),
                 "rm -rf %s/gpu_leg%d && %s -p tiny %s -n 2 -u 2 -l 1e-3 -i %s/b.bin -o %s/gpu_leg%d > "
                 "%s/gpu_leg%da.txt 2>&1 && %s -p tiny %s -n 3 -u 2 -l 1e-3 -i %s/b.bin -o %s/gpu_leg%d -y 1 > "
                 "%s/gpu_leg%db.txt 2>&1",
                 dir, k, TRAINER, legs[k][0], dir, dir, k, dir, k, TRAINER, legs[k][1], dir, dir, k, dir, k);
        int rc = run_command(cmd);
        snprintf(a, sizeof(a), "%s/gpu_dp0_0/ckpt_00000003.bin", dir);  // -g 1 -b 4, 3 steps
        snprintf(b, sizeof(b), "%s/gpu_leg%d/ckpt_00000003.bin", dir, k);
        double ew = ckpt_training_error(a, b);
        check(rc == 0 && ew < TOL_RUNS, "a %s checkpoint of step 2 continued on %s: step 3's weights and moments vs 3 "
              "steps on -g 1 -b 4, rel err %.2e (tol %.1e)", legs[k][0], legs[k][1], ew, TOL_RUNS);
    }
}

// Faults (MULTI_GPU): an NCCL error on one rank, or a rank that hangs in a collective, ends the run
// with one line naming the rank and exit status 1; the checkpoints written before stay whole and
// -y 1 continues. The emulation injects them (CUDA_EMU_NCCL_FAULT=rank:call:kind) at a call in the
// middle of step 3, after checkpoints 1 and 2: a step makes one all-reduce per range of its
// gradient buckets and one of the loss's sums, counted here from the model's own bucket table.
static void test_faults(const char* dir) {
    printf("\n== faults between GPUs\n");
    int visible = 0;
    cudaGetDeviceCount(&visible);
    if (visible < 2 || strstr(TRAINER, "emu") == NULL) {
        printf("(skipped: faults are injected through the CPU emulation of NCCL)\n");
        return;
    }
    char path[1100];
    snprintf(path, sizeof(path), "%s/b.bin", dir);
    Dataset ds;
    dataset_open(&ds, path);
    FlowConfig c = config_for_data("tiny", 0, &ds);
    dataset_close(&ds);
    FlowVLA probe;
    flow_build(&probe, &c, TRAIN_MODE_ALL);
    int per_step = probe.buckets.first[probe.buckets.n] + 1, call = 2 * per_step + per_step / 2;
    flow_free(&probe);
    const char* kinds[2] = {"error", "hang"};
    const char* needles[2] = {"NCCL reported", "made no progress"};
    // the hang is found by --nccl-timeout: well above an emulated step (1-3 s), so no false alarm
    const int timeouts[2] = {60, 15};
    for (int k = 0; k < 2; k++) {
        char out[1100], cmd[4096], errpath[1100];
        snprintf(out, sizeof(out), "%s/gpu_fault%d", dir, k);
        snprintf(errpath, sizeof(errpath), "%s/gpu_fault%d.err", dir, k);
        snprintf(cmd, sizeof(cmd),
                 "rm -rf %s && CUDA_EMU_NCCL_FAULT=1:%d:%s %s -p tiny -g 2 -b 2 -n 6 -k 1 --nccl-timeout %d "
                 "-i %s/b.bin -o %s > /dev/null 2> %s",
                 out, call, kinds[k], TRAINER, timeouts[k], dir, out, errpath);
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
              steps[0] == 2 && took < 60.0, "an injected NCCL %s at call %d (%d a step): exit %d after %.0f s, newest "
              "checkpoint step %d, '%s'", kinds[k], call, per_step, rc, took, n >= 1 ? (int)steps[0] : -1, err);
        free(err);
        snprintf(cmd, sizeof(cmd), "%s -p tiny -g 2 -b 2 -n 6 -k 1 -i %s/b.bin -o %s -y 1 > %s/gpu_fault%d.txt 2>&1",
                 TRAINER, dir, out, dir, k);
        rc = run_command(cmd);
        n = checkpoint_list(out, steps, 4);
        check(rc == 0 && n >= 1 && steps[0] == 6, "-y 1 after the %s continues from step 2 to the end", kinds[k]);
    }
}

// A run that starts on one trainer and continues on the other (-y 1 on the other's checkpoint)
// follows the run that stayed on the first within the tolerance of the two precisions' difference
// (the CPU trainer computes in fp32: TOL_RUNS in fp32 builds, FLOW_TOL_FWD in bf16), on one GPU
// and across world sizes:
// the GPU's leg on 2 GPUs with ZeRO-1 continued by the CPU, the CPU's continued on 2 GPUs (those
// two skipped, and said so, where fewer than 2 GPUs are visible).
static void test_cross_trainer(const char* dir) {
    printf("\n== checkpoints across train_vla and train_vla_cpu\n");
    if (access("./train_vla_cpu", X_OK) != 0) {
        check(0, "./train_vla_cpu is there to continue train_vla's checkpoints (make train_vla_cpu)");
        return;
    }
    const char* flags = "-p tiny -u 2 -l 1e-3 --log-every 100";
    char gpu1[1100], gpu2[1100];
    // (-g 1 given: -y 1 would otherwise take the other run's -g 2 from its run.json)
    snprintf(gpu1, sizeof(gpu1), "%s -g 1 -b 4", TRAINER);
    snprintf(gpu2, sizeof(gpu2), "%s -g 2 -b 2 -z 1", TRAINER);
    const char* cpu = "./train_vla_cpu -g 1 -t 1 -b 4";
    const char* runs[][2] = {{gpu1, cpu}, {cpu, gpu1}, {gpu2, cpu}, {cpu, gpu2}};
    int visible = 0;
    cudaGetDeviceCount(&visible);
    for (int k = 0; k < 4; k++) {
        const char* a = runs[k][0];
        const char* b = runs[k][1];
        if (visible < 2 && (a == gpu2 || b == gpu2)) {
            printf("(skipped %s then %s: %d GPU visible)\n", a, b, visible);
            continue;
        }
        char cmd[4096], path[1100];
        snprintf(cmd, sizeof(cmd),
                 "rm -rf %s/x_full %s/x_split && %s %s -n 6 -i %s/a.bin -o %s/x_full > %s/x_full.txt 2>&1 && "
                 "%s %s -n 3 -i %s/a.bin -o %s/x_split > %s/x_1.txt 2>&1 && "
                 "%s %s -n 6 -i %s/a.bin -o %s/x_split -y 1 > %s/x_2.txt 2>&1",
                 dir, dir, a, flags, dir, dir, dir, a, flags, dir, dir, dir, b, flags, dir, dir, dir);
        int rc = run_command(cmd);
        float full[6] = {0}, split[6] = {0};
        snprintf(path, sizeof(path), "%s/x_full/log.jsonl", dir);
        int nf = read_losses(path, 1, 6, full);
        snprintf(path, sizeof(path), "%s/x_split/log.jsonl", dir);
        int ns = read_losses(path, 1, 6, split);
        double e = rel_error(split + 3, full + 3, 3), tol = sizeof(floatX) == 4 ? TOL_RUNS : FLOW_TOL_FWD;
        check(rc == 0 && nf == 6 && ns == 6 && e < tol, "3 steps on %s, 3 more on %s from its checkpoint: steps 4-6 "
              "losses %.6f %.6f %.6f vs %.6f %.6f %.6f straight, rel err %.2e (tol %.1e)", a, b, split[3], split[4],
              split[5], full[3], full[4], full[5], e, tol);
    }
}

// --decay-on all reaches the GPU's AdamW kernels, on one GPU and on two with ZeRO-1 (each rank
// decays its shard): 3 steps of the tiny preset at -w 5, where the decay of the norms (scales of 1)
// outweighs AdamW's step, follow train_vla_cpu's run with it (tested against the oracle's in
// test_vla) within the two trainers' difference (the cross-trainer tolerance), and the biases'
// and norms' updates stand far from its run with the default (matrices): the option is not lost.
static void test_decay_on(const char* dir) {
    printf("\n== --decay-on all vs train_vla_cpu\n");
    if (access("./train_vla_cpu", X_OK) != 0) {
        check(0, "./train_vla_cpu is there to compare with (make train_vla_cpu)");
        return;
    }
    const char* flags = "-p tiny -n 3 -u 2 -l 1e-3 -w 5 -s 1337 --log-every 100";
    char gpu1[1100], gpu2[1100];
    snprintf(gpu1, sizeof(gpu1), "%s -b 2", TRAINER);
    snprintf(gpu2, sizeof(gpu2), "%s -g 2 -b 1 -z 1", TRAINER);
    const char* trainers[4] = {"./train_vla_cpu -t 1 -b 2", "./train_vla_cpu -t 1 -b 2", gpu1, gpu2};
    const char* decay[4] = {"all", "matrices", "all", "all"};
    char ckpt[4][1100];
    int visible = 0;
    cudaGetDeviceCount(&visible);
    double tol = sizeof(floatX) == 4 ? TOL_RUNS : FLOW_TOL_FWD;
    for (int k = 0; k < 4; k++) {
        snprintf(ckpt[k], sizeof(ckpt[k]), "%s/gd_%d/ckpt_00000003.bin", dir, k);
        if (k == 3 && visible < 2) {
            printf("(skipped %s: %d GPU visible)\n", trainers[k], visible);
            continue;
        }
        char cmd[4096];
        snprintf(cmd, sizeof(cmd), "rm -rf %s/gd_%d && %s %s --decay-on %s -i %s/a.bin -o %s/gd_%d > %s/gd_%d.txt 2>&1",
                 dir, k, trainers[k], flags, decay[k], dir, dir, k, dir, k);
        int rc = run_command(cmd);
        check(rc == 0, "%s --decay-on %s: 3 steps (exit %d)", trainers[k], decay[k], rc);
        if (k < 2) { continue; }
        double e = ckpt_training_error(ckpt[0], ckpt[k]);
        double near = ckpt_update_error(ckpt[0], ckpt[k], 0), apart = ckpt_update_error(ckpt[1], ckpt[k], 0);
        check(e < tol && near < tol && apart > 10 * tol && isfinite(apart), "%s --decay-on all vs train_vla_cpu's: "
              "weight updates and moments rel err %.2e, the biases' and norms' updates %.2e (tol %.1e); those vs its "
              "run with the default %.2e (> %.1e)", trainers[k], e, near, tol, apart, 10 * tol);
    }
}

// --init FILE --weights-only on the GPU: from a train_vla_cpu checkpoint of seed 21's init (step 1
// at learning rate 0), the run equals the GPU's own run from seed 21 (the same weights, step 0,
// fresh moments); and it fine-tunes on data of other cameras and dims with --train expert
static void test_weights_only(const char* dir) {
    printf("\n== --init --weights-only\n");
    if (access("./train_vla_cpu", X_OK) != 0) {
        check(0, "./train_vla_cpu is there to write the checkpoint to fine-tune (make train_vla_cpu)");
        return;
    }
    char cmd[4096], p1[1100], p2[1100];
    snprintf(cmd, sizeof(cmd),
             "rm -rf %s/gw_zero %s/gw_seed %s/gw_init %s/gw_b && "
             "./train_vla_cpu -p tiny -b 4 -t 1 -n 1 -l 0 -s 21 -i %s/a.bin -o %s/gw_zero > /dev/null 2>&1 && "
             "%s -p tiny -b 4 -n 3 -u 2 -s 21 -i %s/a.bin -o %s/gw_seed > /dev/null 2>&1 && "
             "%s -b 4 -n 3 -u 2 -s 21 -i %s/a.bin --init %s/gw_zero/ckpt_00000001.bin --weights-only "
             "-o %s/gw_init > /dev/null 2>&1",
             dir, dir, dir, dir, dir, dir, TRAINER, dir, dir, TRAINER, dir, dir, dir);
    int rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/gw_seed/ckpt_00000003.bin", dir);
    snprintf(p2, sizeof(p2), "%s/gw_init/ckpt_00000003.bin", dir);
    check(rc == 0 && files_equal(p1, p2),
          "--weights-only from train_vla_cpu's checkpoint of seed 21's init trains as the GPU's run from seed 21: "
          "the same checkpoint at step 3, byte for byte (exit %d)", rc);
    snprintf(cmd, sizeof(cmd),
             "%s -b 2 -n 2 --train expert -i %s/b.bin --init %s/gw_zero/ckpt_00000001.bin --weights-only "
             "-o %s/gw_b > /dev/null 2>&1",
             TRAINER, dir, dir, dir);
    rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/gw_b/ckpt_00000002.bin", dir);
    Checkpoint ck;
    char err[2048];
    int ok = rc == 0 && checkpoint_read_checked(p1, &ck, err, sizeof(err)) == 0;
    check(ok && ck.config.n_cam == 2 && ck.config.state_dim == 3 && ck.config.action_dim == 2 && ck.step == 2 &&
              ck.train_mode == TRAIN_MODE_EXPERT,
          "a 1-camera tiny checkpoint fine-tunes with --train expert on 2 cameras and 3/2 dims (exit %d)", rc);
    if (ok) { checkpoint_free(&ck); }
}

// ----------------------------------------------------------------------------
// Activation recomputation (--recompute): the backward runs a layer's forward again into one slot
// instead of keeping every layer's, with the same kernels on the same inputs, so the values are
// the same bit for bit (the emulation is deterministic; so is a GPU for the same kernel, launch
// and pointers' alignment). Per train mode, on the tiny preset grown to 2 SigLIP layers and 4
// VLM/expert layers (joint and cross layers, a last VLM layer, a tower that keeps per-layer
// slots): an AdamW step on a batch with text pads and chunk slots past the episode's end, its
// loss, every gradient and the weights after it (and a 10-step sample with them) compared with
// memcmp to --recompute none's, and the activations strictly smaller. Then the binary:
// --recompute layer's checkpoint equals none's, a bad value is refused (test_vla: train_vla_cpu
// refuses every level but none).

// A random batch of B samples for config c: frames at the model's size, token ids with a few pads
// at the end, some action slots past the episode's end; every field in its own device allocation
static ModelInputs recompute_batch(const FlowConfig* c, int B, uint64_t seed) {
    Rng r;
    rng_init(&r, seed, 0);
    ModelInputs in;
    memset(&in, 0, sizeof(in));
    in.B = B;
    size_t frame = (size_t)c->img * c->img * 3, n_act = (size_t)B * c->chunk * c->max_action_dim;
    uint8_t* px = (uint8_t*)mallocCheck(frame * B);
    for (int k = 0; k < c->n_cam; k++) {
        for (size_t i = 0; i < frame * B; i++) { px[i] = (uint8_t)(rng_u64(&r) & 255); }
        in.frames[k] = (const uint8_t*)upload(px, frame * B);
        in.frame_h[k] = in.frame_w[k] = c->img;
    }
    free(px);
    int32_t* tokens = (int32_t*)mallocCheck((size_t)B * c->max_text * sizeof(int32_t));
    float* mask = (float*)mallocCheck((size_t)B * c->max_text * sizeof(float));
    for (int b = 0; b < B; b++) {
        int len = c->max_text - 1 - b % 3;  // 1-3 pads
        for (int j = 0; j < c->max_text; j++) {
            tokens[b * c->max_text + j] = j < len ? (int32_t)(rng_u64(&r) % (uint64_t)c->vocab) : c->pad_token;
            mask[b * c->max_text + j] = j < len ? 1.0f : 0.0f;
        }
    }
    float* f = (float*)mallocCheck((n_act > (size_t)B * c->max_state_dim ? n_act : (size_t)B * c->max_state_dim) *
                                   sizeof(float));
    in.tokens = (const int32_t*)upload(tokens, (size_t)B * c->max_text * sizeof(int32_t));
    in.token_mask = (const float*)upload(mask, (size_t)B * c->max_text * sizeof(float));
    for (size_t i = 0; i < (size_t)B * c->max_state_dim; i++) { f[i] = (float)rng_normal(&r); }
    in.state = (const float*)upload(f, (size_t)B * c->max_state_dim * sizeof(float));
    for (size_t i = 0; i < n_act; i++) { f[i] = (float)rng_normal(&r); }
    in.actions = (const float*)upload(f, n_act * sizeof(float));
    for (size_t i = 0; i < n_act; i++) { f[i] = (float)rng_normal(&r); }
    in.noise = (const float*)upload(f, n_act * sizeof(float));
    for (int i = 0; i < B * c->chunk; i++) { f[i] = i % c->chunk >= c->chunk - 2 * (i / c->chunk) ? 1.0f : 0.0f; }
    in.action_is_pad = (const float*)upload(f, (size_t)B * c->chunk * sizeof(float));
    for (int b = 0; b < B; b++) { f[b] = (float)rng_flow_time(&r); }
    in.t = (const float*)upload(f, B * sizeof(float));
    free(tokens); free(mask); free(f);
    return in;
}

static void recompute_batch_free(ModelInputs* in, int n_cam) {
    for (int k = 0; k < n_cam; k++) { cudaCheck(cudaFree((void*)in->frames[k])); }
    cudaCheck(cudaFree((void*)in->tokens)); cudaCheck(cudaFree((void*)in->token_mask));
    cudaCheck(cudaFree((void*)in->state)); cudaCheck(cudaFree((void*)in->actions));
    cudaCheck(cudaFree((void*)in->noise)); cudaCheck(cudaFree((void*)in->action_is_pad));
    cudaCheck(cudaFree((void*)in->t));
}

// What a run at recompute level rc leaves: one AdamW step's loss, its gradients, the weights after
// it, a 10-step sample with them (with_sample); its activation bytes
typedef struct {
    float loss;
    float* grads;
    floatX* params;
    float* sample;
    size_t act_bytes, n_train, n_params;
} RecomputeRun;

static RecomputeRun recompute_run(const FlowConfig* c, int mode, int rc, const float* init, const ModelInputs* in,
                                  int with_sample) {
    RecomputeRun r;
    FlowVLA m;
    flow_build(&m, c, mode);
    flow_set_recompute(&m, rc);
    flow_set_params(&m, init);
    TrainArgs args;
    train_args_defaults(&args);
    args.warmup = 1;
    args.lr = 1e-2f;  // weights that move: the sample runs on others than the step
    flow_train_step(&m, in, 1, 0, &args);
    flow_read_scalars(&m, &r.loss, NULL);
    r.n_train = m.n_train;
    r.n_params = m.n_params;
    r.grads = (float*)mallocCheck(m.n_train * sizeof(float));
    r.params = (floatX*)mallocCheck(m.n_params * sizeof(floatX));
    cudaCheck(cudaMemcpy(r.grads, m.grads_memory, m.n_train * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(r.params, m.params_memory, m.n_params * sizeof(floatX), cudaMemcpyDeviceToHost));
    size_t n = (size_t)in->B * c->chunk * c->max_action_dim;
    r.sample = (float*)calloc(n, sizeof(float));
    if (with_sample) {
        m.sampling.use_graph = 0;
        flow_sample(&m, in, in->noise, r.sample);
    }
    r.act_bytes = m.act_bytes;
    check(m.device_bytes - m.act_bytes == flow_model_bytes(c, mode) &&
          m.act_bytes == flow_act_bytes(c, mode, in->B, rc), "%s, --recompute %s: the model holds what "
          "flow_model_bytes + flow_act_bytes say (%zu + %zu bytes: --memory's table)", TRAIN_MODE_NAMES[mode],
          RECOMPUTE_NAMES[rc], m.device_bytes - m.act_bytes, m.act_bytes);
    flow_free(&m);
    return r;
}

static void test_recompute(const char* dir) {
    printf("\n== activation recomputation (%s)\n", PRECISION_NAME);
    double t0 = wall_seconds();
    FlowConfig c = flow_preset("tiny")->config;
    c.vis_layers = 2;
    c.n_layer = 4;
    FlowParamTable t;
    flow_table_build(&c, &t);
    float* init = (float*)mallocCheck(t.total * sizeof(float));
    flow_param_init(init, &t, &c, 5);
    int B = 2;
    ModelInputs in = recompute_batch(&c, B, 11);
    size_t n_sample = (size_t)B * c.chunk * c.max_action_dim;
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        // sampling (the forward alone, unchanged by recompute) is the same code in every mode: checked once
        RecomputeRun none = recompute_run(&c, mode, RECOMPUTE_NONE, init, &in, mode == TRAIN_MODE_ALL);
        for (int rc = RECOMPUTE_ATTN; rc <= RECOMPUTE_LAYER; rc++) {
            int sample = mode == TRAIN_MODE_ALL && rc == RECOMPUTE_LAYER;
            RecomputeRun r = recompute_run(&c, mode, rc, init, &in, sample);
            int same = memcmp(&r.loss, &none.loss, sizeof(r.loss)) == 0 &&
                       memcmp(r.grads, none.grads, r.n_train * sizeof(float)) == 0 &&
                       memcmp(r.params, none.params, r.n_params * sizeof(floatX)) == 0 &&
                       (!sample || memcmp(r.sample, none.sample, n_sample * sizeof(float)) == 0);
            check(same && isfinite(r.loss), "%s, --recompute %s: the loss (%.6f), all %zu gradients, the weights after "
                  "AdamW%s identical to none's bit for bit", TRAIN_MODE_NAMES[mode], RECOMPUTE_NAMES[rc], r.loss,
                  r.n_train, sample ? " and a 10-step sample with them" : "");
            check(r.act_bytes < none.act_bytes, "%s, --recompute %s: activations %zu bytes < none's %zu (%.0f%%)",
                  TRAIN_MODE_NAMES[mode], RECOMPUTE_NAMES[rc], r.act_bytes, none.act_bytes,
                  100.0 * r.act_bytes / none.act_bytes);
            free(r.grads); free(r.params); free(r.sample);
        }
        free(none.grads); free(none.params); free(none.sample);
    }
    recompute_batch_free(&in, c.n_cam);
    free(init);
    // the levels in order at the smolvla preset's sizes, from the function the trainer allocates by
    FlowConfig big = flow_preset("smolvla")->config;
    size_t all[3];
    for (int rc = 0; rc < 3; rc++) { all[rc] = flow_act_bytes(&big, TRAIN_MODE_ALL, 8, rc); }
    check(all[2] < all[1] && all[1] < all[0] && 3 * all[2] < all[0], "smolvla --train all -b 8: activations %.2f / "
          "%.2f / %.2f GiB for none / attn / layer", all[0] / 1073741824.0, all[1] / 1073741824.0,
          all[2] / 1073741824.0);

    // the binary: --train all, 2 steps with --recompute layer leave none's checkpoint
    char command[2048], p1[1100], p2[1100];
    float l1[2] = {0}, l2[2] = {0};
    int n1, n2;
    snprintf(command, sizeof(command), "%s -p tiny -b 3 -n 2 -u 2 --train all -i %s/b.bin", TRAINER, dir);
    int rc1 = run_steps(dir, "gpu_rec_none", command, 2, l1, &n1);
    snprintf(command, sizeof(command), "%s -p tiny -b 3 -n 2 -u 2 --train all -i %s/b.bin --recompute layer", TRAINER,
             dir);
    int rc2 = run_steps(dir, "gpu_rec_layer", command, 2, l2, &n2);
    snprintf(p1, sizeof(p1), "%s/gpu_rec_none/ckpt_00000002.bin", dir);
    snprintf(p2, sizeof(p2), "%s/gpu_rec_layer/ckpt_00000002.bin", dir);
    check(rc1 == 0 && rc2 == 0 && n1 == 2 && n2 == 2 && memcmp(l1, l2, sizeof(l1)) == 0 && files_equal(p1, p2),
          "%s --train all --recompute layer: the same losses (%.6f, %.6f) and checkpoint as --recompute none", TRAINER,
          l2[0], l2[1]);
    snprintf(command, sizeof(command), "%s/gpu_rec_layer/log.jsonl", dir);
    char* log = read_text(command);
    check(strstr(log, "\"recompute_saved_bytes\": ") != NULL, "its log.jsonl records what --recompute saves");
    free(log);
    char args[2048];
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s/a.bin -o %s/bad_out --recompute some", dir, dir);
    expect_error_from(dir, TRAINER, "--recompute some", args, "--recompute some: use none, attn or layer");
    printf("(recompute: %.1f s)\n", wall_seconds() - t0);
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
    snprintf(args, sizeof(args), "-p tiny -b 2 -i %s/a.bin --train everything", dir);
    expect_error_from(dir, TRAINER, "an unknown train mode", args, "everything");
    if (!LOSS_SCALING) {  // bf16 and fp32 builds refuse fp16's flags rather than ignore them
        snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s/a.bin -o %s/bad_out --loss-scale 1024", dir, dir);
        expect_error_from(dir, TRAINER, "--loss-scale in a " PRECISION_NAME " build", args, "does not scale the loss");
    }
    // a truncated checkpoint given to --init; a checkpoint of another train mode continued
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "rm -rf %s/gpu_trunc && %s -p tiny -b 2 -n 1 -i %s/a.bin -o %s/gpu_trunc > /dev/null 2>&1 && "
             "head -c 3000 %s/gpu_trunc/ckpt_00000001.bin > %s/gpu_trunc/short.bin",
             dir, TRAINER, dir, dir, dir, dir);
    run_command(cmd);
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 2 -i %s/a.bin -o %s/bad_out --init %s/gpu_trunc/short.bin", dir, dir,
             dir);
    expect_error_from(dir, TRAINER, "truncated checkpoint", args, "truncated");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 2 -i %s/a.bin -o %s/gpu_trunc -y 1 --train expert", dir, dir);
    expect_error_from(dir, TRAINER, "a --train all checkpoint continued with --train expert", args, "--train all");
    // a balanced train_vla_cpu checkpoint continued with --balance none is refused (without the flag,
    // -y 1 takes the run's own --balance tasks from its run.json)
    snprintf(cmd, sizeof(cmd),
             "rm -rf %s/gpu_bal && ./train_vla_cpu -p tiny -b 2 -n 1 -t 1 --balance tasks -i %s/a.bin "
             "-o %s/gpu_bal > /dev/null 2>&1",
             dir, dir, dir);
    run_command(cmd);
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 2 -i %s/a.bin -o %s/gpu_bal -y 1 --balance none", dir, dir);
    expect_error_from(dir, TRAINER, "a --balance tasks checkpoint continued with --balance none", args,
                      "trained with --balance tasks");
    // a shard truncated under the running trainer once it has checkpointed: one line naming the shard
    // (a read past its new end faults inside the mapping), the checkpoint intact. The loader is
    // vla/loader.h's, shared with train_vla_cpu: tests/runs/test_hardening.sh rewrites a shard in place
    // too.
    // (the copy is made before the trainer starts in the background: with `&&` the `&` took the
    // copy along, and on a rerun the wait below found the last run's checkpoints and truncated the
    // shard before the copy put it back)
    snprintf(cmd, sizeof(cmd), "rm -rf %s/gpu_changed && cp %s/a.bin %s/changing.bin || exit 1; "
             "{ %s -p tiny -b 2 -n 1000000 -k 2 -i %s/changing.bin -o %s/gpu_changed "
             "> /dev/null 2> %s/changed_err.txt; echo $? > %s/changed_rc.txt; } & "
             "for i in $(seq 900); do ls %s/gpu_changed/ckpt_*.bin > /dev/null 2>&1 && break; sleep 0.1; done; "
             "truncate -s 100000 %s/changing.bin; wait", dir, dir, dir, TRAINER, dir, dir, dir, dir, dir, dir);
    run_command(cmd);
    char path[1100], needle[1200];
    snprintf(path, sizeof(path), "%s/changed_rc.txt", dir);
    char* rc_text = read_text(path);
    snprintf(path, sizeof(path), "%s/changed_err.txt", dir);
    char* err = read_text(path);
    snprintf(needle, sizeof(needle), "error: dataset shard %s/changing.bin ", dir);
    int lines = 0;
    for (char* p = err; *p; p++) { lines += *p == '\n'; }
    // every checkpoint the run kept is intact (on a GPU the run may be far past step 2 when the shard
    // is cut: --keep's newest three remain)
    snprintf(path, sizeof(path), "%s/gpu_changed", dir);
    uint64_t steps[8];
    int kept_n = checkpoint_list(path, steps, 8), intact = kept_n > 0;
    char why[VLA_PATH_MAX + 512] = "none written";
    for (int k = 0; k < kept_n && intact; k++) {
        char ck_path[VLA_PATH_MAX + 300];
        checkpoint_path(ck_path, sizeof(ck_path), path, steps[k]);
        Checkpoint kept;
        intact = checkpoint_read_checked(ck_path, &kept, why, sizeof(why)) == 0;
        if (intact) { checkpoint_free(&kept); }
    }
    check(atoi(rc_text) == 1 && lines == 1 && strncmp(err, needle, strlen(needle)) == 0 && intact,
          "a shard truncated under the run: exit %d, %d line(s), its %d checkpoint(s) %s: %.300s", atoi(rc_text), lines,
          kept_n, intact ? "intact" : why, err);
    free(rc_text); free(err);
}

// The task_loss arrays of a 2-task balanced run's log, steps 1..n, into out (2 n); the lines read
static int read_task_losses(const char* log, int n, float* out) {
    char* text = read_text(log);
    int got = 0;
    for (char* line = text != NULL ? strtok(text, "\n") : NULL; line != NULL && got < n; line = strtok(NULL, "\n")) {
        char* at = strstr(line, "\"task_loss\": [");
        if (at != NULL && sscanf(at, "\"task_loss\": [%f, %f]", &out[2 * got], &out[2 * got + 1]) == 2) { got++; }
    }
    free(text);
    return got;
}

// --balance tasks on the GPU, on the 1:10 imbalanced dataset (write_imbalanced): two GPUs take the
// samples train_vla_cpu's two simulated ranks take (every step's loss and loss per task as the
// CPU's, within the precision's tolerance), a run resumed mid-epoch is the straight one byte for
// byte, the checkpoints record the balance and train_vla_cpu continues them, and bad weights are
// refused
static void test_balance(const char* dir) {
    printf("\n== task-balanced sampling on the GPU (--balance tasks)\n");
    if (access("./train_vla_cpu", X_OK) != 0) {
        check(0, "./train_vla_cpu is there to compare with (make train_vla_cpu)");
        return;
    }
    char spec[2300], gpu[1200], cpu[300], cmd[16384], p1[1100], p2[1100];
    write_imbalanced(dir, spec, sizeof(spec));
    // two GPUs where there are (the CPU's two simulated ranks beside them), else one
    int visible = 0;
    cudaGetDeviceCount(&visible);
    int g = visible >= 2 ? 2 : 1;
    if (g == 1) { printf("(%d GPU visible: the balanced runs on 1 GPU, not 2)\n", visible); }
    // (fp16: from a loss scale whose steps the tiny model's backward does not overflow, so that no
    // step is skipped and the GPU trains the CPU's steps)
    snprintf(gpu, sizeof(gpu), "%s -p tiny -g %d -b 2 -u 3 --workers 1 --log-every 100 --balance tasks%s", TRAINER, g,
             LOSS_SCALING ? " --loss-scale 1024" : "");
    snprintf(cpu, sizeof(cpu),
             "./train_vla_cpu -p tiny -g %d -b 2 -u 3 -t 1 --workers 1 --log-every 100 --balance tasks", g);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/gbal_full %s/gbal_res %s/gbal_cpu && "
             "%s -n 6 -k 3 -i %s -o %s/gbal_full > %s/gbal_full.txt 2>&1 && "
             "%s -n 3 -i %s -o %s/gbal_res > %s/gbal_r1.txt 2>&1 && "
             "%s -n 6 -y 1 -i %s -o %s/gbal_res > %s/gbal_r2.txt 2>&1 && "
             "%s -n 6 -i %s -o %s/gbal_cpu > %s/gbal_cpu.txt 2>&1",
             dir, dir, dir, gpu, spec, dir, dir, gpu, spec, dir, dir, gpu, spec, dir, dir, cpu, spec, dir, dir);
    int rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/gbal_full/ckpt_00000006.bin", dir);
    snprintf(p2, sizeof(p2), "%s/gbal_res/ckpt_00000006.bin", dir);
    check(rc == 0 && files_equal(p1, p2),
          "-g %d --balance tasks resumed at step 3 (mid-epoch): step 6's checkpoint is the uninterrupted run's "
          "byte for byte (rc %d)", g, rc);
    Dataset ds;
    dataset_open(&ds, spec);
    TaskBalance tb;
    task_balance_build(&tb, &ds, NULL);
    Checkpoint ck;
    char err[1200];
    int read = checkpoint_read_checked(p1, &ck, err, sizeof(err)) == 0;
    check(read && ck.balance == BALANCE_TASKS && ck.balance_id == tb.fingerprint &&
              ck.sampler_pos == (uint64_t)(12 * g),
          "the checkpoint records --balance tasks, the weights' fingerprint and sampler position %d", 12 * g);
    if (read) { checkpoint_free(&ck); }
    task_balance_free(&tb);
    dataset_close(&ds);
    snprintf(p1, sizeof(p1), "%s/gbal_full/log.jsonl", dir);
    check_task_loss_log(p1, 6, "train_vla");
    // the CPU's simulated ranks: the same global batches, so the same losses, task by task
    float gl[6] = {0}, cl[6] = {0}, gt[12] = {0}, ct[12] = {0};
    snprintf(p2, sizeof(p2), "%s/gbal_cpu/log.jsonl", dir);
    int ng = read_losses(p1, 1, 6, gl), nc = read_losses(p2, 1, 6, cl);
    int tg = read_task_losses(p1, 6, gt), tc = read_task_losses(p2, 6, ct);
    double tol = sizeof(floatX) == 4 ? TOL_RUNS : FLOW_TOL_FWD;
    double el = rel_error(gl, cl, 6), et = rel_error(gt, ct, 12);
    check(ng == 6 && nc == 6 && tg == 6 && tc == 6 && el < tol && et < tol,
          "6 balanced steps on %d GPU(s) vs train_vla_cpu -g %d: losses rel err %.2e, per-task losses rel err %.2e "
          "(tol %.1e); step 6's tasks %.5f %.5f vs %.5f %.5f",
          g, g, el, et, tol, gt[10], gt[11], ct[10], ct[11]);
    snprintf(p1, sizeof(p1), "%s/gbal_full/ckpt_00000006.bin", dir);
    snprintf(p2, sizeof(p2), "%s/gbal_cpu/ckpt_00000006.bin", dir);
    double ec = ckpt_training_error(p2, p1);
    check(ec < (sizeof(floatX) == 4 ? TOL_RUNS : FLOW_TOL_GRAD),
          "step 6's checkpoint: the GPU's training vs the CPU's, rel err %.2e", ec);
    // pi0, whose loss counts every slot of a chunk, padded ones too: its per-task losses as train_vla_cpu's
    snprintf(cmd, sizeof(cmd), "rm -rf %s/gbal_pi0 %s/gbal_pi0_cpu && "
             "%s -p pi0_tiny -g %d -b 4 -u 3 --workers 1 --log-every 100 --balance tasks%s -n 4 -i %s -o %s/gbal_pi0 > "
             "%s/gbal_pi0.txt 2>&1 && ./train_vla_cpu -p pi0_tiny -g %d -b 4 -u 3 -t 1 --workers 1 --log-every 100 "
             "--balance tasks -n 4 -i %s -o %s/gbal_pi0_cpu > %s/gbal_pi0_cpu.txt 2>&1",
             dir, dir, TRAINER, g, LOSS_SCALING ? " --loss-scale 1024" : "", spec, dir, dir, g, spec, dir, dir);
    rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/gbal_pi0/log.jsonl", dir);
    snprintf(p2, sizeof(p2), "%s/gbal_pi0_cpu/log.jsonl", dir);
    float pg[8] = {0}, pc[8] = {0};
    tg = read_task_losses(p1, 4, pg), tc = read_task_losses(p2, 4, pc);
    et = rel_error(pg, pc, 8);
    check(rc == 0 && tg == 4 && tc == 4 && et < tol,
          "pi0_tiny, 4 balanced steps on %d GPU(s) vs train_vla_cpu: per-task losses rel err %.2e (tol %.1e), "
          "every slot counted as pi0's loss counts them (rc %d)", g, et, tol, rc);
    // train_vla_cpu continues the GPU's balanced checkpoint (3 more steps)
    snprintf(cmd, sizeof(cmd), "%s -n 9 -y 1 -i %s -o %s/gbal_full > %s/gbal_cont.txt 2>&1", cpu, spec, dir, dir);
    rc = run_command(cmd);
    snprintf(p1, sizeof(p1), "%s/gbal_full/ckpt_00000009.bin", dir);
    check(rc == 0 && access(p1, R_OK) == 0,
          "train_vla_cpu --balance tasks continues the GPU's balanced checkpoint to step 9");
    char args[4096];
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s -o %s/bad_out --balance tasks --task-weights 1,2,3", spec,
             dir);
    expect_error_from(dir, TRAINER, "--task-weights of 3 tasks for a dataset of 2", args,
                      "3 weights for the dataset's 2 tasks");
}

// --profile STEP: step 2 of 3 of the tiny model timed by phase and operation. Its phases' times add
// up to the step's total (the marks tile it), every phase of a --train all step is there, the
// products have FLOPs (a TFLOP/s column), the profiled step is left out of the mean step time, and
// a step outside the run, or the flag on train_vla_cpu, is refused in one line. The config table
// names the attention versions the build runs (dev/cuda/attention_smolvla checks and times each).
static void test_profile(const char* dir) {
    printf("\n== --profile\n");
    char cmd[4096], path[1100];
    snprintf(cmd, sizeof(cmd),
             "rm -rf %s/prof && %s -p tiny -b 2 -n 3 -u 2 --train all -k 0 --log-every 100 -i %s/a.bin "
             "-o %s/prof --profile 2 > %s/prof.txt 2>&1",
             dir, TRAINER, dir, dir, dir);
    int rc = run_command(cmd);
    snprintf(path, sizeof(path), "%s/prof.txt", dir);
    char* text = read_text(path);
    double total = -1.0, sum = 0.0;
    int rows = 0, products = 0;
    const char* at = strstr(text, "profile of step 2: ");
    if (at != NULL) { sscanf(at, "profile of step 2: %lf ms", &total); }
    const char* phases[] = {"images", "vision fwd", "prefix embed", "vlm fwd", "expert fwd", "loss", "expert bwd",
                            "vlm bwd", "prefix bwd", "vision bwd", "grads", "optimizer"};
    const int n_phases = (int)(sizeof(phases) / sizeof(phases[0]));
    int seen[sizeof(phases) / sizeof(phases[0])] = {0};
    const char* table = at != NULL ? strstr(at, "by phase (") : NULL;
    const char* line = table != NULL ? strchr(table, '\n') : NULL;
    // the phase table: "| name | calls | ms | share | TFLOP/s |" rows until a blank line
    while (line != NULL && line[1] == '|') {
        line++;
        char name[64];
        int calls;
        double ms;
        if (sscanf(line, "| %63[^|]| %d | %lf |", name, &calls, &ms) == 3) {
            for (char* e = name + strlen(name) - 1; e > name && *e == ' '; e--) { *e = 0; }
            for (int i = 0; i < n_phases; i++) { seen[i] |= strcmp(name, phases[i]) == 0; }
            sum += ms;
            rows++;
        }
        line = strchr(line, '\n');
    }
    int all_seen = 1;
    for (int i = 0; i < n_phases; i++) { all_seen &= seen[i]; }
    const char* shapes = at != NULL ? strstr(at, "by shape:") : NULL;
    // its rows: | operation | shape | calls | ms | step | TFLOP/s | host ms |
    for (const char* l = shapes; l != NULL && (l = strstr(l, "\n| matmul ")) != NULL; l++) {
        const char* end = strchr(l + 1, '\n');
        const char* bar[8];
        int bars = 0;
        for (const char* c = l + 1; c < end; c++) {
            if (*c == '|' && bars < 8) { bar[bars] = c; }
            bars += *c == '|';
        }
        double tf = -1.0, host = -1.0;
        products += bars == 8 && sscanf(bar[5] + 1, "%lf", &tf) == 1 && tf >= 0.0 &&
                    sscanf(bar[6] + 1, "%lf", &host) == 1 && host >= 0.0;
    }
    check(rc == 0 && total > 0.0 && fabs(sum - total) <= 5e-4 * (rows + 1) + 1e-6 * total,  // (printed to 1e-3 ms)
          "--profile 2: exit %d, %d phases adding up to %.3f ms of the step's %.3f ms", rc, rows, sum, total);
    check(all_seen,
          "every phase of a --train all step has its row (images, vision fwd .. vision bwd, grads, optimizer)");
    check(products > 0, "the products' table: %d rows of matmul with their TFLOP/s and host time", products);
    check(strstr(text, "mean step time") != NULL && strstr(text, "over 1 steps") != NULL,
          "the mean step time leaves out the first step and the profiled one (over 1 steps)");
    // the tiny preset's vision and language heads of 16 take version 4 in bf16 builds; fp16 builds run
    // version 2, fp32 ones version 1 (pi0's heads of 256 take version 5 in every build)
    int bf16 = sizeof(floatX) == 2 && !LOSS_SCALING;
    const char* vision = bf16 ? "v4: flash, mma.sync" : LOSS_SCALING ? "v2: WMMA tiles" : "v1: a warp a query";
    const char* masked = vision;
    char row[2][160];
    snprintf(row[0], sizeof(row[0]), "| vision attention       | %-36s |", vision);
    snprintf(row[1], sizeof(row[1]), "| masked attention       | %-36s |", masked);
    check(strstr(text, row[0]) != NULL && strstr(text, row[1]) != NULL,
          "the config table names the build's attention (vision %s, masked %s)", vision, masked);
    check(attention_version(256, false, true) == ATTENTION_V5 && attention_version(256, true, true) == ATTENTION_V5 &&
          (LOSS_SCALING || attention_version(72, false, true) == ATTENTION_V1),
          "attention_version, which the launchers and the config table ask: pi0's heads of 256 take version 5, its "
          "vision heads of 72 version 1 (fp16 builds: 2 where the GPU's shared memory holds its tiles)");
    free(text);
    char args[2048];
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 3 -i %s/a.bin -o %s/prof_bad --profile 4", dir, dir);
    expect_error_from(dir, TRAINER, "--profile 4 of a 3-step run", args, "--profile 4: this run trains steps 1 to 3");
    if (access("./train_vla_cpu", X_OK) == 0) {
        expect_error_from(dir, "./train_vla_cpu", "--profile on train_vla_cpu", args, "run it with train_vla");
    }
}

// fp16 builds' dynamic loss scaling through the binary: a run of the tiny model at -b 2 that starts
// at scale 2^18, where its backward overflows fp16 (measured: the steps at 2^18, 2^17 and 2^16
// skip, 2^15 trains), with a window of 2 clean steps. 6 steps straight
// against 3, checkpointed, then continued (-y 1) with --loss-scale 1024: the same losses and
// checkpoint files bit for bit, so the scale, its clean steps and the skip count were restored
// from the checkpoint. Its log: the first step skipped, every loss finite, and the scale of each
// step the one the rules give after the step before (halved by a skip, doubled after 2 clean
// steps). A corrupt scale in a checkpoint's header is refused in one line.
static void test_fp16_loss_scale(const char* dir) {
    printf("\n== fp16 dynamic loss scaling\n");
    char trainer[1200];
    snprintf(trainer, sizeof(trainer), "%s -p tiny -b 2 -u 3 --log-every 100 --loss-scale 262144 --loss-scale-window 2",
             TRAINER);
    // the resumed leg says --loss-scale 1024: only the checkpoint can give it 2^18's descendant
    char cmd[4096], p1[1100], p2[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s/fp16_full %s/fp16_resumed && %s -n 6 -i %s/a.bin -o %s/fp16_full -k 3 > "
             "%s/fp16_full.txt 2>&1", dir, dir, trainer, dir, dir, dir);
    int rc1 = run_command(cmd);
    snprintf(cmd, sizeof(cmd), "%s -n 3 -i %s/a.bin -o %s/fp16_resumed > %s/fp16_r1.txt 2>&1", trainer, dir, dir, dir);
    int rc2 = run_command(cmd);
    snprintf(cmd, sizeof(cmd), "%s -p tiny -b 2 -u 3 --log-every 100 --loss-scale 1024 --loss-scale-window 2 -n 6 -i "
             "%s/a.bin -o %s/fp16_resumed -y 1 > %s/fp16_r2.txt 2>&1", TRAINER, dir, dir, dir);
    int rc3 = run_command(cmd);
    float full[6] = {0}, resumed[3] = {0};
    snprintf(p1, sizeof(p1), "%s/fp16_full/log.jsonl", dir);
    snprintf(p2, sizeof(p2), "%s/fp16_resumed/log.jsonl", dir);
    int nf = read_losses(p1, 1, 6, full), nr = read_losses(p2, 4, 6, resumed);
    check(rc1 == 0 && rc2 == 0 && rc3 == 0 && nf == 6 && nr == 3, "fp16 runs at --loss-scale 2^18: straight, first "
          "leg, resumed leg (exit %d %d %d)", rc1, rc2, rc3);
    check(nf == 6 && nr == 3 && memcmp(full + 3, resumed, sizeof(resumed)) == 0,
          "fp16: resumed with --loss-scale 1024 (the checkpoint's scale wins), losses equal the uninterrupted run "
          "bit for bit (steps 4-6: %.7f %.7f %.7f)", resumed[0], resumed[1], resumed[2]);
    snprintf(p1, sizeof(p1), "%s/fp16_full/ckpt_00000006.bin", dir);
    snprintf(p2, sizeof(p2), "%s/fp16_resumed/ckpt_00000006.bin", dir);
    check(files_equal(p1, p2), "fp16: final checkpoints of the straight and resumed runs are identical files (the "
          "loss scale's fields included)");
    // the straight run's log against the rules, and its last checkpoint's header against the log
    snprintf(p1, sizeof(p1), "%s/fp16_full/log.jsonl", dir);
    char* text = read_text(p1);
    double scale[6] = {0};
    long long skips[6] = {0};
    int lines = 0, finite = 1;
    for (char* line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        int step;
        float loss;
        const char* at = strstr(line, "\"loss_scale\": ");
        if (sscanf(line, "{\"step\": %d, \"loss\": %f", &step, &loss) == 2 && step >= 1 && step <= 6 && at != NULL &&
            sscanf(at, "\"loss_scale\": %lf, \"skipped_steps\": %lld", &scale[step - 1], &skips[step - 1]) == 2) {
            lines++;
            finite &= isfinite(loss);
        }
    }
    free(text);
    double expect = 262144.0;
    int clean = 0, rules = lines == 6 && scale[0] == expect && skips[0] == 1;
    for (int k = 0; k < 6 && rules; k++) {
        rules &= scale[k] == expect;
        int skipped = skips[k] - (k > 0 ? skips[k - 1] : 0);
        if (skipped) { expect = fmax(1.0, expect / 2); clean = 0; }
        else if (++clean == 2) { expect *= 2; clean = 0; }
    }
    check(rules && finite && skips[5] < 6,
          "fp16: at scale 2^18 step 1 overflows and is skipped, the run goes on and trains; the scales the steps "
          "ran with %g %g %g %g %g %g, skipped so far %lld .. %lld, as the rules say",
          scale[0], scale[1], scale[2], scale[3], scale[4], scale[5], skips[0], skips[5]);
    // two GPUs with ZeRO-1, one sample each: the same global batch, so the same steps overflow (the
    // norm is the ranks' sum; the scale is per sample) and the same scales, losses as -g 1's
    int visible = 0;
    cudaGetDeviceCount(&visible);
    if (visible >= 2) {
        snprintf(cmd, sizeof(cmd),
                 "%s -p tiny -b 1 -g 2 -z 1 -u 3 --log-every 100 --loss-scale 262144 --loss-scale-window 2", TRAINER);
        snprintf(trainer, sizeof(trainer), "%s -n 3 -i %s/a.bin", cmd, dir);
        float zl[3] = {0};
        int nz, rcz = run_steps(dir, "fp16_zero", trainer, 3, zl, &nz);
        snprintf(p2, sizeof(p2), "%s/fp16_zero/log.jsonl", dir);
        char* zt = read_text(p2);
        int same = nz == 3;
        for (int k = 0; k < 3 && same; k++) {
            char want[96];
            snprintf(want, sizeof(want), "\"loss_scale\": %.9g, \"skipped_steps\": %lld", scale[k], skips[k]);
            char* line = zt;
            for (int j = 0; j < k && line != NULL; j++) { line = strchr(line, '\n'); line = line ? line + 1 : NULL; }
            char* end = line ? strchr(line, '\n') : NULL;
            char* hit = line ? strstr(line, want) : NULL;
            same &= hit != NULL && (end == NULL || hit < end);
        }
        free(zt);
        double e = rel_error(zl, full, 3);
        check(rcz == 0 && same && e < TOL_RUNS, "fp16: -g 2 -z 1 (one sample per GPU) skips the same steps at the same "
              "scales as -g 1, losses rel err %.2e (tol %.2e)", e, TOL_RUNS);
    } else {
        printf("(fp16 on two GPUs: skipped, %d visible)\n", visible);
    }
    Checkpoint ck;
    char err[1400];
    snprintf(p1, sizeof(p1), "%s/fp16_full/ckpt_00000006.bin", dir);
    int ok = checkpoint_read_checked(p1, &ck, err, sizeof(err)) == 0;
    check(ok && ck.loss_scale.scale == (float)expect && ck.loss_scale.clean == (uint32_t)clean &&
              ck.loss_scale.skipped == (uint64_t)skips[5],
          "fp16: the checkpoint at step 6 holds scale %g, %u clean step(s), "
          "%llu skipped (the log's next: %g, %d, %lld)", ok ? (double)ck.loss_scale.scale : 0.0,
          ok ? ck.loss_scale.clean : 0, ok ? (unsigned long long)ck.loss_scale.skipped : 0ULL, expect, clean, skips[5]);
    if (ok) { checkpoint_free(&ck); }
    // corrupt scales in the header: NaN, negative
    const float bad[2] = {NAN, -2.0f};
    for (int k = 0; k < 2; k++) {
        char args[2400];
        snprintf(p2, sizeof(p2), "%s/fp16_full/bad_scale.bin", dir);
        corrupt_copy(p1, p2, (long)offsetof(CheckpointHeader, loss_scale), &bad[k], sizeof(float), -1);
        snprintf(args, sizeof(args), "-p tiny -b 2 -n 8 -i %s/a.bin -o %s/bad_out --init %s", dir, dir, p2);
        expect_error_from(dir, TRAINER, k == 0 ? "a checkpoint with loss scale NaN" : "a checkpoint with loss scale -2",
                          args, "loss scale");
    }
    char args[2400];
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -i %s/a.bin -o %s/bad_out --loss-scale 0.5", dir, dir);
    expect_error_from(dir, TRAINER, "--loss-scale 0.5 (below 1)", args, "--loss-scale 0.5");
}

// Whether the comma-separated list names group
static int list_names(const char* list, const char* group) {
    size_t n = strlen(group);
    for (const char* p = list; *p != '\0';) {
        const char* end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, group, n) == 0) { return 1; }
        p += len + (end != NULL);
    }
    return 0;
}

// VLA_GPU_TESTS=a,b runs only the groups named (oracle, lerobot, training_loop, determinism,
// accumulation, single_gpu_build, multi_gpu, faults, resume, cross_trainer, weights_only,
// decay_on, bad_input, balance, recompute, fp16 (fp16 builds: the loss scaling; with oracle, an injected
// overflow), ...): for working on one feature; make test runs them all in fp32. oracle:MODE and
// lerobot:MODE (expert, vlm, all) run one train mode's case of those groups. VLA_GPU_SKIP=a,b
// leaves groups out (dev/run_tests.sh: the bf16 suite leaves out what no precision changes).
static int wanted(const char* group) {
    const char* only = getenv("VLA_GPU_TESTS");
    const char* skip = getenv("VLA_GPU_SKIP");
    if (skip != NULL && list_names(skip, group)) { return 0; }
    return only == NULL || only[0] == '\0' || list_names(only, group);
}

static int wanted_mode(const char* group, int mode) {
    char one[64];
    snprintf(one, sizeof(one), "%s:%s", group, TRAIN_MODE_NAMES[mode]);
    return wanted(group) || wanted(one);
}

// A group's wall time, for keeping the suites within CI's budget
// A group's wall time since t0, for keeping the suites within CI's budget; returns the time now
static double group_time(const char* group, double t0) {
    double now = wall_seconds();
    printf("(group %s: %.1f s)\n", group, now - t0);
    return now;
}

int main(int argc, char** argv) {
    // positional arguments, and --smolvla LEROBOT_REF_DIR, --pi0 LEROBOT_PI0_REF_DIR anywhere
    const char* args[3] = {NULL, NULL, NULL};
    const char* flow_refs = NULL;
    const char* pi0_refs = NULL;
    int n_args = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--smolvla") == 0 && i + 1 < argc) { flow_refs = argv[++i]; }
        else if (strcmp(argv[i], "--pi0") == 0 && i + 1 < argc) { pi0_refs = argv[++i]; }
        else if (n_args < 3) { args[n_args++] = argv[i]; }
        else { n_args++; }
    }
    if (n_args != 2 && n_args != 3) {
        fprintf(stderr, "usage: %s FIXTURE_DIR TRAINER [TRAINER_WITHOUT_NCCL] [--smolvla LEROBOT_REF_DIR] [--pi0 "
                "LEROBOT_PI0_REF_DIR]   (make test writes the fixtures and the references and runs this)\n", argv[0]);
        return 2;
    }
    const char* dir = args[0];
    TRAINER = args[1];
    setenv("CUDA_EMU_DEVICES", "4", 0);  // under the CPU emulation: four GPUs (a real machine ignores it)
    cudaDeviceProp prop;
    gpu_check_visible(1);
    gpu_init(0, &prop);
    printf("device: %s, precision %s, trainer %s\n", prop.name, PRECISION_NAME, TRAINER);
    // each group's wall time follows it (CI's budget)
    double t0 = wall_seconds();
    int oracle_ran = 0;
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        if (wanted_mode("oracle", mode)) { test_smolvla_oracle(dir, mode); oracle_ran = 1; }
    }
    if (oracle_ran) { t0 = group_time("oracle", t0); }
    if (wanted("lerobot") || wanted("lerobot:expert") || wanted("lerobot:vlm") || wanted("lerobot:all")) {
        if (flow_refs != NULL) { test_smolvla_lerobot("SmolVLA", flow_refs); }
        else { printf("\n(SmolVLA against LeRobot: skipped, no --smolvla LEROBOT_REF_DIR)\n"); }
        // pi0: train mode all, which has every gradient (test_vla checks every mode on the CPU)
        if (pi0_refs != NULL && wanted_mode("lerobot", TRAIN_MODE_ALL)) {
            test_smolvla_case("pi0", pi0_refs, TRAIN_MODE_ALL);
        } else {
            printf("\n(pi0 against LeRobot: skipped, no --pi0 LEROBOT_PI0_REF_DIR)\n");
        }
        t0 = group_time("lerobot", t0);
    }
    if (wanted("training_loop")) { test_training_loop(dir); t0 = group_time("training_loop", t0); }
    if (wanted("determinism")) { test_determinism(dir); t0 = group_time("determinism", t0); }
    if (wanted("accumulation")) { test_accumulation(dir); t0 = group_time("accumulation", t0); }
#if defined(MULTI_GPU)
    if (wanted("single_gpu_build")) {
        if (n_args == 3) { test_single_gpu_build(dir, args[2]); }
        else { printf("\n(world size 1 through NCCL vs the build without it: skipped, no TRAINER_WITHOUT_NCCL)\n"); }
        t0 = group_time("single_gpu_build", t0);
    }
#else
    printf("\n(world size 1 through NCCL: skipped, this build has no NCCL)\n");
#endif
    if (wanted("multi_gpu")) { test_multi_gpu(dir); t0 = group_time("multi_gpu", t0); }
    if (wanted("faults")) { test_faults(dir); t0 = group_time("faults", t0); }
    if (wanted("resume")) {
        char trainer[1100];
        snprintf(trainer, sizeof(trainer), "%s -p tiny -b 4 -u 3 --log-every 100", TRAINER);
        printf("\n== bit-exact resume\n");
        check_resume_bit_exact(dir, trainer, TRAINER);
        t0 = group_time("resume", t0);
    }
    if (wanted("cross_trainer")) { test_cross_trainer(dir); t0 = group_time("cross_trainer", t0); }
    if (wanted("profile")) { test_profile(dir); t0 = group_time("profile", t0); }
    if (wanted("weights_only")) { test_weights_only(dir); t0 = group_time("weights_only", t0); }
    if (wanted("decay_on")) { test_decay_on(dir); t0 = group_time("decay_on", t0); }
    if (wanted("bad_input")) { test_bad_input(dir); t0 = group_time("bad_input", t0); }
    if (wanted("balance")) { test_balance(dir); t0 = group_time("balance", t0); }
    if (wanted("recompute")) { test_recompute(dir); t0 = group_time("recompute", t0); }
    if (LOSS_SCALING && wanted("fp16")) { test_fp16_loss_scale(dir); t0 = group_time("fp16", t0); }
    gpu_shutdown();
    printf("\n%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
