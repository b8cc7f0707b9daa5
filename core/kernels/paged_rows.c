/* The "cpu" backend's kernel: see core/kernels/cpu_backend.py for what it computes and how it is built. */
#include <stdlib.h>
#include <string.h>

#include "paged_rows_simd.h"

/* ---- prefetching: block ids are random, so no hardware prefetcher can guess where the next block is ----
   While one block is computed, the K and V rows of the item's heads in the block PF_BLOCKS further on in its table
   are prefetched a few rows at a time, in memory order (token by token, the item's heads of a token side by side),
   between the q.K tiles and P.V passes. Issuing a whole block's lines at once stalled the core on the full miss
   queue, so fetch and compute did not overlap (docs/kernels-isa.md). The lines go to L2 (locality 2: prefetcht1 on
   x86): prefetched into L1 (prefetcht0) they held the L1's few miss buffers, and the fp32 kernel ran ~1.5x slower
   on one core (33 ms against 21 ms, docs/kernels-isa.md). PF_LOCALITY / PF_BLOCKS may be overridden with -D. */
#ifndef PF_LOCALITY
#define PF_LOCALITY 2
#endif
#ifndef PF_BLOCKS
#define PF_BLOCKS 1
#endif
typedef struct {
    const char *k, *v;          /* the block's K and V rows of its first head (token 0) */
    int64_t kst, vst, khs, vhs; /* token and head strides of K and V in bytes */
    int64_t lines, nh, rows;    /* cache lines per row, heads per token, rows in all (K then V: 2 * tokens * nh) */
    int64_t next, per_step;     /* the next row to issue; rows issued per step */
    int64_t t, h;               /* the next row's token and head (within K or V) */
} prefetcher;

