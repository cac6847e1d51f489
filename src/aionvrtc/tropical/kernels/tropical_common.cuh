// Tropical matrix multiplication: C[b, m, n] = (+)_k A[b, m, k] (x) B[b, k, n]
// over the semirings max-plus, min-plus, max-times and and-or, with the index of the winning k.
//
// What every kernel family shares: numbers, saturating arithmetic, the semirings and how an
// output is written. Each family is a source of its own (tropical_gemm.cu, tropical_tiled.cu,
// tropical_rows.cu, tropical_backward.cu) that includes what it needs, so a kernel's cache key
// covers its family and these headers only: editing one family leaves the others' compiled
// kernels (and the tuning records of the tiled one) valid. Every (semiring, type, variant,
// layout) is one template instantiation, compiled on its own (lazily, through aionvrtc's compile
// service) by naming it as a name expression.
#pragma once

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
