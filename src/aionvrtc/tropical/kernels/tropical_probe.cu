// The ceiling of the tropical kernels' inner step on this GPU (aionvrtc.tropical's device
// figures, against which a contraction's roofline is counted): add+max pairs per second, each
// thread on 64 independent accumulators held in registers, no memory traffic.
// The GEMM's inner step with operands in registers: acc[i][j] = max(acc[i][j], a[i] + b[j]),
// 64 independent accumulators per thread: one add and one max per pair (one instruction with
// DPX). After each round a[i] takes the value of an accumulator, so no sum is loop-invariant
// and the compiler cannot hoist the adds out of the loop (it did, when a and b were fixed:
// the earlier probe timed the max alone). The copies are register renames in unrolled code.
__device__ __forceinline__ float mx(float acc, float s) { return fmaxf(acc, s); }
// Doubles: a compare and a select, as the GEMM's fast step (fmax adds NaN handling).
__device__ __forceinline__ double mx(double acc, double s) { return s > acc ? s : acc; }
__device__ __forceinline__ int mx(int acc, int s) { return max(acc, s); }
__device__ __forceinline__ long long mx(long long acc, long long s) { return max(acc, s); }

template <typename T, bool DPX>
__global__ void probe(T* out, T d, T e, long long iterations) {
    T a[8], b[8], acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) { a[i] = (T)(threadIdx.x + i) * d; b[i] = (T)(blockIdx.x - i) * e; }
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = (T)(i - j);
    // Unrolled so that the loop's own instructions stop counting.
    #pragma unroll 8
    for (long long it = 0; it < iterations; ++it) {
        #pragma unroll
        for (int i = 0; i < 8; ++i)
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                if constexpr (DPX) {
                    acc[i][j] = __viaddmax_s32((int)a[i], (int)b[j], (int)acc[i][j]);
                } else {
                    acc[i][j] = mx(acc[i][j], a[i] + b[j]);
                }
            }
        #pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = acc[i][7 - i];
    }
    T s = 0;
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) s += acc[i][j];
    if (s == (T)12345) out[0] = s;  // keeps the work alive; practically never stores
}
