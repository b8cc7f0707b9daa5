/* Vector helpers of the "cpu" backend's kernel (paged_rows.c, the only includer): dtypes and their
   conversion to float32, the ISA this build targets and its register tiles, loads, horizontal sums, exp. */
#ifndef PAGED_ROWS_SIMD_H
#define PAGED_ROWS_SIMD_H
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

/* float32 -> bfloat16, rounded to nearest even (NaN: the quiet NaN 0x7fc0), as torch converts */
static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

#if defined(__FLT16_MAX__)
static inline float f16_to_f32(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
#else
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (e == 0) { float f = ldexpf((float)man, -24); return sign ? -f : f; }
    v.u = sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (man << 13);
    return v.f;
}
#endif

/* n elements of type dtype at src -> float32 at dst */
static inline void load_row(float *restrict dst, const void *src, int64_t n, int dtype) {
    if (dtype == DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == DT_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
    }
}

/* ---- register-tiled path for head_dim a multiple of VL (GCC/clang vector extensions) ----
   The ISA is the one the compiler targets (the build's -march, chosen in cpu_backend.py); the tiles are sized so
   that a tile's accumulators and operands fit the register file with no spills (checked in the assembly, see
   docs/kernels-isa.md). With VL floats per register:
     q.K tile of RT rows x QK_T tokens: RT*QK_T accumulators + QK_T K vectors + 1 q vector live at once;
     P.V tile of RT rows x PV_G vectors: RT*PV_G accumulators + PV_G V vectors + 1 broadcast weight.
   AVX-512  32 zmm x 16 floats: q.K 4x4 -> 16 + 4 + 1 = 21; P.V 4x4 (64 dims) -> 16 + 4 + 1 = 21 of 32.
   AVX2     16 ymm x  8 floats: q.K 4x2 -> 8 + 2 + 1 = 11; P.V 4x2 (16 dims) -> 8 + 2 + 1 = 11 of 16. (The AVX-512
            tiles built for AVX2 need 32 + 8 + 2 ymm for P.V: GCC spilled them, ~1,000 stack accesses.)
   NEON     32 q x 4 floats: the AVX-512 counts, 4x4 and 4x4 (16 dims), 21 of 32.
   generic  4 floats, 16 registers assumed (SSE2 on x86-64): the AVX2 counts.
   RT = 4 matches a group of 4 query heads per KV head (32 / 8); other groups take 4-row tiles then single rows.
   QK_T / PV_G may be overridden with -D for tile experiments. */
#if defined(PAGED_ISA_GENERIC)
#define ISA_NAME "generic"
#define VL 4
#define NREGS 16
#elif defined(__AVX512F__)
#define ISA_NAME "avx512"
#define VL 16
#define NREGS 32
#elif defined(__AVX2__) && defined(__FMA__)
#define ISA_NAME "avx2"
#define VL 8
#define NREGS 16
#elif defined(__ARM_NEON) && defined(__aarch64__)
#define ISA_NAME "neon"
#define VL 4
#define NREGS 32
#else
#define ISA_NAME "generic"
#define VL 4
#define NREGS 16
#endif
#define RT 4 /* query rows per tile */
#ifndef QK_T /* tokens per q.K tile */
#define QK_T (NREGS >= 32 ? 4 : 2)
#endif
#ifndef PV_G /* VL-float vectors of head_dim per P.V tile */
#define PV_G (NREGS >= 32 ? 4 : 2)
#endif
#ifndef PV_T /* tokens per P.V pass over one head (the accumulators are loaded and stored once a pass) */
#define PV_T 16
#endif
typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));
#if defined(__clang__)
#define UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define UNROLL _Pragma("GCC unroll 16")
#else
#define UNROLL
#endif

