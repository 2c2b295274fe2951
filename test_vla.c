/*
test_vla.c: checks train_vla.c against the PyTorch oracle (dev/model.py) and tests the plumbing.
Includes the production code, so what is tested is what runs.

  make test     builds everything, writes fixtures and the oracle's debug states into build/test,
                then runs ./test_vla build/test

Per debug state (one per fixture config): init from the seed, batch assembly, velocities, loss,
every parameter gradient by name, finite differences (the oracle's, in double precision, and our
own in fp32), 10-step sampling, the losses of 10 optimizer steps. Then: simulated ranks,
checkpoints and bit-exact resume, the sampler, and bad input through the real binary.
Exits non-zero on any failure; the last line is `N passed, M failed`.
*/
#define TESTING
#include "train_vla.c"
#include "dev/test_util.h"
#include <arpa/inet.h>
#include <netinet/in.h>

// Whether each of the n counters is exactly 1: a partition covered every element once
static int covered_once(const unsigned char* seen, size_t n) {
    int once = 1;
    for (size_t e = 0; e < n; e++) { once &= seen[e] == 1; }
    return once;
}

// ----------------------------------------------------------------------------
// tests against the oracle

typedef struct {
    VLAConfig config;
    int B;
    uint64_t seed;
    float hp[6];  // lr, min_lr_frac, warmup, steps, weight_decay, clip
} OracleSetup;

