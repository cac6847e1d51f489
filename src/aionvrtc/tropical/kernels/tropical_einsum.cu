// The small kernels around an einsum's products: a strided copy (an operand to the order a
// product can read, the result to the output's order), the gather of a compiled contraction's
// operands into its bound inputs, and the backtrace of the products' argmaxes to an assignment.
// The copy and the gather take T, an unsigned type of the element's size: they move elements,
// never compute; the backtrace takes the element type and semiring (it may scan a product
// again). And the small products of a compiled contraction's steps, many in one launch.
#include "tropical_common.cuh"

#define EINSUM_MAX_DIMS 32
#define EINSUM_MAX_GATHER 448

// The destination's C-order sizes and the source's element strides along them (a struct
// passed by value: one launch argument, no device buffer to keep).
struct EinsumDims {
    long long size[EINSUM_MAX_DIMS];
    long long from[EINSUM_MAX_DIMS];
};

template <typename T>
__global__ void einsum_copy(const T* __restrict__ src, T* __restrict__ dst, long long total,
                            int ndim, EinsumDims dims) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long rest = i, at = 0;
        for (int d = ndim - 1; d >= 0; --d) {
            const long long q = rest / dims.size[d];
            at += (rest - q * dims.size[d]) * dims.from[d];
            rest = q;
        }
        dst[i] = src[at];
    }
}

// Operand blockIdx.y of this launch: `to` holds (destination, elements) per operand, fixed when
// the program is built; the sources are each call's (the destination itself: in place).
struct EinsumSources {
    const void* at[EINSUM_MAX_GATHER];
};

