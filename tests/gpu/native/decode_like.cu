// A decode loop as a native inference engine runs it, for tuiprof's GPU verification of native
// programs (bench/verify_native.py): set-up kernels, a prefill over the prompt, then STEPS
// decode steps, each launching the same 26 kernels (an embedding, LAYERS layers of 11, a head
// with a GEMV over the vocabulary and an argmax) and reading the token back (the host waits).
// The GEMVs run on 8 blocks: far fewer than the H100's 132 SMs (tuiprof's grid-too-small).
//
//   decode_like STEPS [--nvtx] [--sleep-us N] [--pad-mb N]
//
// Prints its own timing (host clock around the decode loop, per step and in total), and the
// kernel names of one decode step in launch order. Every decode kernel also times itself on the
// GPU: its blocks' earliest first instruction and latest last one by %globaltimer, into buffers
// read after the loop. Those are the kernels' durations as the program sees them, with or
// without a profiler, to tell a profiler that mis-measures a kernel from a kernel that runs
// differently under it (each tool's own device allocations may move the program's buffers:
// --pad-mb N allocates N MiB first, as a tool would, to test that alone). Kernels are
// extern "C": the same plain name in tuiprof and in nsys, no demangling in the comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "decode_like: %s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int H = 1024, V = 8192, LAYERS = 2, PROMPT = 64, GEMV_BLOCKS = 8;
constexpr int KPS = 1 + LAYERS * 11 + 3;  // kernels a decode step launches

