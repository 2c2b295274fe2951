/*
resize_pad.cu: the camera frames' way into the vision tower, on the device: stored uint8 frames
(n_img, h, w, 3) of any size -> floatX images (n_img, 3, S, S), channel-major, as LeRobot's
SmolVLA prepares them (prepare_images: resize_with_pad(img, S, S, pad_value=0), then x * 2 - 1),
and pi0 (resize_with_pad_torch: the padding centred).
  - Pixels enter as u8 / 255 in float, as LeRobot's frames do.
  - A frame already S x S is returned as it is (resize_with_pad returns early).
  - Otherwise ratio = max(w / S, h / S) and the frame is resized to rh x rw = int(h / ratio) x
    int(w / ratio), computed with Python's doubles (so 9 x 18 at S = 224 gives 111 rows, not 112),
    by torch.nn.functional.interpolate(mode='bilinear', align_corners=False, antialias=False):
    with the size given, torch's scale is in / out in float (not the ratio); output pixel d reads
    source coordinate src = max(scale (d + 0.5) - 0.5, 0), between pixels i0 = floor(src) and
    i1 = min(i0 + 1, in - 1) with weight l = src - i0 on i1, first along the width, then along the
    height: (1 - ly) ((1 - lx) p00 + lx p01) + ly ((1 - lx) p10 + lx p11).
  - Then padded with 0 to S x S, on the LEFT and TOP (SmolVLA: S - rw columns, S - rh rows) or
    centred (pi0: (S - rw) / 2 columns on the left, the rest on the right; (S - rh) / 2 rows on
    top, the rest below), and mapped x * 2 - 1, so the padding reads -1. (pi0's resize also clamps
    the resized image to [0, 1]: the bilinear weights being convex, that moves a value by an ulp
    at most, which the kernels leave.)

  version 1  (this program's) one thread per output value (resize_pad_kernel1)
  version 2  one thread per x128::size consecutive pixels of a row, all three channels: the row's
             weights computed once, a tap's three bytes read together, 128-bit stores into the
             three planes (resize_pad_kernel2; S a multiple of x128::size, 16-byte aligned planes,
             which resize_pad2_fits tests): the trainer's (vla/cuda/resize_pad.cuh), launched by
             its resize_pad ("launcher" below), which refuses the calls version 2 cannot take

  nvcc -O3 -std=c++17 -arch=sm_90 resize_pad.cu -o resize_pad && ./resize_pad
  ./resize_pad --dump FILE writes a few frames with what the launcher makes of them, for
  dev/cuda/resize_pad_check.py to compare against LeRobot's own resize_with_pad under torch (and
  the centred cases against pi0's rule written with torch).
*/
#include "common.h"
#include "../../vla/cuda/resize_pad.cuh"
#include <getopt.h>

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 relative per
// value); in fp32 builds the kernel works in float (as torch does) and the reference in double,
// and they differ by a few float roundings of values in [-1, 1]
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// version 1 (version 2 and what both use, ResizePad and its plan resize_pad_plan, resize_source
// and bilinear_u8, are vla/cuda/resize_pad.cuh's)

// out: n_img images (3, S, S), image i at out + i out_stride; frames: n_img (h, w, 3) u8 frames,
// frame i at frames + i in_stride. One thread per output value.
__global__ void resize_pad_kernel1(floatX* out, const uint8_t* frames, ResizePad r, int n_img, size_t in_stride,
                                   size_t out_stride) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t plane = (size_t)r.S * r.S;
    if (idx >= (size_t)n_img * 3 * plane) { return; }
    int x = (int)(idx % r.S), y = (int)(idx / r.S % r.S), c = (int)(idx / plane % 3);
    size_t img = idx / (3 * plane);
    const uint8_t* f = frames + img * in_stride;
    int yr = y - r.pad_top, xr = x - r.pad_left;
    float v = 0.0f;  // the padding, in [0, 1] units
    if (yr >= 0 && yr < r.rh && xr >= 0 && xr < r.rw) {
        if (r.rh == r.h && r.rw == r.w) {  // nothing to resize (a frame already at size)
            v = (float)f[((size_t)yr * r.w + xr) * 3 + c] / 255.0f;
        } else {
            int y0, y1, x0, x1;
            float ly, lx;
            resize_source(yr, r.scale_h, r.h, &y0, &y1, &ly);
            resize_source(xr, r.scale_w, r.w, &x0, &x1, &lx);
            v = bilinear_u8(f, r.w, c, y0, y1, ly, x0, x1, lx);
        }
    }
    out[img * out_stride + (size_t)c * plane + (size_t)y * r.S + x] = fx(v * 2.0f - 1.0f);
}

