/*
emulate.h: runs this project's CUDA C++ on the CPU, so the kernels of train_vla.cu and dev/cuda
are exercised by `make test` on machines without a GPU.

It implements the subset of the CUDA runtime, cuda_bf16, cuda_fp16, WMMA (nvcuda::wmma), PTX's
bf16 mma.sync m16n8k16 and ldmatrix (emu_mma_m16n8k16_bf16, emu_ldmatrix_x4) and cuBLASLt that the
project uses, on the host:
- A launch runs the blocks of the grid one after another. The threads of a block are fibers
  (each its own stack, switched by a few lines of x86-64 assembly), so __syncthreads, __syncwarp
  and the warp shuffles mean what they mean on a GPU: a thread waits until every live thread of
  its block (or lane of its warp) has arrived.
- WMMA fragments hold the whole tile in every lane (the real layout is unspecified, so code that
  is correct on a GPU only touches fragment elements uniformly); mma_sync multiplies in fp32, once
  for the 32 lanes of a warp that multiply the same tiles.
- mma.sync's and ldmatrix's fragments are PTX's, lane by lane, so a kernel that reads or writes
  their elements (row maxima, P as the next product's operand) is checked as it runs on a GPU.
- cublasLtMatmul computes D = alpha op(A) op(B) + beta C (+ bias, then GELU-tanh where the
  epilogue asks) in column-major order, one product or a strided batch of them (BATCH_COUNT,
  STRIDED_BATCH_OFFSET), with fp32 accumulation, checking the layouts it is given.

It also checks what a GPU reports less plainly, and stops with one line when it finds it:
- a barrier or shuffle that not every live thread reaches (the deadlock is reported),
- host code touching device memory (device memory is inaccessible outside kernels and copies),
- a kernel reading or writing past the end of a device allocation (each allocation ends at a
  guard page),
- reads of memory nothing wrote: cudaMalloc (up to 16 MB; larger buffers read as zero) and
  shared memory (dynamic, and static for each block) are filled with 0xFF bytes, a NaN in fp32,
  bf16 and fp16,
- cudaMemcpy directions that do not match where the pointers live, blocks over 1024 threads,
- a launch with over 48 KiB of dynamic shared memory that cudaFuncSetAttribute did not allow on
  that device (cudaFuncAttributeMaxDynamicSharedMemorySize).
- cp.async copies read before the issuing thread's wait (they land at the wait; until then their
  destination is 0xFF bytes), and cp.async addresses that are not 16-byte aligned.
What it cannot show: races between threads as such (fibers run one at a time, so a missing barrier
only shows where the order of the threads decides a result: CUDA_EMU_SCHEDULE=reverse runs the last
warp first, and what passes both ways has no producer and consumer that rely on luck), performance.

Streams are synchronous: work runs when it is issued, in issue order. CUDA graphs are emulated by
stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture): work issued to the capturing stream
by the capturing host thread is recorded with its arguments as they were at the call (a product's
descriptors and bias, a kernel's parameters), not run, and cudaGraphLaunch replays it; what a GPU
refuses during a capture (synchronous copies and memsets, work on the legacy default stream, a
synchronize of the capturing stream) stops the program. emu_launch_count() counts the work handed
to the device (kernel launches, cuBLASLt products, copies, memsets; a graph's launch counts once),
and each event remembers the count at its record (emu_event_launches), to count what a piece of
code launches.

Several GPUs: CUDA_EMU_DEVICES=N emulates N devices (CUDA_VISIBLE_DEVICES narrows them as on a real
machine); host threads may drive them at once, their device work taking turns. NCCL's collectives
among the ranks of one process are emulated too (nccl.h): each call waits for every rank, then the
last to arrive reduces in rank order for all. CUDA_EMU_NCCL_FAULT=rank:call:error|hang makes that
rank's call-th collective fail (an asynchronous error) or hang, to test a trainer's fault handling.

Build: dev/cuda/emu/launch.sed turns `kernel<<<grid, block, smem, stream>>>(args)` into
`emu_launch(kernel, grid, block, smem, stream)(args)` and `extern __shared__ T name[];` into a
pointer to the launch's dynamic shared memory; then g++ -x c++ compiles the result with this
folder first on the include path, where cuda_runtime.h, cuda_bf16.h, mma.h and cublasLt.h are
shims that include this file. See the Makefile's emu targets.
*/
#ifndef CUDA_EMULATE_H
#define CUDA_EMULATE_H

#if !defined(__x86_64__)
#error "the CUDA emulation switches fibers with x86-64 assembly: build it on an x86-64 machine"
#endif

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define CUDA_EMULATION 1

// ----------------------------------------------------------------------------
// qualifiers and built-in types

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
// one copy per block: blocks run one after another on one host thread
#define __shared__ static

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __align__(8) int2 { int x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(16) uint4 { unsigned int x, y, z, w; };
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };

inline thread_local uint3 emu_thread_idx;
inline thread_local uint3 emu_block_idx;
inline thread_local dim3 emu_block_dim;
inline thread_local dim3 emu_grid_dim;
#define threadIdx emu_thread_idx
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim
static constexpr int warpSize = 32;

// device math the kernels use, with the host's libm behind them
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// __expf and __logf: glibc declares both
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

// ----------------------------------------------------------------------------
// errors

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorIllegalState = 401,
    cudaErrorStreamCaptureUnsupported = 900,
} cudaError_t;
typedef cudaError_t cudaError;

static inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorIllegalState: return "the operation is not permitted in the current state";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    }
    return "unknown error";
}

namespace emu {

// A misuse the GPU would turn into a crash, a hang or garbage: say what, then stop.
[[noreturn]] static inline void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] static inline void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "CUDA emulation: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stdout);
    fflush(stderr);
    _exit(3);
}

// ----------------------------------------------------------------------------
// device memory: every allocation is its own mapping that ends at a guard page, inaccessible
// (PROT_NONE) except while a kernel, a copy or a matrix product runs

struct Allocation {
    uint8_t* map;      // first byte of the mapping
    size_t map_bytes;  // usable pages (the guard page follows)
    uint8_t* ptr;      // what cudaMalloc returned
    size_t bytes;
};

// Device work (kernels, copies, products, allocations) takes turns under this lock, so host threads
// driving different emulated GPUs never run two grids at once.
inline std::recursive_mutex device_mutex;

struct State {
    std::vector<Allocation> allocs;
    size_t used = 0, peak = 0;
    int open_depth = 0;  // > 0 while device code runs
    bool handler_installed = false;
    uint8_t* dynamic_shared = nullptr;
    size_t dynamic_shared_bytes = 0;  // the launch's, as asked for
};
inline State state;
inline std::vector<void*> static_shared;  // the static __shared__ variables filled for the running block

static inline size_t page_size(void) {
    static size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    return ps;
}

static inline const Allocation* find_alloc(const void* p) {
    const uint8_t* q = (const uint8_t*)p;
    for (const Allocation& a : state.allocs) {
        if (q >= a.map && q < a.map + a.map_bytes + page_size()) { return &a; }
    }
    return nullptr;
}

static inline bool is_device(const void* p) { return find_alloc(p) != nullptr; }

static inline void protect_all(int prot) {
    for (const Allocation& a : state.allocs) {
        if (mprotect(a.map, a.map_bytes, prot) != 0) { fail("mprotect failed"); }
    }
}

// device memory opens for the duration of device work (kernels, copies, cuBLASLt)
static inline void device_open(void) {
    if (state.open_depth++ == 0) { protect_all(PROT_READ | PROT_WRITE); }
}
static inline void device_close(void) {
    if (--state.open_depth == 0) { protect_all(PROT_NONE); }
}