template <typename T>
__global__ void einsum_gather(const long long* __restrict__ to, long long count,
                              EinsumSources sources) {
    const long long operand = blockIdx.y;
    if (operand >= count) return;
    const T* src = static_cast<const T*>(sources.at[operand]);
    T* dst = reinterpret_cast<T*>(to[2 * operand]);
    if (src == dst) return;
    const long long n = to[2 * operand + 1];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

// Small contractions, many in one launch: blockIdx.y takes the one `table` describes in row
// blockIdx.y (EINSUM_ROW entries), its outputs spread over blockIdx.x. A row is a group of
// steps (see _fusion.py: a chain, one step or more) contracted as one: each output is the sum
// over every summed index of the product of the group's tensors (its leaves), folded in the
// row's order, which is the order in which the steps apart multiply them. Each tensor is read
// through its own strides along every index (as a tensor, not a 3-D view), so one that no view
// can read needs no copy first. A row: C, I (argmax, or null), the outputs, K (the summed
// values per output), the output indices, the summed indices and the leaves counted, the
// threads per output (see below; plus 256 where some leaf's offsets need 64 bits), each
// leaf's address, then for each output index its size and each leaf's stride along it (C is
// contiguous over them), then the same for each summed index (the argmax numbers K in C order
// over them). A compiled contraction's independent
// small groups (see _einsum_program) take one launch instead of one each, and copy nothing.
#define EINSUM_OUT 24
#define EINSUM_SUMMED 8
#define EINSUM_LEAVES 8
#define EINSUM_WIDTH (1 + EINSUM_LEAVES)
#define EINSUM_ROW (8 + EINSUM_LEAVES + EINSUM_WIDTH * (EINSUM_OUT + EINSUM_SUMMED))

template <typename T>
__device__ __forceinline__ T team_shuffle(T v, int offset, int width) {
    return __shfl_xor_sync(0xffffffffu, v, offset, width);
}
template <>
__device__ __forceinline__ bool team_shuffle<bool>(bool v, int offset, int width) {
    return __shfl_xor_sync(0xffffffffu, (int)v, offset, width) != 0;
}

// One pass of the threads over a row's outputs: thread u of the pass takes output u / lanes
// and its own run of K. Offsets into the leaves are of type O: int where every leaf's
// elements are numbered below 2^31 (the row says so), far cheaper than 64-bit arithmetic
// over up to 8 leaves and 32 indices per output.
template <typename T, typename S, typename O>
__device__ __forceinline__ void many_pass(const long long* row, long long u, T& acc, int& winner) {
    const long long total = row[2], K = row[3];
    const int outs = (int)row[4], sums = (int)row[5], leaves = (int)row[6];
    const int lanes = (int)(row[7] & 0xff), shift = __ffs(lanes) - 1;
    const long long* from = row + 8;
    const long long* out = from + EINSUM_LEAVES;
    const long long* kd = out + EINSUM_WIDTH * EINSUM_OUT;
    const long long t = u >> shift, per = (K + lanes - 1) >> shift;
    long long k = (long long)(u & (lanes - 1)) * per;
    const long long end = min(K, k + per);
    if (t >= total || k >= end) return;
    O at[EINSUM_LEAVES];
#pragma unroll
    for (int l = 0; l < EINSUM_LEAVES; ++l) at[l] = 0;
    if (total <= 0xffffffffLL) {  // 32-bit division, far cheaper, where the outputs allow
        unsigned rest = (unsigned)t;
        for (int j = outs - 1; j >= 0; --j) {
            const long long* o = out + EINSUM_WIDTH * j;
            const unsigned size = (unsigned)o[0], q = rest / size;
            const O i = (O)(rest - q * size);
#pragma unroll
            for (int l = 0; l < EINSUM_LEAVES; ++l)
                if (l < leaves) at[l] += i * (O)o[1 + l];
            rest = q;
        }
    } else {
        long long rest = t;
        for (int j = outs - 1; j >= 0; --j) {
            const long long* o = out + EINSUM_WIDTH * j;
            const long long q = rest / o[0];
            const O i = (O)(rest - q * o[0]);
#pragma unroll
            for (int l = 0; l < EINSUM_LEAVES; ++l)
                if (l < leaves) at[l] += i * (O)o[1 + l];
            rest = q;
        }
    }
    int digit[EINSUM_SUMMED];
    unsigned rest = (unsigned)k;  // this thread's first k's digits, the last fastest (K is
    for (int j = sums - 1; j >= 0; --j) {  // below 2^31: the winner is an int)
        const long long* s = kd + EINSUM_WIDTH * j;
        const unsigned size = (unsigned)s[0], q = rest / size;
        digit[j] = (int)(rest - q * size);
        rest = q;
#pragma unroll
        for (int l = 0; l < EINSUM_LEAVES; ++l)
            if (l < leaves) at[l] += (O)digit[j] * (O)s[1 + l];
    }
    for (; k < end; ++k) {
        T p = reinterpret_cast<const T*>(from[0])[at[0]];
#pragma unroll
        for (int l = 1; l < EINSUM_LEAVES; ++l)
            if (l < leaves) p = S::mul(p, reinterpret_cast<const T*>(from[l])[at[l]]);
        if (S::better(p, acc)) {
            acc = p;
            winner = (int)k;
        }
        for (int j = sums - 1; j >= 0; --j) {  // the next k
            const long long* s = kd + EINSUM_WIDTH * j;
            ++digit[j];
#pragma unroll
            for (int l = 0; l < EINSUM_LEAVES; ++l)
                if (l < leaves) at[l] += (O)s[1 + l];
            if (digit[j] < s[0]) break;
#pragma unroll
            for (int l = 0; l < EINSUM_LEAVES; ++l)
                if (l < leaves) at[l] -= (O)digit[j] * (O)s[1 + l];
            digit[j] = 0;
        }
    }
}

// Each output is computed by a team of `lanes` threads of one warp (a power of 2 up to 32, in
// the row), each over its own run of K, then the team's best is taken by shuffles: a thread's
// chain of dependent loads is K / lanes long, not K (a chain of small contractions is bound by
// that latency, with too few outputs to hide it). Ties go to the smallest k, as one thread
// taking K in order would find. Every thread of a block runs the same passes (the shuffles
// need the whole warp); those past the outputs take part with the zero. The row is read from
// shared memory, where each block puts it first (every thread reads all of it).
template <typename T, typename S, bool ARGMAX>
__global__ void __launch_bounds__(256) tropical_many(const long long* __restrict__ table) {
    __shared__ long long row[EINSUM_ROW];
    const long long* d = table + EINSUM_ROW * (long long)blockIdx.y;
    for (int i = threadIdx.x; i < EINSUM_ROW; i += blockDim.x) row[i] = d[i];
    __syncthreads();
    T* C = reinterpret_cast<T*>(row[0]);
    int* I = reinterpret_cast<int*>(row[1]);
    const int lanes = (int)(row[7] & 0xff), shift = __ffs(lanes) - 1;
    const bool wide = (row[7] >> 8) != 0;  // some leaf's offsets need 64 bits
    const long long threads = row[2] << shift;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < threads;
         base += (long long)gridDim.x * blockDim.x) {
        const long long u = base + threadIdx.x;
        T acc = S::template zero<T>();
        int winner = -1;
        if (wide)
            many_pass<T, S, long long>(row, u, acc, winner);
        else
            many_pass<T, S, int>(row, u, acc, winner);
        for (int offset = lanes >> 1; offset > 0; offset >>= 1) {
            const T other = team_shuffle(acc, offset, lanes);
            const int won = __shfl_xor_sync(0xffffffffu, winner, offset, lanes);
            // (values never NaN: only a better product replaces the zero; equal values
            // both have a winner, or neither)
            if (S::better(other, acc) || (!S::better(acc, other) && won >= 0 && won < winner)) {
                acc = other;
                winner = won;
            }
        }
        if (u < threads && (u & (lanes - 1)) == 0)
            write_output<S, ARGMAX, false>(C + (u >> shift), ARGMAX ? I + (u >> shift) : nullptr,
                                           acc, winner);
    }
}

