/* Decode attention over KIVI codes on the CPU, read straight from the codes (never dequantized
 * into a buffer). Built and loaded by kernels.py (`cc -O3 -march=native`); the torch path in
 * quantized_attention.py computes the same sums and is what the tests compare these with.
 *
 * duocal_quantized_attention: softmax(q . keys) over the quantized history, as the running max, the sum
 *   of exp(score - max) and the unnormalized weighted values per query row, which the caller folds
 *   with its full-precision residual. Keys quantized per channel over groups of tokens, values per
 *   token over groups of channels; 8 tokens at a time, scores, softmax and values in registers.
 * duocal_weighted_values: p @ values for values quantized per token (H2O slots).
 * duocal_token_scores: q . keys for keys quantized per token, as values are (H2O slots).
 *
 * Layouts (fp32 unless said): q [B, G, R, D] (scaled) and p [B, G, R, n] contiguous; codes uint8
 * rows of D * bits / 8 bytes (4 bits: channel i in the low nibble of byte i, channel i + D/2 in
 * the high one); keys' scale and zero a row of D per group of `group` tokens, values' a row of
 * D / group per token (keys too, in duocal_token_scores); strides (b, g, token) in elements, the
 * last axis contiguous; the mask uint8 [B, n] (1 = visible, batch stride mask_b) or NULL; scores
 * out [B, G, R, n]. Needs D % 16 == 0, D <= 256, group % 8 == 0,
 * R <= 64, and n % group == 0 for quantized keys.
 */
#include <math.h>
#include <pthread.h>

#include "vectors.h"

#define MAXV 32 /* vectors of 8 channels in a row: head_dim <= 256 */
#define MAXR 64 /* query rows per KV head */
#define TILE 8  /* tokens per step */

typedef struct {
    const uint8_t *codes;
    const float *scale, *zero;
    int64_t cs[3], ss[3], zs[3]; /* strides of codes, scale, zero: b, g, token (or token group) */
} Codes;

typedef struct {
    const float *x; /* q (attention) or p (weighted values) */
    Codes k, v;
    const uint8_t *mask;
    int64_t mask_b;
    float *out, *max, *sum;
    int64_t B, G, R, D, n, bits, group;
    int64_t first, last; /* heads b * G + g in [first, last) */
} Job;

static inline const uint8_t *code_row(const Codes *c, int64_t b, int64_t g, int64_t t) {
    return c->codes + b * c->cs[0] + g * c->cs[1] + t * c->cs[2];
}

/* acc[r] += sum over `count` tokens from t0 of p[r][k] * (codes[t] * scale[t] + zero[t]) per channel
 * group; p[r] holds the tile's probabilities (row stride p_r, token k at p[r * p_r + k]) */
