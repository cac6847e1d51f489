// Tropical matrix multiplication: C[b, m, n] = (+)_k A[b, m, k] (x) B[b, k, n]
// over the semirings max-plus, min-plus, max-times and and-or, with the index of the winning k.
//
// Every (semiring, type, variant, layout) is one template instantiation, compiled on its own
// (lazily, through aionvrtc's compile service) by naming it as a name expression.

// -- numbers ---------------------------------------------------------------------------------

template <typename T> struct Num;
template <> struct Num<float> {
    __device__ static float lowest() { return __int_as_float(0xff800000); }   // -inf
    __device__ static float highest() { return __int_as_float(0x7f800000); }  // +inf
};
template <> struct Num<double> {
    __device__ static double lowest() { return __longlong_as_double(0xfff0000000000000ULL); }
    __device__ static double highest() { return __longlong_as_double(0x7ff0000000000000ULL); }
};
template <> struct Num<int> {
    __device__ static int lowest() { return -2147483647 - 1; }
    __device__ static int highest() { return 2147483647; }
};
template <> struct Num<long long> {
    __device__ static long long lowest() { return -9223372036854775807LL - 1; }
    __device__ static long long highest() { return 9223372036854775807LL; }
};
template <> struct Num<bool> {
    __device__ static bool lowest() { return false; }
    __device__ static bool highest() { return true; }
};

// Integer "infinity" is the type's extreme value, and arithmetic saturates: nothing wraps.
template <typename I, typename U>
__device__ __forceinline__ I saturating_add(I a, I b) {
    const I s = (I)((U)a + (U)b);
    // Overflow iff a and b have one sign and the sum the other.
    if (((a ^ s) & (b ^ s)) < 0) return a < 0 ? Num<I>::lowest() : Num<I>::highest();
    return s;
}
__device__ __forceinline__ int sat_add(int a, int b) { return saturating_add<int, unsigned>(a, b); }
__device__ __forceinline__ long long sat_add(long long a, long long b) {
    return saturating_add<long long, unsigned long long>(a, b);
}

// -- semirings ---------------------------------------------------------------------------------
// zero(): the identity of the reduction, absorbing for the combination.
// mul(a, b): the combination. better(x, y): x wins the reduction over y (strictly: ties keep
// the first k, so the argmax is the smallest winning k).

struct MaxPlus {
    template <typename T> __device__ static T zero() { return Num<T>::lowest(); }
    // IEEE for floats (-inf + x = -inf; -inf + inf is NaN, which never wins: it counts as zero).
    __device__ static float mul(float a, float b) { return a + b; }
    __device__ static double mul(double a, double b) { return a + b; }
    template <typename I> __device__ static I mul(I a, I b) {
        if (a == Num<I>::lowest() || b == Num<I>::lowest()) return Num<I>::lowest();
        const I s = sat_add(a, b);
        return s == Num<I>::lowest() ? Num<I>::lowest() + 1 : s;  // finite stays finite
    }
    template <typename T> __device__ static bool better(T x, T y) { return x > y; }
};

struct MinPlus {
    template <typename T> __device__ static T zero() { return Num<T>::highest(); }
    __device__ static float mul(float a, float b) { return a + b; }
    __device__ static double mul(double a, double b) { return a + b; }
    template <typename I> __device__ static I mul(I a, I b) {
        if (a == Num<I>::highest() || b == Num<I>::highest()) return Num<I>::highest();
        const I s = sat_add(a, b);
        return s == Num<I>::highest() ? Num<I>::highest() - 1 : s;
    }
    template <typename T> __device__ static bool better(T x, T y) { return x < y; }
};

// Max-times is defined for non-negative inputs: zero is 0 and products saturate at the
// type's largest value.
struct MaxMul {
    template <typename T> __device__ static T zero() { return T(0); }
    __device__ static float mul(float a, float b) { return a * b; }
    __device__ static double mul(double a, double b) { return a * b; }
    template <typename I> __device__ static I mul(I a, I b) {
        if (a != 0 && b > Num<I>::highest() / a) return Num<I>::highest();
        return a * b;
    }
    template <typename T> __device__ static bool better(T x, T y) { return x > y; }
};

struct AndOr {
    template <typename T> __device__ static T zero() { return false; }
    __device__ static bool mul(bool a, bool b) { return a && b; }
    template <typename T> __device__ static bool better(T x, T y) { return x && !y; }
};

// One output of a product (and its argmax). With ACCUMULATE, C = C (+) A (x) B: the value that was
// there first wins ties, and keeps its index.
template <typename S, bool ARGMAX, bool ACCUMULATE, typename T>
__device__ __forceinline__ void write_output(T* c, int* ix, T value, int winner) {
    if (ACCUMULATE) {
        const T old = *c;
        if (!S::better(value, old)) {
            value = old;
            if (ARGMAX) winner = *ix;
        }
    }
    *c = value;
    if (ARGMAX) *ix = winner;
}

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

// -- backward ------------------------------------------------------------------------------------
// The gradient flows through the winning k only: dA[b, m, k*] += g and dB[b, k*, n] += g for
// the plus semirings; times B[b, k*, n] and A[b, m, k*] (the product rule) for max-times.
// Broadcast inputs have batch stride 0 in their gradient, so the atomics sum over the batch.

template <typename T, bool PRODUCT>
__global__ void tropical_backward(
    const T* __restrict__ G, const int* __restrict__ I,
    const T* __restrict__ A, const T* __restrict__ B, T* GA, T* GB,
    long long M, long long N, long long batch,
    long long sGb, long long sGm, long long sGn,
    long long sIb, long long sIm, long long sIn,
    long long sAb, long long sAm, long long sAk,
    long long sBb, long long sBk, long long sBn,
    long long sGAb, long long sGAm, long long sGAk,
    long long sGBb, long long sGBk, long long sGBn) {
    const long long total = batch * M * N;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long n = t % N, m = (t / N) % M, b = t / (M * N);
        const long long k = I[b * sIb + m * sIm + n * sIn];
        if (k < 0) continue;
        const T g = G[b * sGb + m * sGm + n * sGn];
        if (GA != nullptr)
            atomicAdd(GA + b * sGAb + m * sGAm + k * sGAk,
                      PRODUCT ? g * B[b * sBb + k * sBk + n * sBn] : g);
        if (GB != nullptr)
            atomicAdd(GB + b * sGBb + k * sGBk + n * sGBn,
                      PRODUCT ? g * A[b * sAb + m * sAm + k * sAk] : g);
    }
}

// -- the tuned product (row-major operands) ------------------------------------------------------
// A (M x K) with unit stride along k and B (K x N) with unit stride along n. Block tile BM x BN,
// k-step BK, each thread a TM x TN tile of C split in two halves along each side (rows
// ty * TM/2 + i and BM/2 + ty * TM/2 + i, likewise columns), so that the threads of a warp read
// consecutive shared-memory words (16-byte loads). The next k-tile is loaded into registers while
// the current one is computed (double-buffered shared memory, one barrier per k-tile). Interior
// tiles of aligned operands load 16 bytes at a time without bounds checks.
//
// fast(): the semiring's step acc = acc (+) a (x) b in the fewest instructions, exact whenever
// the tile holds no infinity and no value that could overflow (always, for floats: fmax and fmin
// ignore the NaN of -inf + inf, as the semantics ask). Tiles that do not qualify, and the last,
// partial k-tile, take the exact path.

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