static inline void on_segv(int sig, siginfo_t* info, void* ctx) {
    (void)ctx;
    const Allocation* a = find_alloc(info->si_addr);
    if (a != nullptr) {
        const uint8_t* q = (const uint8_t*)info->si_addr;
        if (q >= a->ptr + a->bytes) {
            fprintf(stderr, "CUDA emulation: access %zu bytes past the end of a %zu-byte device allocation at %p\n",
                    (size_t)(q - (a->ptr + a->bytes)), a->bytes, (void*)a->ptr);
        } else {
            fprintf(stderr, "CUDA emulation: host code touched device memory at %p (byte %zu of a %zu-byte "
                    "cudaMalloc): copy it with cudaMemcpy first\n", info->si_addr, (size_t)(q - a->ptr), a->bytes);
        }
        _exit(3);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline void install_handler(void) {
    if (state.handler_installed) { return; }
    state.handler_installed = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    // the fault may come from a fiber's small stack: handle it on a stack of its own
    static uint8_t alt_stack[64 * 1024];
    stack_t ss;
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof(alt_stack);
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

enum : size_t { POISON_BYTES = 16u << 20 };

static inline void* device_alloc(size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(device_mutex);
    install_handler();
    size_t ps = page_size();
    size_t rounded = (bytes + 255) / 256 * 256;
    size_t map_bytes = (rounded + ps - 1) / ps * ps;
    if (map_bytes == 0) { map_bytes = ps; }
    uint8_t* map = (uint8_t*)mmap(nullptr, map_bytes + ps, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) { return nullptr; }
    Allocation a = {map, map_bytes, map + map_bytes - rounded, bytes};
    // poison: whatever a kernel reads before something wrote it is NaN. Large buffers (cuBLASLt's
    // workspace, say) stay untouched instead, reading as zero: their page tables would make every
    // launch's change of protection slow.
    if (bytes <= POISON_BYTES) {
        mprotect(map, map_bytes, PROT_READ | PROT_WRITE);
        memset(map, 0xFF, map_bytes);
    }
    mprotect(map, map_bytes, state.open_depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE);
    state.allocs.push_back(a);
    state.used += bytes;
    if (state.used > state.peak) { state.peak = state.used; }
    return a.ptr;
}

static inline bool device_free(void* p) {
    std::lock_guard<std::recursive_mutex> lock(device_mutex);
    for (size_t i = 0; i < state.allocs.size(); i++) {
        if (state.allocs[i].ptr == p) {
            munmap(state.allocs[i].map, state.allocs[i].map_bytes + page_size());
            state.used -= state.allocs[i].bytes;
            state.allocs.erase(state.allocs.begin() + (long)i);
            return true;
        }
    }
    return false;
}

// ----------------------------------------------------------------------------
// fibers: the threads of one block. emu_switch saves the callee-saved registers on the current
// stack, stores its stack pointer in *save, loads `next` and returns into whatever it saved.

extern "C" void emu_switch(void** save, void* next);
__asm__(
    ".text\n"
    ".globl emu_switch\n"
    ".hidden emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size emu_switch, .-emu_switch\n");

enum { RUNNABLE = 0, WAIT_BLOCK = 1, WAIT_WARP = 2, DONE = 3 };
enum { MAX_THREADS = 1024, STACK_BYTES = 256 * 1024 };
enum { WARP_SYNC = 0, WARP_SHFL = 1, WARP_BALLOT = 2 };

// one cp.async of 16 bytes in flight: where it lands, and what it read at its issue
struct AsyncCopy {
    uint8_t* dst;
    uint8_t bytes[16];
};

struct Fiber {
    void* sp;
    int state;
    uint3 idx;
    int warp_op;       // what the lane waits for in WAIT_WARP
    int shfl_src;      // lane to read from (WARP_SHFL)
    uint64_t posted;   // the lane's value (shuffle bits or ballot predicate)
    uint64_t result;   // what the exchange gives back
    std::vector<AsyncCopy> copies;  // the thread's cp.async copies not landed yet, in issue order
    std::vector<size_t> groups;     // where each committed group of them ends in copies, oldest first
};

struct Block {
    Fiber fibers[MAX_THREADS];
    int n;
    int current;
    void* scheduler_sp;
    void (*body)(void*);
    void* body_arg;
    uint8_t* stacks;  // MAX_THREADS stacks, each followed by a guard page
};
inline Block block;

static inline size_t stack_stride(void) { return STACK_BYTES + page_size(); }

static inline void fiber_entry(void) {
    Block& b = block;
    b.body(b.body_arg);
    b.fibers[b.current].state = DONE;
    emu_switch(&b.fibers[b.current].sp, b.scheduler_sp);
    fail("a finished thread was resumed");
}

// The running thread yields to the scheduler until its wait is over.
static inline void yield(int wait_state) {
    Block& b = block;
    b.fibers[b.current].state = wait_state;
    __asm__ __volatile__("" ::: "memory");
    emu_switch(&b.fibers[b.current].sp, b.scheduler_sp);
    __asm__ __volatile__("" ::: "memory");
}

static inline void fiber_prepare(Fiber* f, int k) {
    // the stack grows down from the top of slot k: six saved registers, then the address
    // emu_switch returns to, then a slot that keeps the entry's stack 16-byte aligned
    uint8_t* top = block.stacks + (size_t)k * stack_stride() + page_size() + STACK_BYTES;
    uint64_t* sp = (uint64_t*)((uintptr_t)top & ~(uintptr_t)15) - 2;
    sp[0] = (uint64_t)(uintptr_t)&fiber_entry;
    sp[1] = 0;
    sp -= 6;
    for (int i = 0; i < 6; i++) { sp[i] = 0; }
    f->sp = sp;
    f->state = RUNNABLE;
    f->copies.clear();
    f->groups.clear();
}

// The order in which a block's threads run between their meetings: warp 0 first and each warp's
// lanes from 0 (forward, the default), or the last warp first and each warp's lanes from the last
// (reverse). A missing barrier or cp.async wait hides in one of the two orders (a consumer that runs
// after its producer by luck) and shows in the other: CUDA_EMU_SCHEDULE=reverse runs a program again
// the other way round (dev/run_tests.sh runs the dev/cuda checks both ways).
inline int schedule = -1;  // 0 forward, 1 reverse; -1 until CUDA_EMU_SCHEDULE is read
static inline bool schedule_reverse(void) {
    if (schedule < 0) {
        const char* s = getenv("CUDA_EMU_SCHEDULE");
        if (s == nullptr || *s == '\0' || strcmp(s, "forward") == 0) {
            schedule = 0;
        } else if (strcmp(s, "reverse") == 0) {
            schedule = 1;
        } else {
            fail("CUDA_EMU_SCHEDULE=%s: expected forward (warp 0 first, the default) or reverse (the last warp first)", s);
        }
    }
    return schedule == 1;
}

// If every live lane of warp [w0, w1) waits at a warp operation, performs it (a shuffle's
// exchange, a ballot, or just the meeting of __syncwarp) and lets the lanes run again.
static inline bool resolve_warp(int w0, int w1) {
    Block& b = block;
    int live = 0, waiting = 0;
    for (int t = w0; t < w1; t++) {
        live += b.fibers[t].state != DONE;
        waiting += b.fibers[t].state == WAIT_WARP;
    }
    if (live == 0 || waiting != live) { return false; }
    int op = -1;
    uint64_t ballot = 0;
    for (int t = w0; t < w1; t++) {
        if (b.fibers[t].state != WAIT_WARP) { continue; }
        if (op >= 0 && b.fibers[t].warp_op != op) {
            fail("block (%u,%u,%u): lanes of warp %d wait at different warp operations (shuffle, ballot, "
                 "__syncwarp): a divergent warp-level call", emu_block_idx.x, emu_block_idx.y, emu_block_idx.z, w0 / 32);
        }
        op = b.fibers[t].warp_op;
        if (b.fibers[t].posted != 0) { ballot |= 1ull << (t - w0); }
    }
    for (int t = w0; t < w1; t++) {
        Fiber& f = b.fibers[t];
        if (f.state != WAIT_WARP) { continue; }
        if (op == WARP_SHFL) {
            int src = w0 + f.shfl_src;
            f.result = (src >= w0 && src < w1 && b.fibers[src].state == WAIT_WARP) ? b.fibers[src].posted : f.posted;
        } else if (op == WARP_BALLOT) {
            f.result = ballot;
        }
    }
    for (int t = w0; t < w1; t++) {
        if (b.fibers[t].state == WAIT_WARP) { b.fibers[t].state = RUNNABLE; }
    }
    return true;
}

static inline void report_deadlock(void) {
    Block& b = block;
    int counts[4] = {0, 0, 0, 0};
    for (int t = 0; t < b.n; t++) { counts[b.fibers[t].state]++; }
    fail("block (%u,%u,%u) of %d threads cannot go on: %d wait at __syncthreads, %d at a warp operation, %d "
         "finished: a barrier or shuffle that not every live thread reaches",
         emu_block_idx.x, emu_block_idx.y, emu_block_idx.z, b.n, counts[WAIT_BLOCK], counts[WAIT_WARP], counts[DONE]);
}

static inline void run_block(void (*body)(void*), void* arg) {
    Block& b = block;
    if (b.stacks == nullptr) {
        b.stacks = (uint8_t*)mmap(nullptr, MAX_THREADS * stack_stride(), PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (b.stacks == MAP_FAILED) { fail("cannot map fiber stacks"); }
        for (int k = 0; k < MAX_THREADS; k++) { mprotect(b.stacks + (size_t)k * stack_stride(), page_size(), PROT_NONE); }
    }
    dim3 bd = emu_block_dim;
    b.n = (int)(bd.x * bd.y * bd.z);
    b.body = body;
    b.body_arg = arg;
    for (int t = 0; t < b.n; t++) {
        b.fibers[t].idx = uint3{(unsigned)t % bd.x, ((unsigned)t / bd.x) % bd.y, (unsigned)t / (bd.x * bd.y)};
        fiber_prepare(&b.fibers[t], t);
    }
    // warp by warp: a warp's lanes run until each waits, and warp operations are resolved on the
    // spot, so shuffles cost a pass over 32 lanes, not over the block (in schedule_reverse's order)
    bool rev = schedule_reverse();
    int n_warps = (b.n + 31) / 32;
    for (;;) {
        bool progressed = false, all_done = true;
        for (int wi = 0; wi < n_warps; wi++) {
            int w0 = 32 * (rev ? n_warps - 1 - wi : wi), w1 = w0 + 32 < b.n ? w0 + 32 : b.n;
            for (;;) {
                for (int k = 0; k < w1 - w0; k++) {
                    int t = rev ? w1 - 1 - k : w0 + k;
                    if (b.fibers[t].state == RUNNABLE) {
                        b.current = t;
                        emu_thread_idx = b.fibers[t].idx;
                        emu_switch(&b.scheduler_sp, b.fibers[t].sp);
                        progressed = true;
                    }
                }
                if (!resolve_warp(w0, w1)) { break; }
                progressed = true;
            }
            for (int t = w0; t < w1; t++) { all_done &= b.fibers[t].state == DONE; }
        }
        if (all_done) { break; }
        int live = 0, at_barrier = 0;
        for (int t = 0; t < b.n; t++) {
            live += b.fibers[t].state != DONE;
            at_barrier += b.fibers[t].state == WAIT_BLOCK;
        }
        if (live > 0 && at_barrier == live) {
            if (live < b.n) {
                fail("block (%u,%u,%u): __syncthreads reached by %d of %d threads, the others returned: a barrier "
                     "must be reached by the whole block", emu_block_idx.x, emu_block_idx.y, emu_block_idx.z, live, b.n);
            }
            for (int t = 0; t < b.n; t++) { b.fibers[t].state = RUNNABLE; }
            progressed = true;
        }
        if (!progressed) { report_deadlock(); }
    }
}

template <typename F>
static inline void call_body(void* f) { (*(F*)f)(); }

// Runs body() once per thread of every block of the grid.
template <typename F>
static inline void run_grid(dim3 grid, dim3 blk, size_t dynamic_smem, F& body) {
    size_t threads = (size_t)blk.x * blk.y * blk.z;
    if (threads == 0 || threads > MAX_THREADS || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
        grid.z > 65535 || blk.z > 64) {
        fail("invalid launch: grid (%u,%u,%u), block (%u,%u,%u): a block holds 1 to 1024 threads and no grid "
             "dimension may be 0", grid.x, grid.y, grid.z, blk.x, blk.y, blk.z);
    }
    if (dynamic_smem > 227 * 1024) { fail("invalid launch: %zu bytes of dynamic shared memory (at most 227 KiB)", dynamic_smem); }
    std::lock_guard<std::recursive_mutex> lock(device_mutex);
    // dynamic shared memory starts 128-byte aligned, as on a GPU whose kernel has no static share
    size_t smem_bytes = (dynamic_smem + 127) / 128 * 128 + 128;
    uint8_t* smem = (uint8_t*)aligned_alloc(128, smem_bytes);
    device_open();
    emu_grid_dim = grid;
    emu_block_dim = blk;
    for (unsigned z = 0; z < grid.z; z++) {
        for (unsigned y = 0; y < grid.y; y++) {
            for (unsigned x = 0; x < grid.x; x++) {
                memset(smem, 0xFF, smem_bytes);  // shared memory starts as garbage: NaN here
                static_shared.clear();            // (and static __shared__ variables: emu_static_shared)
                state.dynamic_shared = smem;
                state.dynamic_shared_bytes = dynamic_smem;
                emu_block_idx = uint3{x, y, z};
                run_block(&call_body<F>, &body);
            }
        }
    }
    state.dynamic_shared = nullptr;
    state.dynamic_shared_bytes = 0;
    free(smem);
    device_close();
}

}  // namespace emu

static inline void* emu_dynamic_shared(void) { return emu::state.dynamic_shared; }

// A kernel's static __shared__ variable (launch.sed declares it static and calls this after it):
// garbage (0xFF bytes, a NaN) for each block, as dynamic shared memory is. The block's first thread
// to reach the declaration fills it; the others find it done.
static inline void emu_static_shared(void* var, size_t bytes) {
    for (void* v : emu::static_shared) {
        if (v == var) { return; }
    }
    memset(var, 0xFF, bytes);
    emu::static_shared.push_back(var);
}

// ----------------------------------------------------------------------------
// synchronization inside a block

static inline void __syncthreads(void) { emu::yield(emu::WAIT_BLOCK); }

static inline uint64_t emu_warp_op(int op, uint64_t value, int src_lane) {
    emu::Fiber& f = emu::block.fibers[emu::block.current];
    f.warp_op = op;
    f.posted = value;
    f.shfl_src = src_lane;
    emu::yield(emu::WAIT_WARP);
    return f.result;
}

static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; emu_warp_op(emu::WARP_SYNC, 0, 0); }
static inline int emu_lane(void) { return emu::block.current % 32; }

template <typename T>
static inline uint64_t emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <typename T>
static inline T emu_from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    (void)mask;
    int lane = emu_lane();
    int src = ((lane ^ lane_mask) / width == lane / width) ? (lane ^ lane_mask) : lane;
    return emu_from_bits<T>(emu_warp_op(emu::WARP_SHFL, emu_bits(var), src));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    (void)mask;
    int lane = emu_lane();
    int src = (lane % width) + (int)delta < width ? lane + (int)delta : lane;
    return emu_from_bits<T>(emu_warp_op(emu::WARP_SHFL, emu_bits(var), src));
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    (void)mask;
    int lane = emu_lane();
    int src = (lane / width) * width + (src_lane % width);
    return emu_from_bits<T>(emu_warp_op(emu::WARP_SHFL, emu_bits(var), src));
}
static inline unsigned __ballot_sync(unsigned mask, int predicate) {
    (void)mask;
    return (unsigned)emu_warp_op(emu::WARP_BALLOT, predicate != 0, 0);
}

// ----------------------------------------------------------------------------
// bf16: conversions only (round to nearest even); arithmetic goes through float, explicitly

struct __align__(2) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
        r.__x = (unsigned short)((u >> 16) | 0x40u);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.__x = (unsigned short)(u >> 16);
    return r;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ----------------------------------------------------------------------------
// fp16 (IEEE binary16): conversions only, as bf16's. 5 exponent bits (bias 15), 10 fraction bits:
// largest finite 65504, smallest normal 2^-14, smallest subnormal 2^-24. Round to nearest even;
// what rounds past 65504 (from 65520 up) is +-Inf; subnormals are kept; NaN stays a (quiet) NaN.

struct __align__(2) __half {
    unsigned short __x;
    __half() = default;
};
typedef __half half;

static inline __half __float2half(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    __half r;
    if (a > 0x7f800000u) {  // NaN: quiet, with the top of the payload
        r.__x = (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
        return r;
    }
    if (a >= 0x477ff000u) {  // 65520 and up (Inf included) round to Inf
        r.__x = (unsigned short)(sign | 0x7c00u);
        return r;
    }
    if (a >= 0x38800000u) {  // normal in fp16 (>= 2^-14): rebias the exponent, round 13 bits away
        uint32_t h = (a - 0x38000000u) >> 13, rest = a & 0x1fffu;
        h += rest > 0x1000u || (rest == 0x1000u && (h & 1u));  // a carry into the exponent is right
        r.__x = (unsigned short)(sign | h);
        return r;
    }
    if (a < 0x33000000u) {  // below half the smallest subnormal (2^-25): zero; 2^-25 itself ties to 0
        r.__x = (unsigned short)sign;
        return r;
    }
    // subnormal: the value in units of 2^-24, the implicit bit made explicit, rounded to even
    int e = (int)(a >> 23);                        // 102 .. 112 here
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;   // value = mant * 2^(e - 150)
    int shift = 126 - e;                           // to units of 2^-24: 14 .. 24 bits away
    uint32_t h = mant >> shift, rest = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    h += rest > halfway || (rest == halfway && (h & 1u));
    r.__x = (unsigned short)(sign | h);
    return r;
}
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline float __half2float(__half h) {
    uint32_t sign = (uint32_t)(h.__x & 0x8000u) << 16, e = (h.__x >> 10) & 0x1fu, m = h.__x & 0x3ffu, u;
    if (e == 0x1fu) {  // Inf or NaN
        u = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        u = sign;
    } else {  // subnormal: m * 2^-24, exact in fp32
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline bool __hisinf(__half h) { return (h.__x & 0x7fffu) == 0x7c00u; }
static inline bool __hisnan(__half h) { return (h.__x & 0x7fffu) > 0x7c00u; }

// ----------------------------------------------------------------------------
// WMMA: every lane holds the whole tile. Loads and stores are collective, as on the GPU: no lane
// stores until every lane of the warp has loaded (each meets the others before and after), so a
// tile loaded, updated and stored back in place is read once, not once per lane.

// WMMA wants 256-bit aligned tile pointers
static inline void emu_check_aligned(const void* p, const char* what) {
    if ((uintptr_t)p % 32 != 0) { emu::fail("wmma::%s on %p, which is not 32-byte aligned", what, p); }
}

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct tile_shape;
template <int M, int N, int K> struct tile_shape<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct tile_shape<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct tile_shape<accumulator, M, N, K> { enum { rows = M, cols = N }; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    enum { rows = tile_shape<Use, M, N, K>::rows, cols = tile_shape<Use, M, N, K>::cols };
    enum { num_elements = rows * cols };
    T x[rows * cols];
};

template <typename T> static inline float emu_to_float(T v);
template <> inline float emu_to_float<float>(float v) { return v; }
template <> inline float emu_to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> inline float emu_to_float<__half>(__half v) { return __half2float(v); }

template <typename Use, int M, int N, int K, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T v) {
    for (int i = 0; i < f.num_elements; i++) { f.x[i] = v; }
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
    emu_check_aligned(p, "load_matrix_sync");
    __syncwarp();
    bool row = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < f.rows; r++) {
        for (int c = 0; c < f.cols; c++) { f.x[r * f.cols + c] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]; }
    }
    __syncwarp();
}

template <int M, int N, int K, typename T>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout) {
    emu_check_aligned(p, "load_matrix_sync");
    __syncwarp();
    for (int r = 0; r < f.rows; r++) {
        for (int c = 0; c < f.cols; c++) {
            f.x[r * f.cols + c] = layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
        }
    }
    __syncwarp();
}