static inline __attribute__((always_inline)) void value_tile(const Codes *v, int64_t b, int64_t g, int64_t t0, const int64_t count,
                                                             const float *p, int64_t p_r, int64_t R, v8f acc[MAXR][MAXV],
                                                             float zacc[MAXR][MAXV], const int64_t D, const int64_t bits,
                                                             const int64_t group) {
    const int64_t nv = D / 8, ng = D / group, per = group / 8;
    const float *s0 = v->scale + b * v->ss[0] + g * v->ss[1], *z0 = v->zero + b * v->zs[0] + g * v->zs[1];
    v8f c[TILE][MAXV], a[MAXV];
    float zr[MAXV];
    for (int64_t k = 0; k < count; k++) unpack(code_row(v, b, g, t0 + k), nv, bits, c[k]);
    if (count == TILE) { /* a whole tile: scales and zeros of its 8 tokens as vectors, per channel group */
        v8f sv[MAXV], zv[MAXV], w[MAXV];
        for (int64_t m = 0; m < ng; m++) {
            float sk[TILE], zk[TILE];
            for (int64_t k = 0; k < TILE; k++) sk[k] = s0[(t0 + k) * v->ss[2] + m], zk[k] = z0[(t0 + k) * v->zs[2] + m];
            sv[m] = load8(sk), zv[m] = load8(zk);
        }
        for (int64_t r = 0; r < R; r++) {
            const v8f pv = load8(p + r * p_r);
            for (int64_t i = 0; i < nv; i++) a[i] = acc[r][i];
            for (int64_t m = 0; m < ng; m++) w[m] = pv * sv[m], zacc[r][m] += sum1(pv * zv[m]);
            for (int64_t k = 0; k < TILE; k++)
                for (int64_t m = 0; m < ng; m++) {
                    const v8f wk = splat(w[m][k]);
                    for (int64_t i = m * per; i < (m + 1) * per; i++) a[i] += wk * c[k][i];
                }
            for (int64_t i = 0; i < nv; i++) acc[r][i] = a[i];
        }
        return;
    }
    for (int64_t r = 0; r < R; r++) {
        for (int64_t i = 0; i < nv; i++) a[i] = acc[r][i];
        for (int64_t m = 0; m < ng; m++) zr[m] = 0;
        for (int64_t k = 0; k < count; k++) {
            const float pr = p[r * p_r + k], *s = s0 + (t0 + k) * v->ss[2], *z = z0 + (t0 + k) * v->zs[2];
            for (int64_t m = 0; m < ng; m++) {
                const v8f w = splat(pr * s[m]);
                zr[m] += pr * z[m];
                for (int64_t i = m * per; i < (m + 1) * per; i++) a[i] += w * c[k][i];
            }
        }
        for (int64_t i = 0; i < nv; i++) acc[r][i] = a[i];
        for (int64_t m = 0; m < ng; m++) zacc[r][m] += zr[m];
    }
}

static void add_rows(int64_t R, int64_t nv, v8f acc[MAXR][MAXV], float zacc[MAXR][MAXV], v8f part[MAXR][MAXV], float zpart[MAXR][MAXV]) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < nv; i++) acc[r][i] += part[r][i], zacc[r][i] += zpart[r][i];
}

static void store_rows(float *out, int64_t R, int64_t D, int64_t group, v8f acc[MAXR][MAXV], float zacc[MAXR][MAXV]) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < D / 8; i++) store8(out + r * D + 8 * i, acc[r][i] + splat(zacc[r][8 * i / group]));
}

/* scores of a tile of 8 tokens for every row: q[r] . (codes[t] * scale + zero) = qs[r] . codes[t] + qz[r] */
static inline __attribute__((always_inline)) void score_tile(const Codes *k, int64_t b, int64_t g, int64_t t0, int64_t R,
                                                             v8f qs[MAXR][MAXV], const float *qz, v8f *scores,
                                                             const int64_t nv, const int64_t bits) {
    v8f c[TILE][MAXV], acc[TILE];
    for (int64_t t = 0; t < TILE; t++) unpack(code_row(k, b, g, t0 + t), nv, bits, c[t]);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t t = 0; t < TILE; t++) acc[t] = qs[r][0] * c[t][0];
        for (int64_t i = 1; i < nv; i++)
            for (int64_t t = 0; t < TILE; t++) acc[t] += qs[r][i] * c[t][i];
        scores[r] = sums8(acc) + splat(qz[r]);
    }
}

