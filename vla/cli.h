/*
vla/cli.h: the command line: TrainArgs, its defaults, getopt_long's parse (-h lists every option
with its default), the settings a world size implies, and when checkpoints are due. Needs
config.h, sampler.h, loss_scale.h and checkpoint.h.
*/
#ifndef VLA_CLI_H
#define VLA_CLI_H

#include "common.h"
#include "config.h"
#include "sampler.h"
#include "loss_scale.h"
#include "checkpoint.h"
#include <getopt.h>

// ----------------------------------------------------------------------------
// command line

typedef struct {
    const char* input;      // shards: files and folders, comma-separated
    const char* output;     // output folder: checkpoints and the log
    const char* preset;     // -p: the model's sizes (a run from a checkpoint without -p takes the checkpoint's)
    int preset_given;       // -p was given
    int train_mode;  // --train: TRAIN_MODE_*, what trains (unless given: the checkpoint's, else the preset's default)
    int train_given;        // --train was given
    int recompute;          // --recompute: RECOMPUTE_*, what the GPU trainer's backward runs again (none on the CPU)
    int memory;             // --memory: print the activation memory table and exit (the GPU trainer)
    int profile;  // --profile STEP: time that step's GPU work by phase and operation (the GPU trainer), 0: off
    int max_text;           // --max-text: instruction tokens the model reads, 0: the checkpoint's or the preset's
    const char* init;       // checkpoint to start from (weights, optimizer, step; weights alone with weights_only)
    int weights_only;       // --weights-only: from --init's weights alone (fine-tuning: step 0, fresh optimizer)
    int batch;              // per-rank micro-batch
    int ranks;              // GPUs (CUDA) or simulated ranks (CPU)
    int total_batch;        // -d: samples per optimizer step over all ranks and micro-steps, 0: batch x ranks
    int lr_scale;           // LR_SCALE_*: how the peak learning rate grows with the world size
    int accum;              // micro-steps per optimizer step, from -d (train_args_for_world)
    int zero;               // -z 1: ZeRO-1, the optimizer state sharded over the ranks
    int nodes, node_rank;   // machines of the run and this one's place (Slurm's environment by default)
    const char* master;     // host:port of node 0, where the other nodes fetch NCCL's unique id
    const char* bind;       // --bind: the address node 0 listens on, NULL: the one --master names
    const char* run_token;  // --run-token or VLA_RUN_TOKEN: the secret every node proves at the start, NULL: none
    float bootstrap_timeout;  // seconds the nodes wait for each other at the start
    float nccl_timeout;       // seconds one step may take (collectives included) before the run is aborted as hung
    float lr_base;          // -l as given; lr is it scaled by --lr-scale (train_args_for_world)
    int steps;              // optimizer steps in total
    float lr, min_lr_frac, weight_decay, grad_clip;
    int decay_on;           // --decay-on: DECAY_ON_*, the tensors AdamW's weight decay acts on
    int warmup;
    uint64_t seed;
    int resume;             // -y 1: continue from the newest complete checkpoint in output
    int new_run;            // --new-run: move the run the output folder holds into previous_<N>/ and start anew
    int ckpt_every, keep;
    int no_checkpoint;      // --no-checkpoint: write none (benchmarks); the run's weights are not kept
    int log_every;
    int threads;            // OpenMP threads, 0: the runtime's default
    int workers;            // data loader threads, 0: assemble in the training thread
    int augment;            // random image shift in pixels, 0: off
    int balance;            // --balance: BALANCE_*, the sampler's sequence
    const char* task_weights;  // --task-weights: one whole number per task, NULL: equal
    uint64_t balance_id;    // the trainer's TaskBalance fingerprint once built (checkpoints record it), 0: none
    float loss_scale;       // --loss-scale: fp16 builds' initial dynamic loss scale
    int loss_scale_window;  // --loss-scale-window: clean steps before the scale doubles
    int eval_every;         // --eval-every N: evaluate each N-th step's checkpoint in the background, 0: off
    const char* eval_cmd;   // --eval-cmd: the evaluation's command, NULL: Meta-World (vla/evaluation.h)
    uint64_t given;         // the options given on the command line: bit k, TRAIN_ARGS_OPTIONS[k] (train_args_given)
} TrainArgs;

#define VLA_OUTPUT_ROOT "out"  // the default output folder is out/<preset>

enum { LR_SCALE_NONE = 0, LR_SCALE_LINEAR = 1, LR_SCALE_SQRT = 2 };
static const char* const LR_SCALE_NAMES[] = {"none", "linear", "sqrt"};
#define LR_SCALE_COUNT ((int)(sizeof(LR_SCALE_NAMES) / sizeof(LR_SCALE_NAMES[0])))