static void test_against_oracle(const char* dir, const char* name) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s_state.bin", dir, name);
    printf("\n== %s: %s\n", name, path);
    DebugState st;
    debug_state_read(&st, path);
    OracleSetup o;
    int32_t* cfg = (int32_t*)debug_get(&st, "config", 15);
    memcpy(&o.config, cfg, sizeof(VLAConfig));
    free(cfg);
    const VLAConfig* c = &o.config;
    int32_t* seed = (int32_t*)debug_get(&st, "seed", 1);
    o.seed = (uint64_t)seed[0];
    free(seed);
    float* hp = (float*)debug_get(&st, "hparams", 6);
    memcpy(o.hp, hp, sizeof(o.hp));
    free(hp);
    o.B = (int)debug_find(&st, "batch/t")->numel;
    int B = o.B, H = c->chunk, A = c->action_dim, S = c->state_dim;
    size_t HA = (size_t)H * A;

    Model m;
    model_build(&m, c);
    // 1. init from the seed matches the oracle's numpy RNG
    param_init(m.params_memory, &m.table, c, o.seed);
    double worst = 0.0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        char key[96];
        snprintf(key, sizeof(key), "param/%s", m.table.spec[i].name);
        float* ref = (float*)debug_get(&st, key, m.table.spec[i].numel);
        double e = rel_error(m.params_memory + m.table.spec[i].offset, ref, m.table.spec[i].numel);
        if (e > worst) { worst = e; }
        memcpy(m.params_memory + m.table.spec[i].offset, ref, m.table.spec[i].numel * sizeof(float));  // use the oracle's
        free(ref);
    }
    // same RNG stream, float rounding of Box-Muller in double is the only difference: 1e-6
    check(worst < 1e-6, "%s init from seed %llu: worst tensor rel err %.2e (tol 1e-6)", name, (unsigned long long)o.seed, worst);

    // 2. the batch: sampler + assembly + flow noise reproduce the oracle's step-0 batch
    Dataset ds;
    snprintf(path, sizeof(path), "%s/%s.bin", dir, name);
    dataset_open(&ds, path);
    Sampler sampler;
    sampler_init(&sampler, ds.n_samples, o.seed);
    Batch batch;
    batch_alloc(&batch, c, B);
    uint64_t* idx = (uint64_t*)callocCheck(B, sizeof(uint64_t));
    batch_fill_indices(idx, &sampler, 0, 0, 0, B, 1, 0);
    batch_fill(&batch, &ds, c, idx, o.seed, 0, 0, 0);
    int32_t* ref_idx = (int32_t*)debug_get(&st, "batch/indices", B);
    int same_idx = 1;
    for (int i = 0; i < B; i++) { same_idx &= idx[i] == (uint64_t)ref_idx[i]; }
    free(ref_idx);
    free(idx);
    check(same_idx, "%s sampler picks the oracle's step-0 samples", name);
    size_t img_bytes = (size_t)B * c->n_cam * c->img * c->img * 3;
    uint8_t* ref_images = (uint8_t*)debug_get(&st, "batch/images", img_bytes);
    uint8_t* ref_text = (uint8_t*)debug_get(&st, "batch/text", (size_t)B * c->max_text);
    check(memcmp(ref_images, batch.images, img_bytes) == 0 && memcmp(ref_text, batch.text, (size_t)B * c->max_text) == 0,
          "%s images and text bytes identical", name);
    free(ref_images); free(ref_text);
    struct { const char* key; float* ours; size_t n; double tol; } fields[] = {
        {"batch/text_mask", batch.text_mask, (size_t)B * c->max_text, 0.0},
        {"batch/action_mask", batch.action_mask, (size_t)B * H, 0.0},
        {"batch/state", batch.state, (size_t)B * S, 0.0},
        {"batch/actions", batch.actions, (size_t)B * HA, 0.0},
        {"batch/t", batch.t, (size_t)B, 1e-7},      // pow/log/cos in double, then rounded to float:
        {"batch/eps", batch.eps, (size_t)B * HA, 1e-7},  // libm and numpy may differ in the last bit
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        float* ref = (float*)debug_get(&st, fields[i].key, fields[i].n);
        double e = rel_error(fields[i].ours, ref, fields[i].n);
        check(e <= fields[i].tol, "%s %s rel err %.2e (tol %.0e)", name, fields[i].key, e, fields[i].tol);
        memcpy(fields[i].ours, ref, fields[i].n * sizeof(float));  // continue on the oracle's exact batch
        free(ref);
    }
    float masked = 0.0f, text_pads = 0.0f;
    for (int i = 0; i < B * H; i++) { masked += batch.action_mask[i] == 0.0f; }
    for (int i = 0; i < B * c->max_text; i++) { text_pads += batch.text_mask[i] == 0.0f; }
    printf("        (batch: %d samples, %.0f masked action slots, %.0f text pads)\n", B, masked, text_pads);
    if (strcmp(name, "b") == 0) {  // fixture b exists to cover these: make sure it does
        check(masked > 0 && text_pads > 0, "%s batch has chunks past an episode's end and padded instructions", name);
    }

    // 3. forward and backward against the oracle. fp32 against the float64 oracle: the error is
    // our fp32 rounding, ~1e-7 per op growing over a few hundred sequential ops: 1e-5.
    const double tol = 1e-5;
    float loss = model_forward(&m, &batch);
    model_backward(&m, &batch);
    check_forward_against(&st, name, m.acts.v_pred, (size_t)B * HA, loss, tol);
    check_grads_against(&st, name, c, &m.table, m.grads_memory, tol);

    // 4. finite differences of selected entries: the oracle's central differences in float64
    // (tol 1e-4: its O(h^2) error), and ours on the fp32 forward (tol 3e-2: fp32 loss rounding / h)
    const Record* fd_names = debug_find(&st, "fd/index");
    int n_fd = (int)fd_names->numel / 2;
    int32_t* fd_idx = (int32_t*)debug_get(&st, "fd/index", (size_t)n_fd * 2);
    float* fd_val = (float*)debug_get(&st, "fd/value", (size_t)n_fd);
    double worst_fd64 = 0.0, worst_fd32 = 0.0;
    float* saved_grads = (float*)mallocCheck(m.table.total * sizeof(float));
    memcpy(saved_grads, m.grads_memory, m.table.total * sizeof(float));
    for (int k = 0; k < n_fd; k++) {
        size_t at = m.table.spec[fd_idx[2 * k]].offset + (size_t)fd_idx[2 * k + 1];
        float g = saved_grads[at];
        double e64 = fabs((double)g - fd_val[k]) / fmax(fabs((double)fd_val[k]), 1e-3);
        if (e64 > worst_fd64) { worst_fd64 = e64; }
        float p0 = m.params_memory[at], h = 1e-2f * fmaxf(fabsf(p0), 0.05f);
        m.params_memory[at] = p0 + h;
        double lp = model_forward(&m, &batch);
        m.params_memory[at] = p0 - h;
        double lm = model_forward(&m, &batch);
        m.params_memory[at] = p0;
        double fd32 = (lp - lm) / (2.0 * h);
        double e32 = fabs((double)g - fd32) / fmax(fabs((double)g), 1e-2);
        if (e32 > worst_fd32) { worst_fd32 = e32; }
    }
    check(n_fd > 0 && worst_fd64 < 1e-4, "%s %d gradient entries vs float64 finite differences: worst rel err %.2e (tol 1e-4)",
          name, n_fd, worst_fd64);
    check(n_fd > 0 && worst_fd32 < 3e-2, "%s same entries vs fp32 finite differences of this code: worst rel err %.2e (tol 3e-2)",
          name, worst_fd32);
    free(fd_idx); free(fd_val); free(saved_grads);

    // 5. inference: 10 Euler steps from the batch's noise, un-normalized with the dataset stats
    float* stats = (float*)debug_get(&st, "stats", 2 * (size_t)(S + A));
    float* sampled = (float*)mallocCheck((size_t)B * HA * sizeof(float));
    model_sample_actions(&m, &batch, batch.eps, stats + 2 * S, stats + 2 * S + A, sampled);
    float* ref_sample = (float*)debug_get(&st, "expect/sample", (size_t)B * HA);
    double es = rel_error(sampled, ref_sample, (size_t)B * HA);
    check(es < 1e-5, "%s 10-step sampled actions rel err %.2e (tol 1e-5)", name, es);
    float stats_err = (float)rel_error(ds.state_mean, stats, S) + (float)rel_error(ds.action_std, stats + 2 * S + A, A);
    check(stats_err == 0.0f, "%s normalization statistics identical", name);
    free(stats); free(sampled); free(ref_sample);

    // 6. ten AdamW steps on the same batch: losses before each update. Tolerance 1e-5 relative:
    // Adam divides by sqrt(v), which amplifies fp32 noise in near-zero gradients a little.
    TrainArgs args;
    train_args_defaults(&args);
    args.lr = o.hp[0]; args.min_lr_frac = o.hp[1]; args.warmup = (int)o.hp[2]; args.steps = (int)o.hp[3];
    args.weight_decay = o.hp[4]; args.grad_clip = o.hp[5];
    float* ref_losses = (float*)debug_get(&st, "expect/losses", 10);
    float* ref_norms = (float*)debug_get(&st, "expect/norms", 10);
    float losses[10], norms[10];
    for (int step = 0; step < 10; step++) {
        losses[step] = model_forward(&m, &batch);
        model_backward(&m, &batch);
        norms[step] = model_update(&m, lr_at_step(&args, step), args.weight_decay, args.grad_clip, step, 1);
    }
    double e_losses = rel_error(losses, ref_losses, 10), e_norms = rel_error(norms, ref_norms, 10);
    check(e_losses < 1e-5, "%s 10 optimizer steps: losses %.6f -> %.6f, rel err %.2e (tol 1e-5)", name, losses[0], losses[9],
          e_losses);
    check(e_norms < 1e-5, "%s 10 optimizer steps: grad norms rel err %.2e (tol 1e-5)", name, e_norms);
    check(losses[9] < losses[0], "%s loss decreases over 10 steps on one batch", name);
    free(ref_losses); free(ref_norms);

    batch_free(&batch);
    sampler_free(&sampler);
    dataset_close(&ds);
    model_free(&m);
    free(st.recs); free(st.file);
}

