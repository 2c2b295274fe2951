// fuzz_policy.c: the policy library's checkpoint load (libvla.so's vla_policy_load, what
// scripts/vla_policy.py calls) on arbitrary bytes. An accepted checkpoint also answers one
// observation (8x8 frames of every camera) when its model is small enough to run thousands of
// times a second: as a string (vla_policy_act: acts under the "bytes" tokenizer, refused under any
// other) and as token ids at both ends of the vocabulary (vla_policy_act_tokens: always acts).
#define VLA_LIBRARY
#include "fuzz_util.h"
#include "../../train_vla.c"
#include "../../vla/config.h"
#include "../../vla/atomic_file.h"
#include "../../vla/checkpoint.h"
#include "../../vla/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // a mutated file rarely keeps its CRC-32 (fuzz_checkpoint reads it as it is): here it is
    // resealed with the CRC its bytes have, so that loading and acting stay in reach
    uint8_t* sealed = (uint8_t*)mallocCheck(size > 0 ? size : 1);
    memcpy(sealed, data, size);
    if (size >= sizeof(CheckpointHeader)) {
        memset(sealed + offsetof(CheckpointHeader, crc), 0, 4);
        uint32_t crc = crc32_update(0, sealed, size);
        memcpy(sealed + offsetof(CheckpointHeader, crc), &crc, 4);
    }
    const char* path = fuzz_file(sealed, size);
    free(sealed);
    char err[VLA_PATH_MAX + 1024];
    VLAPolicy* p = vla_policy_load(path, 1, err, (int)sizeof(err));
    if (p == NULL) {
        if (err[0] == '\0') { abort(); }  // a refusal always says why
        return 0;
    }
    const FlowConfig* c = &p->model.config;
    int32_t config[FLOW_CONFIG_STORED + 2];
    vla_policy_config(p, config);
    if (config[0] != c->n_cam || config[FLOW_CONFIG_STORED] != p->facts.train_mode ||
        config[FLOW_CONFIG_STORED + 1] != c->family || vla_policy_tokenizer(p)[0] == '\0') {
        abort();
    }
    size_t vision_tokens = (size_t)c->n_cam * flow_grid(c) * flow_grid(c);
    if (flow_n_prefix(c) + c->chunk <= 96 && vision_tokens <= 64 && c->img <= 64 && p->model.table.total <= (1u << 16) &&
        (size_t)c->vis_layers + c->n_layer <= 8) {
        enum { SIDE = 8 };
        int32_t cam_hw[2 * VLA_MAX_CAM];
        const uint8_t* images[VLA_MAX_CAM];
        uint8_t* frame = (uint8_t*)callocCheck(SIDE * SIDE * 3, 1);
        for (int k = 0; k < c->n_cam; k++) { cam_hw[2 * k] = SIDE; cam_hw[2 * k + 1] = SIDE; images[k] = frame; }
        float* state = (float*)callocCheck((size_t)c->state_dim, sizeof(float));
        float* actions = (float*)mallocCheck((size_t)c->chunk * c->action_dim * sizeof(float));
        const char* text[1] = {"open the drawer"};
        int want = policy_takes_strings(vla_policy_tokenizer(p)) ? POLICY_OK : POLICY_NOT_BYTES;
        if (vla_policy_act(p, 1, cam_hw, images, text, state, NULL, 7, actions) != want) { abort(); }  // square frames fit
        int32_t ids[3] = {0, (c->vocab - 1) / 2, c->vocab - 1}, n_ids[1] = {3};
        if (vla_policy_act_tokens(p, 1, cam_hw, images, ids, n_ids, state, NULL, 7, actions) != POLICY_OK) { abort(); }
        free(frame); free(state); free(actions);
    }
    vla_policy_free(p);
    return 0;
}
