/* The "cpu" backend's kernel: see core/kernels/cpu_backend.py for what it computes and how it is built. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };
#ifndef PF_DIST /* blocks ahead whose rows are prefetched (block ids are random: no hardware prefetcher guesses) */
#define PF_DIST 1
#endif

static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
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

#ifndef PF_HEAD /* 1: while one KV head of a block is computed, prefetch the next head's rows into L1 */
#define PF_HEAD 1
#endif
/* rows of row_bytes each, row_stride_bytes apart, prefetched with locality LOC (a constant: 3 = L1, 2 = L2) */
#define PREFETCH_ROWS(base, row_stride_bytes, rows, row_bytes, LOC)                                           \
    for (int64_t t_ = 0; t_ < (rows); t_++)                                                                 \
        for (int64_t o_ = 0; o_ < (row_bytes); o_ += 64)                                                    \
            __builtin_prefetch((base) + t_ * (row_stride_bytes) + o_, 0, LOC)

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

/* sc[r * BS + t + j] = q_r . k_(t+j) for rows [0, nr), j in [0, nt); nr <= RT, nt <= QK_T (constants when
   inlined). k: the block's K rows (dtype dt), krs elements apart. */
static inline __attribute__((always_inline)) void qk_tile(
    const float *q, int64_t D, const void *k, int64_t krs, int64_t t, float *sc, int64_t BS,
    const int nr, const int nt, const int dt) {
    vf acc[RT][QK_T];
    UNROLL for (int r = 0; r < nr; r++) UNROLL for (int j = 0; j < nt; j++) acc[r][j] = (vf){0};
    for (int64_t c = 0; c < D; c += VL) {
        vf kv[QK_T];
        UNROLL for (int j = 0; j < nt; j++) kv[j] = ldx(k, (t + j) * krs + c, dt);
        UNROLL for (int r = 0; r < nr; r++) {
            const vf qv = ldv(q + r * D + c);
            UNROLL for (int j = 0; j < nt; j++) acc[r][j] += qv * kv[j];
        }
    }
#if HAVE_SHUFFLE
    if (nr == RT && nt == QK_T && RT * QK_T % VL == 0) { /* full tile: sums of VL accumulators at a time */
        float out[RT * QK_T];
        UNROLL for (int g = 0; g < RT * QK_T / VL; g++) {
            vf part[VL];
            UNROLL for (int i = 0; i < VL; i++) part[i] = acc[(g * VL + i) / QK_T][(g * VL + i) % QK_T];
            stv(out + g * VL, sums(part));
        }
        UNROLL for (int r = 0; r < RT; r++) memcpy(sc + r * BS + t, out + r * QK_T, sizeof(float) * QK_T);
        return;
    }
#endif
    UNROLL for (int r = 0; r < nr; r++) UNROLL for (int j = 0; j < nt; j++) sc[r * BS + t + j] = hsum(acc[r][j]);
}

/* acc_r[c .. c + ng*VL) += sum_t p[r * BS + t] v_t[...] for rows [0, nr), tokens [0, n); v: V rows (dtype dt) */
static inline __attribute__((always_inline)) void pv_tile(
    float *acc, int64_t D, const void *v, int64_t vrs, const float *p, int64_t BS, int64_t n, int64_t c,
    const int nr, const int ng, const int dt) {
    vf a[RT][PV_G];
    UNROLL for (int r = 0; r < nr; r++) UNROLL for (int g = 0; g < ng; g++) a[r][g] = ldv(acc + r * D + c + g * VL);
    for (int64_t t = 0; t < n; t++) {
        vf vv[PV_G];
        UNROLL for (int g = 0; g < ng; g++) vv[g] = ldx(v, t * vrs + c + g * VL, dt);
        UNROLL for (int r = 0; r < nr; r++) {
            const vf pb = bcast(p[r * BS + t]);
            UNROLL for (int g = 0; g < ng; g++) a[r][g] += pb * vv[g];
        }
    }
    UNROLL for (int r = 0; r < nr; r++) UNROLL for (int g = 0; g < ng; g++) stv(acc + r * D + c + g * VL, a[r][g]);
}

/* One block of one KV head for query rows [0, nr) (nr <= RT): scores, online-softmax update, P.V.
   q/acc: the rows' scaled queries and accumulators [nr, D]; m/l: their running max and denominator; pos: their
   last visible positions; window: positions a row sees (it sees pos - window + 1 .. pos); t0: the block's first
   position; tb: tokens of the block that may be read; k/v: the block's rows of the head (dtype dt, float32 or
   bfloat16), krs/vrs elements apart. Tokens before every row's window start are never read. */
