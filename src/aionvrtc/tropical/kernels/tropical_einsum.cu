// The small kernels around an einsum's products: a strided copy (an operand to the order a
// product can read, the result to the output's order), the gather of a compiled contraction's
// operands into its bound inputs, and the backtrace of the products' argmaxes to an assignment.
// The copy and the gather take T, an unsigned type of the element's size: they move elements,
// never compute. And the small products of a compiled contraction's steps, many in one launch.
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

// The walk of `code` (see _backtrace.py, whose `follow` is the same walk on the host, one
// product after another from the last back): for each product, the position of the known
// indices in its argmax, the argmax read there, and its digits assigned to the indices it
// summed. A product's known indices are assigned by the products that read its result, so the
// products are taken by depth in the contraction tree (`schedule`: where each depth's products
// start, then each product's code's offset, by depth), those of one depth by threads of their
// own (each index is summed by one product: no two write one value). The values are kept as
// int32 (each is below its index's size, at most 2^31: an argmax's K) in shared memory where
// they fit (`shared`: dynamic shared memory of 4 * indices bytes), else in the output's own
// memory; then widened to the int64 output, followed by the value's bytes, so that one copy
// brings both back.
__device__ __forceinline__ void backtrace_step(const long long* __restrict__ c,
                                               const char* __restrict__ base, int* a) {
    const int* argmax = reinterpret_cast<const int*>(base + c[0]);
    const long long known = c[1];
    long long at = 0;
    for (long long j = 0; j < known; ++j) at += (long long)a[c[2 + 2 * j]] * c[3 + 2 * j];
    long long won = argmax[at];
    if (won < 0) won = 0;  // the semiring's zero: every assignment attains it
    const long long* d = c + 2 + 2 * known;
    if (d[0] >= 0) won += (long long)a[d[0]] * d[1];  // the part of a split K
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

__global__ void einsum_backtrace(const long long* __restrict__ code,
                                 const long long* __restrict__ schedule, long long depths,
                                 const char* __restrict__ base, long long* assignment,
                                 long long indices, const unsigned char* __restrict__ value,
                                 long long itemsize, int shared) {
    extern __shared__ int fast[];
    if (blockIdx.x != 0) return;
    int* a = shared ? fast : reinterpret_cast<int*>(assignment);
    for (long long i = threadIdx.x; i < indices; i += blockDim.x) a[i] = 0;
    __syncthreads();
    const long long* offsets = schedule + depths + 1;
    for (long long depth = 0; depth < depths; ++depth) {
        for (long long t = schedule[depth] + threadIdx.x; t < schedule[depth + 1]; t += blockDim.x)
            backtrace_step(code + offsets[t], base, a);
        __syncthreads();
    }
    if (shared) {
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

// Small products, many in one launch: blockIdx.y takes the product `table` describes in row
// blockIdx.y (EINSUM_ROW entries), its outputs spread over blockIdx.x. Each operand is read
// through its own strides along every index (as a tensor, not a 3-D view), so an operand that
// no view can read needs no copy first: pointers A, B, C, I (argmax, or null), then the
// outputs, K, the output indices and the summed indices counted, then (size, A's stride, B's
// stride) for each output index (C is contiguous over them), then for each summed index (the
// argmax numbers k in C order over them). A compiled contraction's independent small steps (see
// _einsum_program) take one launch instead of one each, and copies none.
#define EINSUM_OUT 24
#define EINSUM_SUMMED 8
#define EINSUM_ROW (8 + 3 * (EINSUM_OUT + EINSUM_SUMMED))

template <typename T, typename S, bool ARGMAX>
__global__ void __launch_bounds__(256) tropical_many(const long long* __restrict__ table) {
    const long long* d = table + EINSUM_ROW * (long long)blockIdx.y;
    const T* A = reinterpret_cast<const T*>(d[0]);
    const T* B = reinterpret_cast<const T*>(d[1]);
    T* C = reinterpret_cast<T*>(d[2]);
    int* I = reinterpret_cast<int*>(d[3]);
    const long long total = d[4], K = d[5];
    const int outs = (int)d[6], sums = (int)d[7];
    const long long* out = d + 8;
    const long long* kd = d + 8 + 3 * EINSUM_OUT;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long oa = 0, ob = 0;
        if (total <= 0xffffffffLL) {  // 32-bit division, far cheaper, where the outputs allow
            unsigned rest = (unsigned)t;
            for (int j = outs - 1; j >= 0; --j) {
                const unsigned size = (unsigned)out[3 * j], q = rest / size;
                const long long i = rest - q * size;
                oa += i * out[3 * j + 1];
                ob += i * out[3 * j + 2];
                rest = q;
            }
        } else {
            long long rest = t;
            for (int j = outs - 1; j >= 0; --j) {
                const long long q = rest / out[3 * j], i = rest - q * out[3 * j];
                oa += i * out[3 * j + 1];
                ob += i * out[3 * j + 2];
                rest = q;
            }
        }
        T acc = S::template zero<T>();
        int winner = -1;
        long long at[EINSUM_SUMMED] = {0};
        long long ka = 0, kb = 0;
        for (long long k = 0; k < K; ++k) {
            const T p = S::mul(A[oa + ka], B[ob + kb]);
            if (S::better(p, acc)) {
                acc = p;
                winner = (int)k;
            }
            for (int j = sums - 1; j >= 0; --j) {  // the next k: the last index fastest
                ++at[j];
                ka += kd[3 * j + 1];
                kb += kd[3 * j + 2];
                if (at[j] < kd[3 * j]) break;
                ka -= at[j] * kd[3 * j + 1];
                kb -= at[j] * kd[3 * j + 2];
                at[j] = 0;
            }
        }
        write_output<S, ARGMAX, false>(C + t, ARGMAX ? I + t : nullptr, acc, winner);
    }
}