#define VLA_MAX_RUN_TOKEN 256  // bytes of --run-token (HMAC hashes it to 32 anyway)

static inline void train_args_defaults(TrainArgs* a) {
    memset(a, 0, sizeof(*a));
    a->input = "data/default";
    a->output = VLA_OUTPUT_ROOT "/<preset>";  // (train_args_parse names the preset)
    a->preset = "small";
    a->train_mode = TRAIN_MODE_ALL;  // the default preset's
    a->max_text = 0;
    a->init = NULL;
    a->batch = 8; a->ranks = 1; a->steps = 1000;
    a->total_batch = 0; a->lr_scale = LR_SCALE_NONE; a->accum = 1; a->zero = 0;
    a->nodes = 1; a->node_rank = 0; a->master = NULL; a->bootstrap_timeout = 120.0f; a->nccl_timeout = 600.0f;
    a->bind = NULL; a->run_token = NULL;
    a->lr = 3e-4f; a->min_lr_frac = 0.1f; a->weight_decay = 0.01f; a->grad_clip = 1.0f;
    a->decay_on = DECAY_ON_MATRICES;
    a->lr_base = a->lr;
    a->warmup = 100;
    a->seed = 1337;
    a->resume = 0; a->ckpt_every = 200; a->keep = 3; a->log_every = 1; a->threads = 0;
    a->workers = 2; a->augment = 0;
    a->loss_scale = VLA_LOSS_SCALE_DEFAULT; a->loss_scale_window = VLA_LOSS_SCALE_WINDOW_DEFAULT;
}

// Builds without dynamic loss scaling (train_vla_cpu, train_vla in bf16 or fp32) refuse its flags
// rather than ignore them: `what` names the build.
static inline void train_args_no_loss_scale(const TrainArgs* a, const char* what) {
    if (a->loss_scale != VLA_LOSS_SCALE_DEFAULT || a->loss_scale_window != VLA_LOSS_SCALE_WINDOW_DEFAULT) {
        vla_fail("--loss-scale and --loss-scale-window are for fp16 mixed precision; %s does not scale the loss: drop "
                 "them, or build train_vla with PRECISION=FP16", what);
    }
}