static inline __attribute__((always_inline)) void block_rows(
    const float *q, float *acc, float *m, float *l, const int64_t *pos, int64_t window, int64_t t0, int64_t tb,
    const void *k, int64_t krs, const void *v, int64_t vrs, int64_t D, float *sc, int64_t BS, const int nr,
    const int dt) {
    int64_t n = 0; /* tokens any row of the tile sees: [tmin, n) */
    int64_t lo[RT];
    for (int r = 0; r < nr; r++) {
        const int64_t nr_ = pos[r] - t0 + 1 < tb ? pos[r] - t0 + 1 : tb;
        n = nr_ > n ? nr_ : n;
    }
    if (n <= 0) return;
    int64_t tmin = n;
    for (int r = 0; r < nr; r++) {
        int64_t first = pos[r] - window + 1 - t0; /* the row's first visible token in this block */
        first = first < 0 ? 0 : first;
        lo[r] = pos[r] - t0 < 0 || first > n ? n : first;
        tmin = lo[r] < tmin ? lo[r] : tmin;
    }
    if (tmin >= n) return;
    int64_t t = tmin;
    for (; t + QK_T <= n; t += QK_T) qk_tile(q, D, k, krs, t, sc, BS, nr, QK_T, dt);
    for (; t < n; t++) qk_tile(q, D, k, krs, t, sc, BS, nr, 1, dt);
    for (int r = 0; r < nr; r++) {
        float *p = sc + r * BS;
        const int64_t seen = pos[r] - t0 + 1 < n ? pos[r] - t0 + 1 : n; /* tokens row r may see: [lo, seen) */
        for (int64_t j = tmin; j < lo[r]; j++) p[j] = 0.0f;
        float bm = -INFINITY;
        for (int64_t j = lo[r]; j < seen; j++) bm = p[j] > bm ? p[j] : bm;
        if (seen > lo[r] && bm > m[r]) {
            const float alpha = expf(m[r] - bm); /* 0 when m was -inf */
            l[r] *= alpha;
            for (int64_t d = 0; d < D; d++) acc[r * D + d] *= alpha;
            m[r] = bm;
        }
        float sum = 0.0f;
        int64_t j = lo[r];
        for (; j + VL <= seen; j += VL) {
            vf e = vexp(ldv(p + j) - m[r]);
            stv(p + j, e);
            sum += hsum(e);
        }
        for (; j < n; j++) {
            p[j] = j < seen ? expf(p[j] - m[r]) : 0.0f;
            sum += p[j];
        }
        l[r] += sum;
    }
    /* P.V over tokens [tmin, n) */
    const void *vt = dt == DT_BF16 ? (const void *)((const uint16_t *)v + tmin * vrs)
                                   : (const void *)((const float *)v + tmin * vrs);
    const float *pt = sc + tmin;
    int64_t c = 0;
    for (; c + PV_G * VL <= D; c += PV_G * VL) pv_tile(acc, D, vt, vrs, pt, BS, n - tmin, c, nr, PV_G, dt);
    for (; c < D; c += VL) pv_tile(acc, D, vt, vrs, pt, BS, n - tmin, c, nr, 1, dt);
}

/* Rows [0, R) of one KV head against one block, register-tiled (head_dim a multiple of VL): RT-row tiles, then
   single rows. Arguments as block_rows'; q/acc [R, D], m/l/pos [R]. */
static void head_block_tiled(const float *q, float *acc, float *m, float *l, const int64_t *pos, int64_t R,
                             int64_t window, int64_t t0, int64_t tb, const void *k, int64_t krs, const void *v,
                             int64_t vrs, int64_t D, float *sc, int64_t BS, int dt) {
    int64_t r = 0;
    if (dt == DT_BF16) {
        for (; r + RT <= R; r += RT)
            block_rows(q + r * D, acc + r * D, m + r, l + r, pos + r, window, t0, tb, k, krs, v, vrs, D, sc, BS,
                       RT, DT_BF16);
        for (; r < R; r++)
            block_rows(q + r * D, acc + r * D, m + r, l + r, pos + r, window, t0, tb, k, krs, v, vrs, D, sc, BS,
                       1, DT_BF16);
        return;
    }
    for (; r + RT <= R; r += RT)
        block_rows(q + r * D, acc + r * D, m + r, l + r, pos + r, window, t0, tb, k, krs, v, vrs, D, sc, BS, RT,
                   DT_F32);
    for (; r < R; r++)
        block_rows(q + r * D, acc + r * D, m + r, l + r, pos + r, window, t0, tb, k, krs, v, vrs, D, sc, BS, 1,
                   DT_F32);
}

