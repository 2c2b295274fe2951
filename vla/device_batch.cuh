/*
vla/device_batch.cuh: the device side of train_vla.cu's data path. It owns the device batches (one
buffer in the host batch's layout, so a batch is one copy), the model's inputs read from one, the
pinning of the loader's ring, the upload of the next batch on the copy stream, and TaskLosses, the
per-task losses --balance tasks logs. task_losses_add, which launches kernels, stays in train_vla.cu:
the emulation rewrites the launches of that file only.

Included by train_vla.cu after the model and its data-parallel section (dist_sum); it uses
main_stream, copy_stream, cudaCheck and the loader (vla/loader.h).
*/

// Device copy of a host batch's layout (smolvla_batch_layout: each camera's frames at their stored
// size, tokens, state, actions, pads, t, noise); the host slot and this buffer are copied in one go.
static void device_batch_alloc(SmolVLA* m, SmolBatch* dev, const Cameras* cams, int B) {
    size_t bytes = smolvla_batch_layout(dev, NULL, &m->config, cams, B);
    smolvla_batch_layout(dev, (uint8_t*)smolvla_device_malloc(m, bytes), &m->config, cams, B);
}

// The model's inputs from a device batch (the first b->B samples of its layout)
static SmolInputs smolvla_inputs(const SmolBatch* b) {
    SmolInputs in;
    memset(&in, 0, sizeof(in));
    in.B = b->B;
    for (int k = 0; k < b->cams.n; k++) {
        in.frames[k] = b->images[k];
        in.frame_h[k] = (int)b->cams.height[k];
        in.frame_w[k] = (int)b->cams.width[k];
    }
    in.frame_stride = 0;  // each camera's frames packed
    in.tokens = b->tokens; in.token_mask = b->token_mask; in.state = b->state;
    in.actions = b->actions; in.action_is_pad = b->action_is_pad; in.t = b->t; in.noise = b->eps;
    return in;
}

// Pins the loader's ring of host batches so copies from them are asynchronous.
static void loader_pin(Loader* L, int pin) {
    for (int k = 0; k < L->n_slots; k++) {
        if (pin) { cudaCheck(cudaHostRegister(L->slots[k].memory, L->slots[k].bytes, cudaHostRegisterDefault)); }
        else { cudaCheck(cudaHostUnregister(L->slots[k].memory)); }
    }
}

// --balance tasks' per-task losses of a rank (TaskLosses): the task of each sample goes up with its
// batch; after each forward the samples' squared errors and valid entries are added to their
// tasks' sums on the device; at the end of the step the sums are added over the ranks and become
// each task's mean loss over its valid entries in the whole global batch, as train_vla_cpu logs it.
typedef struct {
    const TaskBalance* tb;  // NULL: none kept
    const Dataset* ds;
    int T, B;
    int* host_task;         // (2, B) the tasks of the batch being uploaded into device batch k (host)
    int* dev_task;          // (2, B) device: device batch k's
    float* sample_sums;     // (B, 2) device: the last forward's per-sample sums
    float* task_sums;       // (T, 2) device: the step's per-task sums (squared errors, valid entries)
    float* host_sums;       // (T, 2)
    double* task_loss;      // (T) the step's mean per task (NaN: no valid entry), what the log writes
} TaskLosses;

static void task_losses_init(TaskLosses* tl, const TaskBalance* tb, const Dataset* ds, int B) {
    memset(tl, 0, sizeof(*tl));
    if (tb == NULL) { return; }
    tl->tb = tb; tl->ds = ds; tl->T = tb->n_tasks; tl->B = B;
    tl->host_task = (int*)mallocCheck(2 * (size_t)B * sizeof(int));
    tl->host_sums = (float*)mallocCheck(2 * (size_t)tl->T * sizeof(float));
    tl->task_loss = (double*)mallocCheck((size_t)tl->T * sizeof(double));
    cudaCheck(cudaMalloc(&tl->dev_task, 2 * (size_t)B * sizeof(int)));
    cudaCheck(cudaMalloc(&tl->sample_sums, 2 * (size_t)B * sizeof(float)));
    cudaCheck(cudaMalloc(&tl->task_sums, 2 * (size_t)tl->T * sizeof(float)));
}

static void task_losses_free(TaskLosses* tl) {
    if (tl->tb == NULL) { return; }
    free(tl->host_task); free(tl->host_sums); free(tl->task_loss);
    cudaCheck(cudaFree(tl->dev_task)); cudaCheck(cudaFree(tl->sample_sums)); cudaCheck(cudaFree(tl->task_sums));
}

// At the end of the step (after the update): the per-task sums added over the ranks, and copied
// for task_losses_read once the step's scalars are read (which waits for the main stream)
static void task_losses_reduce(TaskLosses* tl, SmolVLA* m) {
    if (tl->tb == NULL) { return; }
    dist_sum(m->dist, tl->task_sums, 2 * (size_t)tl->T);
    cudaCheck(cudaMemcpyAsync(tl->host_sums, tl->task_sums, 2 * (size_t)tl->T * sizeof(float), cudaMemcpyDeviceToHost,
                              main_stream));
}

static void task_losses_read(TaskLosses* tl) {
    if (tl->tb == NULL) { return; }
    cudaCheck(cudaStreamSynchronize(main_stream));
    for (int t = 0; t < tl->T; t++) {
        float n = tl->host_sums[2 * t + 1];
        tl->task_loss[t] = n > 0.0f ? (double)tl->host_sums[2 * t] / (double)n : NAN;
    }
}

// Starts copying the loader's next batch into dev (device batch k) on the copy stream, once the
// compute that last read dev is done (`consumed`, recorded on the main stream; a fresh event is no
// wait); `uploaded` fires when the batch has landed, with its samples' tasks when tl keeps them.
static void batch_upload(Loader* L, SmolBatch* dev, cudaEvent_t consumed, cudaEvent_t uploaded, TaskLosses* tl, int k) {
    SmolBatch* host = loader_next(L);
    cudaCheck(cudaStreamWaitEvent(copy_stream, consumed, 0));
    cudaCheck(cudaMemcpyAsync(dev->memory, host->memory, host->bytes, cudaMemcpyHostToDevice, copy_stream));
    if (tl->tb != NULL) {
        // (the previous copy from this slot of host_task landed before dev's last use: the step loop
        // waits for each upload before starting the next)
        int* task = tl->host_task + (size_t)k * tl->B;
        const uint64_t* idx = loader_indices(L);
        for (int b = 0; b < tl->B; b++) { task[b] = task_balance_task_of(tl->tb, tl->ds, idx[b]); }
        cudaCheck(cudaMemcpyAsync(tl->dev_task + (size_t)k * tl->B, task, (size_t)tl->B * sizeof(int),
                                  cudaMemcpyHostToDevice, copy_stream));
    }
    cudaCheck(cudaEventRecord(uploaded, copy_stream));
}
