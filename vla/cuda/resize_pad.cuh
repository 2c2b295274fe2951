/*
vla/cuda/resize_pad.cuh: stored camera frames of any size resized with padding to the model's square
input (LeRobot's resize_with_pad: bilinear, aspect kept), and scaled to [-1, 1]. Forward only: the
frames are data.
*/
#ifndef VLA_CUDA_RESIZE_PAD_CUH
#define VLA_CUDA_RESIZE_PAD_CUH

#include "common.cuh"
#include "profiler.cuh"

// ---- stored frames of any size resized with padding (LeRobot's resize_with_pad)

// resize_with_pad at the model's size S for h x w frames: resized size, padding, torch's scales
typedef struct {
    int h, w;                 // stored frame
    int S;                    // the model's square image size
    int rh, rw;               // resized (keeping the aspect ratio), at most S
    int pad_top, pad_left;    // rows above and columns to the left: S - rh and S - rw, or half of them (centred)
    float scale_h, scale_w;   // source pixels per resized pixel: h / rh and w / rw in float, as torch
} ResizePad;

// torch's bilinear source index, align_corners=False: pixel d reads i0, i1 with weight l on i1.
// One fused multiply-add as torch does (rounding first moves src by an ulp); min keeps reads inside.
static __device__ __forceinline__ void resize_source(int d, float scale, int in, int* i0, int* i1, float* l) {
    float src = fmaxf(fmaf(scale, (float)d + 0.5f, -0.5f), 0.0f);
    int i = min((int)src, in - 1);  // src >= 0: truncation is floor
    *i0 = i;
    *i1 = i + (i < in - 1 ? 1 : 0);
    *l = src - (float)i;
}

// Channel c of the bilinear blend of four taps of an (h, w, 3) u8 frame, in [0, 1], in torch's order
static __device__ __forceinline__ float bilinear_u8(const uint8_t* f, int w, int c, int y0, int y1, float ly, int x0,
                                                    int x1, float lx) {
    float p00 = (float)f[((size_t)y0 * w + x0) * 3 + c] / 255.0f,
          p01 = (float)f[((size_t)y0 * w + x1) * 3 + c] / 255.0f;
    float p10 = (float)f[((size_t)y1 * w + x0) * 3 + c] / 255.0f,
          p11 = (float)f[((size_t)y1 * w + x1) * 3 + c] / 255.0f;
    return (1.0f - ly) * ((1.0f - lx) * p00 + lx * p01) + ly * ((1.0f - lx) * p10 + lx * p11);
}

// out: n_img images (3, S, S); frames: n_img (h, w, 3) u8. x128::size pixels of a row per thread.
__global__ void resize_pad_kernel2(floatX* out, const uint8_t* frames, ResizePad r, int n_img, size_t in_stride,
                                   size_t out_stride) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int packs = r.S / x128::size;
    if (idx >= (size_t)n_img * r.S * packs) { return; }
    int xs = (int)(idx % packs) * x128::size, y = (int)(idx / packs % r.S);
    size_t img = idx / ((size_t)packs * r.S);
    const uint8_t* f = frames + img * in_stride;
    int yr = y - r.pad_top, y0 = 0, y1 = 0;
    bool copy = r.rh == r.h && r.rw == r.w, row_padded = y < r.pad_top || yr >= r.rh;
    float ly = 0.0f;
    if (!row_padded && !copy) { resize_source(yr, r.scale_h, r.h, &y0, &y1, &ly); }
    x128 o[3];
    #pragma unroll
    for (int k = 0; k < x128::size; k++) {
        int x = xs + k, xr = x - r.pad_left;
        float v[3] = {0.0f, 0.0f, 0.0f};
        if (!row_padded && x >= r.pad_left && xr < r.rw) {
            if (copy) {
                const uint8_t* p = f + ((size_t)yr * r.w + xr) * 3;
                #pragma unroll
                for (int c = 0; c < 3; c++) { v[c] = (float)p[c] / 255.0f; }
            } else {
                int x0, x1;
                float lx;
                resize_source(xr, r.scale_w, r.w, &x0, &x1, &lx);
                #pragma unroll
                for (int c = 0; c < 3; c++) { v[c] = bilinear_u8(f, r.w, c, y0, y1, ly, x0, x1, lx); }
            }
        }
        #pragma unroll
        for (int c = 0; c < 3; c++) { o[c].v[k] = fx(v[c] * 2.0f - 1.0f); }
    }
    size_t plane = (size_t)r.S * r.S;
    #pragma unroll
    for (int c = 0; c < 3; c++) { store128(out + img * out_stride + c * plane + (size_t)y * r.S + xs, o[c]); }
}

// resize_with_pad's sizes with Python's arithmetic (the same correctly rounded doubles, int() truncating);
// centred: resize_with_pad_torch's padding (pi0), half above and to the left, the odd one below and right
static ResizePad resize_pad_plan(int h, int w, int S, int centred = 0) {
    ResizePad r;
    r.h = h; r.w = w; r.S = S;
    if (h == S && w == S) {  // resize_with_pad returns the frame untouched
        r.rh = h;
        r.rw = w;
    } else {
        double ratio = fmax((double)w / S, (double)h / S);
        r.rh = (int)(h / ratio);
        r.rw = (int)(w / ratio);
    }
    if (r.rh < 1 || r.rw < 1 || r.rh > S || r.rw > S) {
        vla_fail("resize_pad: a %d x %d frame resizes to %d x %d at image size %d: the frame's aspect ratio is too "
                 "extreme for this image size (crop the frames, or use a larger image size)", h, w, r.rh, r.rw, S);
    }
    r.pad_top = centred ? (S - r.rh) / 2 : S - r.rh;
    r.pad_left = centred ? (S - r.rw) / 2 : S - r.rw;
    r.scale_h = (float)h / (float)r.rh;  // torch: static_cast<float>(input_size) / output_size
    r.scale_w = (float)w / (float)r.rw;
    return r;
}

static bool resize_pad2_fits(const floatX* out, int S, size_t out_stride) {
    return packable(S, x128::size, out) && out_stride % x128::size == 0;
}

// out (n_img, 3, S, S) from frames (n_img, h, w, 3) u8; strides in elements, 0 means packed
static void resize_pad(floatX* out, const uint8_t* frames, int n_img, int h, int w, int S, size_t in_stride = 0,
                       size_t out_stride = 0, int centred = 0) {
    ProfOp prof_op("resize");
    ResizePad r = resize_pad_plan(h, w, S, centred);
    in_stride = in_stride > 0 ? in_stride : (size_t)h * w * 3;
    out_stride = out_stride > 0 ? out_stride : (size_t)3 * S * S;
    if (!resize_pad2_fits(out, S, out_stride)) {
        vla_fail("resize_pad: image size %d or its images' place not in whole 16-byte packs of %d (the kernel's "
                 "stores)", S, x128::size);
    }
    size_t n = (size_t)n_img * S * (S / x128::size);
    resize_pad_kernel2<<<ceil_div(n, BLOCK), BLOCK, 0, main_stream>>>(out, frames, r, n_img, in_stride, out_stride);
    launchCheck();
}

#endif  // VLA_CUDA_RESIZE_PAD_CUH
