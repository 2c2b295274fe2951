# The GPU architecture to build for, shared by the Makefile and dev/cuda/Makefile: the GPU's own
# when nvidia-smi finds one, sm_90 (H100/H200) otherwise or with CI=true. GPU_ARCH=sm_XX overrides.
# HAS_GPU is 1 when a GPU is there to run on.
HAS_GPU := $(if $(filter true,$(CI)),0,$(shell nvidia-smi -L > /dev/null 2>&1 && echo 1 || echo 0))
# The line saying which architecture is printed once, by the first nvcc recipe that runs (so
# `make setup` or `make train_vla_cpu` say nothing of GPUs).
ifndef GPU_ARCH
  ifeq ($(HAS_GPU),1)
    GPU_ARCH := sm_$(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '. ')
    gpu_arch_line = train_vla: building for the GPU found by nvidia-smi: $(GPU_ARCH) (set GPU_ARCH=sm_XX to override)
  else
    GPU_ARCH := sm_90
    gpu_arch_line = train_vla: no GPU found$(if $(filter true,$(CI)), (CI=true),): building for $(GPU_ARCH), H100/H200 (set GPU_ARCH=sm_XX for another GPU)
  endif
  export GPU_ARCH
endif
gpu_arch_note = $(if $(gpu_arch_noted),,$(eval gpu_arch_noted := 1)$(if $(gpu_arch_line),$(info $(gpu_arch_line)))$(if \
	$(gpu_precision_line),$(info $(gpu_precision_line)))$(if $(gpu_nccl_line),$(info $(gpu_nccl_line))))
# GPUs before sm_80 (V100 sm_70, T4 sm_75) have no bf16 tensor cores: there train_vla builds in
# fp16 (PRECISION=FP16, dynamic loss scaling) unless PRECISION says otherwise, refuses BF16, and
# dev/cuda's programs compile their kernels in fp16 too (GPU_NO_BF16_FLAG).
GPU_NO_BF16 := $(if $(filter sm_70 sm_72 sm_75 compute_70 compute_72 compute_75,$(GPU_ARCH)),1,0)
ifeq ($(GPU_NO_BF16),1)
  GPU_NO_BF16_FLAG = -DENABLE_FP16
  ifeq ($(origin PRECISION),undefined)
    PRECISION := FP16
    gpu_precision_line = train_vla: $(GPU_ARCH) has no bf16 tensor cores: building PRECISION=FP16 (fp16, dynamic loss scaling; PRECISION=FP32 for fp32)
  else ifeq ($(PRECISION),BF16)
    $(error PRECISION=BF16 needs sm_80 or newer (bf16 tensor cores), $(GPU_ARCH) has none: use PRECISION=FP16 (or FP32))
  endif
endif
ifndef NVCC
  NVCC := $(shell command -v nvcc || echo /usr/local/cuda/bin/nvcc)
endif
# the first line of every nvcc recipe, in both Makefiles (a variable, not a rule: a rule here would
# become dev/cuda's default goal)
nvcc_check = $(gpu_arch_note)@test -x "$(NVCC)" || command -v "$(NVCC)" > /dev/null || { \
	echo "error: nvcc not found ($(NVCC)): install the CUDA Toolkit or set NVCC=/path/to/nvcc"; exit 1; }; \
	"$(NVCC)" --list-gpu-code | grep -qx "$(GPU_ARCH)" || { echo "error: $(NVCC) does not build for $(GPU_ARCH), only \
	for $$("$(NVCC)" --list-gpu-code | paste -sd ' '): pick one of those with GPU_ARCH, or set NVCC to an nvcc that has \
	it (CUDA 13 dropped sm_70, the V100: CUDA 12's has it)"; exit 1; }
NVCC_FLAGS = -O3 -std=c++17 -arch=$(GPU_ARCH) -Xcompiler -Wall,-Wno-unused-function,-Wno-format-truncation
NVCC_LDLIBS = -lcublasLt -lm -lpthread

# NCCL: MULTI_GPU builds (one process, several GPUs, more nodes) where nccl.h is found next to nvcc
# or in the system's include folders; MULTI_GPU=0 builds the single-GPU trainer anyway.
ifndef MULTI_GPU
  MULTI_GPU := $(if $(wildcard $(dir $(NVCC))../include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h),1,0)
  ifeq ($(MULTI_GPU),0)
    gpu_nccl_line = train_vla: nccl.h not found: building the single-GPU trainer (install NCCL for -g above 1)
  endif
endif
MULTI_GPU_FLAGS = $(if $(filter 1,$(MULTI_GPU)),-DMULTI_GPU -Xcompiler -fopenmp,)
MULTI_GPU_LIBS = $(if $(filter 1,$(MULTI_GPU)),-lnccl -lgomp,)