// The walk of `code` (see _backtrace.py, whose `follow` is the same walk on the host, one
// product after another from the last back), a block for each element of the result, from its
// output indices' values (its position): for each product, the position of the known
// indices in its argmax, the argmax read there, and its digits assigned to the indices it
// summed. A product's known indices are assigned by the products that read its result, so the
// products are taken by depth in the contraction tree, those of one depth by threads of their
// own (each index is summed by one product: no two write one value). (A warp a product, its
// lanes sharing the known indices and the digits, was slower on an H200: 123 us against 105
// for the 15x15 king's graph's 75 depths, its shuffles costing more than the reads they
// spread.) A product whose argmax was not kept (`where` -1: a large product, whose argmax
// costs more in its kernel than a scan here) is taken by the whole block: its K scanned again
// at the position, for the first best k, as its kernel would have kept.
//
// The values are kept as int32 (each is below its index's size, at most 2^31: an argmax's K)
// in shared memory where they fit (`flags` & 1: dynamic shared memory of 4 * indices bytes),
// else in the output's own memory; then widened to the int64 output, followed by the value's
// bytes, so that one copy brings both back. With `flags` & 2 the code and schedule are int32
// (C), copied into shared memory after the values first, by every thread at once: walked from
// global memory, each depth waited on a chain of reads from DRAM, about 5 us a depth (the
// arena's traffic had evicted the code from L2).
#define EINSUM_BACKTRACE_THREADS 256

// The position of a product's known indices in its result.
template <typename C>
__device__ __forceinline__ long long backtrace_position(const C* __restrict__ c, const int* a) {
    const long long known = c[1];
    long long at = 0;
#pragma unroll 4  // (the reads of several indices in flight: each is two dependent reads)
    for (long long j = 0; j < known; ++j) at += (long long)a[c[2 + 2 * j]] * (long long)c[3 + 2 * j];
    return at;
}

// The winner's digits assigned (`d`: the code after the known indices).
template <typename C>
__device__ __forceinline__ void backtrace_digits(const C* __restrict__ d, long long won, int* a) {
    if (won < 0) won = 0;  // the semiring's zero: every assignment attains it
    if (d[0] >= 0) won += (long long)a[d[0]] * (long long)d[1];  // the part of a split K
    const long long summed = d[2];
    for (long long j = 0; j < summed; ++j) {
        const long long index = d[3 + 2 * j], size = d[4 + 2 * j];
        if (won < 0x7fffffffLL && size < 0x7fffffffLL) {  // 32-bit division: far cheaper
            const unsigned w = (unsigned)won, n = (unsigned)size;
            a[index] = (int)(w % n);
            won = w / n;
        } else {
            a[index] = (int)(won % size);
            won /= size;
        }
    }
}

// (best, k) and (other, k2): whether the second wins (the better value, else the smaller k).
template <typename T, typename S>
__device__ __forceinline__ bool scan_takes(T best, long long k, T other, long long k2) {
    if (k2 < 0) return false;
    return k < 0 || S::better(other, best) || (!S::better(best, other) && k2 < k);
}

template <typename T, typename S>
__device__ __forceinline__ void scan_reduce(T& best, long long& k) {
    for (int o = 16; o > 0; o >>= 1) {
        const T other = team_shuffle(best, o, 32);
        const long long k2 = __shfl_xor_sync(0xffffffffu, k, o);
        if (scan_takes<T, S>(best, k, other, k2)) best = other, k = k2;
    }
}