template <int M, int N, int K, typename T>
static inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
    emu_check_aligned(p, "store_matrix_sync");
    __syncwarp();
    for (int r = 0; r < f.rows; r++) {
        for (int c = 0; c < f.cols; c++) {
            if (layout == mem_row_major) { p[(size_t)r * ldm + c] = f.x[r * f.cols + c]; }
            else { p[(size_t)c * ldm + r] = f.x[r * f.cols + c]; }
        }
    }
    __syncwarp();
}

// Every lane holds the whole tiles, so the 32 lanes of a warp multiply the same tiles one after
// another (they run in turn between two barriers): the first computes the product, and a lane whose
// tiles are the same bytes as the last product's of its host thread takes that product. The sums run
// in the same order either way, k rising from c, so the result is the same bits.
template <int M, int N, int K, typename Tab, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, Tab, LA>& a,
                            const fragment<matrix_b, M, N, K, Tab, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    struct Last {
        bool valid = false;
        fragment<matrix_a, M, N, K, Tab, LA> a;
        fragment<matrix_b, M, N, K, Tab, LB> b;
        fragment<accumulator, M, N, K, float> c, d;
    };
    static thread_local Last last;
    if (last.valid && memcmp(&last.a, &a, sizeof(a)) == 0 && memcmp(&last.b, &b, sizeof(b)) == 0 &&
        memcmp(&last.c, &c, sizeof(c)) == 0) {
        d = last.d;
        return;
    }
    last.a = a;
    last.b = b;
    last.c = c;
    float af[M * K], bt[N * K];  // A's rows and B's columns in fp32, each contiguous
    for (int i = 0; i < M * K; i++) { af[i] = emu_to_float(a.x[i]); }
    for (int k = 0; k < K; k++) {
        for (int j = 0; j < N; j++) { bt[j * K + k] = emu_to_float(b.x[k * N + j]); }
    }
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            float s = c.x[i * N + j];
            for (int k = 0; k < K; k++) { s += af[i * K + k] * bt[j * K + k]; }
            last.d.x[i * N + j] = s;
        }
    }
    last.valid = true;
    d = last.d;
}
}  // namespace wmma
}  // namespace nvcuda