static inline void train_args_usage(const char* prog) {
    TrainArgs d;
    train_args_defaults(&d);
    printf("usage: %s [options]\n", prog);
    printf("  -i, --input LIST       dataset shards: files or folders of *.bin, comma-separated (%s)\n", d.input);
    printf("  -o, --output DIR       the run's folder: checkpoints, log.jsonl, run.json (its settings), TensorBoard's\n"
           "                         events (%s)\n", d.output);
    printf("  -p, --preset NAME      model size:");
    for (int i = 0; i < FLOW_N_PRESETS; i++) { printf(" %s", FLOW_PRESETS[i].name); }
    printf(" (%s)\n", d.preset);
    printf("      --train MODE       what trains: expert (the action expert; LeRobot's train_expert_only), vlm (also\n"
           "                         the VLM but its vision tower: freeze_vision_encoder; SmolVLA's last VLM layer\n"
           "                         and final norm never train), all (everything); default: expert for smolvla,\n"
           "                         all for pi0 (LeRobot's defaults) and the presets trained from scratch\n");
    printf("      --recompute LEVEL  activation recomputation (train_vla): none (keep every activation), attn (run\n"
           "                         each layer's attention half again in the backward), layer (keep each layer's\n"
           "                         input alone, run the layer again): less memory for one more forward (%s)\n",
           RECOMPUTE_NAMES[d.recompute]);
    printf("      --memory           train_vla: print the activation memory per --train and --recompute at a few\n"
           "                         batch sizes for -p's model, and the largest batch that fits, then exit\n");
    printf("      --profile STEP     train_vla: time step STEP's GPU work by phase (vision, VLM, expert, optimizer..)\n"
           "                         and operation (matmul, attention, norms..), the products' shapes and TFLOP/s\n"
           "                         too, and print the tables after the run (STEP > the first, which warms up)\n");
    printf("      --max-text N       instruction tokens the model reads (longer ones are cut), 0: the preset's (%d)\n",
           d.max_text);
    printf("  -b, --batch N          samples per rank per step (%d)\n", d.batch);
    printf("  -g, --gpus N           ranks: GPUs for train_vla, simulated ranks for train_vla_cpu (%d)\n", d.ranks);
    printf("  -d, --total-batch N    samples per optimizer step over all ranks; a multiple of -b x ranks, the rest\n"
           "                         accumulated over micro-steps; 0: -b x ranks (%d)\n", d.total_batch);
    printf("  -n, --steps N          optimizer steps in total (%d)\n", d.steps);
    printf("  -l, --lr X             peak learning rate (%g)\n", d.lr);
    printf("      --lr-scale MODE    grow the peak learning rate with the world size: none, linear, sqrt (%s)\n",
           LR_SCALE_NAMES[d.lr_scale]);
    printf("  -z, --zero 0|1         1: ZeRO-1, AdamW state and master weights sharded over the ranks (%d)\n", d.zero);
    printf(
        "      --nodes N          machines of a multi-node run; -g GPUs on each (%d; Slurm's SLURM_NNODES when set)\n",
        d.nodes);
    printf("      --node-rank R      this machine's place, 0 .. N-1 (%d; Slurm's SLURM_NODEID when set)\n",
           d.node_rank);
    printf("      --master HOST:PORT node 0's address and a free port (VLA_MASTER, or MASTER_ADDR and MASTER_PORT)\n");
    printf(
        "      --bind ADDR        the address node 0 listens on, 0.0.0.0 for all (default: the one --master names)\n");
    printf(
        "      --run-token T      a secret every node must give alike (VLA_RUN_TOKEN; 1 to %d bytes): a host without\n"
        "                         it cannot join the run or stop its start (not set)\n",
        VLA_MAX_RUN_TOKEN);
    printf("      --bootstrap-timeout S  seconds the nodes wait for each other at the start (%g)\n",
           d.bootstrap_timeout);
    printf("      --nccl-timeout S   seconds one step may take (collectives included) before the run is aborted (%g)\n",
           d.nccl_timeout);
    printf("      --min-lr-frac X    cosine floor as a fraction of the peak (%g)\n", d.min_lr_frac);
    printf("  -u, --warmup N         linear warmup steps (%d)\n", d.warmup);
    printf("  -w, --weight-decay X   AdamW's decoupled weight decay, see --decay-on (%g)\n", d.weight_decay);
    printf("      --decay-on WHAT    what the weight decay acts on: matrices (linear weights and embeddings), all\n"
           "                         (every trainable tensor, biases and norms too: LeRobot's AdamW) (%s)\n",
           DECAY_ON_NAMES[d.decay_on]);
    printf("  -c, --clip X           global gradient-norm clip, 0 disables (%g)\n", d.grad_clip);
    printf("  -s, --seed N           seed for init, sampler and flow noise (%llu)\n", (unsigned long long)d.seed);
    printf("  -y, --resume 0|1       1: continue from the newest complete checkpoint in the output folder, with the\n"
           "                         settings its run.json recorded and the flags given (%d)\n", d.resume);
    printf("      --new-run          start anew in an output folder that holds a run: its checkpoints and log move\n"
           "                         into <output>/previous_<N>/ (nothing is deleted)\n");
    printf(
        "      --init FILE        start from this checkpoint (weights, optimizer, step, sampler, seed: it "
        "continues)\n");
    printf(
        "      --weights-only     with --init: its weights alone (fine-tuning: step 0, fresh optimizer, this run's "
        "seed\n"
        "                         and the dataset's statistics; its sizes, and cameras and dims from the dataset)\n");
    printf("  -k, --ckpt-every N     checkpoint every N steps and at the end, 0: only at the end (%d)\n", d.ckpt_every);
    printf("      --keep N           checkpoints kept in the output folder (%d)\n", d.keep);
    printf("      --no-checkpoint    write no checkpoint, not even at the end or on Ctrl-C (benchmarks: the weights\n"
           "                         trained are not kept)\n");
    printf("      --eval-every N     checkpoint each N-th step and evaluate it (and the last) in the background, at\n"
           "                         the lowest CPU priority; results go to log.jsonl and TensorBoard; 0: off (%d)\n",
           d.eval_every);
    printf("      --eval-cmd CMD     the evaluation's shell command: {checkpoint}, {step} and {results} (the JSON\n"
           "                         object of numbers it writes) are put in (Meta-World's MT10, 5 episodes a task,\n"
           "                         through scripts/eval_metaworld.py)\n");
    printf("      --log-every N      print a step line every N steps (%d)\n", d.log_every);
    printf("  -t, --threads N        OpenMP threads, 0: runtime default (%d)\n", d.threads);
    printf("      --workers N        data loader threads filling a ring of batches ahead of the trainer (%d)\n",
           d.workers);
    printf("      --augment-shift N  random image shift of up to N pixels per camera, 0: off (%d)\n", d.augment);
    printf("      --balance MODE     none: every sample once per epoch; tasks: every global batch draws the tasks\n"
           "                         in equal proportion (or --task-weights'), each task's samples in turn (%s)\n",
           BALANCE_NAMES[d.balance]);
    printf("      --task-weights W   with --balance tasks: one whole number per task, comma-separated (1,3: three\n"
           "                         samples of task 1 per one of task 0); default equal\n");
    printf("      --loss-scale S     fp16 builds (PRECISION=FP16): the initial dynamic loss scale (%g)\n",
           d.loss_scale);
    printf("      --loss-scale-window N  fp16 builds: clean steps before the loss scale doubles; a step with Inf/NaN\n"
           "                         gradients is skipped and halves it (%d)\n", d.loss_scale_window);
    printf("  -h, --help             this message\n");
}

