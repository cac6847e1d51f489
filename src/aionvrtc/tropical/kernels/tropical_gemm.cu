// The generic product: any semiring, type and strides (tropical_common.cuh).
#include "tropical_common.cuh"

// -- the product -------------------------------------------------------------------------------
// Block tile 64 x 64, k-step 16, 256 threads each owning a 4 x 4 tile of C (rows ty + 16 i,
// columns tx + 16 j). Out-of-range elements load as the semiring's zero, which never wins, so
// the inner loop needs no bounds checks. Strides are in elements and may be zero (a broadcast
// batch) or negative. ROWMAJOR: A has unit stride along k and B along n (the common layout),
// known at compile time.

constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4, THREADS = 256;

template <typename T, typename S, bool ARGMAX, bool ACCUMULATE, bool ROWMAJOR>
__global__ void __launch_bounds__(THREADS) tropical_gemm(
    const T* __restrict__ A, const T* __restrict__ B, T* C, int* I,
    long long M, long long N, long long K, long long batch,
    long long sAb, long long sAm, long long sAk,
    long long sBb, long long sBk, long long sBn,
    long long sCb, long long sCm, long long sCn,
    long long sIb, long long sIm, long long sIn) {
    if (ROWMAJOR) { sAk = 1; sBn = 1; }
    __shared__ T As[BK][BM];
    __shared__ T Bs[BK][BN];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long m0 = (long long)blockIdx.x * BM;
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        for (long long n0 = (long long)blockIdx.y * BN; n0 < N; n0 += (long long)gridDim.y * BN) {
            T acc[TM][TN];
            int idx[TM][TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) { acc[i][j] = S::template zero<T>(); idx[i][j] = -1; }
            for (long long k0 = 0; k0 < K; k0 += BK) {
                for (int t = threadIdx.x; t < BK * BM; t += THREADS) {
                    const int kk = t / BM, mm = t % BM;
                    const long long m = m0 + mm, k = k0 + kk;
                    As[kk][mm] = (m < M && k < K) ? A[b * sAb + m * sAm + k * sAk] : S::template zero<T>();
                }
                for (int t = threadIdx.x; t < BK * BN; t += THREADS) {
                    const int kk = t / BN, nn = t % BN;
                    const long long n = n0 + nn, k = k0 + kk;
                    Bs[kk][nn] = (n < N && k < K) ? B[b * sBb + k * sBk + n * sBn] : S::template zero<T>();
                }
                __syncthreads();
                #pragma unroll
                for (int kk = 0; kk < BK; ++kk) {
                    T a[TM], bv[TN];
                    #pragma unroll
                    for (int i = 0; i < TM; ++i) a[i] = As[kk][ty + 16 * i];
                    #pragma unroll
                    for (int j = 0; j < TN; ++j) bv[j] = Bs[kk][tx + 16 * j];
                    #pragma unroll
                    for (int i = 0; i < TM; ++i)
                        #pragma unroll
                        for (int j = 0; j < TN; ++j) {
                            const T p = S::mul(a[i], bv[j]);
                            if (S::better(p, acc[i][j])) {
                                acc[i][j] = p;
                                if (ARGMAX) idx[i][j] = (int)(k0 + kk);
                            }
                        }
                }
                __syncthreads();
            }
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const long long m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
                    if (m >= M || n >= N) continue;
                    T* c = C + b * sCb + m * sCm + n * sCn;
                    int* ix = ARGMAX ? I + b * sIb + m * sIm + n * sIn : nullptr;
                    T value = acc[i][j];
                    int winner = idx[i][j];
                    write_output<S, ARGMAX, ACCUMULATE>(c, ix, value, winner);
                }
        }
    }
}