static inline void pf_step(prefetcher *p, int64_t n) {
    const int64_t half = p->rows / 2;
    for (; n > 0 && p->next < p->rows; n--, p->next++) {
        if (p->next == half) p->t = 0, p->h = 0;
        const char *row = p->next < half ? p->k + p->t * p->kst + p->h * p->khs : p->v + p->t * p->vst + p->h * p->vhs;
        for (int64_t i = 0; i < p->lines; i++) __builtin_prefetch(row + i * 64, 0, PF_LOCALITY);
        if (++p->h == p->nh) p->h = 0, p->t++;
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

/* Element i of a float32 or bfloat16 array. */
static inline const void *elem(const void *base, int64_t i, int dt) {
    return dt == DT_BF16 ? (const void *)((const uint16_t *)base + i) : (const void *)((const float *)base + i);
}

/* Tokens of a block that each row sees: row r sees [lo[r], hi[r]) of the block's tb tokens (none when lo >= hi;
   pos: the rows' last visible positions, window: positions a row sees, t0: the block's first position). Returns n,
   the end of their union [*tmin, n) (0 when no row sees any token of the block). */
static int64_t block_span(const int64_t *pos, int64_t R, int64_t window, int64_t t0, int64_t tb, int64_t *lo,
                          int64_t *hi, int64_t *tmin) {
    int64_t n = 0, first = tb;
    for (int64_t r = 0; r < R; r++) {
        const int64_t start = pos[r] - window + 1 - t0;
        hi[r] = pos[r] - t0 + 1 < tb ? pos[r] - t0 + 1 : tb;
        lo[r] = start > 0 ? start : 0;
        if (lo[r] < hi[r]) {
            n = hi[r] > n ? hi[r] : n;
            first = lo[r] < first ? lo[r] : first;
        }
    }
    *tmin = first;
    return n;
}

/* One block for the rows [0, R) of nh KV heads (head_dim a multiple of VL), in the order the block lies in memory:
   q.K for QK_T tokens of every head, then the next QK_T tokens; the online-softmax update of every row; P.V over
   PV_T tokens of every head, then the next PV_T. q/acc: the rows' scaled queries and accumulators [nh, R, D];
   m/l: running max and denominator [nh, R]; lo/hi/tmin/n: block_span's; k/v: the block's rows of the first head
   (dtype dt, float32 or bfloat16), khs/vhs elements from one head to the next, krs/vrs from one token to the next;
   sc: scores [nh, R, BS]. Tokens outside [tmin, n) are never read. */
static inline __attribute__((always_inline)) void block_heads(
    const float *q, float *acc, float *m, float *l, int64_t R, int64_t nh, const int64_t *lo, const int64_t *hi,
    int64_t tmin, int64_t n, const void *k, int64_t khs, int64_t krs, const void *v, int64_t vhs, int64_t vrs,
    int64_t D, float *sc, int64_t BS, const int dt, prefetcher *pf) {
    int64_t t = tmin;
    for (; t + QK_T <= n; t += QK_T) {
        for (int64_t h = 0; h < nh; h++) {
            const void *kh = elem(k, h * khs, dt);
            const float *qh = q + h * R * D;
            float *sh = sc + h * R * BS;
            int64_t r = 0;
            for (; r + RT <= R; r += RT) qk_tile(qh + r * D, D, kh, krs, t, sh + r * BS, BS, RT, QK_T, dt);
            for (; r < R; r++) qk_tile(qh + r * D, D, kh, krs, t, sh + r * BS, BS, 1, QK_T, dt);
            pf_step(pf, pf->per_step);
        }
    }
    for (; t < n; t++) {
        for (int64_t h = 0; h < nh; h++) {
            const void *kh = elem(k, h * khs, dt);
            int64_t r = 0;
            for (; r + RT <= R; r += RT)
                qk_tile(q + (h * R + r) * D, D, kh, krs, t, sc + (h * R + r) * BS, BS, RT, 1, dt);
            for (; r < R; r++) qk_tile(q + (h * R + r) * D, D, kh, krs, t, sc + (h * R + r) * BS, BS, 1, 1, dt);
        }
    }
    for (int64_t i = 0; i < nh * R; i++) {
        const int64_t r = i % R, sees = lo[r] < hi[r], a = sees ? lo[r] : n, e = sees ? hi[r] : n;
        float *p = sc + i * BS;
        for (int64_t j = tmin; j < a; j++) p[j] = 0.0f;
        if (!sees) continue;
        float bm = -INFINITY;
        for (int64_t j = a; j < e; j++) bm = p[j] > bm ? p[j] : bm;
        if (bm > m[i]) {
            const float alpha = expf(m[i] - bm); /* 0 when m was -inf */
            l[i] *= alpha;
            for (int64_t d = 0; d < D; d++) acc[i * D + d] *= alpha;
            m[i] = bm;
        }
        float sum = 0.0f;
        int64_t j = a;
        for (; j + VL <= e; j += VL) {
            vf x = vexp(ldv(p + j) - m[i]);
            stv(p + j, x);
            sum += hsum(x);
        }
        for (; j < n; j++) {
            p[j] = j < e ? expf(p[j] - m[i]) : 0.0f;
            sum += p[j];
        }
        l[i] += sum;
    }
    for (t = tmin; t < n; t += PV_T) {
        const int64_t nt = n - t < PV_T ? n - t : PV_T;
        for (int64_t h = 0; h < nh; h++) {
            const void *vt = elem(v, h * vhs + t * vrs, dt);
            for (int64_t r = 0; r < R;) {
                const int64_t i = h * R + r;
                const float *pt = sc + i * BS + t;
                int64_t c = 0;
                if (r + RT <= R) {
                    for (; c + PV_G * VL <= D; c += PV_G * VL) pv_tile(acc + i * D, D, vt, vrs, pt, BS, nt, c, RT, PV_G, dt);
                    for (; c < D; c += VL) pv_tile(acc + i * D, D, vt, vrs, pt, BS, nt, c, RT, 1, dt);
                    r += RT;
                } else {
                    for (; c + PV_G * VL <= D; c += PV_G * VL) pv_tile(acc + i * D, D, vt, vrs, pt, BS, nt, c, 1, PV_G, dt);
                    for (; c < D; c += VL) pv_tile(acc + i * D, D, vt, vrs, pt, BS, nt, c, 1, 1, dt);
                    r += 1;
                }
            }
            pf_step(pf, pf->per_step);
        }
    }
}

/* block_heads for float32 or bfloat16 K/V (dt a constant in each copy, so the tiles' loads are). */
static void block_heads_f32(const float *q, float *acc, float *m, float *l, int64_t R, int64_t nh, const int64_t *lo,
                            const int64_t *hi, int64_t tmin, int64_t n, const void *k, int64_t khs, int64_t krs,
                            const void *v, int64_t vhs, int64_t vrs, int64_t D, float *sc, int64_t BS, prefetcher *pf) {
    block_heads(q, acc, m, l, R, nh, lo, hi, tmin, n, k, khs, krs, v, vhs, vrs, D, sc, BS, DT_F32, pf);
}
static void block_heads_bf16(const float *q, float *acc, float *m, float *l, int64_t R, int64_t nh,
                             const int64_t *lo, const int64_t *hi, int64_t tmin, int64_t n, const void *k, int64_t khs,
                             int64_t krs, const void *v, int64_t vhs, int64_t vrs, int64_t D, float *sc, int64_t BS,
                             prefetcher *pf) {
    block_heads(q, acc, m, l, R, nh, lo, hi, tmin, n, k, khs, krs, v, vhs, vrs, D, sc, BS, DT_BF16, pf);
}

/* Rows [0, R) of one KV head against one block, for any head_dim: one row at a time with plain loops. q/acc [R, D],
   m/l/pos [R]; window, t0: as block_span's; tb: tokens of the block that may be read; kr/vr: the head's float32 K/V
   rows of the block, krs/vrs elements apart; sc: scores [BS]. */
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

/* Per-thread scratch: queries and accumulators of an item's heads, statistics, a block's K/V of the item's heads as
   float32 (float16 input, or bfloat16 with a head_dim the tiles do not cover), the block's scores and the rows'
   visible spans in a block. */
typedef struct { float *qf, *acc, *m, *l, *kbuf, *vbuf, *sc; int64_t *lo, *hi; } scratch;

static int scratch_alloc(scratch *w, int64_t heads, int64_t R, int64_t D, int64_t BS) {
    w->qf = malloc(sizeof(float) * heads * R * D);
    w->acc = malloc(sizeof(float) * heads * R * D);
    w->m = malloc(sizeof(float) * heads * R);
    w->l = malloc(sizeof(float) * heads * R);
    w->kbuf = malloc(sizeof(float) * BS * heads * D);
    w->vbuf = malloc(sizeof(float) * BS * heads * D);
    w->sc = malloc(sizeof(float) * heads * R * BS);
    w->lo = malloc(sizeof(int64_t) * R);
    w->hi = malloc(sizeof(int64_t) * R);
    return w->qf && w->acc && w->m && w->l && w->kbuf && w->vbuf && w->sc && w->lo && w->hi;
}

static void scratch_free(scratch *w) {
    free(w->qf); free(w->acc); free(w->m); free(w->l); free(w->kbuf); free(w->vbuf); free(w->sc);
    free(w->lo); free(w->hi);
}

/* The K/V caches: base pointers, element strides (block, token, head), element size, head_dim, block size. */
typedef struct {
    const char *k, *v;
    int64_t k_b, k_t, k_h, v_b, v_t, v_h, esize, D, BS;
} caches;

/* Aim pf at the K/V rows of block bid, heads [h, h + nh), tokens [0, tb), to be issued over `steps` calls of
   pf_step (all at once when steps is 0). */
static void pf_aim(prefetcher *pf, const caches *c, int64_t bid, int64_t h, int64_t nh, int64_t tb, int64_t steps) {
    pf_step(pf, pf->rows); /* whatever the last target left */
    pf->k = c->k + (bid * c->k_b + h * c->k_h) * c->esize, pf->v = c->v + (bid * c->v_b + h * c->v_h) * c->esize;
    pf->kst = c->k_t * c->esize, pf->vst = c->v_t * c->esize, pf->khs = c->k_h * c->esize, pf->vhs = c->v_h * c->esize;
    pf->lines = (c->D * c->esize + 63) / 64, pf->nh = nh, pf->rows = 2 * tb * nh;
    pf->next = 0, pf->t = 0, pf->h = 0;
    pf->per_step = steps > 0 ? (pf->rows + steps - 1) / steps : pf->rows;
}

/* One work item: sequence s, KV heads [h0, h1); q/out/table/pos/window/scale/dtype as paged_rows' (table and pos
   already at sequence s). Blocks are taken in table order, every head of the item in one pass over a block. */
static void run_item(const scratch *w, int64_t s, int64_t h0, int64_t h1, const void *q, int64_t q_s,
                     int64_t q_h, int64_t q_r, const caches *c, const int64_t *table, const int64_t *pos,
                     void *out, int out_dtype, int64_t KV, int64_t R, float scale, int dtype, int64_t window) {
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
        int64_t tmin;
        const int64_t n = block_span(pos, R, window, t0, tb, w->lo, w->hi, &tmin);
        if (n == 0) continue;
        if (PF_BLOCKS > 0 && b + PF_BLOCKS < nblocks) { /* the next block, over this block's q.K tiles and P.V passes */
            const int64_t ftb = maxpos + 1 - (t0 + PF_BLOCKS * BS) < BS ? maxpos + 1 - (t0 + PF_BLOCKS * BS) : BS;
            const int64_t steps = tiled ? nh * ((n - tmin) / QK_T + (n - tmin + PV_T - 1) / PV_T) : nh;
            pf_aim(&pf, c, table[b + PF_BLOCKS], h0, nh, ftb, steps);
        }
        const char *kb = c->k + (bid * c->k_b + h0 * c->k_h) * esize, *vb = c->v + (bid * c->v_b + h0 * c->v_h) * esize;
        if (tiled) {
            if (direct && dtype == DT_F32)
                block_heads_f32(w->qf, w->acc, w->m, w->l, R, nh, w->lo, w->hi, tmin, n, kb, c->k_h, c->k_t, vb,
                                c->v_h, c->v_t, D, w->sc, BS, &pf);
            else if (direct)
                block_heads_bf16(w->qf, w->acc, w->m, w->l, R, nh, w->lo, w->hi, tmin, n, kb, c->k_h, c->k_t, vb,
                                 c->v_h, c->v_t, D, w->sc, BS, &pf);
            else { /* float16: the block's rows of the item's heads as float32, [tokens, nh, D] */
                for (int64_t t = tmin; t < n; t++)
                    for (int64_t h = 0; h < nh; h++) {
                        load_row(w->kbuf + (t * nh + h) * D, kb + (t * c->k_t + h * c->k_h) * esize, D, dtype);
                        load_row(w->vbuf + (t * nh + h) * D, vb + (t * c->v_t + h * c->v_h) * esize, D, dtype);
                    }
                block_heads_f32(w->qf, w->acc, w->m, w->l, R, nh, w->lo, w->hi, tmin, n, w->kbuf, D, nh * D,
                                w->vbuf, D, nh * D, D, w->sc, BS, &pf);
            }
            continue;
        }
        for (int64_t h = 0; h < nh; h++) { /* any head_dim: one head at a time, plain loops on float32 rows */
            const char *kh = kb + h * c->k_h * esize, *vh = vb + h * c->v_h * esize;
            const float *kr = (const float *)kh, *vr = (const float *)vh;
            int64_t krs = c->k_t, vrs = c->v_t;
            if (!direct) { /* bfloat16 or float16: convert the head's rows to float32 */
                for (int64_t t = 0; t < tb; t++) {
                    load_row(w->kbuf + t * D, kh + t * c->k_t * esize, D, dtype);
                    load_row(w->vbuf + t * D, vh + t * c->v_t * esize, D, dtype);
                }
                kr = w->kbuf, vr = w->vbuf, krs = D, vrs = D;
            }
            head_block_plain(w->qf + h * R * D, w->acc + h * R * D, w->m + h * R, w->l + h * R, pos, R, window, t0,
                             tb, kr, krs, vr, vrs, D, w->sc);
            pf_step(&pf, pf.per_step);
        }
    }
    for (int64_t i = 0; i < nh * R; i++) {
        const int64_t at = ((s * KV + h0) * R + i) * D;
        const float inv = w->l[i] > 0.0f ? 1.0f / w->l[i] : 0.0f;
        if (out_dtype == DT_BF16) {
            uint16_t *o = (uint16_t *)out + at;
            for (int64_t d = 0; d < D; d++) o[d] = f32_to_bf16(w->l[i] > 0.0f ? w->acc[i * D + d] * inv : 0.0f);
        } else {
            float *o = (float *)out + at;
            for (int64_t d = 0; d < D; d++) o[d] = w->l[i] > 0.0f ? w->acc[i * D + d] * inv : 0.0f;
        }
    }
}

/* rows [S, KV, R, D] (element strides q_s, q_h, q_r; stride 1 in D) attend to positions
   max(0, row_pos[s, r] - window + 1) .. row_pos[s, r] of sequence s (-1: none, output 0; window >= 1, a huge
   value for full attention). K/V caches [num_blocks, BS, KV, D] with element strides (k_b, k_t, k_h),
   (v_b, v_t, v_h). table [S, table_stride] int64. out [S, KV, R, D] contiguous, float32 or (out_dtype DT_BF16) bfloat16, the
   float32 result rounded to nearest even as torch rounds.
   Work items (sequence, range of KV heads) are shared dynamically over nthreads OpenMP threads.
   Returns 0, or -1 when scratch memory could not be allocated. */
int paged_rows_out(const void *q, int64_t q_s, int64_t q_h, int64_t q_r,
               const void *kc, int64_t k_b, int64_t k_t, int64_t k_h,
               const void *vc, int64_t v_b, int64_t v_t, int64_t v_h,
               const int64_t *table, int64_t table_stride, const int64_t *row_pos, void *out, int out_dtype,
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
                     table + s * table_stride, row_pos + s * R, out, out_dtype, KV, R, scale, dtype, window);
        }
        scratch_free(&w);
    }
    return failed ? -1 : 0;
}