// ----------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, PTX's warp-wide product, with the fragment
// layouts PTX documents (the kernels' wrapper issues the instruction itself on a GPU). Lane
// 4 g + t holds: a[r], two bf16 of A (16x16) at row g + 8 (r % 2), columns 2t + 8 (r / 2) and the
// next; b[r], two of B (16x8) at column g, rows 2t + 8 r and the next; d[i], D (16x8, fp32) at row
// g + 8 (i / 2), column 2t + i % 2. The lower index sits in a register's low half. The lanes post
// their registers, meet, and each sums its four outputs in fp32; they meet again before any lane
// can post the next product's.
namespace emu {
struct MmaPost { uint32_t a[4], b[2]; };
inline MmaPost mma_posts[MAX_THREADS];
}  // namespace emu

static inline float emu_bf16_half(uint32_t r, int high) {
    uint32_t u = (high ? r >> 16 : r & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void emu_mma_m16n8k16_bf16(float* d, const uint32_t* a, const uint32_t* b) {
    int lane = emu_lane();
    emu::MmaPost& mine = emu::mma_posts[emu::block.current];
    memcpy(mine.a, a, sizeof(mine.a));
    memcpy(mine.b, b, sizeof(mine.b));
    __syncwarp();
    const emu::MmaPost* warp = emu::mma_posts + (emu::block.current - lane);
    int g = lane / 4, t = lane % 4;
    float out[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float s = d[i];
        for (int k = 0; k < 16; k++) {
            // A (row, k): lane 4 (row % 8) + (k % 8) / 2, register row / 8 + 2 (k / 8); B (k, col): lane
            // 4 col + (k % 8) / 2, register k / 8; the half k % 2 in both
            float av = emu_bf16_half(warp[4 * (row % 8) + (k % 8) / 2].a[row / 8 + 2 * (k / 8)], k % 2);
            float bv = emu_bf16_half(warp[4 * col + (k % 8) / 2].b[k / 8], k % 2);
            s += av * bv;
        }
        out[i] = s;
    }
    __syncwarp();
    memcpy(d, out, sizeof(out));
}

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l posts the address of row l % 8 of matrix
// l / 8 (16 bytes of 16-bit elements, 16-byte aligned, in shared memory); after the meeting it
// takes, of matrix j, the two elements at row l / 4, columns 2 (l % 4) and the next (register j,
// the first in the low half), or with .trans those at rows 2 (l % 4) and the next of column l / 4.
namespace emu {
inline const void* ldmatrix_posts[MAX_THREADS];
}  // namespace emu

static inline void emu_ldmatrix_x4(uint32_t* r, const void* row, bool trans) {
    int lane = emu_lane();
    uint8_t* smem = (uint8_t*)emu::state.dynamic_shared;
    if ((uintptr_t)row % 16 != 0 || smem == nullptr || (const uint8_t*)row < smem ||
        (const uint8_t*)row + 16 > smem + emu::state.dynamic_shared_bytes) {
        emu::fail("ldmatrix at %p: a row address must be 16-byte aligned and its 16 bytes in the launch's dynamic "
                  "shared memory", row);
    }
    emu::ldmatrix_posts[emu::block.current] = row;
    __syncwarp();
    const void* const* warp = emu::ldmatrix_posts + (emu::block.current - lane);
    uint32_t out[4];
    for (int j = 0; j < 4; j++) {
        uint16_t e[2];
        for (int h = 0; h < 2; h++) {
            const uint16_t* at = trans ? (const uint16_t*)warp[8 * j + 2 * (lane % 4) + h] + lane / 4 :
                                         (const uint16_t*)warp[8 * j + lane / 4] + 2 * (lane % 4) + h;
            memcpy(&e[h], at, 2);
        }
        out[j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    __syncwarp();
    memcpy(r, out, sizeof(out));
}

// cp.async.cg.shared.global (16 bytes, sm_80), cp.async.commit_group and cp.async.wait_group n as
// PTX allows a GPU to run them: a copy may land at any moment between its issue and the issuing
// thread's wait that covers its group. Here it lands at that wait, and its 16 bytes of shared memory
// are garbage (0xFF, a NaN) from the issue until then, so a thread that reads a tile before the
// wait (and the barrier after it) sees NaN, and one that overwrites a tile another warp still reads
// shows in the other's result. The source is read at the issue (kernels do not write what they
// copy); both addresses must be 16-byte aligned, the destination in the launch's dynamic shared
// memory.
static inline void emu_cp_async16(void* dst, const void* src) {
    uint8_t* smem = (uint8_t*)emu::state.dynamic_shared;
    if ((uintptr_t)dst % 16 != 0 || (uintptr_t)src % 16 != 0 || smem == nullptr || (uint8_t*)dst < smem ||
        (uint8_t*)dst + 16 > smem + emu::state.dynamic_shared_bytes) {
        emu::fail("cp.async from %p to %p: both addresses must be 16-byte aligned, the destination's 16 bytes in the "
                  "launch's dynamic shared memory", src, dst);
    }
    emu::AsyncCopy c;
    c.dst = (uint8_t*)dst;
    memcpy(c.bytes, src, 16);
    memset(dst, 0xFF, 16);
    emu::block.fibers[emu::block.current].copies.push_back(c);
}
// closes the thread's group of copies issued since the last commit (an empty group is a group)
static inline void emu_cp_async_commit(void) {
    emu::Fiber& f = emu::block.fibers[emu::block.current];
    f.groups.push_back(f.copies.size());
}
// lands the copies of every committed group but the newest n (copies not committed stay in flight)
static inline void emu_cp_async_wait(int n) {
    emu::Fiber& f = emu::block.fibers[emu::block.current];
    if ((int)f.groups.size() <= n) { return; }
    size_t groups_done = f.groups.size() - (size_t)n, landed = f.groups[groups_done - 1];
    for (size_t i = 0; i < landed; i++) { memcpy(f.copies[i].dst, f.copies[i].bytes, 16); }
    f.copies.erase(f.copies.begin(), f.copies.begin() + (long)landed);
    f.groups.erase(f.groups.begin(), f.groups.begin() + (long)groups_done);
    for (size_t& end : f.groups) { end -= landed; }
}

// for tests: the schedule of the launches that follow (0 forward, 1 reverse), whatever
// CUDA_EMU_SCHEDULE says
static inline void emu_set_schedule(int reverse) { emu::schedule = reverse ? 1 : 0; }

// ----------------------------------------------------------------------------
// the runtime API: synchronous streams; the devices emu_device_count says

typedef struct EmuStream* cudaStream_t;
typedef struct EmuEvent { double t; uint64_t launches; }* cudaEvent_t;  // when, and emu_launch_count() then
typedef enum { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
               cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 } cudaMemcpyKind;
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };
enum { cudaHostRegisterDefault = 0, cudaHostRegisterPortable = 1 };
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int multiProcessorCount;
    int major, minor;
    int warpSize;
    int maxThreadsPerBlock;
    int l2CacheSize;
    int clockRate;
};

#define EMU_DEVICE_MEMORY (16ull << 30)  // what the emulated device reports as its memory

// CUDA_EMU_DEVICES emulated GPUs (1 by default), of which CUDA_VISIBLE_DEVICES lists the visible ones
static inline int emu_device_count(void) {
    const char* e = getenv("CUDA_EMU_DEVICES");
    int n = e != nullptr ? atoi(e) : 1;
    n = n < 0 ? 0 : (n > 64 ? 64 : n);
    const char* vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis == nullptr) { return n; }
    int visible = 0;
    for (const char* p = vis; *p;) {
        char* end;
        long d = strtol(p, &end, 10);
        if (end == p) { break; }  // CUDA stops at the first entry it cannot read
        visible += d >= 0 && d < n;
        p = *end == ',' ? end + 1 : end;
    }
    return visible;
}
inline thread_local int emu_current_device = 0;
static inline cudaError_t cudaGetDeviceCount(int* n) {
    *n = emu_device_count();
    return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}
static inline cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu_device_count()) { return cudaErrorInvalidDevice; }
    emu_current_device = d;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDevice(int* d) {
    *d = emu_current_device;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d < 0 || d >= emu_device_count()) { return cudaErrorInvalidDevice; }
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "CPU emulation of CUDA (dev/cuda/emu)");
    p->totalGlobalMem = EMU_DEVICE_MEMORY;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->multiProcessorCount = 4;
    p->major = 9; p->minor = 0;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->l2CacheSize = 4 << 20;
    return cudaSuccess;
}
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }

static inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = nullptr;
    if (emu::state.used + bytes > EMU_DEVICE_MEMORY) { return cudaErrorMemoryAllocation; }
    *p = emu::device_alloc(bytes);
    return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename T>
static inline cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc((void**)p, bytes); }
static inline cudaError_t cudaFree(void* p) {
    if (p == nullptr) { return cudaSuccess; }
    return emu::device_free(p) ? cudaSuccess : cudaErrorInvalidValue;
}
static inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    *total = EMU_DEVICE_MEMORY;
    *free_bytes = EMU_DEVICE_MEMORY - emu::state.used;
    return cudaSuccess;
}

static inline cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags) {
    (void)flags;
    if (emu::is_device(p) || bytes == 0) { return cudaErrorInvalidValue; }
    return cudaSuccess;
}
static inline cudaError_t cudaHostUnregister(void* p) { (void)p; return cudaSuccess; }

// ---- work for a stream: run now (streams are synchronous), or recorded while the stream captures

namespace emu {
typedef std::function<void()> Work;  // a kernel launch, a product, a copy, a memset, a graph
struct Capture {
    cudaStream_t stream;
    std::vector<Work> work;
};
inline thread_local Capture* capture = nullptr;  // this host thread's capture, if one is open
inline std::atomic<uint64_t> launches{0};        // work handed to the device, every thread's

// Hands `work` to stream s: recorded if this thread captures s, else counted and run now.
static inline void submit(cudaStream_t s, const char* what, Work work) {
    if (capture != nullptr && s == capture->stream) {
        capture->work.push_back(std::move(work));
        return;
    }
    if (capture != nullptr && s == nullptr) {
        fail("%s on the legacy default stream (a synchronous call, or stream 0) while stream %p captures a graph: a "
             "GPU refuses it (cudaErrorStreamCaptureImplicit); issue it on the capturing stream, or after the capture",
             what, (void*)capture->stream);
    }
    launches++;
    work();
}
}  // namespace emu

// Work handed to the device so far (kernel launches, cuBLASLt products, copies, memsets; a graph's
// launch once): emulation only, for counting what a piece of code launches.
static inline uint64_t emu_launch_count(void) { return emu::launches.load(); }

