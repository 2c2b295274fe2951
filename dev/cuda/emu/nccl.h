// nccl.h: shim of NCCL's header for the CPU emulation (emulate.h says what is emulated)
#include "emulate.h"