static inline long parse_int_arg(const char* name, const char* s, long lo, long hi) {
    char* end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        vla_fail("--%s %s: expected an integer in [%ld, %ld]", name, s, lo, hi);
    }
    return v;
}

static inline float parse_float_arg(const char* name, const char* s, float lo, float hi) {
    char* end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) {
        vla_fail("--%s %s: expected a number in [%g, %g]", name, s, lo, hi);
    }
    return v;
}

// --master "host:port" or "[ipv6]:port" into host and port; NULL on success, else what is wrong with it.
// train_args_parse checks it early, bootstrap_exchange splits it.
static inline const char* boot_parse_master(const char* master, char* host, size_t size, char* port, size_t port_size) {
    const char* bad_form = "expected host:port (node 0's address and a free port)";
    const char* colon = strrchr(master, ':');
    if (colon == NULL || colon == master || colon[1] == '\0') { return bad_form; }
    const char* h = master;
    size_t n = (size_t)(colon - master);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') { h++; n -= 2; }
    if (n == 0 || n >= size || strlen(colon + 1) >= port_size) { return bad_form; }
    memcpy(host, h, n);
    host[n] = '\0';
    snprintf(port, port_size, "%s", colon + 1);
    for (const char* p = port; *p; p++) {
        if (*p < '0' || *p > '9') { return bad_form; }
    }
    // getaddrinfo would take 0 as "any port" and wrap 65536 and up: refuse them here
    long number = strtol(port, NULL, 10);
    if (number < 1 || number > 65535) { return "the port is out of range: pick one from 1 to 65535"; }
    return NULL;
}

// The options, long names first: train_args_parse reads them, TrainArgs.given records which were
// given (bit k: TRAIN_ARGS_OPTIONS[k]), and run.json (run_record.h) keys the settings by these names.
enum { OPT_MIN_LR = 1000, OPT_INIT, OPT_KEEP, OPT_LOG_EVERY, OPT_WORKERS, OPT_AUGMENT, OPT_LR_SCALE, OPT_NODES,
       OPT_NODE_RANK, OPT_MASTER, OPT_BOOT_TIMEOUT, OPT_NCCL_TIMEOUT, OPT_MAX_TEXT, OPT_TRAIN, OPT_WEIGHTS_ONLY,
       OPT_BALANCE, OPT_TASK_WEIGHTS, OPT_RECOMPUTE, OPT_MEMORY, OPT_LOSS_SCALE, OPT_LOSS_SCALE_WINDOW, OPT_PROFILE,
       OPT_NO_CHECKPOINT, OPT_NEW_RUN, OPT_DECAY_ON, OPT_BIND, OPT_RUN_TOKEN, OPT_EVAL_EVERY, OPT_EVAL_CMD };