static inline cudaError_t emu_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t s = nullptr) {
    bool dd = emu::is_device(dst), sd = emu::is_device(src);
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && (dd != want_dd || sd != want_sd)) {
        emu::fail("cudaMemcpy of %zu bytes with kind %d, but the destination is %s memory and the source %s memory",
                  bytes, (int)kind, dd ? "device" : "host", sd ? "device" : "host");
    }
    emu::submit(s, "cudaMemcpy", [=]() {
        std::lock_guard<std::recursive_mutex> lock(emu::device_mutex);
        emu::device_open();
        memmove(dst, src, bytes);
        emu::device_close();
    });
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    return emu_copy(dst, src, bytes, kind);
}
static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                          cudaStream_t s = nullptr) {
    return emu_copy(dst, src, bytes, kind, s);
}
static inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr) {
    if (!emu::is_device(p)) { emu::fail("cudaMemset on host memory at %p", p); }
    emu::submit(s, "cudaMemset", [=]() {
        std::lock_guard<std::recursive_mutex> lock(emu::device_mutex);
        emu::device_open();
        memset(p, value, bytes);
        emu::device_close();
    });
    return cudaSuccess;
}
static inline cudaError_t cudaMemset(void* p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes); }

static inline double emu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = (cudaStream_t)malloc(1); return cudaSuccess; }
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (emu::capture != nullptr && (s == emu::capture->stream || s == nullptr)) {
        emu::fail("cudaStreamSynchronize of stream %p while stream %p captures a graph: a GPU refuses it; synchronize "
                  "after cudaStreamEndCapture", (void*)s, (void*)emu::capture->stream);
    }
    return cudaSuccess;
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0) {
    (void)s; (void)e; (void)flags;
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = (cudaEvent_t)calloc(1, sizeof(**e)); return cudaSuccess; }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) { (void)flags; return cudaEventCreate(e); }
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
    if (emu::capture != nullptr && s == emu::capture->stream) {
        emu::capture->work.push_back([e]() { e->t = emu_now(); e->launches = emu::launches.load(); });
    } else {
        e->t = emu_now();
        e->launches = emu::launches.load();
    }
    return cudaSuccess;
}
// The work handed to the device between the records of events a and b: emulation only.
static inline uint64_t emu_event_launches(cudaEvent_t a, cudaEvent_t b) { return b->launches - a->launches; }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; return cudaSuccess; }
static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(1000.0 * (b->t - a->t));
    return cudaSuccess;
}
// A kernel may take over 48 KiB of dynamic shared memory only after cudaFuncSetAttribute raised its
// cudaFuncAttributeMaxDynamicSharedMemorySize on that device, and never more than it was raised to:
// a GPU refuses such a launch, so the emulation stops at it. Kept per (kernel, device).
namespace emu {
inline std::mutex smem_optin_mutex;
inline std::map<std::pair<const void*, int>, int> smem_optins;  // (kernel, device) -> bytes allowed
inline int smem_optin(const void* kernel, int device) {
    std::lock_guard<std::mutex> lock(smem_optin_mutex);
    auto it = smem_optins.find({kernel, device});
    return it == smem_optins.end() ? -1 : it->second;
}
}  // namespace emu
template <typename K>
static inline cudaError_t cudaFuncSetAttribute(K kernel, cudaFuncAttribute attr, int value) {
    if (value < 0 || value > 227 * 1024) { return cudaErrorInvalidValue; }
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        std::lock_guard<std::mutex> lock(emu::smem_optin_mutex);
        emu::smem_optins[{(const void*)kernel, emu_current_device}] = value;
    }
    return cudaSuccess;
}

// ---- CUDA graphs by stream capture: every mode captures the calling thread's work on the stream

typedef enum {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
} cudaStreamCaptureMode;
struct EmuGraph { std::vector<emu::Work> work; };
typedef EmuGraph* cudaGraph_t;
typedef EmuGraph* cudaGraphExec_t;

static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    (void)mode;
    if (s == nullptr) { return cudaErrorStreamCaptureUnsupported; }  // the legacy stream cannot capture
    if (emu::capture != nullptr) { return cudaErrorIllegalState; }
    emu::capture = new emu::Capture{s, {}};
    return cudaSuccess;
}
static inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
    *graph = nullptr;
    if (emu::capture == nullptr || emu::capture->stream != s) { return cudaErrorIllegalState; }
    *graph = new EmuGraph{std::move(emu::capture->work)};
    delete emu::capture;
    emu::capture = nullptr;
    return cudaSuccess;
}
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0) {
    (void)flags;
    *exec = new EmuGraph{graph->work};
    return cudaSuccess;
}
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    emu::submit(s, "cudaGraphLaunch", [exec]() {
        for (const emu::Work& w : exec->work) { w(); }
    });
    return cudaSuccess;
}
static inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) { delete graph; return cudaSuccess; }
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) { delete exec; return cudaSuccess; }

// ----------------------------------------------------------------------------
// kernel launches: emu_launch(kernel, grid, block, smem, stream)(args...) is what launch.sed
// makes of kernel<<<grid, block, smem, stream>>>(args...)

template <typename... P>
struct EmuLaunch {
    void (*kernel)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <typename... A>
    void operator()(A&&... a) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        std::tuple<P...> args(std::forward<A>(a)...);  // converted to the parameter types, as a launch does
        void (*k)(P...) = kernel;
        dim3 g = grid, b = block;
        size_t sm = smem;
        if (sm > 48 * 1024) {
            int optin = emu::smem_optin((const void*)k, emu_current_device);
            if (optin < 0 || sm > (size_t)optin) {
                emu::fail("invalid launch: %zu bytes of dynamic shared memory, over 48 KiB, need "
                          "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, %zu) on device %d "
                          "first (%s)", sm, sm, emu_current_device,
                          optin < 0 ? "it was never set there" : "it was set lower");
            }
        }
        emu::submit(stream, "a kernel launch", [k, g, b, sm, args]() {
            auto body = [&]() { std::apply(k, args); };
            emu::run_grid(g, b, sm, body);
        });
    }
};

template <typename... P>
static inline EmuLaunch<P...> emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0,
                                         cudaStream_t stream = nullptr) {
    return EmuLaunch<P...>{kernel, grid, block, smem, stream};
}

// ----------------------------------------------------------------------------
// cuBLASLt: the matrix products, column-major, checked

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
} cublasLtMatmulDescAttributes_t;
typedef enum { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4, CUBLASLT_EPILOGUE_GELU = 32,
               CUBLASLT_EPILOGUE_GELU_BIAS = 36 } cublasLtEpilogue_t;
typedef enum { CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6 } cublasLtMatrixLayoutAttribute_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

