// cuda_fp16.h: shim of the CUDA header for the CPU emulation (emulate.h says what is emulated)
#include "emulate.h"