static const struct option TRAIN_ARGS_OPTIONS[] = {  // at most 64 (TrainArgs.given)
    {"input", required_argument, 0, 'i'},        {"output", required_argument, 0, 'o'},
    {"preset", required_argument, 0, 'p'},       {"batch", required_argument, 0, 'b'},
    {"gpus", required_argument, 0, 'g'},         {"steps", required_argument, 0, 'n'},
    {"lr", required_argument, 0, 'l'},           {"min-lr-frac", required_argument, 0, OPT_MIN_LR},
    {"warmup", required_argument, 0, 'u'},       {"weight-decay", required_argument, 0, 'w'},
    {"decay-on", required_argument, 0, OPT_DECAY_ON},
    {"clip", required_argument, 0, 'c'},         {"seed", required_argument, 0, 's'},
    {"resume", required_argument, 0, 'y'},       {"init", required_argument, 0, OPT_INIT},
    {"new-run", no_argument, 0, OPT_NEW_RUN},
    {"weights-only", no_argument, 0, OPT_WEIGHTS_ONLY},
    {"ckpt-every", required_argument, 0, 'k'},   {"keep", required_argument, 0, OPT_KEEP},
    {"no-checkpoint", no_argument, 0, OPT_NO_CHECKPOINT},
    {"log-every", required_argument, 0, OPT_LOG_EVERY}, {"threads", required_argument, 0, 't'},
    {"workers", required_argument, 0, OPT_WORKERS}, {"augment-shift", required_argument, 0, OPT_AUGMENT},
    {"total-batch", required_argument, 0, 'd'},  {"lr-scale", required_argument, 0, OPT_LR_SCALE},
    {"zero", required_argument, 0, 'z'},         {"nodes", required_argument, 0, OPT_NODES},
    {"node-rank", required_argument, 0, OPT_NODE_RANK}, {"master", required_argument, 0, OPT_MASTER},
    {"bootstrap-timeout", required_argument, 0, OPT_BOOT_TIMEOUT},
    {"bind", required_argument, 0, OPT_BIND},    {"run-token", required_argument, 0, OPT_RUN_TOKEN},
    {"nccl-timeout", required_argument, 0, OPT_NCCL_TIMEOUT},
    {"max-text", required_argument, 0, OPT_MAX_TEXT}, {"train", required_argument, 0, OPT_TRAIN},
    {"balance", required_argument, 0, OPT_BALANCE}, {"task-weights", required_argument, 0, OPT_TASK_WEIGHTS},
    {"recompute", required_argument, 0, OPT_RECOMPUTE}, {"memory", no_argument, 0, OPT_MEMORY},
    {"profile", required_argument, 0, OPT_PROFILE},
    {"eval-every", required_argument, 0, OPT_EVAL_EVERY}, {"eval-cmd", required_argument, 0, OPT_EVAL_CMD},
    {"loss-scale", required_argument, 0, OPT_LOSS_SCALE},
    {"loss-scale-window", required_argument, 0, OPT_LOSS_SCALE_WINDOW},
    {"help", no_argument, 0, 'h'},               {0, 0, 0, 0}};

// Whether option `name` (its long name) was given on the command line
static inline int train_args_given(const TrainArgs* a, const char* name) {
    for (int k = 0; TRAIN_ARGS_OPTIONS[k].name != NULL; k++) {
        if (k < 64 && strcmp(TRAIN_ARGS_OPTIONS[k].name, name) == 0) { return (int)((a->given >> k) & 1); }
    }
    return 0;
}

