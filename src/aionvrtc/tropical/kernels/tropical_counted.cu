// Counted products: C[b, m, n] = (+)_k A[b, m, k] (x) B[b, k, n], each element with the count
// of the ways its value is attained: counts of equal products add, a better product replaces
// them, and each product's count is the product of its operands' counts. The element of
// GenericTensorNetworks.jl's CountingTropical, as two arrays (values, and int64 counts) rather
// than one of pairs, so that the values stay the arrays the other kernels read.
//
// Counts as tropical_counts.cuh keeps them (exact, modulo a prime, or each entry's 1). A
// product whose value is the semiring's zero, or NaN (-inf + inf), counts nothing.
#include "tropical_common.cuh"
#include "tropical_counts.cuh"
#include "tropical_fast.cuh"

// The running (value, count) of one output takes the product x with count c (made only where
// it is needed: most products of a long sum neither beat nor tie the running value).
template <typename S, typename C, typename T>
__device__ __forceinline__ void take(T& acc, long long& count, T x, long long ca, long long cb,
                                     Modulus m) {
    if (S::better(x, acc)) {
        acc = x;
        count = C::mul(ca, cb, m);
    } else if (x == acc) {
        count = C::add(count, C::mul(ca, cb, m), m);
    }
}

// One output (value, count) written; with accumulate, joined with the pair there first.
template <typename S, typename T>
__device__ __forceinline__ void write_counted(T* v, long long* c, T value, long long count,
                                              int accumulate, Modulus m) {
    if (accumulate) {
        const T old = *v;
        const long long before = m.p ? reduce((unsigned long long)*c, m) : *c;
        if (old == value) {
            count = count_add(count, before, m);
        } else if (!S::better(value, old)) {
            value = old;
            count = before;
        }
    }
    // The zero (and NaN, != itself) is attained by no assignment that counts.
    if (value == S::template zero<T>() || value != value) count = 0;
    *v = value;
    *c = count;
}

// Element strides (batch, rows, columns) of the six arrays: A, A's counts, B, B's counts, C and
// C's counts. (Separate arguments, not a struct: the launcher packs one 8-byte slot each.)
#define COUNTED_STRIDES                                                                          \
    long long sab, long long sam, long long sak, long long scab, long long scam, long long scak, \
    long long sbb, long long sbk, long long sbn, long long scbb, long long scbk, long long scbn, \
    long long svb, long long svm, long long svn, long long snb, long long snm, long long snn

// -- the tiled kernel ------------------------------------------------------------------------
// As the generic kernel (tropical_gemm.cu): block tile 64 x 64, k-step 16, 256 threads each
// owning a 4 x 4 tile of C (rows ty + 16 i, columns tx + 16 j), any strides; the counts of the
// operands' tiles beside their values in shared memory. Out-of-range elements load as the zero,
// which no product that counts ties with.

constexpr int CBM = 64, CBN = 64, CBK = 16, CTM = 4, CTN = 4, CTHREADS = 256;

