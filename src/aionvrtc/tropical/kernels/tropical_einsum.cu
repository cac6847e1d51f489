// The small kernels around an einsum's products: a strided copy (an operand to the order a
// product can read, the result to the output's order), the gather of a compiled contraction's
// operands into its bound inputs, and the backtrace of the products' argmaxes to an assignment.
// T is an unsigned type of the element's size: these kernels move elements, never compute.

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
// the program is built; the sources are each call's (null: already in place).
struct EinsumSources {
    const void* at[EINSUM_MAX_GATHER];
};

template <typename T>
__global__ void einsum_gather(const long long* __restrict__ to, long long count,
                              EinsumSources sources) {
    const long long operand = blockIdx.y;
    const T* src = static_cast<const T*>(sources.at[operand]);
    if (operand >= count || src == nullptr) return;
    T* dst = reinterpret_cast<T*>(to[2 * operand]);
    const long long n = to[2 * operand + 1];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

// One thread follows `code` (see _backtrace.py, whose `follow` is the same walk on the host):
// for each product from the last back, the position of the known indices in its argmax, the
// argmax read there, and its digits assigned to the indices it summed. Then the value's bytes
// after the assignment, so that one copy brings both back.
__global__ void einsum_backtrace(const long long* __restrict__ code, long long steps,
                                 const char* __restrict__ base, long long* assignment,
                                 long long indices, const unsigned char* __restrict__ value,
                                 long long itemsize) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (long long i = 0; i < indices; ++i) assignment[i] = 0;
    const long long* c = code;
    for (long long s = 0; s < steps; ++s) {
        const int* argmax = reinterpret_cast<const int*>(base + c[0]);
        const long long known = c[1];
        c += 2;
        long long at = 0;
        for (long long j = 0; j < known; ++j, c += 2) at += assignment[c[0]] * c[1];
        long long won = argmax[at];
        if (won < 0) won = 0;  // the semiring's zero: every assignment attains it
        if (c[0] >= 0) won += assignment[c[0]] * c[1];  // the part of a split K
        const long long summed = c[2];
        c += 3;
        for (long long j = 0; j < summed; ++j, c += 2) {
            assignment[c[0]] = won % c[1];
            won /= c[1];
        }
    }
    unsigned char* bytes = reinterpret_cast<unsigned char*>(assignment + indices);
    for (long long b = 0; b < 8; ++b) bytes[b] = b < itemsize ? value[b] : 0;
}
