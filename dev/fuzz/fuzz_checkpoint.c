// fuzz_checkpoint.c: the checkpoint reader on arbitrary bytes. Each input is one checkpoint file
// (version 2: SmolVLA's config, the train mode, every weight, the moments of the trainable domain):
// its header is checked (checkpoint_read_header, what -y 1 runs over every ckpt_*.bin of a folder),
// then it is read whole (checkpoint_read_checked, what --init, -y 1 and the policy library run),
// and an accepted checkpoint's parameter table and optimizer domain are laid over its weights and
// moments as the trainers lay them. A mutated file rarely keeps its CRC-32, so each input is read
// twice: as it is (the checksum refuses it) and resealed with the CRC its bytes have (the checks
// past the checksum, and acceptance, stay in reach).
#include "fuzz_util.h"
#include "../../vla/config.h"
#include "../../vla/atomic_file.h"
#include "../../vla/checkpoint.h"

static void read_checkpoint_input(const uint8_t* data, size_t size) {
    const char* path = fuzz_file(data, size);
    CheckpointHeader h;
    char err[VLA_PATH_MAX + 1024];
    int header_ok = checkpoint_read_header(path, &h, err, sizeof(err)) == 0;
    Checkpoint ck;
    if (checkpoint_read_checked(path, &ck, err, sizeof(err)) != 0) {
        if (header_ok && size >= sizeof(h) && h.file_size == size) {
            // a header that passed may fail only on its statistics, its checksum or non-finite weights
            if (strstr(err, "normalization statistic") == NULL && strstr(err, "checksum mismatch") == NULL &&
                strstr(err, "weights are not finite") == NULL) {
                abort();
            }
        }
        return;
    }
    FlowConfig header_config = ckpt_header_config(&h);
    if (!header_ok || flow_config_diff(&ck.config, &header_config) != NULL || ck.train_mode != h.train_mode) { abort(); }
    FlowParamTable t;
    flow_table_build(&ck.config, &t);
    FlowOptDomain d;
    flow_opt_domain(&t, ck.train_mode, &d);
    if (ck.n_params != t.total || ck.n_trainable != d.total) { abort(); }  // the counts the trainers lay out
    FlowParameters p;
    flow_point(&p, ck.params, &t);
    double sum = 0.0;  // the last weight of every tensor and the last moment of every trainable one, through the table
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        if (t.spec[i].numel == 0) { continue; }  // a tensor the family lacks
        sum += ck.params[t.spec[i].offset + t.spec[i].numel - 1];
        if (d.numel[i] > 0) { sum += ck.m[d.offset[i] + d.numel[i] - 1] + ck.v[d.offset[i] + d.numel[i] - 1]; }
    }
    sum += p.action_out_b[ck.config.max_action_dim - 1] + ck.stats[2 * (ck.config.state_dim + ck.config.action_dim) - 1];
    if (isnan(sum) && t.total == 0) { abort(); }
    checkpoint_free(&ck);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    read_checkpoint_input(data, size);
    CheckpointHeader h;
    if (size < sizeof(h)) { return 0; }
    memcpy(&h, data, sizeof(h));
    if ((h.flags & CKPT_FLAG_CRC) == 0) { return 0; }
    uint8_t* sealed = (uint8_t*)mallocCheck(size);
    memcpy(sealed, data, size);
    memset(sealed + offsetof(CheckpointHeader, crc), 0, sizeof(h.crc));
    uint32_t crc = crc32_update(0, sealed, size);
    memcpy(sealed + offsetof(CheckpointHeader, crc), &crc, sizeof(crc));
    read_checkpoint_input(sealed, size);
    free(sealed);
    return 0;
}