extern "C" __global__ void fill_weights(float *w, size_t n, float v) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        w[i] = v * (float)((i * 2654435761u) % 1000) / 1000.0f;
}
// the kernel's own span: t0 = its blocks' earliest start, t1 = their latest end (ns)
__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
    return g;
}
__device__ __forceinline__ void span_in(unsigned long long *t0) {
    if (threadIdx.x == 0) atomicMin(t0, gtime());
}
__device__ __forceinline__ void span_out(unsigned long long *t1) {
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(t1, gtime());
}
#define SPAN unsigned long long *t0, unsigned long long *t1
extern "C" __global__ void embed(const float *table, const int *tok, float *x, SPAN) {
    span_in(t0);
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[i] = table[(size_t)(*tok % V) * H + i];
    span_out(t1);
}
extern "C" __global__ void rmsnorm(const float *x, float *y, SPAN) {
    span_in(t0);
    __shared__ float s[256];
    float a = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) a += x[i] * x[i];
    s[threadIdx.x] = a;
    __syncthreads();
    for (int k = blockDim.x / 2; k; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    float r = rsqrtf(s[0] / H + 1e-6f);
    for (int i = threadIdx.x; i < H; i += blockDim.x) y[i] = x[i] * r;
    span_out(t1);
}
// y[rows] = W[rows x H] x: each of GEMV_BLOCKS blocks walks rows, one warp a row
extern "C" __global__ void gemv_small_grid(const float *w, const float *x, float *y, int rows, SPAN) {
    span_in(t0);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int r = blockIdx.x * warps + warp; r < rows; r += gridDim.x * warps) {
        float a = 0;
        for (int i = lane; i < H; i += 32) a += w[(size_t)r * H + i] * x[i];
        for (int o = 16; o; o >>= 1) a += __shfl_down_sync(0xffffffff, a, o);
        if (!lane) y[r] = a;
    }
    span_out(t1);
}
extern "C" __global__ void rope(float *q, int pos, SPAN) {
    span_in(t0);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < H / 2) {
        float t = pos * __powf(10000.0f, -2.0f * i / H), c = __cosf(t), s = __sinf(t);
        float a = q[2 * i], b = q[2 * i + 1];
        q[2 * i] = a * c - b * s;
        q[2 * i + 1] = a * s + b * c;
    }
    span_out(t1);
}
extern "C" __global__ void attn_decode(const float *q, const float *kv, float *o, int len, SPAN) {
    span_in(t0);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < H) {
        float a = 0;
        for (int t = 0; t < len; t++) a += q[i] * kv[(size_t)t * H + i];
        o[i] = a / (len + 1);
    }
    span_out(t1);
}
extern "C" __global__ void add_residual(float *x, const float *y, SPAN) {
    span_in(t0);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < H) x[i] += y[i];
    span_out(t1);
}
extern "C" __global__ void silu_mul(const float *g, float *u, SPAN) {
    span_in(t0);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < H) u[i] = g[i] / (1.0f + __expf(-g[i])) * u[i];
    span_out(t1);
}
extern "C" __global__ void argmax_token(const float *logits, int *tok, SPAN) {
    span_in(t0);
    __shared__ float bv[256];
    __shared__ int bi[256];
    float v = -1e30f;
    int k = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (logits[i] > v) { v = logits[i]; k = i; }
    bv[threadIdx.x] = v;
    bi[threadIdx.x] = k;
    __syncthreads();
    for (int s = blockDim.x / 2; s; s >>= 1) {
        if (threadIdx.x < s && bv[threadIdx.x + s] > bv[threadIdx.x]) {
            bv[threadIdx.x] = bv[threadIdx.x + s];
            bi[threadIdx.x] = bi[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (!threadIdx.x) *tok = bi[0];
    span_out(t1);
}
// the prefill's own kernels: all prompt positions at once
extern "C" __global__ void gemm_prefill(const float *w, const float *x, float *y, int rows) {
    int r = blockIdx.x, p = blockIdx.y;
    float a = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) a += w[(size_t)r * H + i] * x[(size_t)p * H + i];
    for (int o = 16; o; o >>= 1) a += __shfl_down_sync(0xffffffff, a, o);
    if (!(threadIdx.x % 32)) atomicAdd(&y[(size_t)p * rows + r], a);
}
extern "C" __global__ void attn_prefill(const float *x, float *o) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < PROMPT * H) o[i] = x[i] * 0.5f;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 256;
    bool nvtx = false;
    int sleep_us = 0, pad_mb = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--nvtx")) nvtx = true;
        if (!strcmp(argv[i], "--sleep-us") && i + 1 < argc) sleep_us = atoi(argv[++i]);
        if (!strcmp(argv[i], "--pad-mb") && i + 1 < argc) pad_mb = atoi(argv[++i]);
    }
    // --pad-mb: device memory taken before the program's own buffers, as a tool's allocations
    // would be, to see whether where the buffers land changes the kernels' own speed
    // the device memory in use once the context exists and before any of the program's buffers:
    // the driver's context and whatever a tool reserved at its creation (CUPTI's record buffers)
    size_t free_b = 0, total_b = 0;
    CK(cudaFree(0));
    CK(cudaMemGetInfo(&free_b, &total_b));
    void *pad = nullptr;
    if (pad_mb > 0) CK(cudaMalloc(&pad, (size_t)pad_mb << 20));
    size_t wl = (size_t)H * H;
    float *wq, *wo, *wu, *wd, *wlm, *emb, *x, *y, *z, *kv, *logits, *px, *py;
    int *tok;
    // every decode launch's span (steps x KPS), then the prefill's argmax: starts at all ones
    // (atomicMin), ends at zero (atomicMax)
    size_t spans = (size_t)(steps + 1) * KPS;
    unsigned long long *t0s, *t1s;
    CK(cudaMalloc(&t0s, spans * 8));
    CK(cudaMalloc(&t1s, spans * 8));
    CK(cudaMemset(t0s, 0xff, spans * 8));
    CK(cudaMemset(t1s, 0, spans * 8));
    CK(cudaMalloc(&wq, wl * 4 * LAYERS));
    CK(cudaMalloc(&wo, wl * 4 * LAYERS));
    CK(cudaMalloc(&wu, wl * 4 * LAYERS));
    CK(cudaMalloc(&wd, wl * 4 * LAYERS));
    CK(cudaMalloc(&wlm, (size_t)V * H * 4));
    CK(cudaMalloc(&emb, (size_t)V * H * 4));
    CK(cudaMalloc(&x, H * 4));
    CK(cudaMalloc(&y, H * 4));
    CK(cudaMalloc(&z, H * 4));
    CK(cudaMalloc(&kv, (size_t)(PROMPT + steps + 1) * H * 4));
    CK(cudaMalloc(&logits, V * 4));
    CK(cudaMalloc(&px, (size_t)PROMPT * H * 4));
    CK(cudaMalloc(&py, (size_t)PROMPT * V * 4));
    CK(cudaMalloc(&tok, 4));
    for (float *w : {wq, wo, wu, wd}) fill_weights<<<264, 256>>>(w, wl * LAYERS, 0.01f);
    fill_weights<<<264, 256>>>(wlm, (size_t)V * H, 0.01f);
    fill_weights<<<264, 256>>>(emb, (size_t)V * H, 1.0f);
    fill_weights<<<264, 256>>>(kv, (size_t)(PROMPT + steps + 1) * H, 0.1f);
    fill_weights<<<264, 256>>>(px, (size_t)PROMPT * H, 1.0f);
    CK(cudaMemset(tok, 0, 4));
    CK(cudaDeviceSynchronize());

    // prefill: the prompt's positions at once, then its last position's token
    if (nvtx) nvtxRangePushA("prefill");
    auto p0 = std::chrono::steady_clock::now();
    CK(cudaMemset(py, 0, (size_t)PROMPT * V * 4));
    for (int l = 0; l < LAYERS; l++) {
        gemm_prefill<<<dim3(H, PROMPT), 32>>>(wq + l * wl, px, py, H);
        attn_prefill<<<(PROMPT * H + 255) / 256, 256>>>(px, px);
    }
    gemm_prefill<<<dim3(V, 1), 32>>>(wlm, px, logits, V);
    argmax_token<<<1, 256>>>(logits, tok, t0s + (size_t)steps * KPS, t1s + (size_t)steps * KPS);
    int host_tok = 0;
    CK(cudaMemcpy(&host_tok, tok, 4, cudaMemcpyDeviceToHost));
    if (nvtx) nvtxRangePop();
    double prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0).count();

    std::vector<const char *> names;
    std::vector<double> step_us;
    step_us.reserve(steps);
    auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; s++) {
        auto a = std::chrono::steady_clock::now();
        if (nvtx) nvtxRangePushA("decode");
        bool log = s == 0;
        size_t slot = (size_t)s * KPS;
#define L(name, g, b, ...) do { name<<<g, b>>>(__VA_ARGS__, t0s + slot, t1s + slot); slot++; \
                                if (log) names.push_back(#name); } while (0)
        L(embed, 1, 256, emb, tok, x);
        for (int l = 0; l < LAYERS; l++) {
            L(rmsnorm, 1, 256, x, y);
            L(gemv_small_grid, GEMV_BLOCKS, 256, wq + l * wl, y, z, H);
            L(rope, (H / 2 + 255) / 256, 256, z, PROMPT + s);
            L(attn_decode, (H + 255) / 256, 256, z, kv, y, PROMPT + s);
            L(gemv_small_grid, GEMV_BLOCKS, 256, wo + l * wl, y, z, H);
            L(add_residual, (H + 255) / 256, 256, x, z);
            L(rmsnorm, 1, 256, x, y);
            L(gemv_small_grid, GEMV_BLOCKS, 256, wu + l * wl, y, z, H);
            L(silu_mul, (H + 255) / 256, 256, y, z);
            L(gemv_small_grid, GEMV_BLOCKS, 256, wd + l * wl, z, y, H);
            L(add_residual, (H + 255) / 256, 256, x, y);
        }
        L(rmsnorm, 1, 256, x, y);
        L(gemv_small_grid, GEMV_BLOCKS, 256, wlm, y, logits, V);
        L(argmax_token, 1, 256, logits, tok);
#undef L
        CK(cudaMemcpy(&host_tok, tok, 4, cudaMemcpyDeviceToHost));  // the host waits for it
        if (nvtx) nvtxRangePop();
        step_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
        if (sleep_us) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
    double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::vector<double> sorted = step_us;
    std::sort(sorted.begin(), sorted.end());
    std::vector<unsigned long long> a0(spans), a1(spans);
    CK(cudaMemcpy(a0.data(), t0s, spans * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(a1.data(), t1s, spans * 8, cudaMemcpyDeviceToHost));
    std::vector<const char *> kinds;  // each kernel name once, in launch order
    for (auto n : names)
        if (std::find_if(kinds.begin(), kinds.end(), [&](const char *k) { return !strcmp(k, n); }) == kinds.end())
            kinds.push_back(n);
    std::string own;  // {"NAME_ns": median span over every decode launch of NAME, ...}
    for (auto k : kinds) {
        std::vector<unsigned long long> d;
        for (int s = 0; s < steps; s++)
            for (size_t i = 0; i < names.size(); i++)
                if (!strcmp(names[i], k)) d.push_back(a1[(size_t)s * KPS + i] - a0[(size_t)s * KPS + i]);
        std::sort(d.begin(), d.end());
        char buf[96];
        snprintf(buf, sizeof buf, "%s\"%s_ns\": %llu", own.empty() ? "" : ", ", k,
                 d.empty() ? 0ULL : d[d.size() / 2]);
        own += buf;
    }
    printf("decode_like: kernels per step %zu:", names.size());
    for (auto n : names) printf(" %s", n);
    printf("\n");
    printf("decode_like: {\"steps\": %d, \"kernels_per_step\": %zu, \"prefill_ms\": %.3f, "
           "\"decode_ms\": %.3f, \"median_step_us\": %.2f, \"token\": %d, "
           "\"used_mib_at_start\": %.1f, \"in_kernel\": {%s}}\n",
           steps, names.size(), prefill_ms, total_ms, sorted[sorted.size() / 2], host_tok,
           (total_b - free_b) / 1048576.0, own.c_str());
    return 0;
}
