/* Row-invariant float32 kernels for the reference engine's layer loop: a GEMM y[M, N] = x[M, K] W[N, K]^T (+ b[N]),
 * RMSNorm, attention over ragged rows (rotary embedding, KV cache writes, softmax(q k^T) v per query) and SwiGLU's gate.
 *
 * Every output element is summed in one order that depends on K only: acc = 0; for k = 0 .. K - 1:
 * acc = fma(x[m, k], W[n, k], acc); then + b[n]. The number of rows M, where a row sits among them, the
 * tile it shares and the thread count change which rows share registers and which thread computes a
 * column block, never that order, so a row gets the same bits alone or in any batch. BLAS GEMMs (MKL,
 * OpenBLAS) pick another kernel, and with it another summation order, for another M (a GEMV at M = 1).
 *
 * The weight is repacked once (specbuild.engine.rowgemm.pack_weight) into column blocks of 16: wp[b][k][l] = W[16 b + l, k],
 * zero past N, so that one vector load gives 16 columns' weights at one k and each column's sum is one
 * SIMD lane (no horizontal sums). The packed weights are float32, or bfloat16 for draft-side layers
 * (specbuild_rowgemm_bf16w: half the bytes, each weight widened exactly to float32 before its fma).
 * A decoding pass (a few rows) streams wp once per tile of up to 6 rows: it is bound by memory bandwidth, which this layout uses better than oneDNN's packed fp32 kernels
 * (SmolLM2-135M, 2-core Xeon, all linears: one row 17.0 ms against 23.4 ms, 64 rows 61 against 73 ms;
 * 256 rows, a prompt, about equal at 200 ms, where both are bound by the FMA units).
 *
 * Built by specbuild.engine.rowgemm with the host's compiler for the host's CPU (-march=native; GCC
 * vector extensions lower to AVX-512, AVX2 or NEON, whatever the CPU has).
 */
#include <math.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <omp.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));

/* A tile is up to 6 rows by 4 column blocks, or 8 rows by 3 blocks when a pass has 7 or 8 rows (one sweep
 * over the weights instead of two): at most 24 accumulators, plus the weight vectors and a broadcast, in 32
 * vector registers. */
#define MAX_ROWS 8
#define TILE_BLOCKS 4
/* Without AVX-512 a v16 takes two registers (AVX2: 16 of 256 bits; NEON: four of 128 bits), and a tile of 6 rows
 * by 4 blocks spilled its accumulators to the stack: each extra row cost a whole extra pass (AVX2-only EPYC:
 * 5 rows 5.3x one row, so speculation never paid). There a tile is up to 6 rows by one column block: 6
 * accumulators, the weights and a broadcast fill the 16 registers, and the weights still stream once per 6 rows
 * (5 rows: 2.3x one row). One row keeps 4 blocks, whose 4 accumulators fit (2 rows by 2 blocks measured slower
 * than 2 rows by 1).
 * Tiles only group rows and columns: the order of every sum, and so every bit, is the same either way. */
#ifdef __AVX512F__
#define WIDE_TILES 1
#else
#define WIDE_TILES 0
#endif
/* Each column block's weights are a stream of one 64-byte line per k; the tile asks for the line PREFETCH_K
 * steps ahead of the one it loads. The hardware prefetcher alone left the FMAs of a tile of several rows
 * waiting on memory: SmolLM2-135M's linears at 8 rows cost 1.30x one row without this, 1.10-1.13x with it
 * (2-core Xeon; distances of 16 to 64 lines measured alike). Near a tile's end each stream prefetches the start of
 * its counterpart in the thread's next tile (column blocks b0 + nb ..), which it would otherwise meet cold: all
 * linears at 8 rows -0.5 ms of 23.5 (2-core Xeon with AMX). It changes no arithmetic. */
#define PREFETCH_K 32

typedef int vi16 __attribute__((vector_size(64)));
typedef unsigned short vh16 __attribute__((vector_size(32)));
typedef unsigned int vu16 __attribute__((vector_size(64)));

