/* BLAKE2b (RFC 7693) as kvtrace's tags use it: a keyed 16-byte digest, of which the tags keep the
 * first TAG_BYTES.  Included by _ctags.c only; tested against hashlib (tests/kvdigest/test_ctags.py). */
#ifndef KVTRACE_BLAKE2B_H
#define KVTRACE_BLAKE2B_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t h[8];
    uint64_t t; /* bytes compressed so far (the high word of the counter is always 0 here) */
    size_t c;   /* bytes waiting in b */
    uint8_t b[128];
} b2b;

#define TAG_BYTES 4
#define DIGEST_BYTES 16

static const uint64_t IV[8] = {
    0x6A09E667F3BCC908ULL, 0xBB67AE8584CAA73BULL, 0x3C6EF372FE94F82BULL, 0xA54FF53A5F1D36F1ULL,
    0x510E527FADE682D1ULL, 0x9B05688C2B3E6C1FULL, 0x1F83D9ABFB41BD6BULL, 0x5BE0CD19137E2179ULL,
};

static const uint8_t SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

#define ROTR64(x, y) (((x) >> (y)) | ((x) << (64 - (y))))
#define G(a, b, c, d, x, y)                \
    do {                                   \
        v[a] = v[a] + v[b] + (x);          \
        v[d] = ROTR64(v[d] ^ v[a], 32);    \
        v[c] = v[c] + v[d];                \
        v[b] = ROTR64(v[b] ^ v[c], 24);    \
        v[a] = v[a] + v[b] + (y);          \
        v[d] = ROTR64(v[d] ^ v[a], 16);    \
        v[c] = v[c] + v[d];                \
        v[b] = ROTR64(v[b] ^ v[c], 63);    \
    } while (0)

static uint64_t load64(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24) |
           ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) | ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static void compress(b2b *s, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= s->t;
    if (last)
        v[14] = ~v[14];
    for (int i = 0; i < 16; i++)
        m[i] = load64(s->b + 8 * i);
    /* the rounds unrolled, so that every message index is a constant (2x faster than a loop) */
#define ROUND(r)                                                   \
    do {                                                           \
        G(0, 4, 8, 12, m[SIGMA[r][0]], m[SIGMA[r][1]]);            \
        G(1, 5, 9, 13, m[SIGMA[r][2]], m[SIGMA[r][3]]);            \
        G(2, 6, 10, 14, m[SIGMA[r][4]], m[SIGMA[r][5]]);           \
        G(3, 7, 11, 15, m[SIGMA[r][6]], m[SIGMA[r][7]]);           \
        G(0, 5, 10, 15, m[SIGMA[r][8]], m[SIGMA[r][9]]);           \
        G(1, 6, 11, 12, m[SIGMA[r][10]], m[SIGMA[r][11]]);         \
        G(2, 7, 8, 13, m[SIGMA[r][12]], m[SIGMA[r][13]]);          \
        G(3, 4, 9, 14, m[SIGMA[r][14]], m[SIGMA[r][15]]);          \
    } while (0)
    ROUND(0);
    ROUND(1);
    ROUND(2);
    ROUND(3);
    ROUND(4);
    ROUND(5);
    ROUND(6);
    ROUND(7);
    ROUND(8);
    ROUND(9);
    ROUND(10);
    ROUND(11);
#undef ROUND
    for (int i = 0; i < 8; i++)
        s->h[i] ^= v[i] ^ v[i + 8];
}

/* BLAKE2 keeps the last block back (it is compressed with the final flag): compress a full
 * buffer only when more input arrives. */
static void update(b2b *s, const uint8_t *in, size_t n) {
    while (n) {
        if (s->c == 128) {
            s->t += 128;
            compress(s, 0);
            s->c = 0;
        }
        size_t k = 128 - s->c;
        if (k > n)
            k = n;
        memcpy(s->b + s->c, in, k);
        s->c += k;
        in += k;
        n -= k;
    }
}

/* The first TAG_BYTES of the 16-byte digest of (a copy of) ``src``, written to ``out``. */
static void final_tag(const b2b *src, uint8_t *out) {
    b2b s = *src;
    s.t += s.c;
    memset(s.b + s.c, 0, 128 - s.c);
    compress(&s, 1);
    for (int i = 0; i < TAG_BYTES; i++)
        out[i] = (uint8_t)(s.h[0] >> (8 * i));
}

#endif
