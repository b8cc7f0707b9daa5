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

static inline void prefetch_rows(const char *base, int64_t row_stride_bytes, int rows, int64_t row_bytes) {
    for (int t = 0; t < rows; t++)
        for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(base + t * row_stride_bytes + o, 0, 3);
}

/* ---- register-tiled path for head_dim a multiple of 16 floats (GCC/clang vector extensions: AVX-512 zmm
   registers with -march=native on x86-64 where available, pairs of ymm/xmm elsewhere) ---- */
#define VL 16
typedef float vf __attribute__((vector_size(VL * 4)));
#define TT 4  /* tokens per QK tile */
#define RT 4  /* query rows per tile */
#define CG 4  /* 16-float chunks per PV tile */
#if defined(__clang__)
#define UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define UNROLL _Pragma("GCC unroll 16")
#else
#define UNROLL
#endif

static inline vf ldv(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void stv(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf bcast(float x) { return (vf){0} + x; }

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
static inline float hsum(vf v) {
    vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}
#else
static inline float hsum(vf v) { float s = 0.0f; for (int i = 0; i < VL; i++) s += v[i]; return s; }
#endif

typedef int32_t vi __attribute__((vector_size(VL * 4)));

/* e^x for x <= 0 (x = score - running max), 16 lanes: 2^n e^r with n = round(x log2 e), |r| <= ln2 / 2, Cephes'
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

/* sc[r * BS + t] = q_r . k_t for rows [0, nr) x tokens [t0, t0 + nt), nr <= RT, nt <= TT (constants when inlined) */
static inline __attribute__((always_inline)) void qk_tile(
    const float *q, int64_t D, const float *k, int64_t krs, int64_t t, float *sc, int64_t BS,
    const int nr, const int nt) {
    vf acc[RT][TT];
    UNROLL for (int r = 0; r < nr; r++) UNROLL for (int j = 0; j < nt; j++) acc[r][j] = (vf){0};
    for (int64_t c = 0; c < D; c += VL) {
        vf kv[TT];
        UNROLL for (int j = 0; j < nt; j++) kv[j] = ldv(k + (t + j) * krs + c);
        UNROLL for (int r = 0; r < nr; r++) {
            const vf qv = ldv(q + r * D + c);
            UNROLL for (int j = 0; j < nt; j++) acc[r][j] += qv * kv[j];
        }
    }
    UNROLL for (int r = 0; r < nr; r++) UNROLL for (int j = 0; j < nt; j++) sc[r * BS + t + j] = hsum(acc[r][j]);
}

/* acc_r[c .. c + ng*VL) += sum_t p[r * BS + t] v_t[...] for rows [0, nr), tokens [0, n) */
static inline __attribute__((always_inline)) void pv_tile(
    float *acc, int64_t D, const float *v, int64_t vrs, const float *p, int64_t BS, int64_t n, int64_t c,
    const int nr, const int ng) {
    vf a[RT][CG];
    UNROLL for (int r = 0; r < nr; r++) UNROLL for (int g = 0; g < ng; g++) a[r][g] = ldv(acc + r * D + c + g * VL);
    for (int64_t t = 0; t < n; t++) {
        vf vv[CG];
        UNROLL for (int g = 0; g < ng; g++) vv[g] = ldv(v + t * vrs + c + g * VL);
        UNROLL for (int r = 0; r < nr; r++) {
            const vf pb = bcast(p[r * BS + t]);
            UNROLL for (int g = 0; g < ng; g++) a[r][g] += pb * vv[g];
        }
    }
    UNROLL for (int r = 0; r < nr; r++) UNROLL for (int g = 0; g < ng; g++) stv(acc + r * D + c + g * VL, a[r][g]);
}

/* One block of one KV head for query rows [0, nr) (nr <= RT): scores, online-softmax update, P.V.
   q/acc: the rows' scaled queries and accumulators [nr, D]; m/l: their running max and denominator; pos: their
   last visible positions; t0: the block's first position; tb: tokens of the block that may be read. */
static inline __attribute__((always_inline)) void block_rows(
    const float *q, float *acc, float *m, float *l, const int64_t *pos, int64_t t0, int64_t tb,
    const float *k, int64_t krs, const float *v, int64_t vrs, int64_t D, float *sc, int64_t BS, const int nr) {
    int64_t n = 0; /* tokens any row of the tile sees */
    for (int r = 0; r < nr; r++) {
        const int64_t nr_ = pos[r] - t0 + 1 < tb ? pos[r] - t0 + 1 : tb;
        n = nr_ > n ? nr_ : n;
    }
    if (n <= 0) return;
    int64_t t = 0;
    for (; t + TT <= n; t += TT) qk_tile(q, D, k, krs, t, sc, BS, nr, TT);
    for (; t < n; t++) qk_tile(q, D, k, krs, t, sc, BS, nr, 1);
    for (int r = 0; r < nr; r++) {
        float *p = sc + r * BS;
        const int64_t seen = pos[r] - t0 + 1 < n ? pos[r] - t0 + 1 : n; /* tokens row r may see */
        float bm = -INFINITY;
        for (int64_t j = 0; j < seen; j++) bm = p[j] > bm ? p[j] : bm;
        if (seen > 0 && bm > m[r]) {
            const float alpha = expf(m[r] - bm); /* 0 when m was -inf */
            l[r] *= alpha;
            for (int64_t d = 0; d < D; d++) acc[r * D + d] *= alpha;
            m[r] = bm;
        }
        float sum = 0.0f;
        int64_t j = 0;
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
    int64_t c = 0;
    for (; c + CG * VL <= D; c += CG * VL) pv_tile(acc, D, v, vrs, sc, BS, n, c, nr, CG);
    for (; c < D; c += VL) pv_tile(acc, D, v, vrs, sc, BS, n, c, nr, 1);
}

/* rows [S, KV, R, D] (element strides q_s, q_h, q_r; stride 1 in D) attend to positions 0..row_pos[s, r] of
   sequence s (-1: none, output 0). K/V caches [num_blocks, BS, KV, D] with element strides (k_b, k_t, k_h),
   (v_b, v_t, v_h). table [S, table_stride] int64. out [S, KV, R, D] float32 contiguous.
   Returns 0, or -1 when scratch memory could not be allocated. */
int paged_rows(const void *q, int64_t q_s, int64_t q_h, int64_t q_r,
               const void *kc, int64_t k_b, int64_t k_t, int64_t k_h,
               const void *vc, int64_t v_b, int64_t v_t, int64_t v_h,
               const int64_t *table, int64_t table_stride, const int64_t *row_pos, float *out,
               int64_t S, int64_t KV, int64_t R, int64_t D, int64_t BS, float scale, int dtype,
               int nthreads, int64_t head_split) {
    const int64_t esize = dtype == DT_F32 ? 4 : 2;
    const int64_t items = S * head_split;
    const int64_t heads_per_item = (KV + head_split - 1) / head_split;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        float *qf = malloc(sizeof(float) * heads_per_item * R * D);
        float *acc = malloc(sizeof(float) * heads_per_item * R * D);
        float *m = malloc(sizeof(float) * heads_per_item * R);
        float *l = malloc(sizeof(float) * heads_per_item * R);
        float *kbuf = malloc(sizeof(float) * BS * D);
        float *vbuf = malloc(sizeof(float) * BS * D);
        float *sc = malloc(sizeof(float) * RT * BS);
        int ok = qf && acc && m && l && kbuf && vbuf && sc;
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; item++) {
            if (!ok) continue;
            const int64_t s = item / head_split, part = item % head_split;
            const int64_t h0 = part * KV / head_split, h1 = (part + 1) * KV / head_split;
            const int64_t *pos = row_pos + s * R;
            int64_t maxpos = -1;
            for (int64_t r = 0; r < R; r++) maxpos = pos[r] > maxpos ? pos[r] : maxpos;
            for (int64_t h = h0; h < h1; h++) {
                for (int64_t r = 0; r < R; r++) {
                    const int64_t i = (h - h0) * R + r;
                    const char *src = (const char *)q + (s * q_s + h * q_h + r * q_r) * esize;
                    load_row(qf + i * D, src, D, dtype);
                    for (int64_t d = 0; d < D; d++) { qf[i * D + d] *= scale; acc[i * D + d] = 0.0f; }
                    m[i] = -INFINITY;
                    l[i] = 0.0f;
                }
            }
            const int64_t nblocks = maxpos < 0 ? 0 : maxpos / BS + 1;
            for (int64_t b = 0; b < nblocks; b++) {
                const int64_t bid = table[s * table_stride + b];
                const int64_t t0 = b * BS;
                const int64_t tb = maxpos + 1 - t0 < BS ? maxpos + 1 - t0 : BS; /* tokens read in this block */
                if (b + PF_DIST < nblocks) {
                    /* the rows of block b + PF_DIST for the whole head range, in address order */
                    const int64_t pb = table[s * table_stride + b + PF_DIST], pt0 = (b + PF_DIST) * BS;
                    const int64_t ptb = maxpos + 1 - pt0 < BS ? maxpos + 1 - pt0 : BS;
                    prefetch_rows((const char *)kc + (pb * k_b + h0 * k_h) * esize, k_t * esize, (int)ptb,
                                  (h1 - 1 - h0) * k_h * esize + D * esize);
                    prefetch_rows((const char *)vc + (pb * v_b + h0 * v_h) * esize, v_t * esize, (int)ptb,
                                  (h1 - 1 - h0) * v_h * esize + D * esize);
                }
                for (int64_t h = h0; h < h1; h++) {
                    const char *kb = (const char *)kc + (bid * k_b + h * k_h) * esize;
                    const char *vb = (const char *)vc + (bid * v_b + h * v_h) * esize;
                    const float *kr = (const float *)kb, *vr = (const float *)vb;
                    int64_t krs = k_t, vrs = v_t; /* float row strides */
                    if (dtype != DT_F32) {
                        for (int64_t t = 0; t < tb; t++) {
                            load_row(kbuf + t * D, kb + t * k_t * esize, D, dtype);
                            load_row(vbuf + t * D, vb + t * v_t * esize, D, dtype);
                        }
                        kr = kbuf, vr = vbuf, krs = D, vrs = D;
                    }
                    if (D % VL == 0) {
                        const int64_t base = (h - h0) * R;
                        int64_t r = 0;
                        for (; r + RT <= R; r += RT)
                            block_rows(qf + (base + r) * D, acc + (base + r) * D, m + base + r, l + base + r,
                                       pos + r, t0, tb, kr, krs, vr, vrs, D, sc, BS, RT);
                        for (; r < R; r++)
                            block_rows(qf + (base + r) * D, acc + (base + r) * D, m + base + r, l + base + r,
                                       pos + r, t0, tb, kr, krs, vr, vrs, D, sc, BS, 1);
                        continue;
                    }
                    for (int64_t r = 0; r < R; r++) {
                        if (pos[r] < t0) continue;
                        const int64_t n = pos[r] - t0 + 1 < tb ? pos[r] - t0 + 1 : tb;
                        const int64_t i = (h - h0) * R + r;
                        const float *qi = qf + i * D;
                        float *ai = acc + i * D;
                        float bm = -INFINITY;
                        for (int64_t t = 0; t < n; t++) {
                            const float *k = kr + t * krs;
                            float dot = 0.0f;
                            #pragma omp simd reduction(+ : dot)
                            for (int64_t d = 0; d < D; d++) dot += qi[d] * k[d];
                            sc[t] = dot;
                            bm = dot > bm ? dot : bm;
                        }
                        if (bm > m[i]) {
                            const float alpha = expf(m[i] - bm); /* 0 when m was -inf */
                            l[i] *= alpha;
                            #pragma omp simd
                            for (int64_t d = 0; d < D; d++) ai[d] *= alpha;
                            m[i] = bm;
                        }
                        float sum = 0.0f;
                        for (int64_t t = 0; t < n; t++) {
                            const float p = expf(sc[t] - m[i]);
                            sum += p;
                            const float *v = vr + t * vrs;
                            #pragma omp simd
                            for (int64_t d = 0; d < D; d++) ai[d] += p * v[d];
                        }
                        l[i] += sum;
                    }
                }
            }
            for (int64_t h = h0; h < h1; h++) {
                for (int64_t r = 0; r < R; r++) {
                    const int64_t i = (h - h0) * R + r;
                    float *o = out + ((s * KV + h) * R + r) * D;
                    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
                    for (int64_t d = 0; d < D; d++) o[d] = l[i] > 0.0f ? acc[i * D + d] * inv : 0.0f;
                }
            }
        }
        free(qf); free(acc); free(m); free(l); free(kbuf); free(vbuf); free(sc);
    }
    return failed ? -1 : 0;
}