/* The same for any head_dim, one row at a time with plain loops; k/v float32. */
static void head_block_plain(const float *q, float *acc, float *m, float *l, const int64_t *pos, int64_t R,
                             int64_t window, int64_t t0, int64_t tb, const float *kr, int64_t krs, const float *vr,
                             int64_t vrs, int64_t D, float *sc) {
    for (int64_t r = 0; r < R; r++) {
        if (pos[r] < t0) continue;
        const int64_t n = pos[r] - t0 + 1 < tb ? pos[r] - t0 + 1 : tb;
        const int64_t lo = pos[r] - window + 1 - t0 > 0 ? pos[r] - window + 1 - t0 : 0;
        if (lo >= n) continue;
        const float *qi = q + r * D;
        float *ai = acc + r * D;
        float bm = -INFINITY;
        for (int64_t t = lo; t < n; t++) {
            const float *k = kr + t * krs;
            float dot = 0.0f;
            #pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; d++) dot += qi[d] * k[d];
            sc[t] = dot;
            bm = dot > bm ? dot : bm;
        }
        if (bm > m[r]) {
            const float alpha = expf(m[r] - bm); /* 0 when m was -inf */
            l[r] *= alpha;
            #pragma omp simd
            for (int64_t d = 0; d < D; d++) ai[d] *= alpha;
            m[r] = bm;
        }
        float sum = 0.0f;
        for (int64_t t = lo; t < n; t++) {
            const float p = expf(sc[t] - m[r]);
            sum += p;
            const float *v = vr + t * vrs;
            #pragma omp simd
            for (int64_t d = 0; d < D; d++) ai[d] += p * v[d];
        }
        l[r] += sum;
    }
}

/* Per-thread scratch: queries and accumulators of an item's heads, statistics, a block's K/V as float32 (float16
   input, or bfloat16 with a head_dim the tiles do not cover) and one tile's scores. */
typedef struct { float *qf, *acc, *m, *l, *kbuf, *vbuf, *sc; } scratch;

static int scratch_alloc(scratch *w, int64_t heads, int64_t R, int64_t D, int64_t BS) {
    w->qf = malloc(sizeof(float) * heads * R * D);
    w->acc = malloc(sizeof(float) * heads * R * D);
    w->m = malloc(sizeof(float) * heads * R);
    w->l = malloc(sizeof(float) * heads * R);
    w->kbuf = malloc(sizeof(float) * BS * D);
    w->vbuf = malloc(sizeof(float) * BS * D);
    w->sc = malloc(sizeof(float) * RT * BS);
    return w->qf && w->acc && w->m && w->l && w->kbuf && w->vbuf && w->sc;
}

static void scratch_free(scratch *w) {
    free(w->qf); free(w->acc); free(w->m); free(w->l); free(w->kbuf); free(w->vbuf); free(w->sc);
}