static inline void train_args_parse(TrainArgs* a, int argc, char** argv) {
    train_args_defaults(a);
    opterr = 0;
    optind = 1;
    int opt, nodes_given = 0, rank_given = 0, ckpt_given = 0;
    while ((opt = getopt_long(argc, argv, ":i:o:p:b:g:d:n:l:u:w:c:s:y:k:t:z:h", TRAIN_ARGS_OPTIONS, NULL)) != -1) {
        switch (opt) {
            case 'i': a->input = optarg; break;
            case 'o': a->output = optarg; break;
            case 'p':
                if (flow_preset(optarg) == NULL) {
                    vla_fail("unknown preset '%s': use tiny, small, smolvla, pi0_tiny, pi0_small or pi0", optarg);
                }
                a->preset = optarg;
                a->preset_given = 1;
                break;
            case 'b': a->batch = (int)parse_int_arg("batch", optarg, 1, 1 << 20); break;
            case 'g': a->ranks = (int)parse_int_arg("gpus", optarg, 1, 1024); break;
            case 'd': a->total_batch = (int)parse_int_arg("total-batch", optarg, 0, 1 << 30); break;
            case 'z': a->zero = (int)parse_int_arg("zero", optarg, 0, 1); break;
            case OPT_NODES: a->nodes = (int)parse_int_arg("nodes", optarg, 1, 4096); nodes_given = 1; break;
            case OPT_NODE_RANK: a->node_rank = (int)parse_int_arg("node-rank", optarg, 0, 4095); rank_given = 1; break;
            case OPT_MASTER: a->master = optarg; break;
            case OPT_BIND: a->bind = optarg; break;
            case OPT_RUN_TOKEN: a->run_token = optarg; break;
            case OPT_BOOT_TIMEOUT:
                a->bootstrap_timeout = parse_float_arg("bootstrap-timeout", optarg, 0.1f, 1e6f);
                break;
            case OPT_NCCL_TIMEOUT: a->nccl_timeout = parse_float_arg("nccl-timeout", optarg, 0.1f, 1e7f); break;
            case OPT_TRAIN:
                a->train_mode = train_mode_parse(optarg);
                if (a->train_mode < 0) { vla_fail("--train %s: use expert, vlm or all", optarg); }
                a->train_given = 1;
                break;
            case OPT_RECOMPUTE:
                a->recompute = recompute_parse(optarg);
                if (a->recompute < 0) { vla_fail("--recompute %s: use none, attn or layer", optarg); }
                break;
            case OPT_MEMORY: a->memory = 1; break;
            case OPT_PROFILE: a->profile = (int)parse_int_arg("profile", optarg, 1, VLA_MAX_STEPS); break;
            case OPT_BALANCE:
                for (a->balance = 0; a->balance < BALANCE_COUNT && strcmp(optarg, BALANCE_NAMES[a->balance]) != 0;
                     a->balance++) {}
                if (a->balance == BALANCE_COUNT) { vla_fail("--balance %s: use none or tasks", optarg); }
                break;
            case OPT_TASK_WEIGHTS: a->task_weights = optarg; break;
            case OPT_MAX_TEXT: a->max_text = (int)parse_int_arg("max-text", optarg, 0, VLA_MAX_TEXT); break;
            case OPT_LR_SCALE:
                for (a->lr_scale = 0; a->lr_scale < LR_SCALE_COUNT && strcmp(optarg, LR_SCALE_NAMES[a->lr_scale]) != 0;
                     a->lr_scale++) {}
                if (a->lr_scale == LR_SCALE_COUNT) { vla_fail("--lr-scale %s: use none, linear or sqrt", optarg); }
                break;
            case 'n': a->steps = (int)parse_int_arg("steps", optarg, 1, VLA_MAX_STEPS); break;
            case 'l': a->lr = parse_float_arg("lr", optarg, 0.0f, 10.0f); break;
            case OPT_MIN_LR: a->min_lr_frac = parse_float_arg("min-lr-frac", optarg, 0.0f, 1.0f); break;
            case 'u': a->warmup = (int)parse_int_arg("warmup", optarg, 0, 1L << 30); break;
            case 'w': a->weight_decay = parse_float_arg("weight-decay", optarg, 0.0f, 10.0f); break;
            case OPT_DECAY_ON:
                for (a->decay_on = 0; a->decay_on < DECAY_ON_COUNT && strcmp(optarg, DECAY_ON_NAMES[a->decay_on]) != 0;
                     a->decay_on++) {}
                if (a->decay_on == DECAY_ON_COUNT) { vla_fail("--decay-on %s: use matrices or all", optarg); }
                break;
            case 'c': a->grad_clip = parse_float_arg("clip", optarg, 0.0f, 1e9f); break;
            case 's': a->seed = (uint64_t)parse_int_arg("seed", optarg, 0, 0x7fffffffffffffffL); break;
            case 'y': a->resume = (int)parse_int_arg("resume", optarg, 0, 1); break;
            case OPT_INIT: a->init = optarg; break;
            case OPT_NEW_RUN: a->new_run = 1; break;
            case OPT_WEIGHTS_ONLY: a->weights_only = 1; break;
            case 'k': a->ckpt_every = (int)parse_int_arg("ckpt-every", optarg, 0, 1L << 30); ckpt_given = 1; break;
            case OPT_NO_CHECKPOINT: a->no_checkpoint = 1; break;
            case OPT_EVAL_EVERY: a->eval_every = (int)parse_int_arg("eval-every", optarg, 0, 1L << 30); break;
            case OPT_EVAL_CMD: a->eval_cmd = optarg; break;
            case OPT_KEEP: a->keep = (int)parse_int_arg("keep", optarg, 1, 4096); break;
            case OPT_LOG_EVERY: a->log_every = (int)parse_int_arg("log-every", optarg, 1, 1L << 30); break;
            case 't': a->threads = (int)parse_int_arg("threads", optarg, 0, 4096); break;
            case OPT_WORKERS: a->workers = (int)parse_int_arg("workers", optarg, 0, 256); break;
            case OPT_AUGMENT: a->augment = (int)parse_int_arg("augment-shift", optarg, 0, 1024); break;
            case OPT_LOSS_SCALE: a->loss_scale = parse_float_arg("loss-scale", optarg, 1.0f, VLA_LOSS_SCALE_MAX); break;
            case OPT_LOSS_SCALE_WINDOW:
                a->loss_scale_window = (int)parse_int_arg("loss-scale-window", optarg, 1, VLA_LOSS_SCALE_WINDOW_MAX);
                break;
            case 'h': train_args_usage(argv[0]); exit(0);
            case ':': vla_fail("option %s needs a value: see %s -h", argv[optind - 1], argv[0]);
            default: vla_fail("unknown option %s: see %s -h", argv[optind - 1], argv[0]);
        }
        for (int k = 0; TRAIN_ARGS_OPTIONS[k].name != NULL; k++) {
            if (k < 64 && TRAIN_ARGS_OPTIONS[k].val == opt) { a->given |= 1ULL << k; }
        }
    }
    if (optind < argc) {
        vla_fail("unexpected argument '%s': options take the form -x VALUE, see %s -h", argv[optind], argv[0]);
    }
    if (a->resume && a->init != NULL) { vla_fail("-y 1 and --init both pick a checkpoint: use one of them"); }
    if (a->resume && a->new_run) {
        vla_fail("-y 1 continues the run in %s and --new-run moves it aside to start anew: use one of them", a->output);
    }
    if (a->weights_only && a->init == NULL) {
        vla_fail("--weights-only takes the weights of --init FILE: give the checkpoint to fine-tune from with --init");
    }
    if (a->eval_cmd != NULL && a->eval_every == 0) {
        vla_fail("--eval-cmd is the command --eval-every runs: add --eval-every N (the steps between evaluations)");
    }
    if (a->eval_every > 0 && a->no_checkpoint) {
        vla_fail("--eval-every evaluates checkpoints and --no-checkpoint writes none: drop one of the two");
    }
    if (a->no_checkpoint && ckpt_given) {
        vla_fail("--no-checkpoint writes no checkpoint and -k %d asks for them: drop one of the two", a->ckpt_every);
    }
    if (!a->train_given) { a->train_mode = flow_default_train_mode(a->preset); }
    if (a->task_weights != NULL && a->balance != BALANCE_TASKS) {
        vla_fail("--task-weights %s weighs the tasks of --balance tasks: add --balance tasks", a->task_weights);
    }
    if (a->task_weights != NULL) {  // the form and the sum now, the count once the dataset is open
        uint32_t* w = (uint32_t*)mallocCheck((strlen(a->task_weights) / 2 + 1) * sizeof(uint32_t));
        task_weights_parse(a->task_weights, w, (int)(strlen(a->task_weights) / 2 + 1));
        free(w);
    }
    // the default folder is the preset's: runs of the presets one after another do not meet
    static char default_output[64];
    if (!train_args_given(a, "output")) {
        snprintf(default_output, sizeof(default_output), "%s/%s", VLA_OUTPUT_ROOT, a->preset);
        a->output = default_output;
    }
    size_t out_len = strlen(a->output);
    if (out_len == 0 || out_len + VLA_CKPT_NAME_MAX >= VLA_PATH_MAX) {
        vla_fail(
            "-o of %zu bytes: the output folder's path must be 1 to %d bytes long (checkpoint names follow it): use a "
            "shorter one",
            out_len, VLA_PATH_MAX - 1 - VLA_CKPT_NAME_MAX);
    }
    a->lr_base = a->lr;
    // a Slurm allocation of several nodes: its node count, this node's place, the master from the
    // environment (the sbatch script in scripts/ sets VLA_MASTER); flags override it
    const char* slurm_nodes = getenv("SLURM_NNODES");
    const char* slurm_id = getenv("SLURM_NODEID");
    if (!nodes_given && slurm_nodes != NULL) {
        a->nodes = (int)parse_int_arg("nodes (SLURM_NNODES)", slurm_nodes, 1, 4096);
    }
    if (!rank_given && slurm_id != NULL && a->nodes > 1) {
        a->node_rank = (int)parse_int_arg("node-rank (SLURM_NODEID)", slurm_id, 0, 4095);
    }
    static char master_env[300];
    if (a->master == NULL && getenv("VLA_MASTER") != NULL) { a->master = getenv("VLA_MASTER"); }
    if (a->master == NULL && getenv("MASTER_ADDR") != NULL && getenv("MASTER_PORT") != NULL) {
        snprintf(master_env, sizeof(master_env), "%s:%s", getenv("MASTER_ADDR"), getenv("MASTER_PORT"));
        a->master = master_env;
    }
    if (a->node_rank >= a->nodes) {
        vla_fail("--node-rank %d with --nodes %d: node ranks go from 0 to %d", a->node_rank, a->nodes, a->nodes - 1);
    }
    if (a->nodes > 1 && a->master == NULL) {
        vla_fail("--nodes %d needs --master HOST:PORT (node 0's address and a free port), or VLA_MASTER", a->nodes);
    }
    char host[256], port[16];
    const char* problem = a->nodes > 1 ? boot_parse_master(a->master, host, sizeof(host), port, sizeof(port)) : NULL;
    if (problem != NULL) { vla_fail("--master %s: %s", a->master, problem); }
    if (a->bind != NULL && a->bind[0] == '\0') {
        vla_fail("--bind is empty: give the address node 0 listens on (one of its own, or 0.0.0.0 for all of them)");
    }
    // the token itself never goes into a message: it is a secret
    const char* token_from = a->run_token != NULL ? "--run-token" : "VLA_RUN_TOKEN";
    if (a->run_token == NULL && a->nodes > 1) {
        a->run_token = getenv("VLA_RUN_TOKEN");
    }  // (one node has no use for it)
    if (a->run_token != NULL && (a->run_token[0] == '\0' || strlen(a->run_token) > VLA_MAX_RUN_TOKEN)) {
        vla_fail("%s is %s: give every node the same token of 1 to %d bytes (e.g. openssl rand -hex 16)", token_from,
                 a->run_token[0] == '\0' ? "empty" : "too long", VLA_MAX_RUN_TOKEN);
    }
}

