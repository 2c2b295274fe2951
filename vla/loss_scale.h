/*
vla/loss_scale.h: fp16 mixed precision's dynamic loss scale: its defaults and bounds, and the
state a checkpoint records of it. Needs common.h.
*/
#ifndef VLA_LOSS_SCALE_H
#define VLA_LOSS_SCALE_H

#include "common.h"

// ----------------------------------------------------------------------------
// fp16 mixed precision's dynamic loss scaling (train_vla built with PRECISION=FP16; the defaults
// are torch's GradScaler's). Other builds and train_vla_cpu refuse the flags (train_args_no_loss_scale).
#define VLA_LOSS_SCALE_DEFAULT 65536.0f
#define VLA_LOSS_SCALE_WINDOW_DEFAULT 2000
#define VLA_LOSS_SCALE_MAX 16777216.0f  // 2^24: past it a doubling is not taken
#define VLA_LOSS_SCALE_WINDOW_MAX 1000000  // the device counts clean steps in a float: exact far past this

// What a checkpoint records of the dynamic loss scale: 0 for scale where nothing was recorded
// (train_vla_cpu, bf16 and fp32 builds, files written before fp16 existed).
typedef struct {
    float scale;      // the scale the next step starts with
    uint32_t clean;   // clean steps since it last changed
    uint64_t skipped; // steps skipped for Inf/NaN gradients, over the whole run
} LossScaleState;

#endif  // VLA_LOSS_SCALE_H