/* 16 columns' weights at one k: float32, or bfloat16 (the upper half of a float32) widened exactly to float32
 * (zero-extended, shifted into the upper half: unsigned, so a set sign bit is no signed overflow) */
static inline __attribute__((always_inline)) v16 load_w(const char *p, const int half) {
#ifdef __AVX512F__
    /* one widening load (vpmovzxwd zmm, m256): GCC splits the generic form below into 256-bit halves */
    if (half) return (v16)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)p)), 16);
#else
    if (half) return (v16)(__builtin_convertvector(*(const vh16 *)p, vu16) << 16);
#endif
    return *(const v16 *)p;
}

/* rows m0 .. m0 + mm - 1 by column blocks b0 .. b0 + nb - 1 (mm, nb, half compile-time constants after inlining);
 * half: the packed weight holds bfloat16 (2 bytes per weight), else float32 */
static inline __attribute__((always_inline)) void tile(const float *x, const void *wp, const float *bias, float *y,
                                                       long N, long K, long m0, long b0, const int mm, const int nb,
                                                       int accumulate, const int half) {
    v16 acc[MAX_ROWS][TILE_BLOCKS];
    for (int i = 0; i < mm; i++)
        for (int j = 0; j < nb; j++) acc[i][j] = (v16){0};
    const long step = half ? 32 : 64;                                  /* bytes of one k of one column block */
    const char *w = (const char *)wp + b0 * K * step;
    const float *xr = x + m0 * K;
    const long wstride = K * step; /* from one column block to the next */
    for (long k = 0; k < K; k++, w += step, xr++) {
        v16 wv[TILE_BLOCKS];
        for (int j = 0; j < nb; j++) {
            /* in the last PREFETCH_K steps, the start of the same stream of the next tile (column block b0 + nb + j) */
            __builtin_prefetch(w + j * wstride + PREFETCH_K * step + (k + PREFETCH_K >= K ? (nb - 1) * wstride : 0), 0, 3);
            wv[j] = load_w(w + j * wstride, half);
        }
        for (int i = 0; i < mm; i++) {
            const float xs = xr[i * K];
            const v16 xv = {xs, xs, xs, xs, xs, xs, xs, xs, xs, xs, xs, xs, xs, xs, xs, xs}; /* a broadcast load */
            for (int j = 0; j < nb; j++) acc[i][j] = acc[i][j] + xv * wv[j];
        }
    }
    for (int i = 0; i < mm; i++)
        for (int j = 0; j < nb; j++) {
            float s[16];
            memcpy(s, &acc[i][j], sizeof s);
            const long n0 = (b0 + j) * 16;
            float *out = y + (m0 + i) * N + n0;
            for (int l = 0; l < 16 && n0 + l < N; l++) {
                const float v = bias ? s[l] + bias[n0 + l] : s[l];
                out[l] = accumulate ? out[l] + v : v;
            }
        }
}

#define ROW_TILES(nb)                                                                                   \
    for (long m0 = 0; m0 < M; m0 += 6) {                                                                \
        switch (M - m0 >= 6 ? 6 : M - m0) {                                                             \
        case 6: tile(x, wp, bias, y, N, K, m0, b0, 6, nb, accumulate, half); break;                     \
        case 5: tile(x, wp, bias, y, N, K, m0, b0, 5, nb, accumulate, half); break;                     \
        case 4: tile(x, wp, bias, y, N, K, m0, b0, 4, nb, accumulate, half); break;                     \
        case 3: tile(x, wp, bias, y, N, K, m0, b0, 3, nb, accumulate, half); break;                     \
        case 2: tile(x, wp, bias, y, N, K, m0, b0, 2, nb, accumulate, half); break;                     \
        default: tile(x, wp, bias, y, N, K, m0, b0, 1, nb, accumulate, half); break;                    \
        }                                                                                               \
    }

/* x: [M, K], wp: packed [ceil(N / 16), K, 16] float32 (64-byte aligned) or bfloat16 (32-byte aligned), bias: [N] or NULL, y: [M, N]; contiguous float32.
 * accumulate != 0: y[m, n] = y[m, n] + (x W^T + b)[m, n] (a residual connection, rounded as y + linear(x) is). 
 * Each thread takes a contiguous range of column blocks (sizes differing by at most one). */
