// The backward pass of the tropical products: needs nothing but the argmax.

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