// ----------------------------------------------------------------------------
// the whole training loop against the oracle: 5 steps on shard data, each with its own samples,
// noise and learning rate. The C run uses 2 simulated ranks of 2 for the oracle's one rank of 4.

static void test_training_loop(const char* dir) {
    printf("\n== training loop against the oracle\n");
    check_training_loop(dir, "./train_vla_cpu -g 2 -b 2 -t 1", 1e-5);
}

// ----------------------------------------------------------------------------
// simulated ranks: -g 4 -b 2 takes the same samples and noise as -g 1 -b 8, and so does
// -g 2 -b 2 -d 8 (2 ranks, 2 micro-steps each): after 3 steps the parameters agree up to the
// order of fp32 summation

// Three optimizer steps of train_vla_cpu's loop on `ds` with `args` (from train_args_defaults and
// train_args_for_world): the losses into losses[3], the final parameters into a new array
static float* train_three_steps(Dataset* ds, const VLAConfig* c, const TrainArgs* args, float* losses) {
    Model m;
    model_build(&m, c);
    param_init(m.params_memory, &m.table, c, args->seed);
    Loader loader;
    loader_start(&loader, ds, c, args->seed, 0, 0, args->batch, args->ranks * args->accum, 0, 2, 3);
    float* grad_sum = (float*)mallocCheck(m.table.total * sizeof(float));
    for (int step = 0; step < 3; step++) {
        float norm;
        losses[step] = train_step(&m, grad_sum, &loader, args, step, &norm);
    }
    loader_stop(&loader);
    float* params = (float*)mallocCheck(m.table.total * sizeof(float));
    memcpy(params, m.params_memory, m.table.total * sizeof(float));
    free(grad_sum);
    model_free(&m);
    return params;
}

static void test_simulated_ranks(const char* dir) {
    printf("\n== simulated ranks and gradient accumulation\n");
    char path[1024];
    snprintf(path, sizeof(path), "%s/a.bin", dir);
    Dataset ds;
    dataset_open(&ds, path);
    VLAConfig c = config_for_data("tiny", 0, &ds);
    enum { RUNS = 3 };
    float losses[RUNS][3];
    float* final_params[RUNS];
    int ranks[RUNS] = {1, 4, 2}, batches[RUNS] = {8, 2, 2}, totals[RUNS] = {0, 0, 8};
    for (int run = 0; run < RUNS; run++) {
        TrainArgs args;
        train_args_defaults(&args);
        args.ranks = ranks[run]; args.batch = batches[run]; args.total_batch = totals[run];
        args.steps = 3; args.warmup = 1; args.lr_base = 1e-3f;
        train_args_for_world(&args, args.ranks);
        final_params[run] = train_three_steps(&ds, &c, &args, losses[run]);
    }
    ParamTable t;
    param_table_build(&c, &t);
    const char* names[RUNS] = {"", "-g 4 -b 2", "-g 2 -b 2 -d 8"};
    for (int run = 1; run < RUNS; run++) {
        double el = rel_error(losses[run], losses[0], 3), ep = rel_error(final_params[run], final_params[0], t.total);
        check(el < 1e-5, "%s vs -g 1 -b 8: 3 losses rel err %.2e (tol 1e-5)", names[run], el);
        check(ep < 1e-5, "%s vs -g 1 -b 8: parameters after 3 steps rel err %.2e (tol 1e-5)", names[run], ep);
    }
    for (int run = 0; run < RUNS; run++) { free(final_params[run]); }
    dataset_close(&ds);
}