/* One work item: sequence s, KV heads [h0, h1). Arguments as paged_rows'. */
static void run_item(const scratch *w, int64_t s, int64_t h0, int64_t h1, const void *q, int64_t q_s,
                     int64_t q_h, int64_t q_r, const char *kc, int64_t k_b, int64_t k_t, int64_t k_h,
                     const char *vc, int64_t v_b, int64_t v_t, int64_t v_h, const int64_t *table,
                     int64_t table_stride, const int64_t *pos, float *out, int64_t KV, int64_t R, int64_t D,
                     int64_t BS, float scale, int dtype, int64_t window) {
    const int64_t esize = dtype == DT_F32 ? 4 : 2;
    const int tiled = D % VL == 0, direct = dtype == DT_F32 || (dtype == DT_BF16 && tiled);
    int64_t maxpos = -1, minstart = INT64_MAX; /* blocks read: those of positions [minstart, maxpos] */
    for (int64_t r = 0; r < R; r++) {
        maxpos = pos[r] > maxpos ? pos[r] : maxpos;
        const int64_t start = pos[r] - window + 1 > 0 ? pos[r] - window + 1 : 0;
        if (pos[r] >= 0 && start < minstart) minstart = start;
    }
    for (int64_t i = 0; i < (h1 - h0) * R; i++) {
        const int64_t h = h0 + i / R, r = i % R;
        load_row(w->qf + i * D, (const char *)q + (s * q_s + h * q_h + r * q_r) * esize, D, dtype);
        for (int64_t d = 0; d < D; d++) { w->qf[i * D + d] *= scale; w->acc[i * D + d] = 0.0f; }
        w->m[i] = -INFINITY;
        w->l[i] = 0.0f;
    }
    const int64_t nblocks = maxpos < 0 ? 0 : maxpos / BS + 1;
    for (int64_t b = maxpos < 0 ? 0 : minstart / BS; b < nblocks; b++) {
        const int64_t bid = table[s * table_stride + b], t0 = b * BS;
        const int64_t tb = maxpos + 1 - t0 < BS ? maxpos + 1 - t0 : BS; /* tokens read in this block */
        if (PF_DIST > 0 && b + PF_DIST < nblocks) {
            /* the rows of block b + PF_DIST for the whole head range, in address order */
            const int64_t pb = table[s * table_stride + b + PF_DIST], pt0 = (b + PF_DIST) * BS;
            const int64_t ptb = maxpos + 1 - pt0 < BS ? maxpos + 1 - pt0 : BS;
            PREFETCH_ROWS(kc + (pb * k_b + h0 * k_h) * esize, k_t * esize, ptb, (h1 - 1 - h0) * k_h * esize + D * esize, 3);
            PREFETCH_ROWS(vc + (pb * v_b + h0 * v_h) * esize, v_t * esize, ptb, (h1 - 1 - h0) * v_h * esize + D * esize, 3);
        }
        for (int64_t h = h0; h < h1; h++) {
            const int64_t i = (h - h0) * R;
            const char *kb = kc + (bid * k_b + h * k_h) * esize, *vb = vc + (bid * v_b + h * v_h) * esize;
            const void *kr = kb, *vr = vb;
            int64_t krs = k_t, vrs = v_t; /* element row strides */
            if (PF_HEAD && h + 1 < h1) { /* the next head's rows of this block: from L2 into L1 */
                PREFETCH_ROWS(kb + k_h * esize, k_t * esize, tb, D * esize, 3);
                PREFETCH_ROWS(vb + v_h * esize, v_t * esize, tb, D * esize, 3);
            }
            if (!direct) { /* float16, or bfloat16 on the plain path: convert the block's rows to float32 */
                for (int64_t t = 0; t < tb; t++) {
                    load_row(w->kbuf + t * D, kb + t * k_t * esize, D, dtype);
                    load_row(w->vbuf + t * D, vb + t * v_t * esize, D, dtype);
                }
                kr = w->kbuf, vr = w->vbuf, krs = D, vrs = D;
            }
            if (tiled)
                head_block_tiled(w->qf + i * D, w->acc + i * D, w->m + i, w->l + i, pos, R, window, t0, tb, kr,
                                 krs, vr, vrs, D, w->sc, BS, direct ? dtype : DT_F32);
            else
                head_block_plain(w->qf + i * D, w->acc + i * D, w->m + i, w->l + i, pos, R, window, t0, tb, kr,
                                 krs, vr, vrs, D, w->sc);
        }
    }
    for (int64_t i = 0; i < (h1 - h0) * R; i++) {
        float *o = out + ((s * KV + h0) * R + i) * D;
        const float inv = w->l[i] > 0.0f ? 1.0f / w->l[i] : 0.0f;
        for (int64_t d = 0; d < D; d++) o[d] = w->l[i] > 0.0f ? w->acc[i * D + d] * inv : 0.0f;
    }
}

/* rows [S, KV, R, D] (element strides q_s, q_h, q_r; stride 1 in D) attend to positions
   max(0, row_pos[s, r] - window + 1) .. row_pos[s, r] of sequence s (-1: none, output 0; window >= 1, a huge
   value for full attention). K/V caches [num_blocks, BS, KV, D] with element strides (k_b, k_t, k_h),
   (v_b, v_t, v_h). table [S, table_stride] int64. out [S, KV, R, D] float32 contiguous.
   Work items (sequence, range of KV heads) are shared dynamically over nthreads OpenMP threads.
   Returns 0, or -1 when scratch memory could not be allocated. */
int paged_rows(const void *q, int64_t q_s, int64_t q_h, int64_t q_r,
               const void *kc, int64_t k_b, int64_t k_t, int64_t k_h,
               const void *vc, int64_t v_b, int64_t v_t, int64_t v_h,
               const int64_t *table, int64_t table_stride, const int64_t *row_pos, float *out,
               int64_t S, int64_t KV, int64_t R, int64_t D, int64_t BS, float scale, int dtype,
               int nthreads, int64_t head_split, int64_t window) {
    const int64_t items = S * head_split;
    const int64_t heads_per_item = (KV + head_split - 1) / head_split;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        scratch w;
        const int ok = scratch_alloc(&w, heads_per_item, R, D, BS);
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; item++) {
            if (!ok) continue;
            const int64_t s = item / head_split, part = item % head_split;
            run_item(&w, s, part * KV / head_split, (part + 1) * KV / head_split, q, q_s, q_h, q_r,
                     (const char *)kc, k_b, k_t, k_h, (const char *)vc, v_b, v_t, v_h, table, table_stride,
                     row_pos + s * R, out, KV, R, D, BS, scale, dtype, window);
        }
        scratch_free(&w);
    }
    return failed ? -1 : 0;
}

/* What this build targets: the ISA name ("avx512", "avx2", "neon", "generic"), and in tiles[0..4) the floats per
   vector register, query rows per tile, tokens per q.K tile and vectors per P.V tile. */
const char *paged_rows_isa(int64_t *tiles) {
    tiles[0] = VL, tiles[1] = RT, tiles[2] = QK_T, tiles[3] = PV_G;
    return ISA_NAME;
}
