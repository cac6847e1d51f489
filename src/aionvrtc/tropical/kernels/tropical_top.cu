// The k best: C[b, m, n] = (+)_k A[b, m, k] (x) B[b, k, n] where each element is a list of up to
// k (value, count) pairs, distinct values best first, padded with the semiring's zero (count
// 0). A product of two lists is every pair's (value (x), counts multiplied); the sum keeps the
// k best distinct values, the counts of equal values added. The counts are exact (Exact of
// tropical_counts.cuh: -1 past 2^63 - 1, the values standing). The reference's einsum(...,
// top=k) on the GPU.
//
// LANES threads per output list, each keeping a list in registers (KMAX, a template bound on k),
// the outputs in C's order (n fastest) with a grid-stride loop: a thread per output (LANES = 1),
// or a warp per output for a long sum into few outputs (LANES = 32), each lane every 32nd k, the
// lanes' lists then merged by shuffles (a value among the k best of the whole is among the k
// best of every lane that has it, with its whole count there, so the merge is exact). A list's
// entries are contiguous (k of them); the strides are in lists, and a value's list and its
// counts' lie alike.
#include "tropical_common.cuh"
#include "tropical_counts.cuh"

// (v, c) into the sorted list: added to an equal value's count, else bubbled in before the
// first worse value, each displaced entry carried one place down (the last one out falls off).
template <typename S, typename T, int KMAX>
__device__ __forceinline__ void insert(T (&best)[KMAX], long long (&many)[KMAX], int k, T v,
                                       long long c) {
    const Modulus exact = {0, 0};
    bool placed = false;
    #pragma unroll
    for (int p = 0; p < KMAX; ++p) {
        if (p >= k || placed) continue;
        if (many[p] != 0 && best[p] == v) {
            many[p] = Exact::add(many[p], c, exact);
            placed = true;
        } else if (many[p] == 0 || S::better(v, best[p])) {
            const T was = best[p];
            const long long had = many[p];
            best[p] = v;
            many[p] = c;
            v = was;
            c = had;
            placed = had == 0;  // it took an empty place: nothing is carried further
        }
    }
}

template <typename T, typename S, int KMAX, int LANES>
__global__ void __launch_bounds__(256) tropical_top(
    const T* __restrict__ A, const long long* __restrict__ NA,
    const T* __restrict__ B, const long long* __restrict__ NB,
    T* V, long long* NV,
    long long M, long long N, long long K, long long batch, int k,
    long long sab, long long sam, long long sak,
    long long sbb, long long sbk, long long sbn,
    long long svb, long long svm, long long svn) {
    const Modulus exact = {0, 0};
    const T zero = S::template zero<T>();
    static_assert(LANES == 1 || LANES == 32, "a thread or a warp per output");
    const long long total = batch * M * N;
    const int lane = threadIdx.x % LANES;
    // k - 1 hidden from the optimiser: the unrolled select of the k-th entry below, folded into
    // best[k - 1], would move the lists out of registers into local memory.
    int last_at;
    asm("mov.b32 %0, %1;" : "=r"(last_at) : "r"(k - 1));
    // A warp's lanes share one t (LANES = 32), so a warp leaves the loop whole: the shuffles'
    // full mask is every lane.
    for (long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / LANES; t < total;
         t += (long long)gridDim.x * blockDim.x / LANES) {
        const long long n = t % N, r = t / N, m = r % M, b = r / M;
        T best[KMAX];
        long long many[KMAX];
        #pragma unroll
        for (int p = 0; p < KMAX; ++p) { best[p] = zero; many[p] = 0; }
        for (long long kk = lane; kk < K; kk += LANES) {
            const long long at_a = (b * sab + m * sam + kk * sak) * k;
            const long long at_b = (b * sbb + kk * sbk + n * sbn) * k;
            for (int i = 0; i < k; ++i) {
                const T a = A[at_a + i];
                const long long ca = NA[at_a + i];
                if (ca == 0) break;  // the list's padding: no more values
                bool first = true;
                for (int j = 0; j < k; ++j) {
                    const T bj = B[at_b + j];
                    const long long cb = NB[at_b + j];
                    if (cb == 0) break;
                    const T v = S::mul(a, bj);
                    if (v == zero || v != v) break;  // the zero (or NaN): so is every later one
                    // Strictly worse than the k-th value kept: so is every later pair of a.
                    T last = zero;
                    long long held = 0;
                    #pragma unroll
                    for (int p = 0; p < KMAX; ++p)
                        if (p == last_at) { last = best[p]; held = many[p]; }
                    if (held != 0 && S::better(last, v)) break;
                    first = false;
                    insert<S>(best, many, k, v, Exact::mul(ca, cb, exact));
                }
                if (first) break;  // a's next values with b's best are worse still
            }
        }
        #pragma unroll
        for (int w = LANES / 2; w > 0; w /= 2) {
            T theirs[KMAX];
            long long held[KMAX];
            #pragma unroll
            for (int p = 0; p < KMAX; ++p) {
                theirs[p] = shuffle_xor(best[p], w);
                held[p] = shuffle_xor(many[p], w);
            }
            #pragma unroll
            for (int p = 0; p < KMAX; ++p)
                if (held[p] != 0) insert<S>(best, many, k, theirs[p], held[p]);
        }
        if (lane != 0) continue;
        const long long at_v = (b * svb + m * svm + n * svn) * k;
        #pragma unroll
        for (int p = 0; p < KMAX; ++p)
            if (p < k) {
                V[at_v + p] = best[p];
                NV[at_v + p] = many[p];
            }
    }
}
