#include "tropical_fast.cuh"

// -- skinny products (K at most KMAX, N at most 64) ---------------------------------------------
// Tall products from tensor networks (M = 2^20, N = K = 4..64) are bound by memory, or nearly:
// each row of A is read once and each row of C written once. A thread owns a row of C: it holds
// the row's K values of A in registers and walks N four columns at a time, reading B from shared
// memory with one load per four columns that the whole warp shares (a broadcast), so the inner
// step costs little more than the fast step itself. B is padded with zeros to KMAX rows (those k
// meet A's padding, the semiring's zero, which never wins) and to a multiple of four columns
// (never stored). A warp's 32 rows keep many bytes in flight.
//
// Wide products (N = 2^20, M small) run as their transpose, C' = B' A' (the products commute),
// so the same kernel serves both: strides are arguments. Rows of A load 16 bytes at a time where
// A's k-stride is 1 and rows are aligned (`vector` bit 0), else one element per load, which the
// warp's consecutive rows coalesce when A's row stride is 1 (the transposed case); likewise four
// columns of C are stored at once where C's rows are contiguous and aligned (bit 1).
// Blocks of 256 threads per SM the rows kernel asks ptxas to fit: the row's registers and about 40
// more each, since occupancy is what hides this kernel's memory latency (f32 at KMAX = 16: 64
// registers, four blocks, against 65 and three unbounded).
__host__ __device__ constexpr int rows_min_blocks(int words) {
    return 65536 / (256 * (words + 40)) < 1 ? 1 : 65536 / (256 * (words + 40)) > 8 ? 8
        : 65536 / (256 * (words + 40));
}

template <typename T, typename F, bool ACCUMULATE, int KMAX>
__global__ void __launch_bounds__(256, rows_min_blocks(KMAX * (int)sizeof(T) / 4)) tropical_gemm_rows(
    const T* __restrict__ A, const T* __restrict__ B, T* C,
    long long M, long long N, long long K, long long batch,
    long long sAb, long long sAm, long long sAk,
    long long sBb, long long sBk, long long sBn,
    long long sCb, long long sCm, long long sCn, int vector) {
    typedef typename F::Exact S;
    typedef SafeLimit<T, F::product> Safe;
    constexpr int NC = 4, NMAX = 64, V = 16 / sizeof(T) < KMAX ? 16 / sizeof(T) : KMAX;
    __shared__ __align__(16) T Bs[KMAX][NMAX];
    const int NP = (int)(N + NC - 1) / NC * NC;
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        __syncthreads();  // the previous batch's readers are done with Bs
        bool bsafe = true;
        for (int t = threadIdx.x; t < KMAX * NP; t += blockDim.x) {
            const int k = t / NP, n = t % NP;
            T v = T(0);
            if (k < K && n < N) {
                v = B[b * sBb + k * sBk + n * sBn];
                if (!Safe::always) bsafe &= Safe::ok(v);
            }
            Bs[k][n] = v;
        }
        if (Safe::always)
            __syncthreads();
        else
            bsafe = __syncthreads_and(bsafe) != 0;
        for (long long m = (long long)blockIdx.x * blockDim.x + threadIdx.x; m < M;
             m += (long long)gridDim.x * blockDim.x) {
            const T* row = A + b * sAb + m * sAm;
            T a[KMAX];
            #pragma unroll
            for (int c = 0; c < KMAX / V; ++c) {
                if ((vector & 1) && (c + 1) * V <= K) {
                    const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(row + c * V);
                    #pragma unroll
                    for (int v = 0; v < V; ++v) a[c * V + v] = p.v[v];
                } else {
                    #pragma unroll
                    for (int v = 0; v < V; ++v) {
                        const int k = c * V + v;
                        a[k] = k < K ? row[k * sAk] : S::template zero<T>();
                    }
                }
            }
            bool safe = bsafe;
            if (!Safe::always) {
                #pragma unroll
                for (int k = 0; k < KMAX; ++k)
                    if (k < K) safe &= Safe::ok(a[k]);
            }
            T* crow = C + b * sCb + m * sCm;
            for (int n0 = 0; n0 < N; n0 += NC) {
                // H partial results per column (over k mod H), so that the fast step has
                // 4 * H independent chains: with one chain per column, ptxas hoisted every sum
                // and load of the row ahead of the maxima (64 registers at KMAX = 16) and spilled.
                constexpr int H = KMAX < 4 ? KMAX : 4;
                T acc[NC][H];
                #pragma unroll
                for (int w = 0; w < NC; ++w)
                    #pragma unroll
                    for (int h = 0; h < H; ++h) acc[w][h] = S::template zero<T>();
                if (safe) {
                    #pragma unroll
                    for (int k = 0; k < KMAX; ++k) {
                        const Pack<T, NC> bv = *reinterpret_cast<const Pack<T, NC>*>(&Bs[k][n0]);
                        #pragma unroll
                        for (int w = 0; w < NC; ++w) acc[w][k % H] = F::step(acc[w][k % H], a[k], bv.v[w]);
                    }
                } else {
                    #pragma unroll
                    for (int k = 0; k < KMAX; ++k)
                        #pragma unroll
                        for (int w = 0; w < NC; ++w) {
                            const T p = S::mul(a[k], Bs[k][n0 + w]);
                            if (S::better(p, acc[w][k % H])) acc[w][k % H] = p;
                        }
                }
                #pragma unroll
                for (int w = 0; w < NC; ++w)
                    #pragma unroll
                    for (int h = 1; h < H; ++h)
                        if (S::better(acc[w][h], acc[w][0])) acc[w][0] = acc[w][h];
                if ((vector & 2) && n0 + NC <= N) {  // C's rows contiguous and aligned
                    Pack<T, NC>* c = reinterpret_cast<Pack<T, NC>*>(crow + n0);
                    Pack<T, NC> p;
                    if (ACCUMULATE) p = *c;
                    #pragma unroll
                    for (int w = 0; w < NC; ++w)
                        p.v[w] = ACCUMULATE && !S::better(acc[w][0], p.v[w]) ? p.v[w] : acc[w][0];
                    *c = p;
                } else {
                    #pragma unroll
                    for (int w = 0; w < NC; ++w) {
                        if (n0 + w >= N) break;
                        T* c = crow + (n0 + w) * sCn;
                        *c = ACCUMULATE && !S::better(acc[w][0], *c) ? *c : acc[w][0];
                    }
                }
            }
        }
    }
}
