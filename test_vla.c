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
    int32_t* ref_tokens = (int32_t*)debug_get(&st, "batch/tokens", (size_t)B * c->max_text);
    check(memcmp(ref_images, batch.images, img_bytes) == 0 &&
          memcmp(ref_tokens, batch.tokens, (size_t)B * c->max_text * sizeof(int32_t)) == 0,
          "%s images and instruction token ids identical", name);
    free(ref_images); free(ref_tokens);
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
    return cameras_equal(&a->cams, &b->cams) && memcmp(a->images, b->images, B * cameras_frame_bytes(&a->cams)) == 0 &&
           memcmp(a->tokens, b->tokens, B * c->max_text * sizeof(int32_t)) == 0 &&
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
    Cameras cams = cameras_square(1, IMG);
    shard_write(path, &cams, 4, 4, FRAMES, images, state, action, 2, eps, 2, tasks, stats);
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

// ----------------------------------------------------------------------------
// shard format version 2 (token ids, cameras of their own sizes) and version 1 read as the same

// Writes n bytes at offset into an existing file
static void patch_file(const char* path, long offset, const void* data, size_t n) {
    FILE* f = fopenCheck(path, "r+b");
    fseek(f, offset, SEEK_SET);
    if (fwrite(data, 1, n, f) != n) { vla_fail("cannot patch %s", path); }
    fclose(f);
}

