// The fast paths of the tuned kernels (tropical_tiled.cu, tropical_rows.cu).
//
// fast(): the semiring's step acc = acc (+) a (x) b in the fewest instructions, exact whenever
// the tile holds no infinity and no value that could overflow (always, for floats: fmax and fmin
// ignore the NaN of -inf + inf, as the semantics ask). Tiles that do not qualify, and the last,
// partial k-tile, take the exact path.
#pragma once
#include "tropical_common.cuh"

template <typename T> __device__ __forceinline__ T tmax(T a, T b) { return a > b ? a : b; }
template <typename T> __device__ __forceinline__ T tmin(T a, T b) { return a < b ? a : b; }
__device__ __forceinline__ float tmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float tmin(float a, float b) { return fminf(a, b); }
// Doubles have no one-instruction max on Hopper, and fmax's NaN handling costs four more: a
// compare and a select of the new value (s first, so that a NaN s never wins) is exact here.
__device__ __forceinline__ double tmax(double acc, double s) { return s > acc ? s : acc; }
__device__ __forceinline__ double tmin(double acc, double s) { return s < acc ? s : acc; }

// Operands strictly inside (-limit, limit) cannot overflow the fast path's arithmetic; floats
// always qualify (`always`), so their kernels skip the checks and the reduction across the block.
template <typename T, bool PRODUCT> struct SafeLimit;
template <bool P> struct SafeLimit<float, P> {
    static constexpr bool always = true;
    __device__ static bool ok(float) { return true; } };
template <bool P> struct SafeLimit<double, P> {
    static constexpr bool always = true;
    __device__ static bool ok(double) { return true; } };
template <> struct SafeLimit<int, false> {
    static constexpr bool always = false;
    __device__ static bool ok(int x) { return x > -(1 << 30) && x < (1 << 30); } };
template <> struct SafeLimit<int, true> {
    static constexpr bool always = false;
    __device__ static bool ok(int x) { return x > -(1 << 15) && x < (1 << 15); } };
template <> struct SafeLimit<long long, false> {
    static constexpr bool always = false;
    __device__ static bool ok(long long x) { return x > -(1LL << 62) && x < (1LL << 62); } };
template <> struct SafeLimit<long long, true> {
    static constexpr bool always = false;
    __device__ static bool ok(long long x) { return x > -(1LL << 31) && x < (1LL << 31); } };

// step(acc, a, b): acc (+) a (x) b; mul(a, b): a (x) b without the checks for infinities and
// overflow (for the argmax, which compares and selects anyway).
struct FastMaxPlus {
    typedef MaxPlus Exact;
    static constexpr bool product = false;
    template <typename T> __device__ static T mul(T a, T b) { return a + b; }
    template <typename T> __device__ static T step(T acc, T a, T b) { return tmax(acc, a + b); }
    __device__ static int step(int acc, int a, int b) {
#if __CUDA_ARCH__ >= 900
        return __viaddmax_s32(a, b, acc);  // Hopper DPX: max(a + b, acc) in one instruction
#else
        return tmax(acc, a + b);
#endif
    }
};
struct FastMinPlus {
    typedef MinPlus Exact;
    static constexpr bool product = false;
    template <typename T> __device__ static T mul(T a, T b) { return a + b; }
    template <typename T> __device__ static T step(T acc, T a, T b) { return tmin(acc, a + b); }
    __device__ static int step(int acc, int a, int b) {
#if __CUDA_ARCH__ >= 900
        return __viaddmin_s32(a, b, acc);
#else
        return tmin(acc, a + b);
#endif
    }
};
struct FastMaxMul {
    typedef MaxMul Exact;
    static constexpr bool product = true;
    template <typename T> __device__ static T mul(T a, T b) { return a * b; }
    template <typename T> __device__ static T step(T acc, T a, T b) { return tmax(acc, a * b); }
};

// V elements of T in one load of up to 16 bytes.
template <typename T, int V> struct alignas(V * sizeof(T)) Pack { T v[V]; };
// The widest V (at most 16 bytes) that splits both tiles' loads evenly between NT threads.
__host__ __device__ constexpr int pick_vector(int v, int a_elements, int b_elements, int threads) {
    return v == 1 || (a_elements % (v * threads) == 0 && b_elements % (v * threads) == 0)
        ? v : pick_vector(v / 2, a_elements, b_elements, threads);
}