// a launcher per version with its block size (version 0, the trainer's resize_pad, runs version 2
// at BLOCK)

static void resize_pad1(floatX* out, const uint8_t* frames, const ResizePad& r, int n_img, size_t in_stride,
                        size_t out_stride, int block) {
    size_t n = (size_t)n_img * 3 * r.S * r.S;
    resize_pad_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(out, frames, r, n_img, in_stride, out_stride);
    launchCheck();
}

static void resize_pad2(floatX* out, const uint8_t* frames, const ResizePad& r, int n_img, size_t in_stride,
                        size_t out_stride, int block) {
    size_t n = (size_t)n_img * r.S * (r.S / x128::size);
    resize_pad_kernel2<<<ceil_div(n, block), block, 0, main_stream>>>(out, frames, r, n_img, in_stride, out_stride);
    launchCheck();
}

// ----------------------------------------------------------------------------
// reference, in double: LeRobot's resize_with_pad and x * 2 - 1, written again from its rule

// out (n_img, 3, S, S), packed; is_pad (n_img, 3, S, S): 1 where the value is padding; centred:
// pi0's padding, else SmolVLA's
static void resize_pad_reference(double* out, char* is_pad, const uint8_t* frames, int n_img, int h, int w, int S,
                                 int centred) {
    int at_size = h == S && w == S;
    double ratio = (double)w / S > (double)h / S ? (double)w / S : (double)h / S;
    int rh = at_size ? S : (int)(h / ratio), rw = at_size ? S : (int)(w / ratio);
    int top = centred ? (S - rh) / 2 : S - rh, left = centred ? (S - rw) / 2 : S - rw;
    // torch's scale for a given size: in / out, in float
    double sh = (float)h / (float)rh, sw = (float)w / (float)rw;
    for (int i = 0; i < n_img; i++) {
        const uint8_t* f = frames + (size_t)i * h * w * 3;
        for (int c = 0; c < 3; c++) {
            for (int y = 0; y < S; y++) {
                for (int x = 0; x < S; x++) {
                    size_t o = (((size_t)i * 3 + c) * S + y) * S + x;
                    int yr = y - top, xr = x - left, pad = yr < 0 || yr >= rh || xr < 0 || xr >= rw;
                    double v = 0.0;
                    if (!pad && at_size) {
                        v = f[((size_t)y * w + x) * 3 + c] / 255.0;
                    } else if (!pad) {
                        double src_y = fmax((yr + 0.5) * sh - 0.5, 0.0);
                        double src_x = fmax((xr + 0.5) * sw - 0.5, 0.0);
                        int y0 = (int)fmin(floor(src_y), h - 1), x0 = (int)fmin(floor(src_x), w - 1);
                        int y1 = y0 < h - 1 ? y0 + 1 : y0, x1 = x0 < w - 1 ? x0 + 1 : x0;
                        double ly = fmin(fmax(src_y - y0, 0.0), 1.0), lx = fmin(fmax(src_x - x0, 0.0), 1.0);
                        double p00 = f[((size_t)y0 * w + x0) * 3 + c] / 255.0;
                        double p01 = f[((size_t)y0 * w + x1) * 3 + c] / 255.0;
                        double p10 = f[((size_t)y1 * w + x0) * 3 + c] / 255.0;
                        double p11 = f[((size_t)y1 * w + x1) * 3 + c] / 255.0;
                        v = (1.0 - ly) * ((1.0 - lx) * p00 + lx * p01) + ly * ((1.0 - lx) * p10 + lx * p11);
                    }
                    out[o] = v * 2.0 - 1.0;
                    is_pad[o] = (char)pad;
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// checks

static uint8_t* random_frames(size_t n, uint64_t seed) {
    Rng r;
    rng_init(&r, seed, 99);
    uint8_t* p = (uint8_t*)mallocCheck(n);
    for (size_t i = 0; i < n; i++) { p[i] = (uint8_t)(rng_u64(&r) & 255); }
    return p;
}

// The plan against the sizes resize_with_pad gives (read off Python: int(h / max(w / S, h / S)));
// the padding on the left and top (SmolVLA), or centred (pi0: the floor of half of it there)
static void check_plan(void) {
    struct { int h, w, S, rh, rw; } cases[] = {
        {224, 224, 512, 512, 512},  // the smolvla cameras: upsampled, no padding
        {180, 320, 512, 288, 512},  // wide: 224 rows of padding on top
        {320, 180, 512, 512, 288},  // tall: padding on the left
        {512, 512, 512, 512, 512},  // at size: returned as it is
        {480, 640, 512, 384, 512},
        {600, 400, 512, 512, 341},  // 341.33 truncated
        {9, 18, 224, 111, 223},     // 9 / (18 / 224) = 111.99999999999999 in doubles: 111, not 112;
                                    // and 18 / (18 / 224) truncates to 223, not 224
        {63, 72, 224, 195, 223},    // the same rounding: 196 and 224 exactly, 195 and 223 in doubles
        {180, 320, 224, 126, 224},  // pi0's cameras: 98 rows of padding, 49 on top (centred)
        {600, 400, 224, 224, 149},  // 75 columns: 37 on the left, 38 on the right (centred)
    };
    for (int centred = 0; centred <= 1; centred++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            int S = cases[i].S, top = centred ? (S - cases[i].rh) / 2 : S - cases[i].rh;
            int left = centred ? (S - cases[i].rw) / 2 : S - cases[i].rw;
            ResizePad r = resize_pad_plan(cases[i].h, cases[i].w, S, centred);
            char what[200];
            snprintf(what, sizeof(what), "plan %d x %d at %d%s: resized %d x %d (want %d x %d), padding %d top, %d "
                     "left (want %d, %d)", cases[i].h, cases[i].w, S, centred ? " centred" : "", r.rh, r.rw,
                     cases[i].rh, cases[i].rw, r.pad_top, r.pad_left, top, left);
            check_true(what, r.rh == cases[i].rh && r.rw == cases[i].rw && r.pad_top == top && r.pad_left == left);
        }
    }
}

static void run_version(int version, int block, floatX* out, const uint8_t* frames, int n_img, int h, int w, int S,
                        size_t in_stride, size_t out_stride, int centred) {
    if (version == 0) {
        resize_pad(out, frames, n_img, h, w, S, in_stride, out_stride, centred);
    } else if (version == 1) {
        resize_pad1(out, frames, resize_pad_plan(h, w, S, centred), n_img, in_stride, out_stride, block);
    } else {
        resize_pad2(out, frames, resize_pad_plan(h, w, S, centred), n_img, in_stride, out_stride, block);
    }
}

// n_img frames of h x w at S; with `interleaved`, the frames are camera 1 of 2 in both the stored
// frames (plus 3 unused bytes after each pair) and the images, whose camera-0 slots must stay
// untouched; centred: pi0's padding
static void check_shape(int n_img, int h, int w, int S, int interleaved, int centred, uint64_t seed) {
    size_t frame = (size_t)h * w * 3, image = (size_t)3 * S * S;
    size_t in_stride = interleaved ? 2 * frame + 3 : frame, out_stride = interleaved ? 2 * image : image;
    size_t in_offset = interleaved ? frame : 0, out_offset = interleaved ? image : 0;
    uint8_t* stored = random_frames(n_img * in_stride, seed);
    uint8_t* packed = (uint8_t*)mallocCheck(n_img * frame);  // this camera's frames, for the reference
    for (int i = 0; i < n_img; i++) { memcpy(packed + i * frame, stored + i * in_stride + in_offset, frame); }
    uint8_t* d_frames;
    cudaCheck(cudaMalloc(&d_frames, n_img * in_stride));
    cudaCheck(cudaMemcpy(d_frames, stored, n_img * in_stride, cudaMemcpyHostToDevice));
    size_t n = n_img * image;
    double* ref = (double*)mallocCheck(n * sizeof(double));
    char* is_pad = (char*)mallocCheck(n);
    resize_pad_reference(ref, is_pad, packed, n_img, h, w, S, centred);
    // a frame at size is only mapped: u8 / 255 * 2 - 1 in float (times 2 is exact), then floatX
    int at_size = h == S && w == S;
    float* mapped = (float*)mallocCheck(n * sizeof(float));
    for (size_t o = 0; at_size && o < n; o++) {
        size_t i = o / image, c = o / ((size_t)S * S) % 3, y = o / S % S, x = o % S;
        mapped[o] = round_x((float)packed[i * frame + (y * w + x) * 3 + c] / 255.0f * 2.0f - 1.0f);
    }
    size_t n_out = n_img * out_stride;
    floatX* out;
    cudaCheck(cudaMalloc(&out, n_out * sizeof(floatX)));
    float* got = (float*)mallocCheck(n * sizeof(float));
    float* got_pad = (float*)mallocCheck(n * sizeof(float));
    float* minus_one = (float*)mallocCheck(n * sizeof(float));
    for (int version = 0; version <= 2; version++) {
        // the trainer's launcher runs version 2
        if (version != 1 && !resize_pad2_fits(out + out_offset, S, out_stride)) { continue; }
        for (int bi = 0; bi < (version == 0 ? 1 : N_BLOCKS); bi++) {
            poison(out, n_out * sizeof(floatX));
            run_version(version, BLOCKS[bi], out + out_offset, d_frames + in_offset, n_img, h, w, S, in_stride,
                        out_stride, centred);
            float* all = from_device_x(out, n_out);
            for (int i = 0; i < n_img; i++) {
                memcpy(got + i * image, all + i * out_stride + out_offset, image * sizeof(float));
            }
            char what[160], item[200], shape[100];
            snprintf(shape, sizeof(shape), "(%d frames %d x %d -> %d%s%s)", n_img, h, w, S,
                     centred ? ", centred" : "", interleaved ? ", camera 1 of 2" : "");
            if (version == 0) {
                snprintf(what, sizeof(what), "launcher %s", shape);
            } else {
                snprintf(what, sizeof(what), "v%d %s block %d", version, shape, BLOCKS[bi]);
            }
            snprintf(item, sizeof(item), "%s: images", what);
            check_close(item, got, ref, n, TOL_X);
            size_t n_pad = 0;  // the padding is exactly -1 in both precisions
            for (size_t o = 0; o < n; o++) {
                if (is_pad[o]) { got_pad[n_pad] = got[o]; minus_one[n_pad++] = -1.0f; }
            }
            snprintf(item, sizeof(item), "%s: padding is -1", what);
            check_exact(item, got_pad, minus_one, n_pad);
            if (at_size) {  // no resize: exactly the mapped pixels
                snprintf(item, sizeof(item), "%s: at size, u8 / 255 * 2 - 1", what);
                check_exact(item, got, mapped, n);
            }
            if (interleaved) {  // camera 0's slots still hold the poison: nothing wrote there
                size_t touched = 0;
                for (int i = 0; i < n_img; i++) {
                    for (size_t o = 0; o < image; o++) { touched += !isnan(all[i * out_stride + o]); }
                }
                snprintf(item, sizeof(item), "%s: the other camera's images untouched (%zu written)", what, touched);
                check_true(item, touched == 0);
            }
            free(all);
        }
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(d_frames));
    free(stored); free(packed); free(ref); free(is_pad); free(mapped); free(got); free(got_pad); free(minus_one);
}

// ----------------------------------------------------------------------------
// the dump for resize_pad_check.py: a header, then per case its sizes, its frames and the
// launcher's images as float32

#define RESIZE_DUMP_MAGIC 0x5A525056u  // "VPRZ"
#define RESIZE_DUMP_VERSION 2          // 2: each case says its padding
typedef struct {
    uint32_t magic, version;
    uint32_t n_cases;
    uint32_t floatx_bytes;  // 4 (fp32 build) or 2 (bf16, fp16): how finely the images were rounded
} ResizeDumpHeader;
typedef struct {
    int32_t n_img, h, w, S;  // then n_img h w 3 bytes of frames, n_img 3 S S float32 images
    int32_t centred;         // 1: pi0's padding, centred; 0: SmolVLA's, on the left and top
} ResizeDumpCase;

static void fwrite_all(const void* p, size_t bytes, FILE* f, const char* path) {
    if (bytes > 0 && fwrite(p, 1, bytes, f) != bytes) { vla_fail("writing %s: %s", path, strerror(errno)); }
}

static void dump_cases(const char* path) {
    // the smolvla cameras (224 x 224 and 180 x 320 at 512), a frame at size, upsampling and
    // downsampling of both orientations, odd sizes, and the doubles' rounding of resize_with_pad;
    // pi0's padding (centred) of a wide and a tall frame with odd padding, and its camera at 224
    ResizeDumpCase cases[] = {
        {2, 224, 224, 512, 0}, {2, 180, 320, 512, 0}, {1, 64, 64, 64, 0}, {2, 30, 40, 64, 0}, {2, 100, 60, 32, 0},
        {2, 17, 23, 48, 0},    {2, 77, 31, 40, 0},    {1, 9, 18, 224, 0}, {2, 17, 23, 48, 1}, {2, 77, 31, 40, 1},
        {2, 180, 320, 224, 1},
    };
    uint32_t n_cases = sizeof(cases) / sizeof(cases[0]);
    FILE* f = fopenCheck(path, "wb");
    ResizeDumpHeader hd = {RESIZE_DUMP_MAGIC, RESIZE_DUMP_VERSION, n_cases, (uint32_t)sizeof(floatX)};
    fwrite_all(&hd, sizeof(hd), f, path);
    for (uint32_t k = 0; k < n_cases; k++) {
        ResizeDumpCase c = cases[k];
        size_t n_in = (size_t)c.n_img * c.h * c.w * 3, n_out = (size_t)c.n_img * 3 * c.S * c.S;
        uint8_t* frames = random_frames(n_in, 500 + k);
        uint8_t* d_frames;
        cudaCheck(cudaMalloc(&d_frames, n_in));
        cudaCheck(cudaMemcpy(d_frames, frames, n_in, cudaMemcpyHostToDevice));
        floatX* out;
        cudaCheck(cudaMalloc(&out, n_out * sizeof(floatX)));
        resize_pad(out, d_frames, c.n_img, c.h, c.w, c.S, 0, 0, c.centred);
        float* images = from_device_x(out, n_out);
        fwrite_all(&c, sizeof(c), f, path);
        fwrite_all(frames, n_in, f, path);
        fwrite_all(images, n_out * sizeof(float), f, path);
        cudaCheck(cudaFree(d_frames)); cudaCheck(cudaFree(out));
        free(frames); free(images);
    }
    if (fclose(f) != 0) { vla_fail("closing %s: %s", path, strerror(errno)); }
    printf("wrote %u cases to %s: compare them with build/lerobot-venv/bin/python dev/cuda/resize_pad_check.py %s\n",
           n_cases, path, path);
}

// ----------------------------------------------------------------------------
// benchmark at the smolvla shapes: 32 samples x 2 cameras to 512 x 512, from 224 x 224 and from
// 180 x 320 frames

static void benchmark_shape(int n_img, int h, int w, int S, int centred) {
    size_t n_in = (size_t)n_img * h * w * 3, n_out = (size_t)n_img * 3 * S * S;
    uint8_t* frames = random_frames(n_in, 7);
    uint8_t* d_frames;
    cudaCheck(cudaMalloc(&d_frames, n_in));
    cudaCheck(cudaMemcpy(d_frames, frames, n_in, cudaMemcpyHostToDevice));
    floatX* out;
    cudaCheck(cudaMalloc(&out, n_out * sizeof(floatX)));
    double bytes = (double)n_in + (double)n_out * sizeof(floatX);  // frames read once, images written
    for (int version = 1; version <= 2; version++) {
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_version(version, block, out, d_frames, n_img, h, w, S, (size_t)h * w * 3,
                                                    (size_t)3 * S * S, centred); }, 20);
            printf("bench v%d (%d frames %d x %d -> %d%s) block %4d: %7.3f ms, %7.1f GB/s\n", version, n_img, h, w, S,
                   centred ? ", centred" : "", block, ms, bytes / (ms * 1e-3) / 1e9);
        }
    }
    cudaCheck(cudaFree(d_frames)); cudaCheck(cudaFree(out));
    free(frames);
}

static void benchmark(void) {
    benchmark_shape(64, 224, 224, 512, 0);
    benchmark_shape(64, 180, 320, 512, 0);
    benchmark_shape(16, 180, 320, 224, 1);  // pi0 at batch 8: 2 cameras to 224 x 224, centred
}

int main(int argc, char** argv) {
    const char* dump = NULL;
    static struct option longs[] = {{"dump", required_argument, 0, 'd'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":d:h", longs, NULL)) != -1) {
        switch (opt) {
            case 'd': dump = optarg; break;
            case 'h':
                printf("usage: %s [--dump FILE]\n"
                       "  checks the kernels against the reference, then benchmarks them (on a GPU);\n"
                       "  -d, --dump FILE  instead write test frames and the launcher's images to FILE, for\n"
                       "                   dev/cuda/resize_pad_check.py (default: no dump)\n", argv[0]);
                return 0;
            case ':': vla_fail("option %s needs a value: see %s -h", argv[optind - 1], argv[0]);
            default: vla_fail("unknown option %s: see %s -h", argv[optind - 1], argv[0]);
        }
    }
    dev_init("resize_pad");
    if (dump != NULL) {
        dump_cases(dump);
        return 0;
    }
    check_plan();
    // upsampling and downsampling, wide and tall frames (padding on top, on the left), frames at
    // size and at ratio 1 (resized to themselves, then padded), a width S that is a multiple of
    // x128::size in both precisions (16, 24, 32), in fp32 only (20), in neither (18); LeRobot's
    // rounded size (9 x 18 at 224: 111 x 223); frames interleaved with a second camera's; one
    // frame of each smolvla camera
    struct { int n_img, h, w, S, interleaved, centred; } shapes[] = {
        {3, 8, 8, 16, 0, 0},    {2, 12, 20, 16, 0, 0}, {2, 20, 12, 16, 0, 0}, {2, 16, 16, 16, 0, 0},
        {2, 16, 10, 16, 0, 0},  {2, 45, 80, 32, 0, 0}, {1, 7, 5, 24, 0, 0},   {2, 13, 9, 20, 0, 0},
        {2, 11, 17, 18, 0, 0},  {1, 100, 60, 16, 0, 0}, {1, 9, 18, 224, 0, 0}, {2, 6, 10, 24, 1, 0},
        {2, 24, 24, 24, 1, 0},  {1, 224, 224, 512, 0, 0}, {1, 180, 320, 512, 1, 0},
        // pi0's padding: odd and even amounts of it, on both axes, at size, interleaved, its cameras
        {2, 12, 20, 16, 0, 1},  {2, 20, 12, 16, 0, 1}, {2, 13, 9, 20, 0, 1},  {2, 11, 17, 18, 0, 1},
        {1, 100, 60, 16, 0, 1}, {2, 16, 16, 16, 0, 1}, {2, 6, 10, 24, 1, 1},  {1, 180, 320, 224, 1, 1},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_shape(shapes[i].n_img, shapes[i].h, shapes[i].w, shapes[i].S, shapes[i].interleaved, shapes[i].centred,
                    100 + 10 * i);
    }
    return dev_finish(benchmark);
}
