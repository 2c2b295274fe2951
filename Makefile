# train_vla: `make train_vla` builds the GPU trainer, `make train_vla_cpu` the CPU reference,
# `make test` builds and runs every test this machine can run. Every Python tool runs under one
# environment, $(VENV) (Python 3.12 with requirements.txt: the PyTorch oracle, the data tools, the
# evaluation, TensorBoard); LeRobot's own code under $(LEROBOT_VENV). `make setup` makes both (and
# installs the Mesa libraries MuJoCo renders with).

CC ?= gcc
CFLAGS ?= -O3 -march=native -fopenmp -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation
LDLIBS = -lm -lpthread
# The interpreter both venvs are made from: Python 3.12 or newer (LeRobot 0.6.1 needs it; BASE_PY overrides)
BASE_PY ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 \
	/usr/bin/python3.12 /root/.pyenv/versions/3.13*/bin/python3.13 /usr/local/bin/python3.13 /usr/bin/python3.13))
VENV = build/venv
VENV_PY = $(VENV)/bin/python
PYTHON ?= $(VENV_PY)
# LeRobot 0.6.1 (the SmolVLA and pi0 parity references, dev/lerobot): its own venv, its own pins
LEROBOT_VENV = build/lerobot-venv
LEROBOT_PY = $(LEROBOT_VENV)/bin/python
TEST_DIR = build/test
DEFAULT_DATA = data/default/metaworld_mt10_000.bin

.PHONY: all test test_compiles setup clean data venv_check dev_cuda fuzz fuzz_build FORCE

all: train_vla_cpu $(DEFAULT_DATA)

# ---- the GPU trainer. PRECISION=BF16 (default), FP16 (GPUs without bf16: sm_70, sm_75; the default
# there, see dev/gpu_arch.mk) or FP32; the architecture as dev/gpu_arch.mk says
include dev/gpu_arch.mk
PRECISION ?= BF16
ifeq ($(PRECISION),FP32)
  PRECISION_FLAG = -DENABLE_FP32
  PRECISION_SUFFIX = fp32
else ifeq ($(PRECISION),BF16)
  PRECISION_FLAG =
  PRECISION_SUFFIX = bf16
else ifeq ($(PRECISION),FP16)
  PRECISION_FLAG = -DENABLE_FP16
  PRECISION_SUFFIX = fp16
else
  $(error PRECISION=$(PRECISION): use BF16, FP16 or FP32)
