/* The "cpu" backend's kernel: see core/kernels/cpu_backend.py for what it computes and how it is built. */
#include <stdlib.h>
#include <string.h>

#include "paged_rows_simd.h"

/* ---- prefetching: block ids are random, so no hardware prefetcher can guess where the next block is ----
   While one (block, KV head) is computed, the K and V rows of the one PF_AHEAD steps later in the item's order
   (heads of a block, then the next block) are prefetched a few cache lines at a time, between its q.K tiles and
   P.V passes. Issuing them all at once (a whole block's rows, 2,048 lines in float32) stalled the core on the
   full miss queue, so fetch and compute did not overlap: 12.5 ms vs 9.9 ms for AVX2 (docs/kernels-isa.md). */
#ifndef PF_AHEAD
#define PF_AHEAD 4
#endif
typedef struct {
    const char *k, *v;      /* the rows to prefetch: K and V of one (block, head) */
    int64_t kst, vst;       /* their row strides in bytes */
    int64_t lines, total;   /* cache lines per row; lines in all (K then V) */
    int64_t next, per_step; /* the next line to issue; lines issued per step */
} prefetcher;

static inline void pf_step(prefetcher *p, int64_t n) {
    for (; n > 0 && p->next < p->total; n--, p->next++) {
        const int64_t half = p->total / 2, i = p->next < half ? p->next : p->next - half;
        const char *row = p->next < half ? p->k + i / p->lines * p->kst : p->v + i / p->lines * p->vst;
        __builtin_prefetch(row + i % p->lines * 64, 0, 3);
    }
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
    const int dt, prefetcher *pf) {
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
    for (; t + QK_T <= n; t += QK_T) qk_tile(q, D, k, krs, t, sc, BS, nr, QK_T, dt), pf_step(pf, pf->per_step);
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
    for (; c + PV_G * VL <= D; c += PV_G * VL)
        pv_tile(acc, D, vt, vrs, pt, BS, n - tmin, c, nr, PV_G, dt), pf_step(pf, pf->per_step);
    for (; c < D; c += VL) pv_tile(acc, D, vt, vrs, pt, BS, n - tmin, c, nr, 1, dt);
}

/* Rows [0, R) of one KV head against one block, register-tiled (head_dim a multiple of VL): RT-row tiles, then
   single rows. Arguments as block_rows'; q/acc [R, D], m/l/pos [R]. */
