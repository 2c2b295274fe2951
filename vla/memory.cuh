/*
vla/memory.cuh: the device memory of train_vla.cu's model, computed without allocating it: what
--memory's table and the largest-batch search plan with, and what smolvla_build and
smolvla_set_batch check and carve against. Included by train_vla.cu right after the activation
table (SMOLVLA_GPU_ACTIVATIONS); uses floatX, NORM_BLOCKS, LOSS_SCALER and LOSS_SCALING from it.
*/
#ifndef VLA_MEMORY_CUH
#define VLA_MEMORY_CUH

// What smolvla_build allocates on a GPU beside the activations, part by part, for ZeRO-1 over
// shard_world ranks (1: off): the weights (floatX, every tensor), the fp32 gradients of what trains
// (the whole domain on every rank), the fp32 master weights and AdamW's two moments (one shard each),
// and the rest (the norm's partial sums, the RoPE table, fp16's loss scale).
enum { MEM_WEIGHTS = 0, MEM_GRADS = 1, MEM_MASTER = 2, MEM_MOMENTS = 3, MEM_OTHER = 4, MEM_PARTS = 5 };
static const char* const MEM_PART_NAMES[MEM_PARTS] = {"weights", "gradients", "master", "moments", "other"};
static void smolvla_model_parts(const SmolVLAConfig* c, int mode, int shard_world, size_t parts[MEM_PARTS]) {
    SmolParamTable t;
    SmolOptDomain d;
    smolvla_table_build(c, &t);
    smolvla_opt_domain(&t, mode, &d);
    size_t shard = zero_shard_size(d.total, shard_world, 16), n_train = shard * shard_world, n_params = n_train;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) { n_params += (t.spec[i].numel - d.numel[i] + 15) / 16 * 16; }
    size_t rope = (size_t)(smolvla_n_prefix(c) + smolvla_n_suffix(c)) * (c->head_dim / 2) * 2;
    parts[MEM_WEIGHTS] = n_params * sizeof(floatX);
    parts[MEM_GRADS] = n_train * sizeof(float);
    parts[MEM_MASTER] = shard * sizeof(float);
    parts[MEM_MOMENTS] = 2 * shard * sizeof(float);
    parts[MEM_OTHER] = (NORM_BLOCKS + rope) * sizeof(float) + (LOSS_SCALING ? LOSS_SCALER * sizeof(float) : 0);
}

// Device bytes smolvla_build allocates on one GPU without ZeRO-1, activations aside (smolvla_act_bytes):
// what --memory plans with; smolvla_build checks it holds exactly this
static size_t smolvla_model_bytes(const SmolVLAConfig* c, int mode, int shard_world = 1) {
    size_t parts[MEM_PARTS], total = 0;
    smolvla_model_parts(c, mode, shard_world, parts);
    for (int k = 0; k < MEM_PARTS; k++) { total += parts[k]; }
    return total;
}

// The elements one activation tensor of n takes in its type's allocation: rounded up to 64 bytes,
// so that every tensor starts 16-byte aligned (smolvla_set_batch carves by the same rule)
static inline size_t smolvla_act_slot_x(size_t n) { return (n * sizeof(floatX) + 63) / 64 * 64 / sizeof(floatX); }
static inline size_t smolvla_act_slot_4(size_t n) { return (n + 15) / 16 * 16; }  // (float, int)

// The activations' elements of each type for B samples
static void smolvla_act_counts(const SmolVLAConfig* c, int mode, int B, int rc, size_t* nx, size_t* nf, size_t* ni) {
    *nx = *nf = *ni = 0;
#define SMOL_SIZE_X_(nm, n) *nx += smolvla_act_slot_x(n);
#define SMOL_SIZE_F_(nm, n) *nf += smolvla_act_slot_4(n);
#define SMOL_SIZE_I_(nm, n) *ni += smolvla_act_slot_4(n);
    SMOLVLA_GPU_ACTIVATIONS(SMOL_SIZE_X_, SMOL_SIZE_F_, SMOL_SIZE_I_, c, B, mode, rc)
#undef SMOL_SIZE_X_
#undef SMOL_SIZE_F_
#undef SMOL_SIZE_I_
}

// Device bytes of the activations smolvla_set_batch allocates for B samples
static size_t smolvla_act_bytes(const SmolVLAConfig* c, int mode, int B, int rc = RECOMPUTE_NONE) {
    size_t nx, nf, ni;
    smolvla_act_counts(c, mode, B, rc, &nx, &nf, &ni);
    return nx * sizeof(floatX) + nf * sizeof(float) + ni * sizeof(int);
}

#endif  // VLA_MEMORY_CUH