static inline __attribute__((always_inline)) void rowgemm(const float *x, const void *wp, const float *bias, float *y,
                                                          long M, long N, long K, int num_threads, int accumulate,
                                                          const int half) {
    const long blocks = (N + 15) / 16;
    if (blocks == 0 || M <= 0) return;
    if (num_threads < 1) num_threads = 1;
    if (num_threads > blocks) num_threads = (int)blocks;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        const int team = omp_get_num_threads(), me = omp_get_thread_num();
        const long first = blocks * me / team, last = blocks * (me + 1) / team;
        if (!WIDE_TILES && M > 1) {
            for (long b0 = first; b0 < last; b0++) ROW_TILES(1)
        } else if (M == 7 || M == 8) {
            for (long b0 = first; b0 < last; b0 += 3) {
                const long m0 = 0;
                switch ((last - b0 >= 3 ? 3 : last - b0) * 10 + M) {
                case 37: tile(x, wp, bias, y, N, K, m0, b0, 7, 3, accumulate, half); break;
                case 38: tile(x, wp, bias, y, N, K, m0, b0, 8, 3, accumulate, half); break;
                case 27: tile(x, wp, bias, y, N, K, m0, b0, 7, 2, accumulate, half); break;
                case 28: tile(x, wp, bias, y, N, K, m0, b0, 8, 2, accumulate, half); break;
                case 17: tile(x, wp, bias, y, N, K, m0, b0, 7, 1, accumulate, half); break;
                default: tile(x, wp, bias, y, N, K, m0, b0, 8, 1, accumulate, half); break;
                }
            }
        } else {
            for (long b0 = first; b0 < last; b0 += TILE_BLOCKS) {
                switch (last - b0 >= TILE_BLOCKS ? TILE_BLOCKS : last - b0) {
                case 4: ROW_TILES(4) break;
                case 3: ROW_TILES(3) break;
                case 2: ROW_TILES(2) break;
                default: ROW_TILES(1) break;
                }
            }
        }
    }
}

void specbuild_rowgemm_f32(const float *x, const float *wp, const float *bias, float *y, long M, long N, long K,
                           int num_threads, int accumulate) {
    rowgemm(x, wp, bias, y, M, N, K, num_threads, accumulate, 0);
}

/* The same with bfloat16 weights (wp: uint16 bit patterns), each widened exactly to float32 before its fma: the
 * sums run in float32 in the same order, so a row's bits still never depend on the rows beside it. Half the bytes
 * to stream; for draft-side weights, whose rounding changes what is proposed, never what is accepted. */
void specbuild_rowgemm_bf16w(const float *x, const unsigned short *wp, const float *bias, float *y, long M, long N,
                             long K, int num_threads, int accumulate) {
    rowgemm(x, wp, bias, y, M, N, K, num_threads, accumulate, 1);
}

/* RMSNorm of each row (Zhang and Sennrich 2019; transformers' LlamaRMSNorm): y = w * (x * r) with
 * r = 1 / sqrt(mean(x^2) + eps). x, y: [M, H], w: [H]; float32, contiguous. The sum of squares runs in
 * 16 lanes over k = l, l + 16, ..., then a fixed pairwise tree, then the H % 16 tail: per row, the same
 * order whatever M. One call per norm instead of the six elementwise ops and reductions of the module. */
void specbuild_rmsnorm_f32(const float *x, const float *w, float *y, long M, long H, float eps) {
    const long h16 = H & ~15L;
    for (long m = 0; m < M; m++) {
        const float *xr = x + m * H;
        float *yr = y + m * H;
        v16 acc = (v16){0};
        for (long k = 0; k < h16; k += 16) {
            v16 v;
            memcpy(&v, xr + k, sizeof v);
            acc = acc + v * v;
        }
        float s[16];
        memcpy(s, &acc, sizeof s);
        for (int width = 8; width >= 1; width >>= 1)
            for (int i = 0; i < width; i++) s[i] = s[i] + s[i + width];
        float sum = s[0];
        for (long k = h16; k < H; k++) sum = sum + xr[k] * xr[k];
        const float r = 1.0f / sqrtf(sum / (float)H + eps);
        for (long k = 0; k < H; k++) yr[k] = w[k] * (xr[k] * r);
    }
}

