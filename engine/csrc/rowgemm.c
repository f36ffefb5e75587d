/* Row-invariant float32 GEMM for the reference engine: y[M, N] = x[M, K] W[N, K]^T (+ b[N]).
 *
 * Every output element is summed in one order that depends on K only: acc = 0; for k = 0 .. K - 1:
 * acc = fma(x[m, k], W[n, k], acc); then + b[n]. The number of rows M, where a row sits among them, the
 * tile it shares and the thread count change which rows share registers and which thread computes a
 * column block, never that order, so a row gets the same bits alone or in any batch. BLAS GEMMs (MKL,
 * OpenBLAS) pick another kernel, and with it another summation order, for another M (a GEMV at M = 1).
 *
 * The weight is repacked once (specbuild.engine.rowgemm.pack_weight) into column blocks of 16: wp[b][k][l] = W[16 b + l, k],
 * zero past N, so that one vector load gives 16 columns' weights at one k and each column's sum is one
 * SIMD lane (no horizontal sums). A decoding pass (a few rows) streams wp once per tile of up to 6 rows:
 * it is bound by memory bandwidth, which this layout uses better than oneDNN's packed fp32 kernels
 * (SmolLM2-135M, 2-core Xeon, all linears: one row 17.0 ms against 23.4 ms, 64 rows 61 against 73 ms;
 * 256 rows, a prompt, about equal at 200 ms, where both are bound by the FMA units).
 *
 * Built by specbuild.engine.rowgemm with the host's compiler for the host's CPU (-march=native; GCC
 * vector extensions lower to AVX-512, AVX2 or NEON, whatever the CPU has).
 */
#include <math.h>
#include <omp.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));

/* A tile is up to 6 rows by 4 column blocks, or 8 rows by 3 blocks when a pass has 7 or 8 rows (one sweep
 * over the weights instead of two): at most 24 accumulators, plus the weight vectors and a broadcast, in 32
 * vector registers. */
#define MAX_ROWS 8
#define TILE_BLOCKS 4
/* Each column block's weights are a stream of one 64-byte line per k; the tile asks for the line PREFETCH_K
 * steps ahead of the one it loads. The hardware prefetcher alone left the FMAs of a tile of several rows
 * waiting on memory: SmolLM2-135M's linears at 8 rows cost 1.30x one row without this, 1.10-1.13x with it
 * (2-core Xeon; distances of 16 to 64 lines measured alike). It changes no arithmetic. */
#define PREFETCH_K 32

/* rows m0 .. m0 + mm - 1 by column blocks b0 .. b0 + nb - 1 (mm, nb compile-time constants after inlining) */
static inline __attribute__((always_inline)) void tile(const float *x, const float *wp, const float *bias, float *y,
                                                       long N, long K, long m0, long b0, const int mm, const int nb) {
    v16 acc[MAX_ROWS][TILE_BLOCKS];
    for (int i = 0; i < mm; i++)
        for (int j = 0; j < nb; j++) acc[i][j] = (v16){0};
    const float *w = wp + b0 * K * 16, *xr = x + m0 * K;
    const long wstride = K * 16; /* from one column block to the next */
    for (long k = 0; k < K; k++, w += 16, xr++) {
        v16 wv[TILE_BLOCKS];
        for (int j = 0; j < nb; j++) {
            __builtin_prefetch(w + j * wstride + PREFETCH_K * 16, 0, 3);
            wv[j] = *(const v16 *)(w + j * wstride);
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
            for (int l = 0; l < 16 && n0 + l < N; l++) out[l] = bias ? s[l] + bias[n0 + l] : s[l];
        }
}

#define ROW_TILES(nb)                                                                                   \
    for (long m0 = 0; m0 < M; m0 += 6) {                                                                \
        switch (M - m0 >= 6 ? 6 : M - m0) {                                                             \
        case 6: tile(x, wp, bias, y, N, K, m0, b0, 6, nb); break;                                       \
        case 5: tile(x, wp, bias, y, N, K, m0, b0, 5, nb); break;                                       \
        case 4: tile(x, wp, bias, y, N, K, m0, b0, 4, nb); break;                                       \
        case 3: tile(x, wp, bias, y, N, K, m0, b0, 3, nb); break;                                       \
        case 2: tile(x, wp, bias, y, N, K, m0, b0, 2, nb); break;                                       \
        default: tile(x, wp, bias, y, N, K, m0, b0, 1, nb); break;                                      \
        }                                                                                               \
    }

/* x: [M, K], wp: packed [ceil(N / 16), K, 16] (64-byte aligned), bias: [N] or NULL, y: [M, N]; contiguous float32.
 * Each thread takes a contiguous range of column blocks (sizes differing by at most one). */
void specbuild_rowgemm_f32(const float *x, const float *wp, const float *bias, float *y, long M, long N, long K,
                           int num_threads) {
    const long blocks = (N + 15) / 16;
    if (blocks == 0 || M <= 0) return;
    if (num_threads < 1) num_threads = 1;
    if (num_threads > blocks) num_threads = (int)blocks;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        const int team = omp_get_num_threads(), me = omp_get_thread_num();
        const long first = blocks * me / team, last = blocks * (me + 1) / team;
        if (M == 7 || M == 8) {
            for (long b0 = first; b0 < last; b0 += 3) {
                const long m0 = 0;
                switch ((last - b0 >= 3 ? 3 : last - b0) * 10 + M) {
                case 37: tile(x, wp, bias, y, N, K, m0, b0, 7, 3); break;
                case 38: tile(x, wp, bias, y, N, K, m0, b0, 8, 3); break;
                case 27: tile(x, wp, bias, y, N, K, m0, b0, 7, 2); break;
                case 28: tile(x, wp, bias, y, N, K, m0, b0, 8, 2); break;
                case 17: tile(x, wp, bias, y, N, K, m0, b0, 7, 1); break;
                default: tile(x, wp, bias, y, N, K, m0, b0, 8, 1); break;
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
