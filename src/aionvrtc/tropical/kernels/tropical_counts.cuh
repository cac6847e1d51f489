// Count arithmetic of the counted kernels (tropical_counted.cu, tropical_top.cu), and the
// shuffle their warp-per-output forms join lanes with (at the end). Counts are int64: exact
// (Exact: a count past 2^63 - 1 is -1, and stays -1 through every later product and sum,
// never a wrong number), residues modulo p < 2^31 (Modular), or each operand entry's 1 (Ones:
// no count arrays read; a count is at most K, reduced modulo p at the end where p is given).
#pragma once

// p = 0: exact counts. mu = floor(2^64 / p), for Barrett's reduction.
struct Modulus {
    long long p;
    unsigned long long mu;
};

// x mod p for any x below 2^64: the quotient mu x / 2^64 is short by at most one p less than
// two, so one conditional subtraction is left.
__device__ __forceinline__ long long reduce(unsigned long long x, Modulus m) {
    const unsigned long long q = __umul64hi(x, m.mu);
    unsigned long long r = x - q * (unsigned long long)m.p;
    const unsigned long long p = (unsigned long long)m.p;
    return (long long)(r >= p ? r - p : r);
}

// a + b of two counts as the modulus says: residues below p (Modular), else exact with -1 for
// an overflow (both non-negative: their sum passes 2^63 - 1 exactly where it reads negative).
__device__ __forceinline__ long long count_add(long long a, long long b, Modulus m) {
    if (m.p) {
        const long long s = a + b;
        return s >= m.p ? s - m.p : s;
    }
    const long long s = (long long)((unsigned long long)a + (unsigned long long)b);
    return (a | b | s) < 0 ? -1 : s;
}

struct Exact {
    static constexpr bool reads = true;  // the count arrays are read
    __device__ static long long load(long long x, Modulus) { return x; }
    __device__ static long long mul(long long a, long long b, Modulus) {
        if ((a | b) < 0) return -1;
        const unsigned long long x = (unsigned long long)a, y = (unsigned long long)b;
        const unsigned long long lo = x * y;
        return (__umul64hi(x, y) != 0 || (long long)lo < 0) ? -1 : (long long)lo;
    }
    __device__ static long long add(long long a, long long b, Modulus m) {
        const long long s = (long long)((unsigned long long)a + (unsigned long long)b);
        return (a | b | s) < 0 ? -1 : s;
    }
    __device__ static long long finish(long long x, Modulus) { return x; }
};

struct Modular {
    static constexpr bool reads = true;
    // Residues below p < 2^31: a product is below 2^62, a sum of two below 2^32.
    __device__ static long long load(long long x, Modulus m) {
        return reduce((unsigned long long)x, m);
    }
    __device__ static long long mul(long long a, long long b, Modulus m) {
        return reduce((unsigned long long)a * (unsigned long long)b, m);
    }
    __device__ static long long add(long long a, long long b, Modulus m) {
        const long long s = a + b;
        return s >= m.p ? s - m.p : s;
    }
    __device__ static long long finish(long long x, Modulus) { return x; }
};

struct Ones {
    static constexpr bool reads = false;
    __device__ static long long load(long long, Modulus) { return 1; }
    __device__ static long long mul(long long, long long, Modulus) { return 1; }
    __device__ static long long add(long long a, long long b, Modulus) { return a + b; }
    __device__ static long long finish(long long x, Modulus m) { return m.p ? x % m.p : x; }
};

// Lane ^ w's x, every lane of the warp taking part: how the warp-per-output kernels
// (tropical_counted_rows, tropical_top with LANES = 32) join their lanes' parts.
template <typename T> __device__ __forceinline__ T shuffle_xor(T x, int w) {
    return __shfl_xor_sync(0xffffffffu, x, w);
}
template <> __device__ __forceinline__ bool shuffle_xor(bool x, int w) {
    return __shfl_xor_sync(0xffffffffu, (int)x, w) != 0;
}
