// fuzz_checkpoint.c: the checkpoint reader on arbitrary bytes. Each input is one checkpoint file:
// its header is checked (checkpoint_read_header, what -y 1 runs over every ckpt_*.bin of a folder),
// then it is read whole (checkpoint_read_checked, what --init, -y 1 and the policy library run),
// and an accepted checkpoint's parameter table is laid over its weights as the trainers lay it.
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_file(data, size);
    CheckpointHeader h;
    char err[VLA_PATH_MAX + 1024];
    int header_ok = checkpoint_read_header(path, &h, err, sizeof(err)) == 0;
    Checkpoint ck;
    if (checkpoint_read_checked(path, &ck, err, sizeof(err)) != 0) {
        if (header_ok && size >= sizeof(h) && h.file_size == size) {
            // a header that passed may fail only on its statistics
            if (strstr(err, "normalization statistic") == NULL) { abort(); }
        }
        return 0;
    }
    if (!header_ok || vla_config_diff(&ck.config, &h.config) != NULL) { abort(); }  // the two readers disagree
    ParamTable t;
    param_table_build(&ck.config, &t);
    ParameterTensors p;
    param_tensors_point(&p, ck.params, &t);
    double sum = 0.0;  // the last element of every tensor, read through the table
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { sum += ck.params[t.spec[i].offset + t.spec[i].numel - 1]; }
    sum += p.action_out_b[ck.config.action_dim - 1] + ck.m[t.total - 1] + ck.v[t.total - 1];
    if (isnan(sum) && t.total == 0) { abort(); }
    checkpoint_free(&ck);
    return 0;
}