// ZeRO-1 simulated: -z 1 -g 3 updates each rank's shard on its own (tensors split where the shards
// fall) and follows -z 0 -g 3 up to the order of the norm's sums; the shards cover every
// parameter exactly once
static void test_zero(const char* dir) {
    printf("\n== ZeRO-1 over simulated ranks\n");
    char path[1024];
    snprintf(path, sizeof(path), "%s/b.bin", dir);
    Dataset ds;
    dataset_open(&ds, path);
    VLAConfig c = config_for_data("tiny", 0, &ds);
    ParamTable t;
    param_table_build(&c, &t);
    const int W = 3;
    size_t S = zero_shard_size(t.total, W, 1);
    unsigned char* seen = (unsigned char*)callocCheck(t.total, 1);
    int split = 0;
    for (int r = 0; r < W; r++) {
        for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
            size_t first, n = zero_part(t.spec[k].offset, t.spec[k].numel, (size_t)r * S, (size_t)(r + 1) * S, &first);
            for (size_t e = 0; e < n; e++) { seen[t.spec[k].offset + first + e]++; }
            split += n > 0 && n < t.spec[k].numel;
        }
    }
    int once = covered_once(seen, t.total);
    free(seen);
    check(once && split > 0 && S * W >= t.total && t.total % (size_t)W != 0, "%d shards of %zu cover the %zu parameters "
          "exactly once (%zu of padding in the last), %d tensor part(s) cut at a shard boundary", W, S, t.total,
          S * W - t.total, split);
    float* params[2];
    float losses[2][3];
    for (int z = 0; z < 2; z++) {
        TrainArgs args;
        train_args_defaults(&args);
        args.ranks = W; args.batch = 2; args.zero = z; args.steps = 3; args.warmup = 1; args.lr_base = 1e-3f;
        train_args_for_world(&args, W);
        params[z] = train_three_steps(&ds, &c, &args, losses[z]);
    }
    double ep = rel_error(params[1], params[0], t.total);
    check(rel_error(losses[1], losses[0], 3) < 1e-6 && ep < 1e-6, "-z 1 -g 3 vs -z 0 -g 3: parameters after 3 steps rel "
          "err %.2e (tol 1e-6)", ep);
    free(params[0]); free(params[1]);
    dataset_close(&ds);
}

// ----------------------------------------------------------------------------
// the multi-node bootstrap, between two processes on loopback

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

// Node `node` of 2 in a child process: node 0 hands out payload_in, node 1 (payload_in NULL)
// receives into its result. The result comes back through a pipe whose read end goes to
// *result_fd; only the child holds the write end, so a child that dies reads as end of file.
static pid_t boot_child(const char* master, BootIdentity id, int node, const uint8_t* payload_in, double timeout,
                        int* result_fd) {
    int fds[2];
    if (pipe(fds) != 0) { vla_fail("pipe failed: %s", strerror(errno)); }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        BootResult r;
        memset(&r, 0, sizeof(r));
        if (payload_in != NULL) { memcpy(r.payload, payload_in, sizeof(r.payload)); }
        id.node_rank = node;
        r.rc = bootstrap_exchange(master, &id, r.payload, sizeof(r.payload), timeout, r.err, sizeof(r.err));
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

static void test_bootstrap(const char* dir) {
    printf("\n== multi-node bootstrap over loopback\n");
    char path[1024];
    snprintf(path, sizeof(path), "%s/a.bin", dir);
    Dataset ds;
    dataset_open(&ds, path);
    VLAConfig c = config_for_data("tiny", 0, &ds);
    TrainArgs args;
    train_args_defaults(&args);
    args.ranks = 2;
    BootIdentity id = boot_identity(&args, &c, 0, 2, 0, ds.n_samples);
    char master[64];
    uint8_t secret[128];
    for (int i = 0; i < 128; i++) { secret[i] = (uint8_t)(i * 37 + 11); }
    for (int scenario = 0; scenario < 2; scenario++) {  // the same configuration; node 1 with another batch
        snprintf(master, sizeof(master), "127.0.0.1:%d", free_port());
        BootIdentity other = id;
        if (scenario == 1) { other.batch = 5; }
        int fd0, fd1;
        pid_t p1 = boot_child(master, other, 1, NULL, 10.0, &fd1);  // node 1 first: it retries until node 0 listens
        usleep(300000);
        pid_t p0 = boot_child(master, id, 0, secret, 10.0, &fd0);
        BootResult r0 = boot_collect(p0, fd0), r1 = boot_collect(p1, fd1);
        if (scenario == 0) {
            check(r0.rc == 0 && r1.rc == 0 && memcmp(r1.payload, secret, sizeof(secret)) == 0,
                  "node 1 (started first) receives node 0's 128-byte id over TCP (%s)", master);
        } else {
            check(r0.rc == 1 && strstr(r0.err, "node 1 disagrees with node 0 on batch 8 vs 5") != NULL && r1.rc == 1 &&
                  strstr(r1.err, "refused node 1") != NULL, "nodes that disagree both stop: node 0 says '%s'; node 1 '%s'",
                  r0.err, r1.err);
        }
    }
    // a connection that never says hello reaches node 0 before node 1: node 0 drops it after a few
    // seconds and takes node 1 within the timeout
    snprintf(master, sizeof(master), "127.0.0.1:%d", free_port());
    int fd0, fd1, silent = -1;
    pid_t p0 = boot_child(master, id, 0, secret, 10.0, &fd0);
    struct sockaddr_in to;
    memset(&to, 0, sizeof(to));
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)atoi(strchr(master, ':') + 1));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (double give_up = wall_seconds() + 5.0; silent < 0 && wall_seconds() < give_up;) {  // until node 0 listens
        silent = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(silent, (struct sockaddr*)&to, sizeof(to)) != 0) { close(silent); silent = -1; usleep(50000); }
    }
    pid_t p1 = boot_child(master, id, 1, NULL, 10.0, &fd1);
    BootResult r0 = boot_collect(p0, fd0), r1 = boot_collect(p1, fd1);
    if (silent >= 0) { close(silent); }
    check(silent >= 0 && r0.rc == 0 && r1.rc == 0 && memcmp(r1.payload, secret, sizeof(secret)) == 0,
          "a silent connection ahead of node 1 does not hold node 0 up: node 1 joins (node 0 '%s'; node 1 '%s')",
          r0.err, r1.err);
    // the port in use: someone else listens on it
    int port = free_port(), busy = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    int bound = bind(busy, (struct sockaddr*)&a, sizeof(a)) == 0 && listen(busy, 1) == 0;
    snprintf(master, sizeof(master), "127.0.0.1:%d", port);
    char err[512] = "";
    uint8_t payload[128];
    int rc = bootstrap_exchange(master, &id, payload, sizeof(payload), 2.0, err, sizeof(err));
    check(bound && rc == 1 && strstr(err, "the port is in use, pick another") != NULL, "node 0 on a port in use: '%s'", err);
    close(busy);
    // the master unreachable within the timeout
    snprintf(master, sizeof(master), "127.0.0.1:%d", free_port());
    BootIdentity node1 = id;
    node1.node_rank = 1;
    double t0 = wall_seconds();
    rc = bootstrap_exchange(master, &node1, payload, sizeof(payload), 1.0, err, sizeof(err));
    double waited = wall_seconds() - t0;
    check(rc == 1 && strstr(err, "could not reach the master") != NULL && waited >= 0.9 && waited < 5.0,
          "node 1 gives up on an unreachable master after its timeout (%.1f s): '%s'", waited, err);
    rc = bootstrap_exchange("nohost", &id, payload, sizeof(payload), 1.0, err, sizeof(err));
    check(rc == 1 && strstr(err, "expected host:port") != NULL, "a --master without a port: '%s'", err);
    static const char* const bad_ports[] = {"127.0.0.1:0", "127.0.0.1:70000"};
    for (int k = 0; k < 2; k++) {
        rc = bootstrap_exchange(bad_ports[k], &id, payload, sizeof(payload), 1.0, err, sizeof(err));
        check(rc == 1 && strstr(err, "port is out of range: pick one from 1 to 65535") != NULL,
              "a --master port outside 1..65535: '%s'", err);
    }
    // --min-lr-frac and --augment-shift are part of the identity: nodes that differ in them disagree
    TrainArgs changed = args;
    changed.min_lr_frac = 0.5f;
    BootIdentity a_id = boot_identity(&changed, &c, 1, 2, 0, ds.n_samples);
    changed = args;
    changed.augment = 4;
    BootIdentity b_id = boot_identity(&changed, &c, 1, 2, 0, ds.n_samples);
    char diff_a[192], diff_b[192];
    int differ_a = boot_identity_diff(&id, &a_id, diff_a, sizeof(diff_a));
    int differ_b = boot_identity_diff(&id, &b_id, diff_b, sizeof(diff_b));
    check(differ_a && strstr(diff_a, "min_lr_frac_bits") != NULL && differ_b && strstr(diff_b, "augment 0 vs 4") != NULL,
          "nodes that differ in --min-lr-frac or --augment-shift disagree: '%s'; '%s'", diff_a, diff_b);
    dataset_close(&ds);
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
// the prefetching loader and the augmentation

