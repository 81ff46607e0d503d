/* 8-lane float vectors for the kernels (GCC / clang vector extensions, AVX2 where the CPU has it):
 * loads, sums, a select, exp and the unpacking of rows of 8- and 4-bit codes. */
#ifndef DUOCAL_VECTORS_H
#define DUOCAL_VECTORS_H

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <string.h>

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint8_t v8u __attribute__((vector_size(8)));

#if defined(__clang__)
#define SHUFFLE(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define SHUFFLE(x, y, ...) __builtin_shuffle(x, y, (v8i){__VA_ARGS__})
#endif

static inline v8f load8(const float *p) { v8f x; memcpy(&x, p, sizeof x); return x; }
static inline void store8(float *p, v8f x) { memcpy(p, &x, sizeof x); }
static inline v8f splat(float s) { return (v8f){s, s, s, s, s, s, s, s}; }
static inline float sum1(v8f a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }
static inline float max1(v8f a) {
    float m = a[0];
    for (int i = 1; i < 8; i++) m = a[i] > m ? a[i] : m;
    return m;
}
/* where m (a comparison's all-ones lanes): a, else b */
static inline v8f vselect(v8i m, v8f a, v8f b) {
    v8i ai, bi;
    memcpy(&ai, &a, sizeof a);
    memcpy(&bi, &b, sizeof b);
    v8i r = (ai & m) | (bi & ~m);
    v8f out;
    memcpy(&out, &r, sizeof out);
    return out;
}
static inline v8f hadd(v8f x, v8f y) {
    return SHUFFLE(x, y, 0, 2, 8, 10, 4, 6, 12, 14) + SHUFFLE(x, y, 1, 3, 9, 11, 5, 7, 13, 15);
}
/* [sum(a[0]), ..., sum(a[7])] */
static inline v8f sums8(const v8f *a) {
    v8f c0 = hadd(hadd(a[0], a[1]), hadd(a[2], a[3])), c1 = hadd(hadd(a[4], a[5]), hadd(a[6], a[7]));
    return SHUFFLE(c0, c1, 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE(c0, c1, 4, 5, 6, 7, 12, 13, 14, 15);
}
/* exp(x) for x <= 0 (Cephes' expf: x = n ln 2 + g, |g| <= ln 2 / 2; relative error ~1e-7); below
 * -87.3 it returns 2^-126, which a masked token multiplies by 0 */
static inline v8f vexp(v8f x) {
    x = vselect(x < splat(-87.3f), splat(-87.3f), x);
    v8f n = (x * splat(1.44269504f) + splat(12582912.0f)) - splat(12582912.0f); /* round to nearest */
    v8f g = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
    v8f y = splat(1.9875691500e-4f);
    y = y * g + splat(1.3981999507e-3f);
    y = y * g + splat(8.3334519073e-3f);
    y = y * g + splat(4.1665795894e-2f);
    y = y * g + splat(1.6666665459e-1f);
    y = y * g + splat(5.0000001201e-1f);
    y = y * g * g + g + splat(1.0f);
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    v8f two;
    memcpy(&two, &bits, sizeof two);
    return y * two;
}

/* 8 bytes from p, each widened to a 32-bit lane */
static inline v8i widen8(const uint8_t *p) {
#if defined(__AVX2__)
    __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    v8i out;
    memcpy(&out, &x, sizeof out);
    return out;
#else
    v8u x;
    memcpy(&x, p, 8);
    return __builtin_convertvector(x, v8i);
#endif
}

/* one row of codes -> nv vectors of 8 channels, in channel order */
static inline __attribute__((always_inline)) void unpack(const uint8_t *row, const int64_t nv, const int64_t bits, v8f *c) {
    if (bits == 8) {
        for (int64_t i = 0; i < nv; i++) c[i] = __builtin_convertvector(widen8(row + 8 * i), v8f);
        return;
    }
    for (int64_t i = 0; i < nv / 2; i++) { /* 8 bytes widened once, both nibbles taken in 32-bit lanes */
        v8i wide = widen8(row + 8 * i);
        c[i] = __builtin_convertvector(wide & 15, v8f);
        c[i + nv / 2] = __builtin_convertvector(wide >> 4, v8f);
    }
}

#endif
