/* Prototype, not built into the engine: attention scores with the keys stored in blocks of 16 positions x D
 * ([blk][d][16]), so that one query's scores of 16 keys are one chain of multiply-adds over d (no lane shuffles),
 * against the engine's kernel (attend, keys [pos][D]) on the same query group (3 query heads sharing a kv head,
 * D = 64), one thread. Its softmax and weighted sum of values are a copy of attend's at aba1714 (attend does
 * q k, softmax and p v in one function, so only its scoring could not be swapped without a copy).
 *
 * Built against engine/csrc/rowgemm.c at aba1714 (included for exp_v16 and attend):
 *   gcc -O3 -march=native -ffp-contract=fast -fno-math-errno -fopenmp attention_blocked_keys_proto.c -o proto -lm
 *   ./proto 256; ./proto 1024; NOGATHER=1 ./proto 256     (NOGATHER: skip the gather of visible positions)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "../../../engine/csrc/rowgemm.c"

/* ---- variant T: keys blocked [blk][d][16] ---- */
static inline __attribute__((always_inline)) void qk_blocks(const float *q, const float *kt, long nblk, const long D,
                                                            float scale, float *sc, long room, const int nh, const int nb) {
    /* nb blocks starting at kt (each D*16 floats) */
    v16 acc[4][3];
    for (int h = 0; h < nh; h++)
        for (int j = 0; j < nb; j++) {
            const v16 kv = *(const v16 *)(kt + j * D * 16);
            const float s = q[h * D];
            acc[h][j] = (v16){s,s,s,s,s,s,s,s,s,s,s,s,s,s,s,s} * kv;
        }
    for (long d = 1; d < D; d++) {
        v16 kv[3];
        for (int j = 0; j < nb; j++) kv[j] = *(const v16 *)(kt + j * D * 16 + d * 16);
        for (int h = 0; h < nh; h++) {
            const float s = q[h * D + d];
            const v16 qb = {s,s,s,s,s,s,s,s,s,s,s,s,s,s,s,s};
            for (int j = 0; j < nb; j++) acc[h][j] = acc[h][j] + qb * kv[j];
        }
    }
    const v16 sv = {scale,scale,scale,scale,scale,scale,scale,scale,scale,scale,scale,scale,scale,scale,scale,scale};
    for (int h = 0; h < nh; h++)
        for (int j = 0; j < nb; j++) { v16 r = acc[h][j] * sv; memcpy(sc + h * room + j * 16, &r, sizeof r); }
}

static inline __attribute__((always_inline)) void attend_t(const float *q, const float *ktbase, const float *vbase,
                                                         const long *idx, long nv, long nphys, const long D, float scale,
                                                         float *scores, float *phys, long room, float *out, const int nh) {
    const long dv = D / 16;
    const long nblk = (nphys + 15) / 16;
    long b = 0;
    for (; b + 3 <= nblk; b += 3) qk_blocks(q, ktbase + b * D * 16, 3, D, scale, phys + b * 16, room, nh, 3);
    if (nblk - b == 2) qk_blocks(q, ktbase + b * D * 16, 2, D, scale, phys + b * 16, room, nh, 2);
    else if (nblk - b == 1) qk_blocks(q, ktbase + b * D * 16, 1, D, scale, phys + b * 16, room, nh, 1);
    /* visible order */
    if (scores != phys) for (int h = 0; h < nh; h++) for (long i = 0; i < nv; i++) scores[h * room + i] = phys[h * room + idx[i]];
    const long padded = (nv + 15) & ~15L;
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
        for (int i = 0; i < 16; i++) maximum = lanes[i] > maximum ? lanes[i] : maximum;
        for (long i = nv; i < padded; i++) sc[i] = maximum;
        v16 sum = (v16){0};
        for (long g = 0; g < padded; g += 16) {
            v16 x;
            memcpy(&x, sc + g, sizeof x);
            x = exp_v16(x - maximum);
            if (g + 16 > nv) {
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
        const float *vr = vbase + idx[i] * D;
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

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

int main(int argc, char **argv) {
    const long D = 64, nh = 3, L = argc > 1 ? atol(argv[1]) : 256, reps = 20000;
    const long C = L + 16, room = C + 16;
    float *k = aligned_alloc(64, C * D * 4), *kt = aligned_alloc(64, C * D * 4), *v = aligned_alloc(64, C * D * 4);
    float *q = aligned_alloc(64, nh * D * 4), *sc = aligned_alloc(64, 4 * room * 4), *ph = aligned_alloc(64, 4 * room * 4);
    float *o1 = aligned_alloc(64, nh * D * 4), *o2 = aligned_alloc(64, nh * D * 4);
    long *idx = malloc(room * 8);
    srand(1);
    for (long i = 0; i < C * D; i++) { k[i] = rand() / (float)RAND_MAX - .5f; v[i] = rand() / (float)RAND_MAX - .5f; }
    for (long p = 0; p < C; p++) for (long d = 0; d < D; d++) kt[(p / 16) * D * 16 + d * 16 + p % 16] = k[p * D + d];
    for (long i = 0; i < nh * D; i++) q[i] = rand() / (float)RAND_MAX - .5f;
    long nv = L + 1;
    for (long i = 0; i < nv; i++) idx[i] = i;
    double best1 = 1e9, best2 = 1e9;
    for (int round = 0; round < 5; round++) {
        double t = now();
        for (long r = 0; r < reps; r++) attend(q, k, v, idx, nv, 64, 0.125f, sc, room, o1, 3);
        double a = (now() - t) / reps;
        t = now();
        for (long r = 0; r < reps; r++) attend_t(q, kt, v, idx, nv, nv, 64, 0.125f, sc, getenv("NOGATHER") ? sc : ph, room, o2, 3);
        double b = (now() - t) / reps;
        if (a < best1) best1 = a; if (b < best2) best2 = b;
    }
    double md = 0; for (long i = 0; i < nh * D; i++) { double e = fabs(o1[i] - o2[i]); if (e > md) md = e; }
    printf("L=%ld  current %.2f us (%.2f cyc/head-key at 2.6GHz)  transposed %.2f us (%.2f)  maxdiff %.2e\n", L,
           best1 * 1e6, best1 * 2.6e9 / (nh * nv), best2 * 1e6, best2 * 2.6e9 / (nh * nv), md);
    return 0;
}