static int batches_equal(const Batch* a, const Batch* b, const VLAConfig* c) {
    size_t B = (size_t)a->B, HA = (size_t)c->chunk * c->action_dim;
    return memcmp(a->images, b->images, B * c->n_cam * c->img * c->img * 3) == 0 &&
           memcmp(a->text, b->text, B * c->max_text) == 0 &&
           memcmp(a->text_mask, b->text_mask, B * c->max_text * 4) == 0 &&
           memcmp(a->state, b->state, B * c->state_dim * 4) == 0 && memcmp(a->actions, b->actions, B * HA * 4) == 0 &&
           memcmp(a->action_mask, b->action_mask, B * c->chunk * 4) == 0 && memcmp(a->t, b->t, B * 4) == 0 &&
           memcmp(a->eps, b->eps, B * HA * 4) == 0;
}

static void test_loader(const char* dir) {
    printf("\n== loader\n");
    char path[1024];
    snprintf(path, sizeof(path), "%s/b.bin", dir);
    Dataset ds;
    dataset_open(&ds, path);
    VLAConfig c = config_for_data("tiny", 0, &ds);
    const int B = 3, W = 2, steps = 12;  // 72 samples: more than 3 epochs of the 22-frame fixture
    const uint64_t seed = 5, first_pos = 17, first_step = 40;
    Sampler s;
    sampler_init(&s, ds.n_samples, seed);
    Batch ref;
    batch_alloc(&ref, &c, B);
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
    check(all_same, "loader with 0, 1 and 3 worker threads gives the batches of direct assembly, bit for bit, "
          "over %d steps x %d ranks across epoch ends", steps, W);
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
    check(rank_same, "a rank's strided loader (every %d-th job from its rank) gives that rank's batches, bit for bit", W);

    // augmentation: off is the identity; on is a shift of every camera by at most k pixels
    uint64_t idx[B];
    batch_fill_indices(idx, &s, 0, 0, 0, B, 1, 0);
    Batch plain, shifted, again;
    batch_alloc(&plain, &c, B); batch_alloc(&shifted, &c, B); batch_alloc(&again, &c, B);
    batch_fill(&plain, &ds, &c, idx, seed, 3, 0, 0);
    batch_fill(&shifted, &ds, &c, idx, seed, 3, 0, 2);
    batch_fill(&again, &ds, &c, idx, seed, 3, 0, 2);
    size_t img_bytes = (size_t)c.n_cam * c.img * c.img * 3;
    check(batches_equal(&shifted, &again, &c), "augmentation is deterministic in (seed, step, sample)");
    int n = c.img, all_shifts = 1, moved = 0;
    for (int i = 0; i < B; i++) {
        for (int cam = 0; cam < c.n_cam; cam++) {
            const uint8_t* src = plain.images + i * img_bytes + (size_t)cam * n * n * 3;
            const uint8_t* dst = shifted.images + i * img_bytes + (size_t)cam * n * n * 3;
            int found = 0;
            for (int dy = -2; dy <= 2 && !found; dy++) {
                for (int dx = -2; dx <= 2 && !found; dx++) {
                    int match = 1;
                    for (int y = 0; y < n && match; y++) {
                        for (int x = 0; x < n && match; x++) {
                            int sy = y + dy < 0 ? 0 : (y + dy >= n ? n - 1 : y + dy);
                            int sx = x + dx < 0 ? 0 : (x + dx >= n ? n - 1 : x + dx);
                            match = memcmp(dst + ((size_t)y * n + x) * 3, src + ((size_t)sy * n + sx) * 3, 3) == 0;
                        }
                    }
                    if (match) { found = 1; moved += dx != 0 || dy != 0; }
                }
            }
            all_shifts &= found;
        }
    }
    check(all_shifts && moved > 0, "--augment-shift 2 shifts each camera image by at most 2 pixels (%d of %d moved)",
          moved, B * c.n_cam);
    check(memcmp(plain.state, shifted.state, B * c.state_dim * 4) == 0 &&
          memcmp(plain.eps, shifted.eps, (size_t)B * c.chunk * c.action_dim * 4) == 0,
          "augmentation changes only the images");
    batch_free(&plain); batch_free(&shifted); batch_free(&again); batch_free(&ref);
    sampler_free(&s);
    dataset_close(&ds);
}