template <typename T, typename S, typename C>
__global__ void __launch_bounds__(CTHREADS) tropical_counted(
    const T* __restrict__ A, const long long* __restrict__ NA,
    const T* __restrict__ B, const long long* __restrict__ NB,
    T* V, long long* NV,
    long long M, long long N, long long K, long long batch,
    COUNTED_STRIDES, long long p, unsigned long long mu, int accumulate) {
    const Modulus mod = {p, mu};
    __shared__ T As[CBK][CBM];
    __shared__ T Bs[CBK][CBN];
    __shared__ long long NAs[C::reads ? CBK : 1][C::reads ? CBM : 1];
    __shared__ long long NBs[C::reads ? CBK : 1][C::reads ? CBN : 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long m0 = (long long)blockIdx.x * CBM;
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        for (long long n0 = (long long)blockIdx.y * CBN; n0 < N; n0 += (long long)gridDim.y * CBN) {
            T acc[CTM][CTN];
            long long count[CTM][CTN];
            #pragma unroll
            for (int i = 0; i < CTM; ++i)
                #pragma unroll
                for (int j = 0; j < CTN; ++j) { acc[i][j] = S::template zero<T>(); count[i][j] = 0; }
            for (long long k0 = 0; k0 < K; k0 += CBK) {
                for (int t = threadIdx.x; t < CBK * CBM; t += CTHREADS) {
                    const int kk = t / CBM, mm = t % CBM;
                    const long long m = m0 + mm, k = k0 + kk;
                    const bool in = m < M && k < K;
                    As[kk][mm] = in ? A[b * sab + m * sam + k * sak] : S::template zero<T>();
                    if (C::reads)
                        NAs[C::reads ? kk : 0][C::reads ? mm : 0] =
                            in ? C::load(NA[b * scab + m * scam + k * scak], mod) : 0;
                }
                for (int t = threadIdx.x; t < CBK * CBN; t += CTHREADS) {
                    const int kk = t / CBN, nn = t % CBN;
                    const long long n = n0 + nn, k = k0 + kk;
                    const bool in = n < N && k < K;
                    Bs[kk][nn] = in ? B[b * sbb + k * sbk + n * sbn] : S::template zero<T>();
                    if (C::reads)
                        NBs[C::reads ? kk : 0][C::reads ? nn : 0] =
                            in ? C::load(NB[b * scbb + k * scbk + n * scbn], mod) : 0;
                }
                __syncthreads();
                #pragma unroll 4
                for (int kk = 0; kk < CBK; ++kk) {
                    T a[CTM], bv[CTN];
                    long long na[CTM], nb[CTN];
                    #pragma unroll
                    for (int i = 0; i < CTM; ++i) {
                        a[i] = As[kk][ty + 16 * i];
                        na[i] = C::reads ? NAs[C::reads ? kk : 0][C::reads ? ty + 16 * i : 0] : 1;
                    }
                    #pragma unroll
                    for (int j = 0; j < CTN; ++j) {
                        bv[j] = Bs[kk][tx + 16 * j];
                        nb[j] = C::reads ? NBs[C::reads ? kk : 0][C::reads ? tx + 16 * j : 0] : 1;
                    }
                    #pragma unroll
                    for (int i = 0; i < CTM; ++i)
                        #pragma unroll
                        for (int j = 0; j < CTN; ++j)
                            take<S, C>(acc[i][j], count[i][j], S::mul(a[i], bv[j]), na[i], nb[j], mod);
                }
                __syncthreads();
            }
            #pragma unroll
            for (int i = 0; i < CTM; ++i)
                #pragma unroll
                for (int j = 0; j < CTN; ++j) {
                    const long long m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
                    if (m >= M || n >= N) continue;
                    write_counted<S>(V + b * svb + m * svm + n * svn,
                                     NV + b * snb + m * snm + n * snn, acc[i][j],
                                     C::finish(count[i][j], mod), accumulate, mod);
                }
        }
    }
}

// -- the skinny kernels ----------------------------------------------------------------------
// LANES threads per output, the outputs in C's order (n fastest), a grid-stride loop over them:
// for products with few rows or few columns (a tensor network's tall and wide steps), where the
// tiled kernel would leave most of its 64 x 64 tile idle. LANES = 1 (rows): a thread walks its
// output's sum; LANES = 32 (warps): a warp shares a sum over a long K into few outputs, each
// lane every 32nd k, the lanes' (value, count) pairs joined by shuffles as the products join.

// The running (value, count) of one output joined with another lane's.
template <typename S, typename C, typename T>
__device__ __forceinline__ void join(T& acc, long long& count, T x, long long c, Modulus m) {
    if (S::better(x, acc)) {
        acc = x;
        count = c;
    } else if (x == acc) {
        count = C::add(count, c, m);
    }
}