struct EmuLtHandle { int unused; };
struct EmuLtDesc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t transa, transb;
    cublasLtEpilogue_t epilogue;
    const void* bias;  // of D's type
};
struct EmuLtLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;   // matrices of a strided batch (1: one)
    int64_t stride;  // elements from one to the next
};
struct EmuLtPref { size_t workspace; uint32_t min_align[4]; };  // A, B, C, D
typedef EmuLtHandle* cublasLtHandle_t;
typedef EmuLtDesc* cublasLtMatmulDesc_t;
typedef EmuLtLayout* cublasLtMatrixLayout_t;
typedef EmuLtPref* cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { *h = new EmuLtHandle{0}; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
// whether an epilogue adds the bias vector (GELU's applies after it)
static inline bool emu_lt_has_bias(int epilogue) {
    return epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
}

static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    *d = new EmuLtDesc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                            const void* buf, size_t size) {
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
            if (size != sizeof(int32_t)) { return CUBLAS_STATUS_INVALID_VALUE; }
            d->transa = (cublasOperation_t)*(const int32_t*)buf;
            break;
        case CUBLASLT_MATMUL_DESC_TRANSB:
            if (size != sizeof(int32_t)) { return CUBLAS_STATUS_INVALID_VALUE; }
            d->transb = (cublasOperation_t)*(const int32_t*)buf;
            break;
        case CUBLASLT_MATMUL_DESC_EPILOGUE:
            if (size != sizeof(uint32_t)) { return CUBLAS_STATUS_INVALID_VALUE; }
            d->epilogue = (cublasLtEpilogue_t)*(const uint32_t*)buf;
            break;
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            if (size != sizeof(void*)) { return CUBLAS_STATUS_INVALID_VALUE; }
            memcpy(&d->bias, buf, sizeof(void*));
            break;
        default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows,
                                                        uint64_t cols, int64_t ld) {
    if (ld < (int64_t)rows || ld < 1) { return CUBLAS_STATUS_INVALID_VALUE; }
    *l = new EmuLtLayout{type, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                              const void* buf, size_t size) {
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t) && *(const int32_t*)buf >= 1) {
        l->batch = *(const int32_t*)buf;
    } else if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t)) {
        l->stride = *(const int64_t*)buf;
    } else {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    *p = new EmuLtPref{0, {256, 256, 256, 256}};  // cuBLASLt's default: 256-byte aligned matrices
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                                  cublasLtMatmulPreferenceAttributes_t attr,
                                                                  const void* buf, size_t size) {
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == sizeof(size_t)) {
        p->workspace = *(const size_t*)buf;
    } else if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES &&
               size == sizeof(uint32_t)) {
        p->min_align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = *(const uint32_t*)buf;
    } else {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// Shapes and types must fit together as cuBLASLt requires: op(A) m x k, op(B) k x n, C and D m x n.
static inline cublasStatus_t emu_lt_check(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                          cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D) {
    uint64_t m = d->transa == CUBLAS_OP_N ? A->rows : A->cols, ka = d->transa == CUBLAS_OP_N ? A->cols : A->rows;
    uint64_t kb = d->transb == CUBLAS_OP_N ? B->rows : B->cols, n = d->transb == CUBLAS_OP_N ? B->cols : B->rows;
    if (ka != kb || C->rows != m || C->cols != n || D->rows != m || D->cols != n) {
        emu::fail("cublasLtMatmul: shapes do not fit: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu",
                  (unsigned long long)m, (unsigned long long)ka, (unsigned long long)kb, (unsigned long long)n,
                  (unsigned long long)C->rows, (unsigned long long)C->cols, (unsigned long long)D->rows,
                  (unsigned long long)D->cols);
    }
    if (A->type != B->type || C->type != D->type || (A->type == CUDA_R_32F && D->type != CUDA_R_32F)) {
        emu::fail("cublasLtMatmul: unsupported types A %d, B %d, C %d, D %d", A->type, B->type, C->type, D->type);
    }
    if (d->epilogue != CUBLASLT_EPILOGUE_BIAS && d->epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
        d->epilogue != CUBLASLT_EPILOGUE_GELU && d->epilogue != CUBLASLT_EPILOGUE_GELU_BIAS) {
        emu::fail("cublasLtMatmul: epilogue %d is not emulated", (int)d->epilogue);
    }
    if (A->batch != D->batch || B->batch != D->batch || C->batch != D->batch) {
        emu::fail("cublasLtMatmul: batch counts differ: A %d, B %d, C %d, D %d", A->batch, B->batch, C->batch, D->batch);
    }
    if (D->batch > 1 && d->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        emu::fail("cublasLtMatmul: a batched product with an epilogue is not emulated");
    }
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                                                            cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                                            cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t p,
                                                            int requested, cublasLtMatmulHeuristicResult_t* results,
                                                            int* returned) {
    (void)h;
    emu_lt_check(d, A, B, C, D);
    if (requested < 1) { return CUBLAS_STATUS_INVALID_VALUE; }
    memset(results, 0, sizeof(*results));
    // the algorithm remembers the alignment it was chosen for: cublasLtMatmul checks the pointers
    for (int i = 0; i < 4; i++) { results[0].algo.data[i] = p->min_align[i]; }
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static inline float emu_load(const void* p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) { return ((const float*)p)[i]; }
    if (t == CUDA_R_16F) { return __half2float(((const __half*)p)[i]); }
    return __bfloat162float(((const __nv_bfloat16*)p)[i]);
}
static inline void emu_store(void* p, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_32F) { ((float*)p)[i] = v; }
    else if (t == CUDA_R_16F) { ((__half*)p)[i] = __float2half(v); }
    else { ((__nv_bfloat16*)p)[i] = __float2bfloat16(v); }
}

