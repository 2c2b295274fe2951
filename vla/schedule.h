/*
vla/schedule.h: the learning-rate schedule, linear warmup then cosine to min_lr_frac of the
peak. Needs cli.h.
*/
#ifndef VLA_SCHEDULE_H
#define VLA_SCHEDULE_H

#include "common.h"
#include "cli.h"

// ----------------------------------------------------------------------------
// learning-rate schedule: linear warmup to the peak, then cosine down to min_lr_frac * peak

static inline float lr_at_step(const TrainArgs* a, int step) {
    if (step < a->warmup) { return a->lr * (float)(step + 1) / (float)a->warmup; }
    int decay_steps = a->steps - a->warmup;
    float progress = decay_steps > 0 ? (float)(step - a->warmup) / (float)decay_steps : 1.0f;
    if (progress > 1.0f) { progress = 1.0f; }
    float floor_lr = a->lr * a->min_lr_frac;
    return floor_lr + 0.5f * (a->lr - floor_lr) * (1.0f + cosf(3.14159265358979f * progress));
}

// A warmup longer than the run: the learning rate never reaches its peak (nor decays). Said in one
// line under the config table (the run goes on as asked).
static inline void schedule_warn(const TrainArgs* a) {
    if (a->warmup <= a->steps) { return; }
    printf("warning: --warmup %d is longer than the run's %d steps (-n): the learning rate rises for the whole run, "
           "never reaching its peak %g; lower -u or raise -n\n",
           a->warmup, a->steps, (double)a->lr);
}

#endif  // VLA_SCHEDULE_H