static inline vf ldv(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void stv(float *p, vf v) { memcpy(p, &v, sizeof v); }
/* x in every lane: x - 0 is exactly x, so this is a broadcast (vbroadcastss); 0 + x would need an add (-0 + 0 = +0) */
static inline vf bcast(float x) { return x - (vf){0}; }

/* VL elements at element index i of a float32 or bfloat16 row, as float32 (bfloat16: widen, shift into the high
   half: the conversion stays in registers, no scratch copy) */
static inline __attribute__((always_inline)) vf ldx(const void *base, int64_t i, const int dt) {
    if (dt == DT_BF16) {
        vh h;
        memcpy(&h, (const uint16_t *)base + i, sizeof h);
        return (vf)(__builtin_convertvector(h, vi) << 16);
    }
    return ldv((const float *)base + i);
}

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define HAVE_SHUFFLE 1
typedef float vf4 __attribute__((vector_size(16)));
static inline float hsum(vf v) {
#if VL == 16
    typedef float vf8 __attribute__((vector_size(32)));
    vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
#elif VL == 8
    vf4 b = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
#else
    vf4 b = v;
#endif
    return (b[0] + b[2]) + (b[1] + b[3]);
}
#else
static inline float hsum(vf v) { float s = 0.0f; for (int i = 0; i < VL; i++) s += v[i]; return s; }
#endif

#if HAVE_SHUFFLE
/* VL vectors -> one vector of their VL sums (lane i = the sum of a[i]'s lanes), in 3 (VL - 1) shuffles and adds
   instead of VL horizontal sums of log2(VL) steps each. hadd: within each 128-bit chunk, [x0+x1, x2+x3, y0+y1,
   y2+y3] (vhaddps's order, in-lane shuffles); fold: [even chunks of x, even of y] + [odd chunks of x, odd of y]. */
#if VL == 16
#define HADD_EVEN 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30
#define HADD_ODD 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31
#define FOLD_EVEN 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define FOLD_ODD 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#elif VL == 8
#define HADD_EVEN 0, 2, 8, 10, 4, 6, 12, 14
#define HADD_ODD 1, 3, 9, 11, 5, 7, 13, 15
#define FOLD_EVEN 0, 1, 2, 3, 8, 9, 10, 11
#define FOLD_ODD 4, 5, 6, 7, 12, 13, 14, 15
#else
#define HADD_EVEN 0, 2, 4, 6
#define HADD_ODD 1, 3, 5, 7
#endif
static inline vf hadd(vf x, vf y) {
    return __builtin_shufflevector(x, y, HADD_EVEN) + __builtin_shufflevector(x, y, HADD_ODD);
}
#if VL > 4
static inline vf fold(vf x, vf y) {
    return __builtin_shufflevector(x, y, FOLD_EVEN) + __builtin_shufflevector(x, y, FOLD_ODD);
}
#endif
static inline __attribute__((always_inline)) vf sums(vf *a) { /* a[0 .. VL) is overwritten */
    UNROLL for (int i = 0; i < VL / 2; i++) a[i] = hadd(a[2 * i], a[2 * i + 1]);
    UNROLL for (int i = 0; i < VL / 4; i++) a[i] = hadd(a[2 * i], a[2 * i + 1]); /* a[i]: a[4i..4i+4) per chunk */
#if VL == 8
    a[0] = fold(a[0], a[1]);
#elif VL == 16
    a[0] = fold(a[0], a[1]), a[1] = fold(a[2], a[3]), a[0] = fold(a[0], a[1]);
#endif
    return a[0];
}
#endif

/* e^x for x <= 0 (x = score - running max), VL lanes: 2^n e^r with n = round(x log2 e), |r| <= ln2 / 2, Cephes'
   degree-6 polynomial (relative error ~2e-7); x < -87 is clamped (the result, ~1e-38, is below any softmax
   weight that matters). */
static inline vf vexp(vf x) {
    vi lo = x < -87.0f;
    x = (vf)(((vi)x & ~lo) | ((vi)((vf){0} - 87.0f) & lo));
    const vf magic = (vf){0} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    vf t = x * 1.44269504088896341f + magic;
    vf n = t - magic;
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf y = (vf){0} + 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    vi e = ((vi)t - (vi)magic + 127) << 23; /* 2^n as float bits */
    return y * (vf)e;
}

#endif
