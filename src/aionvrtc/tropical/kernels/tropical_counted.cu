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

// -- the skinny kernel -----------------------------------------------------------------------
// A thread per output, the outputs in C's order (n fastest), a grid-stride loop over them: for
// products with few rows or few columns (a tensor network's tall and wide steps), where the
// tiled kernel would leave most of its 64 x 64 tile idle.

template <typename T, typename S, typename C>
__global__ void __launch_bounds__(CTHREADS) tropical_counted_rows(
    const T* __restrict__ A, const long long* __restrict__ NA,
    const T* __restrict__ B, const long long* __restrict__ NB,
    T* V, long long* NV,
    long long M, long long N, long long K, long long batch,
    COUNTED_STRIDES, long long p, unsigned long long mu, int accumulate) {
    const Modulus mod = {p, mu};
    const long long total = batch * M * N;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long n = t % N, r = t / N, m = r % M, b = r / M;
        const T* a = A + b * sab + m * sam;
        const T* bc = B + b * sbb + n * sbn;
        const long long* na = NA + b * scab + m * scam;
        const long long* nb = NB + b * scbb + n * scbn;
        T acc = S::template zero<T>();
        long long count = 0;
        for (long long k = 0; k < K; ++k) {
            const T x = S::mul(a[k * sak], bc[k * sbk]);
            if (C::reads)
                take<S, C>(acc, count, x, C::load(na[k * scak], mod), C::load(nb[k * scbk], mod),
                           mod);
            else
                take<S, C>(acc, count, x, 1LL, 1LL, mod);
        }
        write_counted<S>(V + b * svb + m * svm + n * svn, NV + b * snb + m * snm + n * snn,
                         acc, C::finish(count, mod), accumulate, mod);
    }
}