endif
# the shared plumbing, one header per concern (vla/*.h), and the kernel library, one header per
# operation (vla/cuda)
VLA_HEADERS = $(wildcard vla/*.h vla/cuda/*.cuh)
GPU_SOURCES = train_vla.cu $(VLA_HEADERS)

# every precision for the GPU tests; ./train_vla is a copy of PRECISION's
build/gpu/train_vla_bf16 build/gpu/test_vla_gpu_bf16: PRECISION_FLAG =
build/gpu/train_vla_fp32 build/gpu/test_vla_gpu_fp32: PRECISION_FLAG = -DENABLE_FP32
build/gpu/train_vla_fp16 build/gpu/test_vla_gpu_fp16: PRECISION_FLAG = -DENABLE_FP16
build/gpu/train_vla_bf16 build/gpu/train_vla_fp32 build/gpu/train_vla_fp16: build/gpu/train_vla_%: $(GPU_SOURCES)
	$(nvcc_check)
	@mkdir -p build/gpu
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) $(MULTI_GPU_FLAGS) train_vla.cu $(NVCC_LDLIBS) $(MULTI_GPU_LIBS) -o $@
build/gpu/test_vla_gpu_%: test_vla_gpu.cu tests/util/test_util.h $(GPU_SOURCES)
	$(nvcc_check)
	@mkdir -p build/gpu
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) $(MULTI_GPU_FLAGS) test_vla_gpu.cu $(NVCC_LDLIBS) $(MULTI_GPU_LIBS) -o $@

# build/gpu/precision holds the PRECISION ./train_vla was copied from; it changes only when
# PRECISION does, so `make PRECISION=FP32 train_vla` after a BF16 build copies again
build/gpu/precision: FORCE
	@mkdir -p build/gpu
	@echo $(PRECISION) | cmp -s - $@ || echo $(PRECISION) > $@
train_vla: build/gpu/train_vla_$(PRECISION_SUFFIX) build/gpu/precision $(DEFAULT_DATA)
	cp $< $@

# the trainer without NCCL compiles too (make test builds both, and compares their losses)
build/gpu/train_vla_single_gpu_bf16: $(GPU_SOURCES)
	$(nvcc_check)
	@mkdir -p build/gpu
	$(NVCC) $(NVCC_FLAGS) train_vla.cu $(NVCC_LDLIBS) -o $@

# ptxas's register counts of train_vla.cu's kernels in each precision, for sm_90 or the GPU found:
# dev/cuda/check_registers.sh (in make test) asks each kernel over 64 registers for __launch_bounds__.
# -cubin compiles the device code alone (the host code's compile is half the time of a build)
REGISTER_LOGS = build/gpu/registers_bf16.txt build/gpu/registers_fp32.txt build/gpu/registers_fp16.txt
build/gpu/registers_bf16.txt: PRECISION_FLAG =
build/gpu/registers_fp32.txt: PRECISION_FLAG = -DENABLE_FP32
build/gpu/registers_fp16.txt: PRECISION_FLAG = -DENABLE_FP16
$(REGISTER_LOGS): build/gpu/registers_%.txt: $(GPU_SOURCES)
	$(nvcc_check)
	@mkdir -p build/gpu
	@$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) --resource-usage -cubin train_vla.cu -o build/gpu/registers_$*.cubin > $@.tmp 2>&1 || \
		{ cat $@.tmp; rm -f $@.tmp build/gpu/registers_$*.cubin; exit 1; }
	@rm -f build/gpu/registers_$*.cubin
	mv $@.tmp $@

# the policy interface on the GPU (scripts/vla_policy.py, device="cuda"): libvla.so's functions
libvla_gpu.so: $(GPU_SOURCES)
	$(nvcc_check)
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) -Xcompiler -fPIC,-fvisibility=hidden -diag-suppress 177 -shared -DVLA_LIBRARY train_vla.cu \
		$(NVCC_LDLIBS) -o $@

# ---- the same CUDA sources on the CPU, through the emulation in dev/cuda/emu (what make test
# runs where there is no GPU): launch.sed rewrites the launches, g++ compiles the result
EMU_DIR = build/emu
# the rewritten sources stay: make would otherwise delete them as intermediates and rebuild
.SECONDARY: $(EMU_DIR)/train_vla.cu $(EMU_DIR)/test_vla_gpu.cu $(EMU_DIR)/dev/cuda/emu/test_emulate.cu \
	$(addprefix $(EMU_DIR)/,$(wildcard dev/cuda/*.cu dev/cuda/*.h) $(VLA_HEADERS))
# the headers are read from rewritten copies in build/emu/vla (a quoted include is looked for in the
# including file's folder first), but for vla/cuda/ptx.cuh, where the emulation's own stands in
EMU_HEADERS = $(wildcard dev/cuda/emu/*.h) dev/cuda/emu/launch.sed $(addprefix $(EMU_DIR)/,$(VLA_HEADERS))
# (no -g by default: it makes these builds 40% slower, and CI's time is short; EMU_DEBUG=-g for gdb)
EMU_DEBUG ?=
EMU_CXX = g++ -std=c++17 -O2 $(EMU_DEBUG) -Wall -Wextra -Wno-unused-parameter -Wno-unused-function -Wno-unknown-pragmas \
	-Wno-format-truncation -I dev/cuda/emu -I .
# the emulated trainer is the MULTI_GPU one: CUDA_EMU_DEVICES=N gives it N GPUs and NCCL among them
EMU_MULTI_GPU = -DMULTI_GPU -fopenmp
$(EMU_DIR)/%.cu: %.cu dev/cuda/emu/launch.sed
	@mkdir -p $(dir $@)
	sed -f dev/cuda/emu/launch.sed $< > $@
$(EMU_DIR)/vla/%: vla/% dev/cuda/emu/launch.sed
	@mkdir -p $(dir $@)
	sed -f dev/cuda/emu/launch.sed $< > $@
$(EMU_DIR)/vla/cuda/ptx.cuh: dev/cuda/emu/vla/cuda/ptx.cuh
	@mkdir -p $(dir $@)
	cp $< $@
$(EMU_DIR)/train_vla_bf16 $(EMU_DIR)/test_vla_gpu_bf16 $(EMU_DIR)/libvla_gpu_bf16.so: EMU_PRECISION =
$(EMU_DIR)/train_vla_fp32 $(EMU_DIR)/test_vla_gpu_fp32 $(EMU_DIR)/libvla_gpu_fp32.so: EMU_PRECISION = -DENABLE_FP32
$(EMU_DIR)/train_vla_fp16 $(EMU_DIR)/test_vla_gpu_fp16: EMU_PRECISION = -DENABLE_FP16
$(EMU_DIR)/train_vla_bf16 $(EMU_DIR)/train_vla_fp32 $(EMU_DIR)/train_vla_fp16: $(EMU_DIR)/train_vla_%: $(EMU_DIR)/train_vla.cu $(VLA_HEADERS) $(EMU_HEADERS)
	$(EMU_CXX) $(EMU_PRECISION) $(EMU_MULTI_GPU) -x c++ $< -lm -lpthread -o $@
$(EMU_DIR)/train_vla_single_gpu_bf16: $(EMU_DIR)/train_vla.cu $(VLA_HEADERS) $(EMU_HEADERS)
	$(EMU_CXX) -x c++ $< -lm -lpthread -o $@
$(EMU_DIR)/test_vla_gpu_%: $(EMU_DIR)/test_vla_gpu.cu $(EMU_DIR)/train_vla.cu tests/util/test_util.h $(VLA_HEADERS) \
		$(EMU_HEADERS)
	$(EMU_CXX) $(EMU_PRECISION) $(EMU_MULTI_GPU) -x c++ $< -lm -lpthread -o $@
$(EMU_DIR)/libvla_gpu_bf16.so $(EMU_DIR)/libvla_gpu_fp32.so: $(EMU_DIR)/libvla_gpu_%.so: $(EMU_DIR)/train_vla.cu $(VLA_HEADERS) $(EMU_HEADERS)
	$(EMU_CXX) $(EMU_PRECISION) -fPIC -fvisibility=hidden -shared -DVLA_LIBRARY -x c++ $< -lm -lpthread -o $@
$(EMU_DIR)/dev/cuda/emu/test_emulate: $(EMU_DIR)/dev/cuda/emu/test_emulate.cu $(EMU_HEADERS)
	$(EMU_CXX) -x c++ $< -o $@
$(EMU_DIR)/dev/cuda/%.h: dev/cuda/%.h
	@mkdir -p $(dir $@)
	cp $< $@
$(EMU_DIR)/dev/cuda/%: $(EMU_DIR)/dev/cuda/%.cu $(addprefix $(EMU_DIR)/,$(wildcard dev/cuda/*.h)) \
		$(EMU_HEADERS)
	$(EMU_CXX) -x c++ $< -lm -lpthread -o $@

# every header of the kernel library compiles alone: under the emulation in each precision, and
# with nvcc (bf16)
LIB_HEADERS = $(basename $(notdir $(wildcard vla/cuda/*.cuh)))
HEADER_CHECKS = $(patsubst %,$(EMU_DIR)/alone/%.ok,$(LIB_HEADERS)) $(patsubst %,build/gpu/alone/%.o,$(LIB_HEADERS))
$(EMU_DIR)/alone/%.ok: $(EMU_DIR)/vla/cuda/%.cuh $(EMU_HEADERS)
	@mkdir -p $(dir $@)
	@echo '#include "../vla/cuda/$*.cuh"' > $(EMU_DIR)/alone/$*.cpp
	@for p in "" -DENABLE_FP32 -DENABLE_FP16; do $(EMU_CXX) $$p -fsyntax-only $(EMU_DIR)/alone/$*.cpp || exit 1; done
	@touch $@
build/gpu/alone/%.o: vla/cuda/%.cuh $(VLA_HEADERS)
	$(nvcc_check)
	@mkdir -p $(dir $@)
	@echo '#include "../../../vla/cuda/$*.cuh"' > build/gpu/alone/$*.cu
	$(NVCC) $(NVCC_FLAGS) -c build/gpu/alone/$*.cu -o $@

# dev/cuda: one program per kernel (dev/cuda/README.md); compiled for the GPU by its own Makefile
DEV_CUDA = $(basename $(notdir $(wildcard dev/cuda/*.cu)))
dev_cuda:
	$(MAKE) -C dev/cuda

# the dev/cuda programs are built for the GPU (nvcc) by make test where they run on it; without a
# GPU they are built and run under the emulation, and `make dev_cuda` compiles them with nvcc
# (3 min on 2 cores: kept out of CI's budget, where train_vla.cu's own nvcc builds stay)
ifeq ($(HAS_GPU),1)
GPU_DEV_CUDA = dev_cuda
GPU_TEST_BINARIES = build/gpu/train_vla_bf16 build/gpu/train_vla_fp32 build/gpu/test_vla_gpu_bf16 build/gpu/test_vla_gpu_fp32 \
	build/gpu/train_vla_fp16 build/gpu/test_vla_gpu_fp16
GPU_TEST_RUNNER = build/gpu
GPU_POLICY_LIBRARY = libvla_gpu.so
else
GPU_TEST_BINARIES = $(EMU_DIR)/train_vla_bf16 $(EMU_DIR)/train_vla_fp32 $(EMU_DIR)/test_vla_gpu_bf16 \
	$(EMU_DIR)/test_vla_gpu_fp32 $(EMU_DIR)/dev/cuda/emu/test_emulate $(addprefix $(EMU_DIR)/dev/cuda/,$(DEV_CUDA)) \
	$(EMU_DIR)/libvla_gpu_bf16.so $(EMU_DIR)/libvla_gpu_fp32.so $(EMU_DIR)/train_vla_single_gpu_bf16 \
	$(EMU_DIR)/train_vla_fp16 $(EMU_DIR)/test_vla_gpu_fp16
GPU_TEST_RUNNER = $(EMU_DIR)
GPU_POLICY_LIBRARY = $(EMU_DIR)/libvla_gpu_bf16.so:$(EMU_DIR)/libvla_gpu_fp32.so
endif

train_vla_cpu: train_vla.c $(VLA_HEADERS) $(DEFAULT_DATA)
	$(CC) $(CFLAGS) train_vla.c $(LDLIBS) -o $@

# the policy interface for Python (ctypes): scripts/vla_policy.py
libvla.so: train_vla.c $(VLA_HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function -Wno-unused-const-variable -fPIC -shared -DVLA_LIBRARY train_vla.c $(LDLIBS) -o $@

test_vla: test_vla.c train_vla.c $(VLA_HEADERS) tests/util/test_util.h
	$(CC) $(CFLAGS) test_vla.c $(LDLIBS) -o $@

data/synthetic: data/synthetic.c $(VLA_HEADERS)
	$(CC) $(CFLAGS) data/synthetic.c $(LDLIBS) -o $@

dev/bench_loader: dev/bench_loader.c $(VLA_HEADERS)
	$(CC) $(CFLAGS) dev/bench_loader.c $(LDLIBS) -o $@

# the CPU trainer's matrix products at the smolvla shapes (dev/bench_gemm.sh sets them beside torch's)
dev/bench_gemm: dev/bench_gemm.c train_vla.c $(VLA_HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function -Wno-unused-const-variable dev/bench_gemm.c $(LDLIBS) -o $@

# synthetic data of the smolvla benchmark's shapes: 2 cameras stored at 224 px (the model resizes
# them with padding to its 512), state 6 and action 5 dims (padded to 32 inside the model), as
# dev/lerobot/bench_lerobot.py hands LeRobot its batch: the benchmarks' (dev/bench_loader.sh,
# dev/gpu_check.sh)
build/bench/smolvla.bin: data/synthetic
	@mkdir -p build/bench
	./data/synthetic -o $@ --cams 2 --img 224 --state 6 --action 5 --episodes 30 --min-len 20 --max-len 40

# The data `./train_vla_cpu` trains on when given no -i: Meta-World MT10 expert demonstrations,
# shipped xz-compressed (data/metaworld_mt10.bin.xz, made by the command in data/README.md).
data: $(DEFAULT_DATA)
$(DEFAULT_DATA): data/metaworld_mt10.bin.xz
	@mkdir -p data/default
	xz -dc $< > $@.tmp && mv $@.tmp $@

# the CPU trainer built with AddressSanitizer and UndefinedBehaviorSanitizer: tests/runs/test_hardening.sh
# trains it a few steps (2 simulated ranks, ZeRO-1, augmentation) and feeds it bad input
build/sanitize/train_vla_cpu: train_vla.c $(VLA_HEADERS)
	@mkdir -p build/sanitize
	$(CC) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -fopenmp -Wall -Wextra \
		-Wno-unused-parameter -Wno-format-truncation train_vla.c $(LDLIBS) -o $@

# ---- fuzzing (dev/fuzz): libFuzzer harnesses of every reader of untrusted bytes (shards, several
# shards as one dataset, checkpoints, the policy library's load, safetensors, log.jsonl on resume,
# checkpoint names, the multi-node bootstrap's messages), built by clang with AddressSanitizer and
# UndefinedBehaviorSanitizer. `make fuzz` runs each for FUZZ_SECONDS and keeps the corpora in
# build/fuzz/corpus; make test runs each briefly from the seeds alone (dev/run_tests.sh).
FUZZ_CC ?= clang-14
FUZZ_SECONDS ?= 600
FUZZ_FLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-Wall -Wextra -Wno-unused-parameter -Wno-unused-function -Wno-pass-failed
FUZZ_PLAIN = shard shards checkpoint safetensors log names boot
FUZZ_BINARIES = $(addprefix build/fuzz/fuzz_,$(FUZZ_PLAIN)) build/fuzz/fuzz_policy build/fuzz/make_seeds
fuzz_check = @command -v $(FUZZ_CC) > /dev/null || { \
	echo "error: $(FUZZ_CC) not found: the fuzzers need clang and its runtimes: run 'make setup' (as root) first"; exit 1; }
$(addprefix build/fuzz/fuzz_,$(FUZZ_PLAIN)): build/fuzz/fuzz_%: dev/fuzz/fuzz_%.c dev/fuzz/fuzz_util.h $(VLA_HEADERS)
	$(fuzz_check)
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) $< -lm -lpthread -o $@
build/fuzz/fuzz_policy: dev/fuzz/fuzz_policy.c dev/fuzz/fuzz_util.h $(VLA_HEADERS) train_vla.c
	$(fuzz_check)
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -fopenmp $< -lm -lpthread -o $@
build/fuzz/make_seeds: dev/fuzz/make_seeds.c dev/fuzz/fuzz_util.h $(VLA_HEADERS)
	@mkdir -p build/fuzz
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@
	rm -rf build/fuzz/seeds
fuzz_build: $(FUZZ_BINARIES) data/synthetic
fuzz: fuzz_build
	FUZZ_CORPUS=build/fuzz/corpus dev/fuzz/run_fuzz.sh $(FUZZ_SECONDS)

# ---- test fixtures: small datasets from data/synthetic and the oracle's (dev/model.py) files
# a: one 32 px camera, S = A = 4 (the tiny preset's own shapes). b: two 24 px cameras, state_dim !=
# action_dim, short episodes so chunks run past their end, instructions both shorter and longer
# than max_text.
$(TEST_DIR)/a.bin: data/synthetic
	@mkdir -p $(TEST_DIR)
	./data/synthetic -o $@ --cams 1 --img 32 --state 4 --action 4 --episodes 6 --min-len 6 --max-len 12 --seed 3

$(TEST_DIR)/b.bin: data/synthetic
	@mkdir -p $(TEST_DIR)
	./data/synthetic -o $@ --cams 2 --img 24 --state 3 --action 2 --episodes 5 --min-len 3 --max-len 7 --seed 4

oracle_check = @$(PYTHON) -c "import torch, numpy" 2>/dev/null || { \
	echo "error: the oracle needs torch and numpy under $(PYTHON): run 'make setup' (as root) first"; exit 1; }
ORACLE_SOURCES = dev/model.py dev/smolvla.py data/vla_shard.py Makefile

# five training steps of the oracle on shard data (sampler, noise and schedule of every step),
# everything training
$(TEST_DIR)/a_train.txt: $(TEST_DIR)/a.bin $(ORACLE_SOURCES)
	$(oracle_check)
	$(PYTHON) dev/model.py -i $< -p tiny --dtype float64 -b 4 --seed 1337 --train 5 -n 5 -l 1e-3 -u 2 -w 0.1 -c 0.5 \
		--train-mode all > $@

# the same for pi0's test preset
$(TEST_DIR)/a_pi0_train.txt: $(TEST_DIR)/a.bin $(ORACLE_SOURCES)
	$(oracle_check)
	$(PYTHON) dev/model.py -i $< -p pi0_tiny --dtype float64 -b 4 --seed 1337 --train 5 -n 5 -l 1e-3 -u 2 -w 0.1 -c 0.5 \
		--train-mode all > $@

# pi0's run with the decay on every trainable tensor (--decay-on all, LeRobot's AdamW) at a decay
# that shows in the norms: its losses (.txt) and the weights after it (.bin)
$(TEST_DIR)/a_pi0_decay_all.bin: $(TEST_DIR)/a.bin $(ORACLE_SOURCES)
	$(oracle_check)
	$(PYTHON) dev/model.py -i $< -p pi0_tiny --dtype float64 -b 4 --seed 1337 --train 5 -n 5 -l 1e-3 -u 2 -w 1 -c 0.5 \
		--train-mode all --decay-on all --save-params $@ > $(@:.bin=.txt)

# s: two cameras of different sizes (both resized with padding to the tiny preset's 32 px),
# state_dim != action_dim, chunks past episode ends; the oracle's debug state per train mode
$(TEST_DIR)/s.bin: data/synthetic
	@mkdir -p $(TEST_DIR)
	./data/synthetic -o $@ --cams 2 --cam-size 24x32 --cam-size 20x20 --state 3 --action 2 --episodes 5 --min-len 3 \
		--max-len 7 --seed 5

SMOLVLA_STATES = $(foreach mode,expert vlm all,$(TEST_DIR)/s_$(mode)_state.bin)
$(SMOLVLA_STATES): $(TEST_DIR)/s_%_state.bin: $(TEST_DIR)/s.bin $(ORACLE_SOURCES)
	$(oracle_check)
	$(PYTHON) dev/model.py -i $< -p tiny --set max_text=24 --dtype float64 -b 3 --seed 11 --train-mode $* \
		--debug-state $@

# LeRobot's own SmolVLA on a tiny random model (dev/lerobot): the ground truth of the SmolVLA
# parity checks. Runs under the LeRobot venv that `make setup` makes (Python 3.12, pinned).
LEROBOT_REF = build/lerobot_ref
lerobot_check = @$(LEROBOT_PY) -c "import lerobot" 2>/dev/null || { \
	echo "error: the LeRobot references need LeRobot 0.6.1 in $(LEROBOT_VENV): run 'make setup' (as root) first"; exit 1; }
$(LEROBOT_REF)/all/ref.safetensors: dev/lerobot/make_ref.py dev/lerobot/requirements.txt
	$(lerobot_check)
	rm -rf $(LEROBOT_REF)
	$(LEROBOT_PY) dev/lerobot/make_ref.py --family smolvla -o $(LEROBOT_REF)
# each case's config for the C trainers (dev/smolvla.py --c-config): test_vla's SmolVLA checks read it
SMOLVLA_C_CONFIGS = $(foreach case,expert vlm all,$(LEROBOT_REF)/$(case)/c_config.txt)
$(SMOLVLA_C_CONFIGS): $(LEROBOT_REF)/%/c_config.txt: $(LEROBOT_REF)/all/ref.safetensors dev/smolvla.py
	$(oracle_check)
	$(PYTHON) dev/smolvla.py $(LEROBOT_REF)/$* --c-config $@
# LeRobot's own pi0 at test sizes (dev/lerobot/make_ref.py --family pi0, which also writes each case's
# c_config.txt): the ground truth of the pi0 parity checks
LEROBOT_REF_PI0 = build/lerobot_ref_pi0
$(LEROBOT_REF_PI0)/all/ref.safetensors: dev/lerobot/make_ref.py dev/lerobot/requirements.txt
	$(lerobot_check)
	rm -rf $(LEROBOT_REF_PI0)
	$(LEROBOT_PY) dev/lerobot/make_ref.py --family pi0 -o $(LEROBOT_REF_PI0)

# make test needs what `make setup` installs: it says so before building anything (a look for the
# modules, not an import: fast)
SETUP_MODULES_FOUND = import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))
ifneq ($(filter test,$(MAKECMDGOALS)),)
SETUP_MISSING := $(shell $(PYTHON) -c "$(SETUP_MODULES_FOUND)" torch numpy metaworld mujoco av pyarrow PIL matplotlib tensorboard \
		2>/dev/null || echo "the project's Python environment $(VENV) (requirements.txt);") \
	$(shell $(LEROBOT_PY) -c "$(SETUP_MODULES_FOUND)" lerobot datasets 2>/dev/null || echo "LeRobot in $(LEROBOT_VENV);")
ifneq ($(strip $(SETUP_MISSING)),)
$(error make test needs what make setup installs, and these are missing: $(strip $(SETUP_MISSING)) run 'make setup' (as root) first)
endif
endif

# make test compiles train_vla for the GPU everywhere; its tests run on the GPU if there is one,
# otherwise under the CPU emulation (GPU_TESTS says which folder holds the binaries).
# tests/lerobot/test_lerobot_io.py (LeRobot import/export) needs train_vla_cpu, libvla.so, data/synthetic
# and the LeRobot references
# What make test compiles with the machine's own gcc, g++ and nvcc and nothing that make setup installs
# (train_vla_cpu unpacks the default data with xz, a setup package: it comes later): .ci/run builds
# them beside make setup (`make -j2 setup test_compiles`), on the core pip leaves idle
TEST_COMPILES = test_vla libvla.so data/synthetic build/gpu/train_vla_$(PRECISION_SUFFIX) $(HEADER_CHECKS) \
	build/gpu/train_vla_single_gpu_bf16 libvla_gpu.so $(GPU_DEV_CUDA) $(GPU_TEST_BINARIES) $(REGISTER_LOGS) \
	build/sanitize/train_vla_cpu
test_compiles: $(TEST_COMPILES)
test: $(TEST_COMPILES) train_vla_cpu train_vla fuzz_build $(TEST_DIR)/a.bin $(TEST_DIR)/b.bin $(TEST_DIR)/s.bin $(TEST_DIR)/a_train.txt $(TEST_DIR)/a_pi0_train.txt $(TEST_DIR)/a_pi0_decay_all.bin $(SMOLVLA_STATES) $(LEROBOT_REF)/all/ref.safetensors $(SMOLVLA_C_CONFIGS) \
		$(LEROBOT_REF_PI0)/all/ref.safetensors venv_check
	GPU_TESTS=$(GPU_TEST_RUNNER) VLA_GPU_LIBRARY=$(GPU_POLICY_LIBRARY) dev/run_tests.sh

venv_check:
	@$(VENV_PY) -c "import torch, numpy, metaworld, mujoco, av, pyarrow, PIL, matplotlib, tensorboard" 2>/dev/null || { \
		echo "error: the tests need the project's Python environment $(VENV) with requirements.txt: run 'make setup' (as root) first"; exit 1; }

# What the tests need on a fresh Debian machine: Mesa's EGL/OSMesa for headless MuJoCo rendering,
# clang with its sanitizer, libFuzzer and OpenMP runtimes for the fuzzers (dev/fuzz), fonts with
# Latin, CJK and emoji glyphs for the inspector's contact sheet, xz for the default data; then the
# project's Python environment and LeRobot's. Each stage says what it does first (pip is quiet, and
# the venvs take minutes on a fresh machine); each is skipped or quick where it is done already.
SETUP_PACKAGES = xz-utils libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libosmesa6 clang-14 libclang-rt-14-dev libomp-14-dev \
	fonts-dejavu-core fonts-wqy-microhei fonts-symbola
# an earlier layout's build/venv (made from Debian's Python 3.11): moved aside, not deleted
VENV_OLD = $(shell test -x $(VENV_PY) && $(VENV_PY) -c "import sys; sys.exit(sys.version_info >= (3, 12))" 2>/dev/null && \
	$(VENV_PY) -c "import sys; print('%d.%d' % sys.version_info[:2])")
setup:
	@test -n "$(BASE_PY)" || { echo "error: the Python environments need Python 3.12 or newer and none was found: \
install one and pass BASE_PY=/path/to/python3.12"; exit 1; }
	@echo "setup 1/3: Debian packages: Mesa (headless MuJoCo), clang-14 (the fuzzers), fonts, xz"
	@dpkg -s $(SETUP_PACKAGES) > /dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SETUP_PACKAGES) > /dev/null; }
	@echo "setup 2/3: the project's Python environment $(VENV) from $(BASE_PY): requirements.txt (PyTorch, the data tools, TensorBoard; about 5 GB, minutes on a fresh machine)"
	@if [ -n "$(VENV_OLD)" ]; then mv $(VENV) $(VENV).python$(VENV_OLD) && \
		echo "  $(VENV) was Python $(VENV_OLD)'s: moved to $(VENV).python$(VENV_OLD) (delete it when done with it)"; fi
	@$(VENV_PY) -c "import sys" 2>/dev/null || $(BASE_PY) -m venv $(VENV)
	@$(VENV_PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@echo "setup 3/3: LeRobot 0.6.1 with its smolvla and dataset extras in $(LEROBOT_VENV): dev/lerobot/requirements.txt (about 3 GB)"
	@$(LEROBOT_PY) -c "import sys" 2>/dev/null || $(BASE_PY) -m venv $(LEROBOT_VENV)
	@$(LEROBOT_PY) -m pip install --quiet --disable-pip-version-check -r dev/lerobot/requirements.txt
	@echo "setup: done (Python tools: $(VENV_PY) ARGS; LeRobot: $(LEROBOT_PY))"

clean:
	rm -rf train_vla_cpu test_vla libvla.so libvla_gpu.so train_vla data/synthetic dev/bench_loader dev/bench_gemm build/test build/bench build/gpu \
		build/emu data/default build/sanitize $(FUZZ_BINARIES) build/fuzz/seeds build/fuzz/coverage $(LEROBOT_REF) \
		$(LEROBOT_REF_PI0)
	$(MAKE) -C dev/cuda clean