template <typename T, typename S, typename C, int LANES>
__global__ void __launch_bounds__(CTHREADS) tropical_counted_rows(
    const T* __restrict__ A, const long long* __restrict__ NA,
    const T* __restrict__ B, const long long* __restrict__ NB,
    T* V, long long* NV,
    long long M, long long N, long long K, long long batch,
    COUNTED_STRIDES, long long p, unsigned long long mu, int accumulate) {
    static_assert(LANES == 1 || LANES == 32, "a thread or a warp per output");
    const Modulus mod = {p, mu};
    const long long total = batch * M * N;
    const int lane = threadIdx.x % LANES;
    // A warp's lanes share one t (LANES = 32), so a warp leaves the loop whole: the shuffles'
    // full mask is every lane.
    for (long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / LANES; t < total;
         t += (long long)gridDim.x * blockDim.x / LANES) {
        const long long n = t % N, r = t / N, m = r % M, b = r / M;
        const T* a = A + b * sab + m * sam;
        const T* bc = B + b * sbb + n * sbn;
        const long long* na = NA + b * scab + m * scam;
        const long long* nb = NB + b * scbb + n * scbn;
        T acc = S::template zero<T>();
        long long count = 0;
        for (long long k = lane; k < K; k += LANES) {
            const T x = S::mul(a[k * sak], bc[k * sbk]);
            if (C::reads)
                take<S, C>(acc, count, x, C::load(na[k * scak], mod), C::load(nb[k * scbk], mod),
                           mod);
            else
                take<S, C>(acc, count, x, 1LL, 1LL, mod);
        }
        #pragma unroll
        for (int w = LANES / 2; w > 0; w /= 2)
            join<S, C>(acc, count, shuffle_xor(acc, w), shuffle_xor(count, w), mod);
        if (lane == 0)
            write_counted<S>(V + b * svb + m * svm + n * svn, NV + b * snb + m * snm + n * snn,
                             acc, C::finish(count, mod), accumulate, mod);
    }
}

// -- the count pass ----------------------------------------------------------------------------
// With each output's value known (the value product wrote it first, on the tuned kernels), its
// count is the sum over k of na nb where a (x) b equals that value: for most pairs a product, a
// compare and a predicated add, where the one-pass kernel above branches on "better or equal?"
// and multiplies int64 counts with overflow checks. Counts below 2^31 are kept in shared memory
// as 32 bits, so that a tie costs one 32 x 32 -> 64-bit multiply-add (Tally); a k-tile of exact
// counts that holds a larger one (or an overflowed -1) takes the slow path, reading the int64
// counts of its ties from global memory. Block tile 64 x 64, k-step 16, 256 threads each owning
// a 4 x 4 tile of C (rows 4 ty + i, columns 4 tx + j: one 16-byte shared load of each operand a
// step). Tiles are loaded along whichever of each array's strides is 1, so that row-major and
// transposed operands both coalesce; the shared arrays' rows are padded so that a k-fastest load
// lands on different banks.

constexpr int KBM = 64, KBN = 64, KBK = 16, KPAD = 4;