/* ---- Attention for the engine's layer loop (specbuild.engine.decoder) ---------------------------------- */

/* exp(x), 16 lanes: Cody-Waite reduction x = n ln2 + r and Cephes' polynomial for e^r (cephes/single/expf.c),
 * then 2^n in the exponent bits; about 1 ulp. x is clamped to [-87.34, 88]: under it gives ~1e-38 (never 0
 * or a denormal), over it ~1.6e38. Every lane runs the same instructions, so a
 * lane's result depends on its own input only. */
static inline v16 clamp_v16(v16 x, float low, float high) {
    const v16 lo = {low, low, low, low, low, low, low, low, low, low, low, low, low, low, low, low};
    const v16 hi = {high, high, high, high, high, high, high, high, high, high, high, high, high, high, high, high};
    vi16 m = x < lo;
    x = (v16)(((vi16)x & ~m) | ((vi16)lo & m));
    m = x > hi;
    return (v16)(((vi16)x & ~m) | ((vi16)hi & m));
}

static inline v16 exp_v16(v16 x) {
    x = clamp_v16(x, -87.3365f, 88.0f);
    v16 fx = x * 1.44269504088896341f + 0.5f;
    vi16 n = __builtin_convertvector(fx, vi16);           /* toward zero */
    v16 nf = __builtin_convertvector(n, v16);
    vi16 over = nf > fx;                                   /* -1 where truncation rounded up: floor */
    n = n + over;
    nf = __builtin_convertvector(n, v16);
    x = x - nf * 0.693359375f;
    x = x - nf * -2.12194440e-4f;
    const v16 z = x * x;
    v16 y = x * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    const vi16 bits = (n + 127) << 23;
    v16 scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* Sum of 16 vectors' lanes, one sum per vector: out lane i = the 16 lanes of v[i] added in a fixed tree (lane l
 * with lane l + 8, then + 4, + 2, + 1), the same tree for every vector whatever its place among the 16. */
static inline v16 reduce16(v16 v[16]) {
    v16 a[8], b[4], c[2];
    const vi16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const vi16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const vi16 lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const vi16 hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const vi16 lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const vi16 hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const vi16 lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const vi16 hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    /* a[i]: lanes 0-7 vector 2i's half-sums, lanes 8-15 vector 2i + 1's */
    for (int i = 0; i < 8; i++) a[i] = __builtin_shuffle(v[2 * i], v[2 * i + 1], lo8) + __builtin_shuffle(v[2 * i], v[2 * i + 1], hi8);
    for (int i = 0; i < 4; i++) b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo4) + __builtin_shuffle(a[2 * i], a[2 * i + 1], hi4);
    for (int i = 0; i < 2; i++) c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], lo2) + __builtin_shuffle(b[2 * i], b[2 * i + 1], hi2);
    return __builtin_shuffle(c[0], c[1], lo1) + __builtin_shuffle(c[0], c[1], hi1);
}