// ----------------------------------------------------------------------------
// the real binary: checkpoints, bit-exact resume, bad input

static void test_checkpoints(const char* dir) {
    printf("\n== checkpoints and resume\n");
    char cmd[4096], p1[1024], p2[1024];
    // in-process round trip
    {
        snprintf(p1, sizeof(p1), "%s/a.bin", dir);
        Dataset ds;
        dataset_open(&ds, p1);
        VLAConfig c = config_for_data("tiny", 0, &ds);
        Model m;
        model_build(&m, &c);
        param_init(m.params_memory, &m.table, &c, 7);
        for (size_t i = 0; i < m.table.total; i++) { m.m_memory[i] = 0.5f * m.params_memory[i]; m.v_memory[i] = (float)i; }
        TrainArgs args;
        train_args_defaults(&args);
        snprintf(p2, sizeof(p2), "%s/ckpt_roundtrip", dir);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", p2);
        run_command(cmd);
        args.output = p2; args.seed = 7; args.keep = 6;
        for (int step = 1; step <= 6; step++) { model_save(&m, &ds, &args, step, 1000 + step); }
        uint64_t newest[1];
        check(checkpoint_list(p2, newest, 1) == 1 && newest[0] == 6, "asked for one, the checkpoint list gives the newest");
        run_command(cmd);  // empty the folder again
        args.keep = 2;
        for (int step = 1; step <= 3; step++) { model_save(&m, &ds, &args, step, 1000 + step); }
        Model m2;
        model_build(&m2, &c);
        int step;
        uint64_t seed, pos;
        char path[1100];
        checkpoint_path(path, sizeof(path), p2, 3);
        model_load(&m2, path, &step, &seed, &pos);
        size_t bytes = m.table.total * sizeof(float);
        check(step == 3 && seed == 7 && pos == 1003 && memcmp(m.params_memory, m2.params_memory, bytes) == 0 &&
              memcmp(m.m_memory, m2.m_memory, bytes) == 0 && memcmp(m.v_memory, m2.v_memory, bytes) == 0,
              "checkpoint round trip restores params, moments, step, seed, sampler position bit for bit");
        uint64_t steps[8];
        int n = checkpoint_list(p2, steps, 8);
        check(n == 2 && steps[0] == 3 && steps[1] == 2, "only the newest --keep 2 checkpoints remain (found %d)", n);
        // an incomplete newest file is skipped by resume
        checkpoint_path(path, sizeof(path), p2, 9);
        snprintf(cmd, sizeof(cmd), "head -c 1000 %s/ckpt_00000003.bin > %s", p2, path);
        run_command(cmd);
        n = checkpoint_list(p2, steps, 8);
        check(n == 2 && steps[0] == 3, "a truncated newest checkpoint is skipped when picking one to resume");
        model_free(&m); model_free(&m2);
        dataset_close(&ds);
    }
    check_resume_bit_exact(dir, "./train_vla_cpu -p tiny -b 4 -u 3 -t 1 --log-every 100", "train_vla_cpu");
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
    shard_write(path, 1, IMG, 4, 4, FRAMES, images, state, action, 2, eps, 2, tasks, stats);
    free(images);
    Dataset ds;
    dataset_open(&ds, path);
    int cut = dataset_warn_text_collisions(&ds, 16), full = dataset_warn_text_collisions(&ds, 18);
    int prefix = dataset_warn_text_collisions(&ds, 17);  // "slide the window " both: still one text
    check(cut == 1 && prefix == 1 && full == 0, "two instructions equal in their first 17 bytes collide at 16 and 17 "
          "bytes, not at 18 (%d, %d, %d)", cut, prefix, full);
    VLAConfig c = config_for_data("tiny", 18, &ds);
    check(c.max_text == 18 && vla_preset("tiny")->config.max_text == 16, "--max-text 18 overrides the preset's 16");
    dataset_close(&ds);
    // through the binary: the warning names both and the --max-text that separates them
    const char* base = "./train_vla_cpu -p tiny -b 2 -n 1 -u 1 -t 1 --workers 0";
    snprintf(out, sizeof(out), "%s/window_run.txt", dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/window_run && %s -i %s -o %s/window_run > %s 2>&1", dir, base, path, dir, out);
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
    // the checkpoint carries max_text: resuming without the flag is a one-line error that says so
    snprintf(cmd, sizeof(cmd), "%s -n 2 -y 1 -i %s -o %s/window_run > %s 2>&1", base, path, dir, out);
    rc = run_command(cmd);
    text = read_text(out);
    check(rc == 1 && strstr(text, "max_text 18 vs 16") != NULL && strstr(text, "--max-text") != NULL,
          "resuming it without --max-text 18 names the field: %s", strstr(text, "error:") ? strstr(text, "error:") : text);
    free(text);
}

static void expect_error(const char* dir, const char* what, const char* args, const char* needle) {
    expect_error_from(dir, "./train_vla_cpu", what, args, needle);
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

    // checkpoints: another config, truncated
    char out[1100];
    snprintf(out, sizeof(out), "%s/bad_ckpt", dir);
    snprintf(args, sizeof(args), "rm -rf %s && ./train_vla_cpu -p tiny -b 2 -n 1 -t 1 -i %s -o %s > /dev/null", out, src, out);
    run_command(args);
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 2 -t 1 -i %s/b.bin --init %s/ckpt_00000001.bin -o %s/bad_out", dir, out, dir);
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

// ----------------------------------------------------------------------------
// the parameter table

static void test_param_table(void) {
    printf("\n== parameter table\n");
    for (int i = 0; i < VLA_N_PRESETS; i++) {
        const VLAConfig* c = &VLA_PRESETS[i].config;
        ParamTable t;
        param_table_build(c, &t);
        size_t sum = 0, expected = 0;
        int contiguous = 1;
        for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
            contiguous &= t.spec[k].offset == sum;
            sum += t.spec[k].numel;
        }
        // closed form of the SPEC model's parameter count
        size_t d = c->d_model, da = c->d_expert, D = (size_t)vla_d_attn(c), L = c->n_layer;
        expected = d * vla_patch_dim(c) + d + (size_t)vla_n_image_tokens(c) * d + 256 * d +
                   da * c->state_dim + da + da * c->action_dim + da + 2 * da * da + da + da * da + da +
                   L * (2 * d + 4 * D * d + 3 * (size_t)c->d_ff * d) + L * (2 * da + 4 * D * da + 3 * (size_t)c->d_expert_ff * da) +
                   da + (size_t)c->action_dim * da + c->action_dim;
        check(vla_config_problem(c) == NULL && contiguous && sum == t.total && t.total == expected,
              "preset %-5s: %zu parameters, table contiguous and equal to the closed form", VLA_PRESETS[i].name, t.total);
        // the gradient buckets cover every parameter exactly once
        unsigned char* seen = (unsigned char*)callocCheck(t.total, 1);
        size_t offsets[NUM_PARAM_TENSORS], off[NUM_PARAM_TENSORS], cnt[NUM_PARAM_TENSORS];
        for (int k = 0; k < NUM_PARAM_TENSORS; k++) { offsets[k] = t.spec[k].offset; }
        for (int b = 0; b < param_bucket_count(c); b++) {
            int n = param_bucket_slices(&t, c, offsets, b, off, cnt);
            for (int k = 0; k < n; k++) {
                for (size_t e = 0; e < cnt[k]; e++) { seen[off[k] + e]++; }
            }
        }
        check(covered_once(seen, t.total), "preset %-5s: its %d gradient buckets hold every parameter exactly once", VLA_PRESETS[i].name,
              param_bucket_count(c));
        free(seen);
    }
}

// Issue 11's defects that a file or a flag can provoke in the reader (dev/test_hardening.sh runs
// the ones that need a full disk, a kill, a long path or a sanitizer).
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
    uint64_t u64 = h.off_episodes + 4;
    corrupt_copy(src, bad, offsetof(ShardHeader, off_episodes), &u64, 8, -1);
    expect_error(dir, "an unaligned section offset", args, "section episodes starts at offset");
    Shard shard;
    char err[VLA_PATH_MAX + 512];
    int rc = shard_open_checked(&shard, bad, err, sizeof(err));
    check(rc == 1 && shard.map == NULL && strstr(err, "not a multiple of 64") != NULL,
          "the reader returns the error and keeps nothing mapped: %s", err);

    // configs: every field bounded, sizes computed in checked 64-bit arithmetic
    VLAConfig c = vla_preset("tiny")->config;
    check(vla_config_problem(&c) == NULL && vla_param_count_checked(&c) > 0, "the tiny preset is a valid config");
    VLAConfig wrap = c;
    wrap.n_layer = 1 << 21; wrap.d_ff = 1 << 21; wrap.d_model = 1 << 22;  // vlm_wgate: 2^64 elements
    check(vla_param_count_checked(&wrap) == 0, "a parameter count that wraps 64 bits is caught (old count: %zu)",
          (size_t)wrap.n_layer * (size_t)wrap.d_ff * (size_t)wrap.d_model);
    const char* problem = vla_config_problem(&wrap);
    check(problem != NULL && strstr(problem, "d_model 4194304 is past its bound") != NULL, "and refused by its bound: %s",
          problem ? problem : "(accepted)");
    static const struct { int field; int32_t value; const char* needle; } cases[] = {
        {6, 5000, "chunk 5000 is past its bound 1024"},      {3, 1 << 30, "max_text 1073741824 is past its bound"},
        {2, 64, "patch 64 is past its bound 32"},           {12, 70000, "n_head 70000 is past its bound"},
        {0, 17, "n_cam 17 is past its bound 16"},           {1, 1 << 20, "img 1048576 is past its bound"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        VLAConfig b = c;
        ((int32_t*)&b)[cases[k].field] = cases[k].value;
        problem = vla_config_problem(&b);
        check(problem != NULL && strstr(problem, cases[k].needle) != NULL, "config field %d = %d: %s", cases[k].field,
              cases[k].value, problem ? problem : "(accepted)");
    }
    VLAConfig many = c;
    many.n_cam = 16; many.img = 1024; many.patch = 8;  // 262144 image tokens
    problem = vla_config_problem(&many);
    check(problem != NULL && strstr(problem, "tokens") != NULL, "too many tokens: %s", problem ? problem : "(accepted)");

    // checkpoints: fields that do not change the file's size, a step out of range
    snprintf(ck, sizeof(ck), "%s/bad_ckpt/ckpt_00000001.bin", dir);  // test_bad_input's run wrote it
    struct { long offset; uint64_t value; int bytes; const char* what; const char* needle; } fields[] = {
        {offsetof(CheckpointHeader, config) + offsetof(VLAConfig, chunk), 5000, 4, "chunk 5000", "chunk 5000 is past its bound"},
        {offsetof(CheckpointHeader, config) + offsetof(VLAConfig, max_text), 100000, 4, "max_text 100000",
         "max_text 100000 is past its bound"},
        {offsetof(CheckpointHeader, config) + offsetof(VLAConfig, n_layer), 0x7fffffff, 4, "n_layer 2^31 - 1",
         "n_layer 2147483647 is past its bound"},
        {offsetof(CheckpointHeader, step), UINT64_MAX, 8, "step -1 as signed", "says step 18446744073709551615"},
        {offsetof(CheckpointHeader, step), (1ULL << 32) + 1, 8, "step past 32 bits", "says step 4294967297"},
        {offsetof(CheckpointHeader, sampler_pos), 0, 8, "fewer samples than steps", "after 0 samples, out of range"},
        {256, 0x7fc00000, 4, "a NaN mean in the statistics", "normalization statistic 0 is nan"},
        {256 + 4 * 4, 0, 4, "a zero std in the statistics", "normalization statistic 4 is 0"},
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
    snprintf(args, sizeof(args), "%s -i %s --init %s -n 5 -o %s/bad_out", run, src, bad, dir);
    expect_error(dir, "a checkpoint past the run's end", args, "is at step 7, past this run's end (-n 5): pass -n above 7");

    // --init of something that is not a checkpoint file
    snprintf(args, sizeof(args), "%s -i %s --init %s -o %s/bad_out", run, src, dir, dir);
    expect_error(dir, "--init of a folder", args, "is a folder, not a checkpoint file: pass a ckpt_*.bin file");
    snprintf(args, sizeof(args), "%s -i %s --init /dev/zero -o %s/bad_out", run, src, dir);
    expect_error(dir, "--init of a device", args, "/dev/zero is a device, pipe or socket, not a checkpoint file");
    snprintf(args, sizeof(args), "%s -i /dev/zero -o %s/bad_out", run, dir);
    expect_error(dir, "-i of a device", args, "dataset shard /dev/zero is not a regular file");
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR   (make test writes the fixtures and runs this)\n", argv[0]);
        return 2;
    }
    const char* dir = argv[1];
    test_param_table();
    test_against_oracle(dir, "a");
    test_against_oracle(dir, "b");
    test_training_loop(dir);
    test_simulated_ranks(dir);
    test_world_args();
    test_zero(dir);
    test_bootstrap(dir);
    test_sampler();
    test_loader(dir);
    test_checkpoints(dir);
    test_max_text(dir);
    test_bad_input(dir);
    test_untrusted_files(dir);
    printf("\n%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