// A running count: Ones counts ties in 32 bits (the host routes K of 2^31 or more elsewhere);
// Exact sums in 64 bits, capped at 2^63 (past int64: -1 at the end), which no sum of a capped
// value and a product below 2^62 wraps; Modular keeps its sum below Q = the largest multiple of
// p up to 2^63 by subtracting Q, which leaves the residue as it is.
template <typename C> struct Tally;
template <> struct Tally<Ones> {
    typedef unsigned Acc;
    static constexpr bool wide = false;  // whether a tile may hold counts past 32 bits
    __device__ static Acc add(Acc acc, unsigned, unsigned, unsigned long long) { return acc + 1; }
    __device__ static Acc add_wide(Acc acc, long long, long long) { return acc; }  // never slow
    __device__ static long long finish(Acc acc, Modulus m) {
        return m.p ? (long long)(acc % (unsigned long long)m.p) : (long long)acc;
    }
};
constexpr unsigned long long TALLY_CAP = 1ULL << 63;
template <> struct Tally<Exact> {
    typedef unsigned long long Acc;
    static constexpr bool wide = true;
    __device__ static Acc add(Acc acc, unsigned na, unsigned nb, unsigned long long) {
        const Acc s = acc + (Acc)na * nb;
        return s < TALLY_CAP ? s : TALLY_CAP;
    }
    // A tie of a slow tile: int64 counts as given (-1: past int64 already).
    __device__ static Acc add_wide(Acc acc, long long na, long long nb) {
        const long long x = Exact::mul(na, nb, Modulus{0, 0});
        if (x < 0) return TALLY_CAP;
        const Acc s = acc + (Acc)x;
        return s < TALLY_CAP ? s : TALLY_CAP;
    }
    __device__ static long long finish(Acc acc, Modulus) {
        return acc >= TALLY_CAP ? -1 : (long long)acc;
    }
};
template <> struct Tally<Modular> {
    typedef unsigned long long Acc;
    static constexpr bool wide = false;  // residues: below p < 2^31
    __device__ static Acc add(Acc acc, unsigned na, unsigned nb, unsigned long long q) {
        const Acc s = acc + (Acc)na * nb;
        return s >= q ? s - q : s;
    }
    __device__ static Acc add_wide(Acc acc, long long, long long) { return acc; }  // never slow
    __device__ static long long finish(Acc acc, Modulus m) { return reduce(acc, m); }
};

// One operand's k-tile (values, and where counted, counts as 32 bits) into shared memory,
// [k][row] with rows BM wide: along k where the operand's k-stride is 1 (a row-major A, a
// transposed B), else along the rows. Returns false where an exact count would not fit the
// fast path (at least 2^31, or -1).
template <typename T, typename S, typename C, int BM>
__device__ __forceinline__ bool load_tile(
    T (&values)[KBK][BM + KPAD], unsigned (&counts)[C::reads ? KBK : 1][C::reads ? BM + KPAD : 1],
    const T* X, const long long* NX, long long rows, long long K, long long r0, long long k0,
    long long sr, long long sk, long long cr, long long ck, Modulus mod) {
    bool fits = true;
    const bool along_k = sk == 1;
    for (int t = threadIdx.x; t < KBK * BM; t += CTHREADS) {
        const int kk = along_k ? t % KBK : t / BM, rr = along_k ? t / KBK : t % BM;
        const long long r = r0 + rr, k = k0 + kk;
        const bool in = r < rows && k < K;
        values[kk][rr] = in ? X[r * sr + k * sk] : S::template zero<T>();
        if (C::reads) {
            long long n = in ? C::load(NX[r * cr + k * ck], mod) : 0;
            if ((unsigned long long)n >= (1ULL << 31)) {
                fits = false;
                n = 0;
            }
            counts[C::reads ? kk : 0][C::reads ? rr : 0] = (unsigned)n;
        }
    }
    return fits;
}

