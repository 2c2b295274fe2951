// vla.h: the plumbing moved into vla/, one header per concern; this includes them all until
// every user includes the headers it uses
#ifndef VLA_H
#define VLA_H
#include "vla/common.h"
#include "vla/rng.h"
#include "vla/config.h"
#include "vla/safetensors.h"
#include "vla/shards.h"
#include "vla/run_folder.h"
#include "vla/atomic_file.h"
#include "vla/shard_writer.h"
#include "vla/dataset.h"
#include "vla/sampler.h"
#include "vla/loader.h"
#include "vla/loss_scale.h"
#include "vla/checkpoint.h"
#include "vla/cli.h"
#include "vla/schedule.h"
#include "vla/logging.h"
#include "vla/runs.h"
#include "vla/bootstrap.h"
#include "vla/policy.h"

#endif  // VLA_H