/* one KV head: running softmax of its rows over every quantized token */
static inline __attribute__((always_inline)) void attend_head(const Job *j, int64_t h, const int64_t D, const int64_t bits, const int64_t group) {
    const int64_t nv = D / 8, R = j->R, b = h / j->G, g = h % j->G;
    const float *q = j->x + h * R * D;
    v8f qs[MAXR][MAXV], acc[MAXR][MAXV], scores[MAXR];
    float qz[MAXR], zacc[MAXR][MAXV], m[MAXR], l[MAXR], p[MAXR][TILE];
    for (int64_t r = 0; r < R; r++) {
        m[r] = -INFINITY, l[r] = 0;
        for (int64_t i = 0; i < nv; i++) acc[r][i] = splat(0), zacc[r][i] = 0;
    }
    v8f gacc[MAXR][MAXV];
    float gz[MAXR][MAXV];
    for (int64_t gi = 0; gi < j->n / group; gi++) {
        for (int64_t r = 0; r < R; r++)
            for (int64_t i = 0; i < nv; i++) gacc[r][i] = splat(0), gz[r][i] = 0;
        const float *s = j->k.scale + b * j->k.ss[0] + g * j->k.ss[1] + gi * j->k.ss[2];
        const float *z = j->k.zero + b * j->k.zs[0] + g * j->k.zs[1] + gi * j->k.zs[2];
        for (int64_t r = 0; r < R; r++) { /* the group's scale folded into the query, its zero into one dot */
            v8f a = splat(0);
            for (int64_t i = 0; i < nv; i++) {
                v8f qv = load8(q + r * D + 8 * i);
                qs[r][i] = qv * load8(s + 8 * i);
                a += qv * load8(z + 8 * i);
            }
            qz[r] = sum1(a);
        }
        for (int64_t t0 = gi * group; t0 < (gi + 1) * group; t0 += TILE) {
            v8f visible = splat(1);
            if (j->mask) {
                visible = __builtin_convertvector(widen8(j->mask + b * j->mask_b + t0), v8f); /* 0 or 1 per token */
                if (sum1(visible) == 0) continue;
            }
            score_tile(&j->k, b, g, t0, R, qs, qz, scores, nv, bits);
            for (int64_t r = 0; r < R; r++) {
                v8f sc = vselect(visible > splat(0), scores[r], splat(-INFINITY));
                float top = max1(sc);
                if (top > m[r]) { /* a new max: what was summed so far shrinks by exp(old - new) */
                    float shrink = expf(m[r] - top);
                    l[r] *= shrink;
                    for (int64_t i = 0; i < nv; i++) {
                        acc[r][i] *= splat(shrink), zacc[r][i] *= shrink;
                        gacc[r][i] *= splat(shrink), gz[r][i] *= shrink;
                    }
                    m[r] = top;
                }
                v8f e = vexp(sc - splat(m[r])) * visible;
                l[r] += sum1(e);
                store8(p[r], e);
            }
            value_tile(&j->v, b, g, t0, TILE, &p[0][0], TILE, R, gacc, gz, D, bits, group);
        }
        add_rows(R, nv, acc, zacc, gacc, gz); /* sums of a group at a time: rounding grows with n / group, not n */
    }
    store_rows(j->out + h * R * D, R, D, group, acc, zacc);
    for (int64_t r = 0; r < R; r++) j->max[h * R + r] = m[r], j->sum[h * R + r] = l[r];
}

static __attribute__((noinline)) void value_tail(const Job *j, int64_t b, int64_t g, int64_t t0, v8f acc[MAXR][MAXV], float zacc[MAXR][MAXV]) {
    const float *p = j->x + (b * j->G + g) * j->R * j->n + t0;
    value_tile(&j->v, b, g, t0, j->n - t0, p, j->n, j->R, acc, zacc, j->D, j->bits, j->group);
}

/* one KV head: p @ values over its n tokens */
static inline __attribute__((always_inline)) void value_head(const Job *j, int64_t h, const int64_t D, const int64_t bits, const int64_t group) {
    const int64_t R = j->R, n = j->n, b = h / j->G, g = h % j->G;
    v8f acc[MAXR][MAXV];
    float zacc[MAXR][MAXV];
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < D / 8; i++) acc[r][i] = splat(0), zacc[r][i] = 0;
    v8f part[MAXR][MAXV];
    float zpart[MAXR][MAXV];
    const float *p = j->x + h * R * n;
    int64_t t0 = 0;
    for (; t0 + TILE <= n; t0 += TILE) {
        if (t0 % (4 * TILE) == 0) { /* sums of 32 tokens at a time: rounding grows with n / 32, not n */
            if (t0) add_rows(R, D / 8, acc, zacc, part, zpart);
            for (int64_t r = 0; r < R; r++)
                for (int64_t i = 0; i < D / 8; i++) part[r][i] = splat(0), zpart[r][i] = 0;
        }
        value_tile(&j->v, b, g, t0, TILE, p + t0, n, R, part, zpart, D, bits, group);
    }
    if (t0) add_rows(R, D / 8, acc, zacc, part, zpart);
    if (t0 < n) value_tail(j, b, g, t0, acc, zacc);
    store_rows(j->out + h * R * D, R, D, group, acc, zacc);
}