/* Lane i of reduce16's result holds the sum of vector slot16[i] (a bit reversal of i: its own inverse). */
static const int slot16[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* nh (1 .. MAX_GROUP) query heads that share a kv head, each q[h] of D floats (D a multiple of 16, at most
 * 256), against their visible keys kbase + idx[0 .. nv - 1] (element offsets of rows of D floats): softmax(scale q.k) v summed
 * in the order of idx. A score is q.k in 16 lanes over d = l, l + 16, ... (a chain of fused multiply-adds),
 * then reduce16's tree, times scale; the softmax's maximum, exp and sum and the weighted sum of values run in
 * visible-key order, the sum in 16-lane chunks of that order. Sharing a kv head only shares the loads of its
 * keys and values: each head's arithmetic is the one it has alone, and nothing depends on anything but q, the
 * visible keys and values and their order, not on how many queries, rows or threads share the call.
 * scores: nh * room floats (room >= nv + 16); out: nh * D floats. */
#define MAX_GROUP 4
static inline __attribute__((always_inline)) void attend(const float *q, const float *kbase, const float *vbase,
                                                         const long *idx, long nv, const long D, float scale,
                                                         float *scores, long room, float *out, const int nh) {
    const long dv = D / 16; /* a compile-time constant where attend_heads inlines it */
    v16 qv[MAX_GROUP][16];
    for (int h = 0; h < nh; h++)
        for (long c = 0; c < dv; c++) memcpy(&qv[h][c], q + h * D + 16 * c, sizeof(v16));
    const long padded = (nv + 15) & ~15L;
    const v16 scale_v = {scale, scale, scale, scale, scale, scale, scale, scale, scale, scale, scale, scale, scale, scale, scale, scale};
    for (long g = 0; g < padded; g += 16) {
        v16 part[MAX_GROUP][16];
        for (int i = 0; i < 16; i++) {
            const long j = g + i < nv ? idx[g + i] : idx[0]; /* padding lanes: any real key, result unused */
            const float *kr = kbase + j;
            v16 kv, acc[MAX_GROUP];
            memcpy(&kv, kr, sizeof kv);
            for (int h = 0; h < nh; h++) acc[h] = qv[h][0] * kv;
            for (long c = 1; c < dv; c++) {
                memcpy(&kv, kr + 16 * c, sizeof kv);
                for (int h = 0; h < nh; h++) acc[h] = acc[h] + qv[h][c] * kv;
            }
            for (int h = 0; h < nh; h++) part[h][slot16[i]] = acc[h]; /* so that lane i of reduce16 is key g + i */
        }
        for (int h = 0; h < nh; h++) {
            const v16 sums = reduce16(part[h]) * scale_v;
            memcpy(scores + h * room + g, &sums, sizeof sums);
        }
    }
    float total[MAX_GROUP];
    for (int h = 0; h < nh; h++) {
        float *sc = scores + h * room;
        for (long i = nv; i < padded; i++) sc[i] = -INFINITY;
        v16 top;
        memcpy(&top, sc, sizeof top);
        for (long g = 16; g < padded; g += 16) {
            v16 x;
            memcpy(&x, sc + g, sizeof x);
            const vi16 m = x > top;
            top = (v16)(((vi16)top & ~m) | ((vi16)x & m));
        }
        float lanes[16], maximum = -INFINITY;
        memcpy(lanes, &top, sizeof lanes);
        for (int i = 0; i < 16; i++) maximum = lanes[i] > maximum ? lanes[i] : maximum; /* exact in any order */
        for (long i = nv; i < padded; i++) sc[i] = maximum;
        v16 sum = (v16){0};
        for (long g = 0; g < padded; g += 16) {
            v16 x;
            memcpy(&x, sc + g, sizeof x);
            x = exp_v16(x - maximum);
            if (g + 16 > nv) { /* the last chunk: padding lanes add nothing */
                float e[16];
                memcpy(e, &x, sizeof e);
                for (int i = (int)(nv - g); i < 16; i++) e[i] = 0.0f;
                memcpy(&x, e, sizeof x);
            }
            memcpy(sc + g, &x, sizeof x);
            sum = sum + x;
        }
        float t[16];
        memcpy(t, &sum, sizeof t);
        for (int width = 8; width >= 1; width >>= 1)
            for (int i = 0; i < width; i++) t[i] = t[i] + t[i + width];
        total[h] = t[0];
    }
    v16 acc[MAX_GROUP][16];
    for (int h = 0; h < nh; h++)
        for (long c = 0; c < dv; c++) acc[h][c] = (v16){0};
    for (long i = 0; i < nv; i++) {
        const float *vr = vbase + idx[i];
        v16 pv[MAX_GROUP];
        for (int h = 0; h < nh; h++) {
            const float p = scores[h * room + i];
            pv[h] = (v16){p, p, p, p, p, p, p, p, p, p, p, p, p, p, p, p};
        }
        for (long c = 0; c < dv; c++) {
            v16 vv;
            memcpy(&vv, vr + 16 * c, sizeof vv);
            for (int h = 0; h < nh; h++) acc[h][c] = acc[h][c] + pv[h] * vv;
        }
    }
    for (int h = 0; h < nh; h++)
        for (long c = 0; c < dv; c++) {
            const v16 r = nv ? acc[h][c] / total[h] : (v16){0};
            memcpy(out + h * D + 16 * c, &r, sizeof r);
        }
}

/* attend with nh and D as compile-time constants for the common head sizes (64: SmolLM2, Llama-3.2-1B; 128:
 * Llama-2/3 7B/8B), so that a query's accumulators live in registers. Same arithmetic either way. */
#define ATTEND_D(dconst)                                                                              \
    switch (nh) {                                                                                     \
    case 4: attend(q, kb, vb, idx, nv, dconst, scale, scores, room, o, 4); break;                     \
    case 3: attend(q, kb, vb, idx, nv, dconst, scale, scores, room, o, 3); break;                     \
    case 2: attend(q, kb, vb, idx, nv, dconst, scale, scores, room, o, 2); break;                     \
    default: attend(q, kb, vb, idx, nv, dconst, scale, scores, room, o, 1); break;                    \
    }
static void attend_heads(const float *q, const float *kb, const float *vb, const long *idx, long nv, long D,
                         float scale, float *scores, long room, float *o, long nh) {
    if (D == 64) {
        ATTEND_D(64)
    } else if (D == 128) {
        ATTEND_D(128)
    } else {
        ATTEND_D(D)
    }
}

/* Rotary embedding (Su et al. 2021, RoFormer eq. 34) as transformers' Llama applies it: x * cos + rotate_half(x)
 * * sin with rotate_half(x) = (-x[D/2:], x[D/2:]) ... (x2 negated first, then x1), in place on one head. */
static inline void rope_head(float *x, const float *cos, const float *sin, long D) {
    const long half = D / 2;
    float rotated[256];
    for (long i = 0; i < half; i++) rotated[i] = -x[i + half];
    for (long i = half; i < D; i++) rotated[i] = x[i - half];
    for (long i = 0; i < D; i++) x[i] = x[i] * cos[i] + rotated[i] * sin[i];
}

/* One attention block of the engine's layer loop for B ragged rows (their tokens concatenated, N in all).
 *
 * qkv [N, (Hq + 2 Hkv) D]: the fused q/k/v projection, q heads then k then v; rotary embedding is applied in
 * place to q and k with cos, sin [N, D]. Row b's tokens start[b] .. start[b] + size[b] - 1 write their k and v
 * into its slot at cache positions length[b] + t (cache_k / cache_v: the layer's pool, element (s, h, p, d) at
 * s * slot_stride + h * head_stride + p * pos_stride + d: the pool's strides, so the kernel assumes no layout
 * beyond d being contiguous). Query t of row b, head h, sees the slot's positions
 * 0 .. length[b] - 1 and block token u where allowed[allowed_off[b] + t * size[b] + u] != 0 (allowed_off[b] < 0:
 * u <= t, causal), through kv head h / (Hq / Hkv), scaled by scale. out [N, Hq D].
 * Each (row, token, kv head) is one task, computed whole by one thread (attend), so a query's bits depend on
 * its own visible keys only, never on the batch, the block width or the thread count. scratch: MAX_GROUP *
 * room floats per thread, scratch_idx: room longs (room a multiple of 16, at least capacity + 16). */
void specbuild_attention_f32(float *qkv, const float *cos, const float *sin, float *cache_k, float *cache_v,
                             long slot_stride, long head_stride, long pos_stride, long N, long Hq, long Hkv, long D, long capacity,
                             long B, const long *slot, const long *length, const long *start, const long *size,
                             const unsigned char *allowed, const long *allowed_off, float scale, float *out,
                             float *scratch, long *scratch_idx, long room, int num_threads) {
    const long width = (Hq + 2 * Hkv) * D, groups = Hq / Hkv;
    if (num_threads < 1) num_threads = 1;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && N * Hkv > 1)
    {
        /* 1. rotary embedding of q and k, then k and v into the cache */
#pragma omp for schedule(static)
        for (long b = 0; b < B; b++)
            for (long t = 0; t < size[b]; t++) {
                const long n = start[b] + t;
                float *row = qkv + n * width;
                for (long h = 0; h < Hq + Hkv; h++) rope_head(row + h * D, cos + n * D, sin + n * D, D);
                for (long h = 0; h < Hkv; h++) {
                    const long at = slot[b] * slot_stride + h * head_stride + (length[b] + t) * pos_stride;
                    memcpy(cache_k + at, row + (Hq + h) * D, D * sizeof(float));
                    memcpy(cache_v + at, row + (Hq + Hkv + h) * D, D * sizeof(float));
                }
            }
        /* 2. every (row, token, kv head): its visible positions, then its query heads in groups of MAX_GROUP.
         * Tasks run kv head by kv head (task = kvh * N + n), so a thread's share of a k + 1 block covers as few kv
         * heads as it can and reads each one's keys and values from memory once, the other tokens hitting its L2:
         * one row of 8 tokens after 256 positions, SmolLM2, in a whole pass: 2.0-2.1 -> 1.85 ms (2-core Xeon).
         * Which thread runs a task changes nothing in its arithmetic. */
        float *scores = scratch + omp_get_thread_num() * room * MAX_GROUP;
        long *idx = scratch_idx + omp_get_thread_num() * room;
#pragma omp for schedule(static)
        for (long task = 0; task < N * Hkv; task++) {
            const long kvh = task / N, n = task % N;
            long b = 0;
            while (start[b] + size[b] <= n) b++;
            const long t = n - start[b];
            long nv = 0;
            for (long p = 0; p < length[b]; p++) idx[nv++] = p * pos_stride;
            for (long u = 0; u < size[b]; u++) {
                const int seen = allowed_off[b] < 0 ? u <= t : allowed[allowed_off[b] + t * size[b] + u] != 0;
                if (seen) idx[nv++] = (length[b] + u) * pos_stride;
            }
            const long base = slot[b] * slot_stride + kvh * head_stride;
            for (long h0 = kvh * groups; h0 < (kvh + 1) * groups; h0 += MAX_GROUP) {
                const long nh = (kvh + 1) * groups - h0 >= MAX_GROUP ? MAX_GROUP : (kvh + 1) * groups - h0;
                attend_heads(qkv + n * width + h0 * D, cache_k + base, cache_v + base, idx, nv, D, scale, scores, room,
                             out + n * Hq * D + h0 * D, nh);
            }
        }
    }
}