// Whether each camera of dst is camera of src shifted by at most k pixels (border replicated)
static int cameras_shifted(const uint8_t* src, const uint8_t* dst, const Cameras* cams, int k, int* moved) {
    int all = 1;
    for (int cam = 0; cam < cams->n; cam++) {
        int h = (int)cams->height[cam], w = (int)cams->width[cam], found = 0;
        const uint8_t* a = src + camera_offset(cams, cam);
        const uint8_t* b = dst + camera_offset(cams, cam);
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
               s1.h.n_tokens == s2.h.n_tokens && s1.h.vocab == s2.h.vocab && strcmp(s1.h.tokenizer, s2.h.tokenizer) == 0 &&
               memcmp(s1.h.cam_height, s2.h.cam_height, sizeof(s1.h.cam_height)) == 0 &&
               memcmp(s1.h.cam_width, s2.h.cam_width, sizeof(s1.h.cam_width)) == 0 &&
               memcmp(s1.token_offsets, s2.token_offsets, (s2.h.n_tasks + 1) * 8) == 0 &&
               memcmp(s1.tokens, s2.tokens, s2.h.n_tokens * 4) == 0 && memcmp(s1.images, s2.images, sizes[0]) == 0;
    check(s2.h.version == 2 && s1.h.version == 1 && strcmp(s2.h.tokenizer, "bytes") == 0 && s2.h.vocab == 256 && same,
          "a version-1 copy of b.bin reads as the same view: cameras %ux%u, tokenizer \"%s\" (vocabulary %u), %llu token "
          "ids, images", s1.h.cam_height[0], s1.h.cam_width[0], s1.h.tokenizer, s1.h.vocab,
          (unsigned long long)s1.h.n_tokens);
    check(s1.images >= s1.map && s1.images + sizes[0] <= s1.map + s1.map_size && s1.owned_tokens != NULL &&
          s2.owned_tokens == NULL, "version 1's frames are read in place from the mapped file (only its tokens are made)");
    shard_close(&s1);
    shard_close(&s2);
    Dataset d1, d2;
    dataset_open(&d1, v1);
    dataset_open(&d2, v2);
    VLAConfig c = config_for_data("tiny", 0, &d2);
    const int B = 4, steps = 6;
    Batch b1, b2;
    batch_alloc(&b1, &c, B);
    batch_alloc(&b2, &c, B);
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
    check(batches_same, "versions 1 and 2 of the same data give identical batches (%d steps of %d, shifted images)", steps, B);
    batch_free(&b1); batch_free(&b2);
    sampler_free(&s);
    dataset_close(&d1); dataset_close(&d2);
    // and identical training through the binary: the losses and the checkpoint
    const char* base = "./train_vla_cpu -p tiny -b 4 -n 3 -k 3 -t 1 --workers 1 --augment-shift 2";
    snprintf(cmd, sizeof(cmd), "rm -rf %s/run_v1 %s/run_v2 && %s -i %s -o %s/run_v1 > /dev/null 2>&1 && %s -i %s -o %s/run_v2 "
             "> /dev/null 2>&1", dir, dir, base, v1, dir, base, v2, dir);
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
          "train_vla_cpu on versions 1 and 2: identical losses (%.6f %.6f %.6f) and identical checkpoints", l2[0], l2[1], l2[2]);
    // the shipped data (data/metaworld_mt10.bin.xz) is version 1
    Shard mt10;
    rc = shard_open_checked(&mt10, "data/default/metaworld_mt10_000.bin", err, sizeof(err));
    check(rc == 0 && mt10.h.version == 1 && mt10.h.n_cam == 1 && mt10.h.cam_height[0] == 64 && mt10.h.cam_width[0] == 64 &&
          mt10.h.n_tasks == 10 && mt10.h.n_tokens == mt10.h.task_bytes && strcmp(mt10.h.tokenizer, "bytes") == 0,
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
            size_t at = (size_t)f * frame + camera_offset(&cams, cam), bytes = (size_t)cams.height[cam] * cams.width[cam] * 3;
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
    VLAConfig any = vla_preset("tiny")->config;  // (a model of other cameras: the loader reads only its text and chunk)
    any.state_dim = 3; any.action_dim = 2;
    Batch plain, shifted;
    batch_alloc_cameras(&plain, &any, &ds.cams, FRAMES);
    batch_alloc_cameras(&shifted, &any, &ds.cams, FRAMES);
    uint64_t idx[FRAMES] = {0, 1, 2, 3, 4, 5};
    batch_fill(&plain, &ds, &any, idx, 3, 1, 0, 0);
    batch_fill(&shifted, &ds, &any, idx, 3, 1, 0, 2);
    int all_shifted = 1, moved = 0;
    for (int i = 0; i < FRAMES; i++) {
        all_shifted &= cameras_shifted(plain.images + i * frame, shifted.images + i * frame, &cams, 2, &moved);
    }
    check(memcmp(plain.images, images, FRAMES * frame) == 0 && plain.tokens[0] == (int32_t)(uint8_t)tasks[1][0] &&
          plain.text_mask[11] == 1.0f && plain.text_mask[12] == 0.0f && plain.tokens[12] == 0 &&
          plain.tokens[4 * any.max_text] == 'S' && plain.text_mask[5 * any.max_text - 1] == 1.0f && all_shifted && moved > 0,
          "its batches hold the frames as written, the tokens of each task, and --augment-shift 2 shifts each camera "
          "within its own size (%d of %d moved)", moved, FRAMES * 2);
    batch_free(&plain); batch_free(&shifted);
    dataset_close(&ds);
    free(images);
    // today's model refuses cameras that are not square and of one size, naming the camera
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -t 1 -i %s -o %s/bad_out", path, dir);
    expect_error(dir, "two cameras of different sizes, one not square", args, "camera 1 of the dataset is 8x12 pixels "
                 "(height x width), but this model needs square cameras of one size");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -t 1 -i %s/square_sizes.bin -o %s/bad_out", dir, dir);
    snprintf(cmd, sizeof(cmd), "./data/synthetic -o %s/square_sizes.bin --cam-size 16x16 --cam-size 8x8 --episodes 2 "
             "--min-len 2 --max-len 3 > /dev/null", dir);
    rc = run_command(cmd);
    check(rc == 0, "data/synthetic --cam-size 16x16 --cam-size 8x8 writes cameras of two sizes");
    expect_error(dir, "two square cameras of different sizes", args, "camera 1 of the dataset is 8x8 pixels but camera 0 "
                 "is 16x16: this model needs square cameras of one size");

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
    expect_error(dir, "a tokenizer name without its NUL", args, "the tokenizer name is not NUL-terminated within its 64 bytes");
    u32 = 23;  // camera 0 of 23x24 and img 0: the cameras no longer add up to the images section
    corrupt_copy(v2, bad, offsetof(ShardHeader, cam_height), &u32, 4, -1);
    u32 = 0;
    patch_file(bad, offsetof(ShardHeader, img), &u32, 4);
    char needle[256];
    snprintf(needle, sizeof(needle), "the camera sizes (23x24, 24x24, height x width) make %llu frames %llu bytes of images",
             (unsigned long long)h.n_frames, (unsigned long long)h.n_frames * (23 * 24 + 24 * 24) * 3);
    expect_error(dir, "camera sizes that do not add up to the images section", args, needle);
    u32 = 25;
    corrupt_copy(v2, bad, offsetof(ShardHeader, cam_height), &u32, 4, -1);
    expect_error(dir, "img that disagrees with the camera sizes", args, "img 24 disagrees with the camera sizes (25x24, 24x24");
    u32 = 0;
    corrupt_copy(v2, bad, offsetof(ShardHeader, cam_width) + 4, &u32, 4, -1);
    expect_error(dir, "a camera 0 pixels wide", args, "camera 1 is 24x0 pixels (height x width), outside 1 to 4096");
    u32 = 24;
    corrupt_copy(v2, bad, offsetof(ShardHeader, cam_width) + 8, &u32, 4, -1);
    expect_error(dir, "a size for a camera the shard does not have", args, "camera 2 has a size (0x24) but the shard has 2");
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
    expect_error(dir, "a vocabulary past the model's text table", args, "a vocabulary of 49280, but this model's text "
                 "table has 256 rows");
    snprintf(args, sizeof(args), "-p tiny -b 2 -n 1 -t 1 -i %s,%s -o %s/bad_out", v2, bad, dir);
    expect_error(dir, "shards of two tokenizers", args, "has the token ids of tokenizer tokenizer.json:0123456789abcdef "
                 "(vocabulary 49280) but");
}

// ----------------------------------------------------------------------------
// SmolVLA against LeRobot 0.6.1 itself (dev/lerobot): for each training mode's case folder
// (expert, vlm, all), LeRobot's weights load by name, its batch runs through train_vla.c's
// SmolVLA section from the raw uint8 frames and token ids, and the prepared images, velocities,
// loss, every trainable gradient and the 10-step sampled chunk are checked against what LeRobot
// computed. The config comes from CASE/c_config.txt (dev/smolvla.py --c-config, made by make test).


static void test_smolvla_case(const char* ref_dir, int mode) {
    const char* name = TRAIN_MODE_NAMES[mode];
    char path[1024], err[512];
    double t0 = wall_seconds();
    printf("\n== SmolVLA vs LeRobot 0.6.1: %s/%s (train mode %s)\n", ref_dir, name, name);
    // fp32 against LeRobot's fp32: two roundings of the same few hundred dependent operations in
    // different orders (~1e-7 each); 1e-5 relative bounds their accumulated difference with margin
    const double tol = 1e-5;
    SmolVLAConfig c;
    snprintf(path, sizeof(path), "%s/%s/c_config.txt", ref_dir, name);
    int rc = smolvla_config_read(path, &c, err, sizeof(err));
    check(rc == 0, "%s: config from %s%s%s", name, path, rc ? ": " : "", rc ? err : "");
    if (rc != 0) { return; }
    SmolVLA m;
    smolvla_build(&m, &c);
    SafeTensors weights, ref;
    snprintf(path, sizeof(path), "%s/%s/policy/model.safetensors", ref_dir, name);
    rc = safetensors_open(&weights, path, err, sizeof(err)) || smolvla_load_safetensors(&weights, &c, &m.table, m.params_memory,
                                                                                         err, sizeof(err));
    check(rc == 0, "%s: LeRobot's weights load by name from %s%s%s", name, path, rc ? ": " : "", rc ? err : "");
    safetensors_close(&weights);
    snprintf(path, sizeof(path), "%s/%s/ref.safetensors", ref_dir, name);
    int rc_ref = safetensors_open(&ref, path, err, sizeof(err));
    check(rc_ref == 0, "%s: reference batch %s%s%s", name, path, rc_ref ? ": " : "", rc_ref ? err : "");
    if (rc != 0 || rc_ref != 0) { smolvla_free(&m); return; }

    // parameter counts: LeRobot's include lm_head (vocab x C), which the table leaves out (it feeds nothing)
    snprintf(path, sizeof(path), "%s/%s/case.json", ref_dir, name);
    char* info = read_text(path);
    long long total = json_int(info, "params_total"), trainable = json_int(info, "params_trainable");
    size_t lm_head = (size_t)c.vocab * c.d_model, ours = smolvla_trainable_count(&m.table, mode);
    check(total > 0 && m.table.total + lm_head == (size_t)total, "%s: %zu parameters + lm_head %zu = LeRobot's %lld", name,
          m.table.total, lm_head, total);
    check(trainable > 0 && ours == (size_t)trainable, "%s: %zu trainable, LeRobot's %lld", name, ours, trainable);

    // the batch, as LeRobot's pre-processor left it: raw frames, token ids, normalized state/actions
    char cams[VLA_MAX_CAM][64];
    int n_cams = json_strings(info, "camera_order", cams, VLA_MAX_CAM);
    int B = (int)json_int(info, "batch_size"), H = c.chunk, Am = c.max_action_dim;
    free(info);
    SmolInputs in;
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
    check(have, "%s: the batch (%d cameras, B %d, %d tokens) is in the reference file with the config's shapes", name, n_cams,
          B, c.max_text);
    if (have) {
        in.tokens = tokens; in.token_mask = token_mask; in.state = state; in.actions = actions;
        in.action_is_pad = action_is_pad; in.t = t; in.noise = noise;

        // forward: prepared images, velocities, loss
        float loss = smolvla_forward(&m, &in);
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
        smolvla_backward(&m, mode);
        t_bwd = wall_seconds() - t_bwd;
        const char* tower_names[3] = {"vision", "vlm", "expert"};
        double worst[3] = {0, 0, 0};
        char worst_name[3][256] = {"", "", ""};
        int n_slices[3] = {0, 0, 0}, n_frozen = 0, frozen_ok = 1, n_ref_grads = 0;
        for (int i = 0; i < ref.n; i++) { n_ref_grads += strncmp(ref.tensors[i].name, "grad.", 5) == 0; }
        for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
            const SmolParamSpec* s = &m.table.spec[i];
            size_t n = smolvla_slices(s), per = s->numel / n;
            for (size_t k = 0; k < n; k++) {
                char lname[256], key[300];
                if (s->slices == SLICES_NONE) { snprintf(lname, sizeof(lname), "%s", s->lerobot); }
                else { snprintf(lname, sizeof(lname), s->lerobot, smolvla_slice_layer(&c, s, (int)k)); }
                snprintf(key, sizeof(key), "grad.%s", lname);
                const float* ours_g = m.grads_memory + s->offset + k * per;
                float* ref_g = ref_tensor(&ref, key, per);
                if (smol_grad(&m, mode, i, (int)k) == NULL) {
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
                    check(0, "%s: %s rel err %.2e (tol %.0e)%s", name, key, e, tol, ref_g == NULL ? ": LeRobot has none" : "");
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
        check(frozen_ok && n_trained == n_ref_grads, "%s: %d frozen tensors have no gradient, in LeRobot and here (zero); "
              "LeRobot's %d gradients are the %d trained here", name, n_frozen, n_ref_grads, n_trained);

        // sampling: 10 Euler steps from sample_noise, the prefix computed once
        float* chunk = (float*)mallocCheck((size_t)B * H * Am * sizeof(float));
        double t_smp = wall_seconds();
        smolvla_sample(&m, &in, sample_noise, chunk);
        t_smp = wall_seconds() - t_smp;
        double ec = rel_error(chunk, ref_chunk, (size_t)B * H * Am);
        check(ec <= tol, "%s: chunk_norm (%d Euler steps) rel err %.2e (tol %.0e)", name, SMOLVLA_NUM_STEPS, ec, tol);
        free(chunk);
        printf("        (%s: %.0f ms in all, backward %.1f ms, sampling %.1f ms)\n", name, 1000.0 * (wall_seconds() - t0),
               1000.0 * t_bwd, 1000.0 * t_smp);
    }
    for (int k = 0; k < n_cams; k++) { free(frames[k]); }
    free(tokens); free(token_mask); free(state); free(actions); free(action_is_pad); free(t); free(noise);
    free(sample_noise); free(ref_v); free(ref_loss); free(ref_chunk);
    safetensors_close(&ref);
    smolvla_free(&m);
}

static void test_smolvla_lerobot(const char* ref_dir) {
    double t0 = wall_seconds();
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) { test_smolvla_case(ref_dir, mode); }
    printf("        (SmolVLA vs LeRobot: %.2f s)\n", wall_seconds() - t0);
}

// ----------------------------------------------------------------------------
// SmolVLA against its oracle dev/model_smolvla.py (float64), on shard data: for each training mode,
// the batch assembled from build/test/s.bin (two cameras of different sizes), the seeded init,
// velocities, loss, every trainable gradient, finite differences, sampling and 10 AdamW steps.

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

static void test_smolvla_oracle_mode(const char* dir, int mode) {
    const char* name = TRAIN_MODE_NAMES[mode];
    char path[1024];
    double t0 = wall_seconds();
    snprintf(path, sizeof(path), "%s/s_%s_state.bin", dir, name);
    printf("\n== SmolVLA vs dev/model_smolvla.py: %s (train mode %s)\n", path, name);
    DebugState st;
    debug_state_read(&st, path);

    // the config, hyperparameters and seed of the oracle's run
    SmolVLAConfig c;
    int32_t* values = (int32_t*)debug_get(&st, "config", 26);
    int f = 0;
#define SMOL_FROM_RECORD_(field) c.field = values[f++];
    SMOLVLA_CONFIG_FIELDS(SMOL_FROM_RECORD_)
#undef SMOL_FROM_RECORD_
    free(values);
    const char* problem = smolvla_config_problem(&c);
    check(problem == NULL && f == 26, "%s: config record (%d fields) %s", name, f, problem != NULL ? problem : "is valid");
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

    // the batch: the sampler's samples of step 0 through smolvla_batch_fill
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
    SmolBatch batch;
    smolvla_batch_alloc(&batch, &c, &ds.cams, B);
    smolvla_batch_fill(&batch, &ds, &c, idx, seed, 0, 0);
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
    check(memcmp(ref_tokens, batch.tokens, (size_t)B * c.max_text * sizeof(int32_t)) == 0, "%s: token ids (%d per sample) "
          "equal the oracle's", name, c.max_text);
    free(ref_tokens);
    // the float records are float32 computations of the same expressions (t and eps: doubles
    // rounded once): bit-equal in practice; 1e-7 absolute allows a different rounding of a normalization
    const double tol_batch = 1e-7;
    struct { const char* key; const float* ours; size_t n; } floats[] = {
        {"batch/token_mask", batch.token_mask, (size_t)B * c.max_text}, {"batch/state", batch.state, (size_t)B * c.max_state_dim},
        {"batch/actions", batch.actions, (size_t)B * H * Am}, {"batch/action_is_pad", batch.action_is_pad, (size_t)B * H},
        {"batch/t", batch.t, (size_t)B}, {"batch/eps", batch.eps, (size_t)B * H * Am},
    };
    for (size_t k = 0; k < sizeof(floats) / sizeof(floats[0]); k++) {
        float* ref = (float*)debug_get(&st, floats[k].key, floats[k].n);
        double e = max_abs_diff(floats[k].ours, ref, floats[k].n);
        check(e <= tol_batch, "%s: %s max abs diff %.1e%s (tol %.0e)", name, floats[k].key, e, e == 0.0 ? " (exact)" : "",
              tol_batch);
        free(ref);
    }

    // init from the seed: the same draws, rounded to float32 the same way: exact
    SmolVLA m;
    smolvla_build(&m, &c);
    smolvla_param_init(m.params_memory, &m.table, &c, seed);
    int init_ok = 1;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        const SmolParamSpec* s = &m.table.spec[i];
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
          (unsigned long long)seed, SMOLVLA_NUM_TENSORS);

    // forward and backward: fp32 against float64, a few hundred dependent roundings of ~6e-8 each
    const double tol = 1e-5;
    SmolInputs in = smolvla_inputs(&batch);
    float loss = smolvla_forward(&m, &in);
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
    smolvla_backward(&m, mode);
    double worst = 0.0;
    const char* worst_name = "";
    int n_trained = 0, grads_ok = 1;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        const SmolParamSpec* s = &m.table.spec[i];
        char key[96];
        snprintf(key, sizeof(key), "grad/%s", s->name);
        const Record* r = debug_lookup(&st, key);
        const float* ours = m.grads_memory + s->offset;
        if (smolvla_trainable_numel(s, mode) == 0) {
            int zero = 1;
            for (size_t j = 0; j < s->numel; j++) { zero &= ours[j] == 0.0f; }
            if (r != NULL || !zero) {
                grads_ok = 0;
                check(0, "%s: %s is frozen: the oracle has %s record, ours is %s", name, key, r ? "a" : "no", zero ? "zero" : "NOT zero");
            }
            continue;
        }
        n_trained++;
        double e = INFINITY;
        if (r != NULL && r->numel == s->numel) {
            float* ref = (float*)debug_get(&st, key, s->numel);
            if (i == SMOLP_vis_bk) {
                // zero by symmetry (softmax ignores a shift of a row's scores): both are rounding
                // noise, each measured against the query bias's gradient instead of the other
                float* ref_q = (float*)debug_get(&st, "grad/vis_bq", s->numel);
                double scale = norm2(ref_q, s->numel), e_ours = norm2(ours, s->numel) / scale;
                double e_ref = norm2(ref, s->numel) / scale;
                check(e_ours <= tol && e_ref <= tol, "%s: grad/vis_bk is zero by symmetry: |ours| %.1e, |oracle| %.1e of "
                      "|grad/vis_bq| (tol %.0e)", name, e_ours, e_ref, tol);
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
    check(grads_ok, "%s: %d trainable gradients (%zu elements): worst rel err %.2e (%s) (tol %.0e); the frozen ones zero",
          name, n_trained, smolvla_trainable_count(&m.table, mode), worst, worst_name, tol);

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
        const SmolParamSpec* s = i >= 0 && i < SMOLVLA_NUM_TENSORS ? &m.table.spec[i] : NULL;
        double e = INFINITY;
        if (s != NULL && fd_index[2 * k + 1] >= 0 && (size_t)fd_index[2 * k + 1] < s->numel) {
            float g = m.grads_memory[s->offset + (size_t)fd_index[2 * k + 1]];
            e = fabs((double)g - fd_value[k]) / fabs((double)fd_value[k]);
        }
        if (!(e <= tol_fd)) { fd_ok = 0; check(0, "%s: finite difference %d (%s) rel err %.2e (tol %.0e)", name, k, s ? s->name : "?", e, tol_fd); }
        if (!(e <= worst_fd)) { worst_fd = e; }
    }
    check(fd_ok, "%s: %d finite differences agree with our gradients: worst rel err %.2e (tol %.0e)", name, n_fd, worst_fd,
          tol_fd);
    free(fd_index); free(fd_value);

    // sampling: 10 Euler steps from the batch's eps, then un-normalized
    float* chunk = (float*)mallocCheck(n_out * sizeof(float));
    float* actions = (float*)mallocCheck((size_t)B * H * A * sizeof(float));
    smolvla_sample(&m, &in, batch.eps, chunk);
    for (size_t r = 0; r < (size_t)B * H; r++) {
        for (int d = 0; d < A; d++) { actions[r * A + d] = chunk[r * Am + d] * ds.action_std[d] + ds.action_mean[d]; }
    }
    float* ref_sample = (float*)debug_get(&st, "expect/sample", n_out);
    float* ref_actions = (float*)debug_get(&st, "expect/sample_actions", (size_t)B * H * A);
    double es = rel_error(chunk, ref_sample, n_out), ea = rel_error(actions, ref_actions, (size_t)B * H * A);
    check(es <= tol, "%s: sampled chunk (%d Euler steps) rel err %.2e (tol %.0e)", name, SMOLVLA_NUM_STEPS, es, tol);
    check(ea <= tol, "%s: sampled actions un-normalized rel err %.2e (tol %.0e)", name, ea, tol);
    free(chunk); free(actions); free(ref_sample); free(ref_actions);

    // 10 AdamW steps on this batch: the schedule, clipping and the moments of the trainable prefix
    float losses[10], norms[10];
    for (int step = 0; step < 10; step++) { losses[step] = smolvla_train_step(&m, &in, mode, step, &args, &norms[step]); }
    float* ref_losses = (float*)debug_get(&st, "expect/losses", 10);
    float* ref_norms = (float*)debug_get(&st, "expect/norms", 10);
    double els = rel_error(losses, ref_losses, 10), ens = rel_error(norms, ref_norms, 10);
    check(els <= tol, "%s: 10 AdamW steps' losses %.6f .. %.6f rel err %.2e (tol %.0e)", name, losses[0], losses[9], els, tol);
    check(ens <= tol, "%s: their gradient norms %.6f .. %.6f rel err %.2e (tol %.0e)", name, norms[0], norms[9], ens, tol);
    check(m.opt.total == smolvla_trainable_count(&m.table, mode), "%s: AdamW's moments cover the %zu trainable elements "
          "only (of %zu)", name, m.opt.total, m.table.total);
    int frozen_still = 1;  // the frozen part of every tensor (past its trainable prefix) never moved
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        const SmolParamSpec* s = &m.table.spec[i];
        size_t first = smolvla_trainable_numel(s, mode);
        char key[96];
        snprintf(key, sizeof(key), "param/%s", s->name);
        float* init = (float*)debug_get(&st, key, s->numel);
        frozen_still &= memcmp(init + first, m.params_memory + s->offset + first, (s->numel - first) * sizeof(float)) == 0;
        free(init);
    }
    check(frozen_still, "%s: the %zu frozen elements are bit for bit their init after the 10 steps", name,
          m.table.total - m.opt.total);
    free(ref_losses); free(ref_norms);
    printf("        (%s: %.0f ms)\n", name, 1000.0 * (wall_seconds() - t0));

    smolvla_free(&m);
    smolvla_batch_free(&batch);
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

int main(int argc, char** argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s FIXTURE_DIR [LEROBOT_REF_DIR]   (make test writes both and runs this; the second adds "
                "the SmolVLA checks against LeRobot)\n", argv[0]);
        return 2;
    }
    const char* dir = argv[1];
    test_param_table();
    test_against_oracle(dir, "a");
    test_against_oracle(dir, "b");
    test_smolvla_oracle(dir);
    if (argc == 3) { test_smolvla_lerobot(argv[2]); }
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
    test_shard_versions(dir);
    printf("\n%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