/* a token's codes scaled per channel group: codes * scale, the zero point left to the caller */
static inline __attribute__((always_inline)) void scaled_row(const Codes *k, int64_t b, int64_t g, int64_t t, v8f *c,
                                                             const int64_t nv, const int64_t bits, const int64_t group) {
    const float *s = k->scale + b * k->ss[0] + g * k->ss[1] + t * k->ss[2];
    unpack(code_row(k, b, g, t), nv, bits, c);
    for (int64_t i = 0; i < nv; i++) c[i] *= splat(s[8 * i / group]);
}

/* one KV head: q[r] . (codes[t] * scale[t] + zero[t]) for every row and token, the zero point as
 * (sum of the group's q) * zero */
static inline __attribute__((always_inline)) void token_score_head(const Job *j, int64_t h, const int64_t D, const int64_t bits, const int64_t group) {
    const int64_t nv = D / 8, ng = D / group, R = j->R, n = j->n, b = h / j->G, g = h % j->G;
    const float *q = j->x + h * R * D, *z0 = j->k.zero + b * j->k.zs[0] + g * j->k.zs[1];
    float *out = j->out + h * R * n, qsum[MAXR][MAXV];
    v8f qv[MAXR][MAXV], c[TILE][MAXV], acc[TILE];
    for (int64_t r = 0; r < R; r++) {
        for (int64_t m = 0; m < ng; m++) qsum[r][m] = 0;
        for (int64_t i = 0; i < nv; i++) qv[r][i] = load8(q + r * D + 8 * i), qsum[r][8 * i / group] += sum1(qv[r][i]);
    }
    int64_t t0 = 0;
    for (; t0 + TILE <= n; t0 += TILE) {
        v8f zv[MAXV];
        for (int64_t t = 0; t < TILE; t++) scaled_row(&j->k, b, g, t0 + t, c[t], nv, bits, group);
        for (int64_t m = 0; m < ng; m++) {
            float zk[TILE];
            for (int64_t t = 0; t < TILE; t++) zk[t] = z0[(t0 + t) * j->k.zs[2] + m];
            zv[m] = load8(zk);
        }
        for (int64_t r = 0; r < R; r++) {
            for (int64_t t = 0; t < TILE; t++) acc[t] = qv[r][0] * c[t][0];
            for (int64_t i = 1; i < nv; i++)
                for (int64_t t = 0; t < TILE; t++) acc[t] += qv[r][i] * c[t][i];
            v8f sc = sums8(acc);
            for (int64_t m = 0; m < ng; m++) sc += splat(qsum[r][m]) * zv[m];
            store8(out + r * n + t0, sc);
        }
    }
    for (; t0 < n; t0++) { /* the last n % 8 tokens one at a time */
        const float *z = z0 + t0 * j->k.zs[2];
        scaled_row(&j->k, b, g, t0, c[0], nv, bits, group);
        for (int64_t r = 0; r < R; r++) {
            v8f a = qv[r][0] * c[0][0];
            for (int64_t i = 1; i < nv; i++) a += qv[r][i] * c[0][i];
            float sc = sum1(a);
            for (int64_t m = 0; m < ng; m++) sc += qsum[r][m] * z[m];
            out[r * n + t0] = sc;
        }
    }
}

/* The default group of 32 at head_dim 64 and 128 gets its own code (constant loop bounds, registers
 * instead of memory); other shapes run the same code with bounds read at run time. */