static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* a,
                                            cublasLtMatrixLayout_t A, const void* b, cublasLtMatrixLayout_t B,
                                            const void* beta, const void* c, cublasLtMatrixLayout_t C, void* out,
                                            cublasLtMatrixLayout_t D, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                            size_t workspace_bytes, cudaStream_t stream) {
    (void)h; (void)workspace; (void)workspace_bytes;
    emu_lt_check(d, A, B, C, D);
    const void* ptrs[4] = {a, b, c != nullptr ? c : out, out};
    for (int i = 0; i < 4; i++) {
        if (algo != nullptr && (uintptr_t)ptrs[i] % algo->data[i] != 0) {
            emu::fail("cublasLtMatmul: matrix %c at %p is not aligned to the %llu bytes its algorithm was chosen for "
                      "(set CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)", "ABCD"[i], ptrs[i],
                      (unsigned long long)algo->data[i], "ABCD"[i]);
        }
    }
    if (!emu::is_device(a) || !emu::is_device(b) || !emu::is_device(out) || (c != nullptr && !emu::is_device(c)) ||
        (d->bias != nullptr && emu_lt_has_bias(d->epilogue) && !emu::is_device(d->bias))) {
        emu::fail("cublasLtMatmul given a host pointer: A, B, C, D and the bias must be device memory");
    }
    if (emu_lt_has_bias(d->epilogue) && d->bias == nullptr) { emu::fail("cublasLtMatmul: bias epilogue without a bias pointer"); }
    float al = *(const float*)alpha, be = *(const float*)beta;
    if (be != 0.0f && c == nullptr) { emu::fail("cublasLtMatmul: beta != 0 without C"); }
    if (c == out && (C->ld != D->ld || C->stride != D->stride)) {
        emu::fail("cublasLtMatmul: in place (C == D) needs equal layouts");
    }
    // the descriptors as they are now: a captured product keeps them (and the bias) as a GPU's does
    EmuLtDesc dd = *d;
    EmuLtLayout la = *A, lb = *B, lc = *C, ld = *D;
    emu::submit(stream, "cublasLtMatmul", [=]() {
        uint64_t m = ld.rows, n = ld.cols, k = dd.transa == CUBLAS_OP_N ? la.cols : la.rows;
        std::lock_guard<std::recursive_mutex> lock(emu::device_mutex);
        emu::device_open();
        std::vector<float> col(m);
        for (int32_t g = 0; g < ld.batch; g++) {  // one product after the other, as a batch may read what another wrote
            size_t oa = (size_t)(g * la.stride), ob = (size_t)(g * lb.stride), oc = (size_t)(g * lc.stride);
            size_t od = (size_t)(g * ld.stride);
            for (uint64_t j = 0; j < n; j++) {
                for (uint64_t i = 0; i < m; i++) {
                    float s = 0.0f;
                    for (uint64_t p = 0; p < k; p++) {
                        size_t ia = dd.transa == CUBLAS_OP_N ? i + p * la.ld : p + i * la.ld;
                        size_t ib = dd.transb == CUBLAS_OP_N ? p + j * lb.ld : j + p * lb.ld;
                        s += emu_load(a, la.type, oa + ia) * emu_load(b, lb.type, ob + ib);
                    }
                    float r = al * s;
                    if (be != 0.0f) { r += be * emu_load(c, lc.type, oc + i + j * lc.ld); }
                    if (emu_lt_has_bias(dd.epilogue)) { r += emu_load(dd.bias, ld.type, i); }
                    if (dd.epilogue == CUBLASLT_EPILOGUE_GELU || dd.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS) {
                        r = 0.5f * r * (1.0f + tanhf(0.7978845608028654f * (r + 0.044715f * r * r * r)));  // GELU-tanh
                    }
                    col[i] = r;
                }
                for (uint64_t i = 0; i < m; i++) { emu_store(out, ld.type, od + i + j * ld.ld, col[i]); }
            }
        }
        emu::device_close();
    });
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// NCCL: the collectives among the ranks of one process. A call posts its buffers and waits until
// every rank has posted the same collective; the last to arrive moves the data for all, reducing
// in rank order (so every rank gets the same bits). Calls are synchronous: the stream is ignored.

typedef enum {
    ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
    ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
} ncclResult_t;
typedef enum { ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclAvg = 4 } ncclRedOp_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
#define NCCL_MAJOR 2
#define NCCL_MINOR 99

namespace emu {
enum { COLL_ALLREDUCE = 0, COLL_REDUCESCATTER = 1, COLL_ALLGATHER = 2, COLL_BROADCAST = 3 };
static const char* const COLL_NAMES[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast"};

struct Posted {
    int kind;
    const void* send;
    void* recv;
    size_t count;  // per rank for reduce-scatter (its share) and all-gather (its contribution)
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;
};

struct Clique {  // the ranks that share one ncclUniqueId
    ncclUniqueId id;
    int nranks, joined = 0, arrived = 0;
    uint64_t generation = 0;
    bool aborted = false;
    std::vector<Posted> posted;
    std::mutex mu;
    std::condition_variable cv;
};

inline std::mutex cliques_mu;
inline std::vector<Clique*> cliques;

static inline float nccl_load(const void* p, ncclDataType_t t, size_t i) {
    if (t == ncclFloat) { return ((const float*)p)[i]; }
    if (t == ncclHalf) { return __half2float(((const __half*)p)[i]); }
    return __bfloat162float(((const __nv_bfloat16*)p)[i]);
}
static inline void nccl_store(void* p, ncclDataType_t t, size_t i, float v) {
    if (t == ncclFloat) { ((float*)p)[i] = v; }
    else if (t == ncclHalf) { ((__half*)p)[i] = __float2half(v); }
    else { ((__nv_bfloat16*)p)[i] = __float2bfloat16(v); }
}

// Every rank has posted: move the data (under the device lock, device memory open)
static inline void nccl_perform(Clique* c) {
    const Posted& p0 = c->posted[0];
    for (int r = 1; r < c->nranks; r++) {
        const Posted& p = c->posted[r];
        if (p.kind != p0.kind || p.count != p0.count || p.type != p0.type || p.op != p0.op || p.root != p0.root) {
            fail("NCCL: rank 0 called %s of %zu elements, rank %d %s of %zu: ranks must call the same collectives in "
                 "the same order", COLL_NAMES[p0.kind], p0.count, r, COLL_NAMES[p.kind], p.count);
        }
    }
    int n = c->nranks;
    size_t count = p0.count, total = p0.kind == COLL_ALLGATHER || p0.kind == COLL_REDUCESCATTER ? count * n : count;
    std::lock_guard<std::recursive_mutex> lock(device_mutex);
    device_open();
    std::vector<float> result(total);
    if (p0.kind == COLL_ALLREDUCE || p0.kind == COLL_REDUCESCATTER) {
        for (size_t i = 0; i < total; i++) {
            float acc = nccl_load(c->posted[0].send, p0.type, i);
            for (int r = 1; r < n; r++) { acc += nccl_load(c->posted[r].send, p0.type, i); }
            result[i] = p0.op == ncclAvg ? acc / (float)n : acc;
        }
    } else if (p0.kind == COLL_ALLGATHER) {
        for (int r = 0; r < n; r++) {
            for (size_t i = 0; i < count; i++) { result[(size_t)r * count + i] = nccl_load(c->posted[r].send, p0.type, i); }
        }
    } else {
        for (size_t i = 0; i < total; i++) { result[i] = nccl_load(c->posted[p0.root].send, p0.type, i); }
    }
    for (int r = 0; r < n; r++) {
        if (p0.kind == COLL_REDUCESCATTER) {
            for (size_t i = 0; i < count; i++) { nccl_store(c->posted[r].recv, p0.type, i, result[(size_t)r * count + i]); }
        } else {
            for (size_t i = 0; i < total; i++) { nccl_store(c->posted[r].recv, p0.type, i, result[i]); }
        }
    }
    device_close();
}

// CUDA_EMU_NCCL_FAULT=rank:call:error|hang: what rank `rank` does at its call-th collective
static inline int nccl_fault(int rank, uint64_t call) {
    const char* f = getenv("CUDA_EMU_NCCL_FAULT");
    int fr;
    unsigned long long fc;
    char kind[16];
    if (f == nullptr || sscanf(f, "%d:%llu:%15s", &fr, &fc, kind) != 3 || fr != rank || fc != call) { return 0; }
    return strcmp(kind, "hang") == 0 ? 2 : 1;
}
}  // namespace emu

struct EmuComm {
    emu::Clique* clique;
    int rank;
    uint64_t calls = 0;
    ncclResult_t async_error = ncclSuccess;
};
typedef EmuComm* ncclComm_t;

static inline const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

static inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    static std::atomic<uint64_t> counter{0};
    memset(id, 0, sizeof(*id));
    uint64_t words[3] = {(uint64_t)getpid(), (uint64_t)(emu_now() * 1e9), ++counter};
    memcpy(id->internal, words, sizeof(words));
    return ncclSuccess;
}

static inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (nranks < 1 || rank < 0 || rank >= nranks) { return ncclInvalidArgument; }
    emu::Clique* c = nullptr;
    {
        std::lock_guard<std::mutex> lock(emu::cliques_mu);
        for (emu::Clique* k : emu::cliques) {
            if (memcmp(&k->id, &id, sizeof(id)) == 0) { c = k; }
        }
        if (c == nullptr) {
            c = new emu::Clique();
            c->id = id;
            c->nranks = nranks;
            c->posted.resize(nranks);
            emu::cliques.push_back(c);
        }
    }
    if (c->nranks != nranks) { return ncclInvalidArgument; }
    std::unique_lock<std::mutex> lock(c->mu);
    c->joined++;
    c->cv.notify_all();
    // as NCCL: the call returns once every rank has joined (here: ranks of this process only)
    double give_up = emu_now() + 20.0;
    while (c->joined < c->nranks && !c->aborted) {
        c->cv.wait_for(lock, std::chrono::milliseconds(50));
        if (emu_now() > give_up) {
            emu::fail("NCCL: %d of %d ranks joined in 20 s; the emulation links the ranks of one process only "
                      "(several nodes need real GPUs)", c->joined, c->nranks);
        }
    }
    if (c->aborted) { return ncclInvalidUsage; }
    *comm = new EmuComm{c, rank};
    return ncclSuccess;
}

static inline ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
static inline ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
    std::lock_guard<std::mutex> lock(comm->clique->mu);
    *err = comm->async_error;
    return ncclSuccess;
}

// Wakes every rank waiting in a collective of the clique; their calls return an error
static inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm == nullptr) { return ncclSuccess; }
    {
        std::lock_guard<std::mutex> lock(comm->clique->mu);
        comm->clique->aborted = true;
        comm->clique->cv.notify_all();
    }
    return ncclSuccess;
}
static inline ncclResult_t ncclCommDestroy(ncclComm_t comm) { delete comm; return ncclSuccess; }

static inline ncclResult_t emu_collective(ncclComm_t comm, int kind, const void* send, void* recv, size_t count,
                                          ncclDataType_t type, ncclRedOp_t op, int root) {
    if (!emu::is_device(send) || !emu::is_device(recv)) { emu::fail("%s given host memory", emu::COLL_NAMES[kind]); }
    emu::Clique* c = comm->clique;
    std::unique_lock<std::mutex> lock(c->mu);
    if (c->aborted) { return ncclInvalidUsage; }
    if (comm->async_error != ncclSuccess) { return ncclSuccess; }  // a broken communicator moves nothing
    int fault = emu::nccl_fault(comm->rank, comm->calls++);
    if (fault == 1) {  // an asynchronous error: the call returns, the data never moves
        comm->async_error = ncclSystemError;
        return ncclSuccess;
    }
    if (fault == 2) {  // a hang: wait until someone aborts the communicator
        while (!c->aborted) { c->cv.wait_for(lock, std::chrono::milliseconds(50)); }
        return ncclInvalidUsage;
    }
    c->posted[comm->rank] = emu::Posted{kind, send, recv, count, type, op, root};
    uint64_t gen = c->generation;
    if (++c->arrived == c->nranks) {
        emu::nccl_perform(c);
        c->arrived = 0;
        c->generation++;
        c->cv.notify_all();
        return ncclSuccess;
    }
    while (c->generation == gen && !c->aborted) { c->cv.wait_for(lock, std::chrono::milliseconds(50)); }
    return c->aborted && c->generation == gen ? ncclInvalidUsage : ncclSuccess;
}

static inline ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                         ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return emu_collective(comm, emu::COLL_ALLREDUCE, send, recv, count, type, op, 0);
}
static inline ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return emu_collective(comm, emu::COLL_REDUCESCATTER, send, recv, recv_count, type, op, 0);
}
static inline ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                                         ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return emu_collective(comm, emu::COLL_ALLGATHER, send, recv, send_count, type, ncclSum, 0);
}
static inline ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                         ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return emu_collective(comm, emu::COLL_BROADCAST, send, recv, count, type, ncclSum, root);
}

#endif  // CUDA_EMULATE_H
