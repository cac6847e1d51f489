#include "tropical_fast.cuh"

// -- the tuned product (row-major operands) ------------------------------------------------------
// A (M x K) with unit stride along k and B (K x N) with unit stride along n. Block tile BM x BN,
// k-step BK, each thread a TM x TN tile of C split in two halves along each side (rows
// ty * TM/2 + i and BM/2 + ty * TM/2 + i, likewise columns), so that the threads of a warp read
// consecutive shared-memory words (16-byte loads). The next k-tile is loaded into registers while
// the current one is computed (double-buffered shared memory, one barrier per k-tile). Interior
// tiles of aligned operands load 16 bytes at a time without bounds checks.

// The first product of a k-tile may seed its best without a max, except for doubles, whose
// compare-and-select max (tmax) would keep a NaN seed (-inf + inf) for good.
template <typename T> struct SeedsWithoutMax { static constexpr bool value = true; };
template <> struct SeedsWithoutMax<double> { static constexpr bool value = false; };

// MINB: blocks per SM that ptxas must fit (2 caps 256 threads at 128 registers each).
//
// ARGMAX: each k-tile's best product for every output is found with the fast step (two
// instructions per pair, as without argmax); where it beats the running value, strictly, so that
// the first tile attaining the maximum keeps it, the tile's number is recorded. At the end one
// rescan of that tile (BK products, from global memory) finds the smallest k attaining the value.
// That costs a compare, a select and a store per output and k-tile, instead of per (m, n, k).
// (Comparing once per 32 values of k, two or four tiles, measured slower on the H200.)
template <typename T, typename F, bool ARGMAX, bool ACCUMULATE, int BM, int BN, int BK, int TM, int TN,
          int MINB>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), MINB) tropical_gemm_tiled(
    const T* __restrict__ A, const T* __restrict__ B, T* C, int* I,
    long long M, long long N, long long K, long long batch,
    long long sAb, long long lda, long long sBb, long long ldb,
    long long sCb, long long sCm, long long sCn,
    long long sIb, long long sIm, long long sIn, int aligned) {
    typedef typename F::Exact S;
    typedef SafeLimit<T, F::product> Safe;
    constexpr int NT = (BM / TM) * (BN / TN);
    constexpr int V = pick_vector(16 / sizeof(T), BM * BK, BK * BN, NT);
    constexpr int A_CH = BM * BK / (V * NT), B_CH = BK * BN / (V * NT);  // 16-byte chunks
    constexpr int AI = ARGMAX ? TM : 1, AJ = ARGMAX ? TN : 1;  // sizes of the argmax arrays
    static_assert(BM * BK % (V * NT) == 0 && BK * BN % (V * NT) == 0, "tile loads must divide evenly");
    static_assert(BK % V == 0 && BN % V == 0 && TM % 2 == 0 && TN % 2 == 0, "tile shape");
    __shared__ __align__(16) T As[2][BK][BM];
    __shared__ __align__(16) T Bs[2][BK][BN];
    // ARGMAX: the last k-tile that improved each output's running value (0xffff: none), kept in
    // shared memory, a column per thread (no bank conflicts), so that the registers hold only
    // the running and the tile's best values: with the index in registers too, 8 x 4 outputs
    // per thread took 242 registers. 16 bits: at most ARGMAX_MAX_TILES k-tiles (the host routes
    // longer products to the generic kernel).
    __shared__ unsigned short Ls[ARGMAX ? TM * TN : 1][ARGMAX ? NT : 1];
    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    const long long m0 = (long long)blockIdx.x * BM;
    const long long tiles = (K + BK - 1) / BK;
    // Chunk u of this thread: A row ar[u], columns ac[u]..+V of the tile; B row br[u], cols bc[u].
    int ar[A_CH], ac[A_CH], br[B_CH], bc[B_CH];
    #pragma unroll
    for (int u = 0; u < A_CH; ++u) {
        const int q = tid + u * NT;
        ar[u] = q / (BK / V);
        ac[u] = q % (BK / V) * V;
    }
    #pragma unroll
    for (int u = 0; u < B_CH; ++u) {
        const int q = tid + u * NT;
        br[u] = q / (BN / V);
        bc[u] = q % (BN / V) * V;
    }
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        const T* Ab = A + b * sAb;
        const T* Bb = B + b * sBb;
        for (long long n0 = (long long)blockIdx.y * BN; n0 < N; n0 += (long long)gridDim.y * BN) {
            const bool interior = aligned && m0 + BM <= M && n0 + BN <= N;
            T ra[A_CH][V], rb[B_CH][V];
            auto load = [&](long long k0) {
                if (interior && k0 + BK <= K) {
                    #pragma unroll
                    for (int u = 0; u < A_CH; ++u) {
                        const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(Ab + (m0 + ar[u]) * lda + k0 + ac[u]);
                        #pragma unroll
                        for (int v = 0; v < V; ++v) ra[u][v] = p.v[v];
                    }
                    #pragma unroll
                    for (int u = 0; u < B_CH; ++u) {
                        const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(Bb + (k0 + br[u]) * ldb + n0 + bc[u]);
                        #pragma unroll
                        for (int v = 0; v < V; ++v) rb[u][v] = p.v[v];
                    }
                    return;
                }
                // Edges: rows past M and columns past N are never stored (0 will do); k past K
                // must not win, so it loads as the semiring's zero (which the check below
                // refuses, so integer tiles that hold it take the exact path).
                #pragma unroll
                for (int u = 0; u < A_CH; ++u)
                    #pragma unroll
                    for (int v = 0; v < V; ++v) {
                        const long long m = m0 + ar[u], k = k0 + ac[u] + v;
                        ra[u][v] = k >= K ? S::template zero<T>() : m < M ? Ab[m * lda + k] : T(0);
                    }
                #pragma unroll
                for (int u = 0; u < B_CH; ++u)
                    #pragma unroll
                    for (int v = 0; v < V; ++v) {
                        const long long n = n0 + bc[u] + v, k = k0 + br[u];
                        rb[u][v] = k >= K ? S::template zero<T>() : n < N ? Bb[k * ldb + n] : T(0);
                    }
            };
            // Stores the tile loaded last, and says whether it may take the fast step. The check
            // runs here, long after the loads were issued: run at the load, it made every k-tile
            // of the integer kernels wait on memory.
            auto store = [&](int buf) {
                bool safe = true;
                #pragma unroll
                for (int u = 0; u < A_CH; ++u)
                    #pragma unroll
                    for (int v = 0; v < V; ++v) {
                        As[buf][ac[u] + v][ar[u]] = ra[u][v];
                        if (!Safe::always) safe &= Safe::ok(ra[u][v]);
                    }
                #pragma unroll
                for (int u = 0; u < B_CH; ++u)
                    #pragma unroll
                    for (int v = 0; v < V; ++v) {
                        Bs[buf][br[u]][bc[u] + v] = rb[u][v];
                        if (!Safe::always) safe &= Safe::ok(rb[u][v]);
                    }
                return safe;
            };
            // The barrier that publishes a stored tile; for integers it also agrees on the check.
            auto publish = [&](bool safe) {
                if (Safe::always) {
                    __syncthreads();
                    return true;
                }
                return __syncthreads_and(safe) != 0;
            };
            T acc[TM][TN];
            T part[AI][AJ];  // ARGMAX: this k-tile's best
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) {
                    acc[i][j] = S::template zero<T>();
                    if (ARGMAX) Ls[ARGMAX ? i * TN + j : 0][ARGMAX ? tid : 0] = 0xffff;
                }
            load(0);
            bool tile_safe = publish(store(0));
            for (long long t = 0; t < tiles; ++t) {
                const int buf = t & 1;
                if (t + 1 < tiles) load((t + 1) * BK);
                if (tile_safe) {
                    #pragma unroll
                    for (int kk = 0; kk < BK; ++kk) {
                        T a[TM], bv[TN];
                        #pragma unroll
                        for (int i = 0; i < TM / 2; ++i) {
                            a[i] = As[buf][kk][ty * (TM / 2) + i];
                            a[i + TM / 2] = As[buf][kk][BM / 2 + ty * (TM / 2) + i];
                        }
                        #pragma unroll
                        for (int j = 0; j < TN / 2; ++j) {
                            bv[j] = Bs[buf][kk][tx * (TN / 2) + j];
                            bv[j + TN / 2] = Bs[buf][kk][BN / 2 + tx * (TN / 2) + j];
                        }
                        #pragma unroll
                        for (int i = 0; i < TM; ++i)
                            #pragma unroll
                            for (int j = 0; j < TN; ++j) {
                                if (ARGMAX) {
                                    T& p = part[ARGMAX ? i : 0][ARGMAX ? j : 0];
                                    if (kk == 0 && SeedsWithoutMax<T>::value)
                                        p = F::mul(a[i], bv[j]);
                                    else
                                        p = F::step(kk == 0 ? S::template zero<T>() : p, a[i], bv[j]);
                                } else {
                                    acc[i][j] = F::step(acc[i][j], a[i], bv[j]);
                                }
                            }
                    }
                } else {
                    #pragma unroll
                    for (int i = 0; i < TM; ++i)
                        #pragma unroll
                        for (int j = 0; j < TN; ++j)
                            if (ARGMAX) part[ARGMAX ? i : 0][ARGMAX ? j : 0] = S::template zero<T>();
                    for (int kk = 0; kk < BK; ++kk) {
                        #pragma unroll
                        for (int i = 0; i < TM; ++i) {
                            const int r = (i < TM / 2 ? 0 : BM / 2) + ty * (TM / 2) + i % (TM / 2);
                            const T a = As[buf][kk][r];
                            #pragma unroll
                            for (int j = 0; j < TN; ++j) {
                                const int c = (j < TN / 2 ? 0 : BN / 2) + tx * (TN / 2) + j % (TN / 2);
                                const T p = S::mul(a, Bs[buf][kk][c]);
                                T& best = ARGMAX ? part[ARGMAX ? i : 0][ARGMAX ? j : 0] : acc[i][j];
                                if (S::better(p, best)) best = p;
                            }
                        }
                    }
                }
                if (ARGMAX) {
                    #pragma unroll
                    for (int i = 0; i < TM; ++i)
                        #pragma unroll
                        for (int j = 0; j < TN; ++j) {
                            const T p = part[ARGMAX ? i : 0][ARGMAX ? j : 0];
                            if (S::better(p, acc[i][j])) {
                                acc[i][j] = p;
                                Ls[ARGMAX ? i * TN + j : 0][ARGMAX ? tid : 0] = (unsigned short)t;
                            }
                        }
                }
                bool safe = true;
                if (t + 1 < tiles) safe = store(buf ^ 1);
                tile_safe = publish(safe);
            }
            #pragma unroll
            for (int i = 0; i < TM; ++i) {
                const long long m = m0 + (i < TM / 2 ? 0 : BM / 2) + ty * (TM / 2) + i % (TM / 2);
                #pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const long long n = n0 + (j < TN / 2 ? 0 : BN / 2) + tx * (TN / 2) + j % (TN / 2);
                    if (m >= M || n >= N) continue;
                    T* c = C + b * sCb + m * sCm + n * sCn;
                    int* ix = ARGMAX ? I + b * sIb + m * sIm + n * sIn : nullptr;
                    T value = acc[i][j];
                    int winner = -1;
                    const unsigned last = ARGMAX ? Ls[ARGMAX ? i * TN + j : 0][ARGMAX ? tid : 0] : 0xffff;
                    if (last != 0xffff) {
                        // The smallest k of the improving tile whose product is the value (the
                        // fast step computed the same sums and products, so it is there).
                        const long long k0 = (long long)last * BK;
                        #pragma unroll
                        for (int kk = BK - 1; kk >= 0; --kk) {
                            const long long k = k0 + kk;
                            if (k < K && S::mul(Ab[m * lda + k], Bb[k * ldb + n]) == value) winner = (int)k;
                        }
                    }
                    write_output<S, ARGMAX, ACCUMULATE>(c, ix, value, winner);
                }
            }
        }
    }
}
