/*
vla/cuda/rope.cuh: rotary position embedding (rotate-half) of the query and key heads at per-row
positions; the backward is the same rotation turned back (sign -1).
*/
#ifndef VLA_CUDA_ROPE_CUH
#define VLA_CUDA_ROPE_CUH

#include "common.cuh"
#include "profiler.cuh"

// RoPE (rotate-half) of rows of NH heads of HS, row r at position pos[(r / Tg) * pos_stride + r % Tg]:
// dimension k < HS/2 pairs with k + HS/2 and turns by the table's angle; sign -1 rotates back.
template <typename Tin>
__global__ void rope_at_kernel(floatX* out, const Tin* in, const float* cos_t, const float* sin_t, const int* pos,
                               int rows, int Tg, int pos_stride, int NH, int HS, float sign) {
    int half = HS / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * NH * half) { return; }
    int k = (int)(idx % half), h = (int)(idx / half % NH);
    size_t row = idx / ((size_t)half * NH);
    int at_pos = pos[(row / Tg) * pos_stride + row % Tg];
    size_t at = row * NH * HS + (size_t)h * HS + k;
    float c = cos_t[(size_t)at_pos * half + k], s = sign * sin_t[(size_t)at_pos * half + k];
    float x1 = f32(in[at]), x2 = f32(in[at + half]);
    out[at] = fx(x1 * c - x2 * s);
    out[at + half] = fx(x2 * c + x1 * s);
}

// RoPE at per-row positions: rows of Tg per sample
template <typename Tin>
static void rope_at(floatX* out, const Tin* in, const float* cos_t, const float* sin_t, const int* pos, int rows,
                    int Tg, int pos_stride, int NH, int HS, float sign) {
    ProfOp prof_op("rope");
    size_t n = (size_t)rows * NH * (HS / 2);
    rope_at_kernel<Tin><<<ceil_div(n, BLOCK), BLOCK, 0, main_stream>>>(out, in, cos_t, sin_t, pos, rows, Tg, pos_stride,
                                                                       NH, HS, sign);
    launchCheck();
}

#endif  // VLA_CUDA_ROPE_CUH