template <typename T, typename S, typename C>
__global__ void __launch_bounds__(CTHREADS) tropical_count(
    const T* __restrict__ A, const long long* __restrict__ NA,
    const T* __restrict__ B, const long long* __restrict__ NB,
    const T* __restrict__ V, long long* NV,
    long long M, long long N, long long K, long long batch,
    COUNTED_STRIDES, long long p, unsigned long long mu, int) {
    typedef Tally<C> Y;
    typedef typename Y::Acc Acc;
    const Modulus mod = {p, mu};
    const unsigned long long q = p ? TALLY_CAP / (unsigned long long)p * (unsigned long long)p : 0;
    __shared__ __align__(32) T As[KBK][KBM + KPAD];
    __shared__ __align__(32) T Bs[KBK][KBN + KPAD];
    __shared__ __align__(16) unsigned NAs[C::reads ? KBK : 1][C::reads ? KBM + KPAD : 1];
    __shared__ __align__(16) unsigned NBs[C::reads ? KBK : 1][C::reads ? KBN + KPAD : 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long m0 = (long long)blockIdx.x * KBM;
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        for (long long n0 = (long long)blockIdx.y * KBN; n0 < N; n0 += (long long)gridDim.y * KBN) {
            T v[CTM][CTN];
            Acc acc[CTM][CTN];
            #pragma unroll
            for (int i = 0; i < CTM; ++i)
                #pragma unroll
                for (int j = 0; j < CTN; ++j) {
                    const long long m = m0 + 4 * ty + i, n = n0 + 4 * tx + j;
                    v[i][j] = m < M && n < N ? V[b * svb + m * svm + n * svn] : S::template zero<T>();
                    acc[i][j] = 0;
                }
            for (long long k0 = 0; k0 < K; k0 += KBK) {
                const bool fits =
                    load_tile<T, S, C, KBM>(As, NAs, A + b * sab, NA + b * scab, M, K, m0, k0,
                                            sam, sak, scam, scak, mod) &
                    load_tile<T, S, C, KBN>(Bs, NBs, B + b * sbb, NB + b * scbb, N, K, n0, k0,
                                            sbn, sbk, scbn, scbk, mod);
                // The barrier that publishes the tiles; exact counts also agree on the fast path
                // (for the others it is always taken, and the slow one compiled out).
                bool fast = true;
                if (Y::wide)
                    fast = __syncthreads_and(fits) != 0;
                else
                    __syncthreads();
                #pragma unroll 4
                for (int kk = 0; kk < KBK; ++kk) {
                    const Pack<T, 4> a = *reinterpret_cast<const Pack<T, 4>*>(&As[kk][4 * ty]);
                    const Pack<T, 4> bv = *reinterpret_cast<const Pack<T, 4>*>(&Bs[kk][4 * tx]);
                    Pack<unsigned, 4> na = {{1, 1, 1, 1}}, nb = {{1, 1, 1, 1}};
                    if (C::reads) {
                        na = *reinterpret_cast<const Pack<unsigned, 4>*>(&NAs[C::reads ? kk : 0][C::reads ? 4 * ty : 0]);
                        nb = *reinterpret_cast<const Pack<unsigned, 4>*>(&NBs[C::reads ? kk : 0][C::reads ? 4 * tx : 0]);
                    }
                    #pragma unroll
                    for (int i = 0; i < CTM; ++i)
                        #pragma unroll
                        for (int j = 0; j < CTN; ++j) {
                            if (!(S::mul(a.v[i], bv.v[j]) == v[i][j])) continue;
                            if (fast) {
                                acc[i][j] = Y::add(acc[i][j], na.v[i], nb.v[j], q);
                            } else {
                                const long long m = m0 + 4 * ty + i, n = n0 + 4 * tx + j, k = k0 + kk;
                                if (m < M && n < N && k < K)
                                    acc[i][j] = Y::add_wide(acc[i][j], NA[b * scab + m * scam + k * scak],
                                                            NB[b * scbb + k * scbk + n * scbn]);
                            }
                        }
                }
                __syncthreads();
            }
            #pragma unroll
            for (int i = 0; i < CTM; ++i)
                #pragma unroll
                for (int j = 0; j < CTN; ++j) {
                    const long long m = m0 + 4 * ty + i, n = n0 + 4 * tx + j;
                    if (m >= M || n >= N) continue;
                    // The zero (and NaN, != itself) is attained by no assignment that counts.
                    const T x = v[i][j];
                    NV[b * snb + m * snm + n * snn] =
                        x == S::template zero<T>() || x != x ? 0 : Y::finish(acc[i][j], mod);
                }
        }
    }
}