static void head_block_tiled(const float *q, float *acc, float *m, float *l, const int64_t *pos, int64_t R,
                             int64_t window, int64_t t0, int64_t tb, const void *k, int64_t krs, const void *v,
                             int64_t vrs, int64_t D, float *sc, int64_t BS, int dt, prefetcher *pf) {
    int64_t r = 0;
    if (dt == DT_BF16) {
        for (; r + RT <= R; r += RT)
            block_rows(q + r * D, acc + r * D, m + r, l + r, pos + r, window, t0, tb, k, krs, v, vrs, D, sc, BS,
                       RT, DT_BF16, pf);
        for (; r < R; r++)
            block_rows(q + r * D, acc + r * D, m + r, l + r, pos + r, window, t0, tb, k, krs, v, vrs, D, sc, BS,
                       1, DT_BF16, pf);
        return;
    }
    for (; r + RT <= R; r += RT)
        block_rows(q + r * D, acc + r * D, m + r, l + r, pos + r, window, t0, tb, k, krs, v, vrs, D, sc, BS, RT,
                   DT_F32, pf);
    for (; r < R; r++)
        block_rows(q + r * D, acc + r * D, m + r, l + r, pos + r, window, t0, tb, k, krs, v, vrs, D, sc, BS, 1,
                   DT_F32, pf);
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

/* The K/V caches: base pointers, element strides (block, token, head), element size, head_dim, block size. */
typedef struct {
    const char *k, *v;
    int64_t k_b, k_t, k_h, v_b, v_t, v_h, esize, D, BS;
} caches;

/* Aim pf at the K/V rows of block b, head h (tb tokens), to be issued over `steps` calls of pf_step. */
static void pf_aim(prefetcher *pf, const caches *c, int64_t bid, int64_t h, int64_t tb, int64_t steps) {
    pf_step(pf, pf->total); /* whatever the last target left */
    pf->k = c->k + (bid * c->k_b + h * c->k_h) * c->esize, pf->v = c->v + (bid * c->v_b + h * c->v_h) * c->esize;
    pf->kst = c->k_t * c->esize, pf->vst = c->v_t * c->esize;
    pf->lines = (c->D * c->esize + 63) / 64, pf->total = 2 * tb * pf->lines, pf->next = 0;
    pf->per_step = steps > 0 ? (pf->total + steps - 1) / steps : pf->total;
}

/* One work item: sequence s, KV heads [h0, h1); q/out/table/pos/window/scale/dtype as paged_rows' (table and pos
   already at sequence s). */
static void run_item(const scratch *w, int64_t s, int64_t h0, int64_t h1, const void *q, int64_t q_s,
                     int64_t q_h, int64_t q_r, const caches *c, const int64_t *table, const int64_t *pos,
                     float *out, int64_t KV, int64_t R, float scale, int dtype, int64_t window) {
    const int64_t D = c->D, BS = c->BS, esize = c->esize, nh = h1 - h0;
    const int tiled = D % VL == 0, direct = dtype == DT_F32 || (dtype == DT_BF16 && tiled);
    int64_t maxpos = -1, minstart = INT64_MAX; /* blocks read: those of positions [minstart, maxpos] */
    for (int64_t r = 0; r < R; r++) {
        maxpos = pos[r] > maxpos ? pos[r] : maxpos;
        const int64_t start = pos[r] - window + 1 > 0 ? pos[r] - window + 1 : 0;
        if (pos[r] >= 0 && start < minstart) minstart = start;
    }
    for (int64_t i = 0; i < nh * R; i++) {
        const int64_t h = h0 + i / R, r = i % R;
        load_row(w->qf + i * D, (const char *)q + (s * q_s + h * q_h + r * q_r) * esize, D, dtype);
        for (int64_t d = 0; d < D; d++) { w->qf[i * D + d] *= scale; w->acc[i * D + d] = 0.0f; }
        w->m[i] = -INFINITY;
        w->l[i] = 0.0f;
    }
    const int64_t b0 = maxpos < 0 ? 0 : minstart / BS, nblocks = maxpos < 0 ? 0 : maxpos / BS + 1;
    prefetcher pf = {0};
    for (int64_t b = b0; b < nblocks; b++) {
        const int64_t bid = table[b], t0 = b * BS;
        const int64_t tb = maxpos + 1 - t0 < BS ? maxpos + 1 - t0 : BS; /* tokens read in this block */
        for (int64_t h = h0; h < h1; h++) {
            const int64_t i = (h - h0) * R, ahead = (b - b0) * nh + (h - h0) + PF_AHEAD, fb = b0 + ahead / nh;
            if (fb < nblocks) {
                const int64_t ftb = maxpos + 1 - fb * BS < BS ? maxpos + 1 - fb * BS : BS;
                pf_aim(&pf, c, table[fb], h0 + ahead % nh, ftb, tiled && direct ? tb / QK_T + D / (PV_G * VL) : 0);
            }
            const char *kb = c->k + (bid * c->k_b + h * c->k_h) * esize, *vb = c->v + (bid * c->v_b + h * c->v_h) * esize;
            const void *kr = kb, *vr = vb;
            int64_t krs = c->k_t, vrs = c->v_t; /* element row strides */
            if (!direct) { /* float16, or bfloat16 on the plain path: convert the block's rows to float32 */
                for (int64_t t = 0; t < tb; t++) {
                    load_row(w->kbuf + t * D, kb + t * c->k_t * esize, D, dtype);
                    load_row(w->vbuf + t * D, vb + t * c->v_t * esize, D, dtype);
                }
                kr = w->kbuf, vr = w->vbuf, krs = D, vrs = D;
            }
            if (tiled)
                head_block_tiled(w->qf + i * D, w->acc + i * D, w->m + i, w->l + i, pos, R, window, t0, tb, kr,
                                 krs, vr, vrs, D, w->sc, BS, direct ? dtype : DT_F32, &pf);
            else
                head_block_plain(w->qf + i * D, w->acc + i * D, w->m + i, w->l + i, pos, R, window, t0, tb, kr,
                                 krs, vr, vrs, D, w->sc);
        }
    }
    for (int64_t i = 0; i < nh * R; i++) {
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
    const caches c = {kc, vc, k_b, k_t, k_h, v_b, v_t, v_h, dtype == DT_F32 ? 4 : 2, D, BS};
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
            run_item(&w, s, part * KV / head_split, (part + 1) * KV / head_split, q, q_s, q_h, q_r, &c,
                     table + s * table_stride, row_pos + s * R, out, KV, R, scale, dtype, window);
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