// For a run of `world` ranks (GPUs over all nodes, or simulated ranks): the micro-steps per
// optimizer step that -d asks for, and the peak learning rate scaled by --lr-scale.
static inline void train_args_for_world(TrainArgs* a, int world) {
    int64_t per_micro = (int64_t)a->batch * world;
    if (per_micro > (1 << 30)) {
        vla_fail("-b %d x %d rank(s) is %lld samples per step, past the bound 2^30: use a smaller batch", a->batch,
                 world, (long long)per_micro);
    }
    if (a->total_batch == 0) {
        a->accum = 1;
    } else if (a->total_batch % per_micro != 0) {
        vla_fail("-d %d is not a multiple of -b %d x %d rank(s) = %lld: make the total batch one", a->total_batch,
                 a->batch, world, (long long)per_micro);
    } else {
        a->accum = (int)(a->total_batch / per_micro);
    }
    float factor = a->lr_scale == LR_SCALE_LINEAR ? (float)world
                   : a->lr_scale == LR_SCALE_SQRT ? sqrtf((float)world)
                                                  : 1.0f;
    a->lr = a->lr_base * factor;
}

// Whether a checkpoint is written once `done` steps are: every -k steps, at the end, and when the
// run was stopped early; never with --no-checkpoint
static inline int train_ckpt_due(const TrainArgs* a, int done, int stopped) {
    if (a->no_checkpoint) { return 0; }
    return (a->ckpt_every > 0 && done % a->ckpt_every == 0) || done == a->steps || stopped ||
           (a->eval_every > 0 && done % a->eval_every == 0);  // (what --eval-every evaluates)
}