/* SwiGLU's gate (Shazeer 2020; transformers' LlamaMLP: act_fn(gate_proj(x)) * up_proj(x) with SiLU):
 * y[m, i] = g / (1 + exp(-g)) * u for gate_up [M, 2 I] = (g | u) per row (the fused gate/up projection), y [M, I].
 * exp is exp_v16 (exp(-g) for g < -88 saturates at ~1.6e38: y ~ -0). I a multiple of 16. */
void specbuild_silu_mul_f32(const float *gate_up, float *y, long M, long I, int num_threads) {
    const long chunks = I / 16;
    if (num_threads < 1) num_threads = 1;
    /* elementwise, so split anywhere: one thread below 4096 elements (a one-token step), where waking the team costs more */
#pragma omp parallel for num_threads(num_threads) schedule(static) if (num_threads > 1 && M * I >= 4096)
    for (long at = 0; at < M * chunks; at++) {
        const long m = at / chunks, i = (at % chunks) * 16;
        const float *g = gate_up + m * 2 * I, *u = g + I;
        v16 gv, uv;
        memcpy(&gv, g + i, sizeof gv);
        memcpy(&uv, u + i, sizeof uv);
        const v16 e = exp_v16(-gv);
        const v16 r = gv / (e + 1.0f) * uv;
        memcpy(y + m * I + i, &r, sizeof r);
    }
}
