// fuzz_safetensors.c: the safetensors reader (LeRobot's model.safetensors, what the LeRobot tests
// and tools read) on arbitrary bytes. Each input is one file: safetensors_open parses its JSON
// header and checks every tensor's extent; an accepted file has every tensor looked up by name and
// every floating-point one widened to float32 (safetensors_find, safetensors_read_f32), then
// LeRobot's weights of a small config are loaded from it by name and shape
// (flow_load_safetensors), as the trainers' import path does. A refusal is one line.
#include "fuzz_util.h"
#include "../../vla/config.h"
#include "../../vla/safetensors.h"

static FlowParamTable table;
static float* params;

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (params == NULL) {
        flow_table_build(&FUZZ_SAFETENSORS_CONFIG, &table);
        params = (float*)mallocCheck(table.total * sizeof(float));
    }
    const char* path = fuzz_file(data, size);
    SafeTensors st;
    char err[VLA_PATH_MAX + 1024];
    err[0] = '\0';
    if (safetensors_open(&st, path, err, sizeof(err)) != 0) {
        if (err[0] == '\0' || strchr(err, '\n') != NULL || strchr(err, '\r') != NULL) { abort(); }  // one line, always
        return 0;
    }
    float sum = 0.0f;
    for (int i = 0; i < st.n; i++) {
        const SafeTensorInfo* t = &st.tensors[i];
        // the extent the reader promises: within the data section, exactly numel values
        if (t->begin > t->end || t->end > st.data_size || t->end - t->begin != t->numel * (uint64_t)ST_DTYPE_BYTES[t->dtype]) {
            abort();
        }
        const SafeTensorInfo* found = safetensors_find(&st, t->name);
        if (found == NULL || strcmp(found->name, t->name) != 0) { abort(); }
        if (t->dtype <= ST_F64 && t->numel <= (1u << 14)) {  // the floating-point kinds, read whole
            float buf[1u << 14];
            if (safetensors_read_f32(&st, t, buf) != 0) { abort(); }
            for (uint64_t k = 0; k < t->numel; k++) { sum += buf[k]; }
        } else if (t->dtype > ST_F64 && safetensors_read_f32(&st, t, params) == 0 && t->numel > 0) {
            abort();  // integer tensors are refused, not read as floats
        }
    }
    err[0] = '\0';
    if (flow_load_safetensors(&st, &FUZZ_SAFETENSORS_CONFIG, &table, params, err, sizeof(err)) != 0 &&
        (err[0] == '\0' || strchr(err, '\n') != NULL)) {
        abort();
    }
    if (isnan(sum) && st.n < 0) { abort(); }  // (keeps the sum from being optimized away)
    safetensors_close(&st);
    return 0;
}