// The end of a failed run's error about what it leaves: "the last checkpoint in DIR (step N) is
// intact, continue with -y 1" when the folder holds one, else that it holds none to continue from.
static inline const char* train_checkpoint_left(const char* dir, char* buf, size_t size) {
    uint64_t steps[1];
    if (checkpoint_list(dir, steps, 1) == 1) {
        snprintf(buf, size, "the last checkpoint in %s (step %llu) is intact, continue with -y 1 -o %s",
                 dir, (unsigned long long)steps[0], dir);
    } else {
        snprintf(buf, size, "%s holds no checkpoint to continue from", dir);
    }
    return buf;
}

// What a run stopped by a signal (INT, TERM, HUP) at step `step` prints: where its last step went,
// or that --no-checkpoint kept nothing. A signal after the last step stopped nothing: the run is
// complete (its last checkpoint written). Returns the exit status: 130 interrupted, 0 complete.
static inline int train_report_interrupt(const TrainArgs* a, int step) {
    if (step >= a->steps) {
        printf("the run is complete: all %d steps done%s%s (the signal came after the last step)\n", a->steps,
               a->no_checkpoint ? ", no checkpoint written (--no-checkpoint)" : ", the last checkpoint is in ",
               a->no_checkpoint ? "" : a->output);
        return 0;
    }
    if (a->no_checkpoint) {
        printf("interrupted at step %d: no checkpoint written (--no-checkpoint)\n", step);
    } else {
        printf("interrupted: saved step %d to %s; continue with -y 1 -o %s\n", step, a->output, a->output);
    }
    return 130;
}

// Samples per optimizer step: the effective batch
static inline int64_t train_global_batch(const TrainArgs* a, int world) { return (int64_t)a->batch * world * a->accum; }

#endif  // VLA_CLI_H