/* paged_rows_out writing float32 (the signature tests/kernels/paged_rows_driver.c calls). */
int paged_rows(const void *q, int64_t q_s, int64_t q_h, int64_t q_r,
               const void *kc, int64_t k_b, int64_t k_t, int64_t k_h,
               const void *vc, int64_t v_b, int64_t v_t, int64_t v_h,
               const int64_t *table, int64_t table_stride, const int64_t *row_pos, float *out,
               int64_t S, int64_t KV, int64_t R, int64_t D, int64_t BS, float scale, int dtype,
               int nthreads, int64_t head_split, int64_t window) {
    return paged_rows_out(q, q_s, q_h, q_r, kc, k_b, k_t, k_h, vc, v_b, v_t, v_h, table, table_stride, row_pos, out,
                          DT_F32, S, KV, R, D, BS, scale, dtype, nthreads, head_split, window);
}

/* What this build targets: the ISA name ("avx512", "avx2", "neon", "generic"), and in tiles[0..4) the floats per
   vector register, query rows per tile, tokens per q.K tile and vectors per P.V tile. */
const char *paged_rows_isa(int64_t *tiles) {
    tiles[0] = VL, tiles[1] = RT, tiles[2] = QK_T, tiles[3] = PV_G;
    return ISA_NAME;
}