#define SHAPES(X, head, j, h) \
    X(head, j, h, 64, 4, 32) X(head, j, h, 64, 8, 32) X(head, j, h, 128, 4, 32) X(head, j, h, 128, 8, 32)
#define CASE(head, j, h, d, w, gr) \
    if (j->D == d && j->bits == w && j->group == gr) { head(j, h, d, w, gr); continue; }

/* a thread's share of the heads: the shape's own code where it has one */
#define HEADS_JOB(name, head)                                 \
    static void *name(void *arg) {                            \
        const Job *j = arg;                                   \
        for (int64_t h = j->first; h < j->last; h++) {        \
            SHAPES(CASE, head, j, h)                          \
            head(j, h, j->D, j->bits, j->group);              \
        }                                                     \
        return NULL;                                          \
    }
HEADS_JOB(attend_job, attend_head)
HEADS_JOB(value_job, value_head)
HEADS_JOB(token_score_job, token_score_head)

/* Heads split over `threads` threads, this one included (a thread that cannot start: its heads run here). */
static void run(void *(*work)(void *), Job job, int64_t threads) {
    int64_t heads = job.B * job.G;
    threads = threads > heads ? heads : threads;
    threads = threads > 64 ? 64 : threads < 1 ? 1 : threads;
    Job jobs[64];
    pthread_t ids[64];
    int started[64] = {0};
    for (int64_t t = 0; t < threads; t++) {
        jobs[t] = job;
        jobs[t].first = heads * t / threads;
        jobs[t].last = heads * (t + 1) / threads;
    }
    for (int64_t t = 1; t < threads; t++) started[t] = pthread_create(&ids[t], NULL, work, &jobs[t]) == 0;
    work(&jobs[0]);
    for (int64_t t = 1; t < threads; t++) {
        if (started[t]) pthread_join(ids[t], NULL);
        else work(&jobs[t]);
    }
}

static Codes codes_of(const uint8_t *codes, const float *scale, const float *zero, const int64_t *strides) {
    Codes c = {codes, scale, zero, {strides[0], strides[1], strides[2]}, {strides[3], strides[4], strides[5]},
               {strides[6], strides[7], strides[8]}};
    return c;
}

/* strides: codes, scale, zero (b, g, token) of keys then of values */
void duocal_quantized_attention(const float *q, const uint8_t *kc, const float *ks, const float *kz, const uint8_t *vc,
                            const float *vs, const float *vz, const int64_t *strides, const uint8_t *mask, int64_t mask_b,
                            float *out, float *max, float *sum, int64_t B, int64_t G, int64_t R, int64_t D, int64_t n,
                            int64_t bits, int64_t group, int64_t threads) {
    Job job = {q, codes_of(kc, ks, kz, strides), codes_of(vc, vs, vz, strides + 9), mask, mask_b, out, max, sum, B, G, R, D, n, bits, group, 0, 0};
    run(attend_job, job, threads);
}

void duocal_weighted_values(const float *p, const uint8_t *vc, const float *vs, const float *vz, const int64_t *strides,
                            float *out, int64_t B, int64_t G, int64_t R, int64_t D, int64_t n, int64_t bits, int64_t group,
                            int64_t threads) {
    Job job = {p, {0}, codes_of(vc, vs, vz, strides), NULL, 0, out, NULL, NULL, B, G, R, D, n, bits, group, 0, 0};
    run(value_job, job, threads);
}

void duocal_token_scores(const float *q, const uint8_t *kc, const float *ks, const float *kz, const int64_t *strides,
                         float *out, int64_t B, int64_t G, int64_t R, int64_t D, int64_t n, int64_t bits, int64_t group,
                         int64_t threads) {
    Job job = {q, codes_of(kc, ks, kz, strides), {0}, NULL, 0, out, NULL, NULL, B, G, R, D, n, bits, group, 0, 0};
    run(token_score_job, job, threads);
}