// A product's argmax found again by the block: its K at the position, the first best k.
template <typename T, typename S, typename C>
__device__ __forceinline__ void backtrace_scan(const C* __restrict__ c,
                                               const char* __restrict__ base, int* a) {
    // (Static shared memory beside the dynamic: _einsum_steps._SHARED leaves room for it.)
    __shared__ T bests[32];
    __shared__ long long ks[32];
    const long long at = backtrace_position(c, a);
    const C* d = c + 2 + 2 * c[1];
    const C* s = d + 3 + 2 * d[2];
    const long long m = s[2], n = s[3], K = s[4], mn = m * n;
    const long long b = at / mn, mi = (at - b * mn) / n, ni = at - b * mn - mi * n;
    const T* A = reinterpret_cast<const T*>(base + (long long)s[0]) + b * s[5] + mi * s[6];
    const T* B = reinterpret_cast<const T*>(base + (long long)s[1]) + b * s[8] + ni * s[10];
    const long long ak = s[7], bk = s[9];
    T best = S::template zero<T>();
    long long won = -1;
    for (long long k = threadIdx.x; k < K; k += blockDim.x) {
        const T v = S::mul(A[k * ak], B[k * bk]);
        if (S::better(v, best)) best = v, won = k;  // (a thread's k ascend: the first wins)
    }
    scan_reduce<T, S>(best, won);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) bests[warp] = best, ks[warp] = won;
    __syncthreads();
    if (warp == 0) {
        const bool mine = lane < (int)(blockDim.x >> 5);
        best = mine ? bests[lane] : S::template zero<T>();
        won = mine ? ks[lane] : -1;
        scan_reduce<T, S>(best, won);
        if (lane == 0) backtrace_digits(d, won, a);
    }
    __syncthreads();  // (bests and ks are the next scan's)
}

// `schedule`: where each depth's products start, how many of each depth's are scanned (they
// come first), then each product's code's offset, by depth.
template <typename T, typename S, typename C>
__device__ __forceinline__ void backtrace_walk(const C* code, const C* schedule, long long depths,
                                               const char* base, int* a) {
    const C* scans = schedule + depths + 1;
    const C* offsets = scans + depths;
    for (long long depth = 0; depth < depths; ++depth) {
        const long long first = schedule[depth], kept = first + scans[depth];
        for (long long t = kept + threadIdx.x; t < schedule[depth + 1]; t += blockDim.x) {
            const C* c = code + offsets[t];
            const int* argmax = reinterpret_cast<const int*>(base + (long long)c[0]);
            backtrace_digits(c + 2 + 2 * c[1], argmax[backtrace_position(c, a)], a);
        }
        for (long long t = first; t < kept; ++t)
            backtrace_scan<T, S>(code + offsets[t], base, a);
        __syncthreads();
    }
}

template <typename T, typename S>
__global__ void __launch_bounds__(EINSUM_BACKTRACE_THREADS)
    einsum_backtrace(const void* __restrict__ code, const void* __restrict__ schedule,
                     long long depths, const char* __restrict__ base, long long* assignment,
                     long long indices, const unsigned char* __restrict__ value,
                     long long itemsize, int flags, long long code_words,
                     long long schedule_words, long long outputs) {
    extern __shared__ int fast[];
    // A block per element of the result, its assignment (and value) at its own place; the
    // element's output indices are its position, read from the digits past the schedule.
    const long long element = blockIdx.x;
    assignment += element * (indices + 1);
    value += element * itemsize;
    int* a = (flags & 1) ? fast : reinterpret_cast<int*>(assignment);
    for (long long i = threadIdx.x; i < indices; i += blockDim.x) a[i] = 0;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long e = element;
        for (long long j = 0; j < 2 * outputs; j += 2) {
            const long long at = schedule_words + j;
            const long long index =
                (flags & 2) ? static_cast<const int*>(schedule)[at]
                            : static_cast<const long long*>(schedule)[at];
            const long long size =
                (flags & 2) ? static_cast<const int*>(schedule)[at + 1]
                            : static_cast<const long long*>(schedule)[at + 1];
            a[index] = (int)(e % size);
            e /= size;
        }
    }
    if (flags & 2) {
        int* staged_code = fast + indices;
        int* staged_schedule = staged_code + code_words;
        const int* from_code = static_cast<const int*>(code);
        const int* from_schedule = static_cast<const int*>(schedule);
        for (long long i = threadIdx.x; i < code_words; i += blockDim.x)
            staged_code[i] = from_code[i];
        for (long long i = threadIdx.x; i < schedule_words; i += blockDim.x)
            staged_schedule[i] = from_schedule[i];
        __syncthreads();
        backtrace_walk<T, S, int>(staged_code, staged_schedule, depths, base, a);
    } else {
        __syncthreads();
        backtrace_walk<T, S, long long>(static_cast<const long long*>(code),
                                        static_cast<const long long*>(schedule), depths, base,
                                        a);
    }
    if (flags & 1) {
        for (long long i = threadIdx.x; i < indices; i += blockDim.x) assignment[i] = a[i];
    } else if (threadIdx.x == 0) {
        // Widened in place from the last: a[i] is read before assignment[i] overwrites
        // a[i..2i+1].
        for (long long i = indices - 1; i >= 0; --i) assignment[i] = a[i];
    }
    if (threadIdx.x != 0) return;
    unsigned char* bytes = reinterpret_cast<unsigned char*>(assignment + indices);
    for (long long b = 0; b < 8; ++b) bytes[b] = b < itemsize ? value[b] : 0;
}
