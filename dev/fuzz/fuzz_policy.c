// fuzz_policy.c: the policy library's checkpoint load (libvla.so's vla_policy_load, what
// scripts/vla_policy.py calls) on arbitrary bytes. An accepted checkpoint also answers one
// observation (vla_policy_act) when its model is small enough to run thousands of times a second.
#define VLA_LIBRARY
#include "fuzz_util.h"
#include "../../train_vla.c"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_file(data, size);
    char err[VLA_PATH_MAX + 1024];
    VLAPolicy* p = vla_policy_load(path, 1, err, (int)sizeof(err));
    if (p == NULL) {
        if (err[0] == '\0') { abort(); }  // a refusal always says why
        return 0;
    }
    const VLAConfig* c = &p->model.config;
    if (vla_n_tokens(c) <= 96 && p->model.table.total <= (1u << 16) && (size_t)c->n_cam * c->img * c->img <= 4096) {
        size_t img_bytes = (size_t)c->n_cam * c->img * c->img * 3;
        uint8_t* images = (uint8_t*)callocCheck(img_bytes, 1);
        float* state = (float*)callocCheck((size_t)c->state_dim, sizeof(float));
        float* actions = (float*)mallocCheck((size_t)c->chunk * c->action_dim * sizeof(float));
        const char* text[1] = {"open the drawer"};
        if (vla_policy_act(p, 1, images, text, state, NULL, 7, actions) != 0) { abort(); }
        free(images); free(state); free(actions);
    }
    vla_policy_free(p);
    return 0;
}
