/*
 * Coordinate-wise median and trimmed mean of float32 columns by selection, not a sort (issue 37: "selection, not a
 * full sort, where n is large") -- the same bits as the sorting network (_cwkernel.c), or a flag asking for it.
 * MeaMed, which also needs the median's distances, is in _cwselect_meamed.h.
 *
 * Per column of n values (NaN -> +Inf, as the network loads them):
 *   1. a sample of S = 64 values at rows drawn from the call's seed (the same rows for every column), sorted for
 *      eight columns at once by Batcher's network across lanes (by counting, ties by row, for the last columns of a
 *      range), gives for each wanted rank k a bracket [pL, pH]: the sample values SPREAD = 8 sample ranks below and
 *      above k's expected sample rank;
 *   2. one pass over the column counts the values below each bracket, copies the values inside each bracket to a
 *      scratch array (AVX2 compaction: one permutation of eight lanes), and -- trimmed mean -- adds the values
 *      strictly between the two brackets, which are all inside the window;
 *   3. quickselect (pivots: a median of nine values at drawn positions) in each bracket's values finds the rank's
 *      value (lo, hi); the window's values inside the
 *      brackets are those above lo (below hi) plus as many copies of lo (hi) as the window has slots for them.
 * A rank outside its bracket, or brackets that meet, sends the column to quickselect on all its values
 * (whole_column). An infinite bound of the window, a sum not proven exact (below), a zero median in a column with
 * zeros of both signs (which zero the network leaves at the rank is its order, not a value) or a quickselect that
 * meets more than BAD_STEPS partitions keeping over 3/4 of their values sets the column's flag instead, and the
 * caller runs the network on those columns. The seed (a fresh one per call from the caller) changes no value: only
 * which rows are sampled, which pivots are taken, the time and the flags -- so a Byzantine row cannot be placed where
 * the sample or the pivots will be.
 *
 * Same bits. The median is the value(s) at its rank(s), combined as the network does (0.5 a + 0.5 b in double). The
 * trimmed mean is the window's values added in double: the network adds them one sorted position after another from
 * +0.0, this file in another order (eight lanes, then the brackets' parts). Both are the exact sum -- hence equal --
 * whenever every partial sum is exact, which holds when
 *     ceil(log2 L) + e_max - e_min + 24 <= 53
 * (L the window's length; e_max the biased exponent of the window's largest |value|, max(|lo|, |hi|); e_min the
 * biased exponent, at least 1, of the column's smallest non-zero |value|): every float32 value is a multiple of
 * 2^(e_min - 150), every partial sum of at most L of them is below L 2^(e_max - 126) in magnitude, so it is an
 * integer multiple of 2^(e_min - 150) below 2^53 of them -- a double holds it exactly. Copies of lo added as c lo are
 * such a partial sum too. A zero sum is +0.0 either way (both start from +0.0, and x + (-x) = +0.0). A column that
 * fails the condition is flagged: about 0.07 % of Gaussian columns at n = 1,000, f = 200 (benchmarks/cw_select.py,
 * "flagged"; the condition then fails because the column's smallest |value| is below 2^-19 of the window's largest).
 *
 * Cost: one pass, a sample and two selections in about a quarter of the column each, against the network's
 * n log^2 n / 4 compare-exchanges (benchmarks/cw_select.py). The worst case an attacker can force without the seed
 * is flags -- one row of 1e-45 fails the exactness condition in every column it reaches (--tiny-every there): the
 * condition is tested on the brackets' bounds before any selection, a block a quarter flagged starts the back-off in
 * select_columns, and the caller gathers scattered flagged columns. Measured: all columns flagged, the network's
 * time; a fifth, at most 1.1x it (n = 640).
 * Built for AVX2 (target attribute, chosen at run time by `available`); elsewhere `available` is False.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_SELECT 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,popcnt")))
#else
#define HAVE_SELECT 0
#endif

#define SAMPLE 64
#define SPREAD 8      /* sample ranks on each side of a wanted rank's expected sample rank */
#define COLS 128 /* columns transposed at a time */
/* Counting loops over floats vectorise only if the compiler may compare every lane (no -ftrapping-math; no code
 * here reads the floating-point exception flags). */
#if defined(__GNUC__) && !defined(__clang__)
#define COUNTS __attribute__((optimize("no-trapping-math")))
#else
#define COUNTS
#endif
#define SMALL 8      /* quickselect below this: rank by counting */
#define BAD_STEPS 4   /* quickselect partitions keeping > 3/4 of their values before giving up (flag) */
#define MAX_ROWS (1 << 24) /* counts fit an int32 lane, and L copies of a float32 value are an exact double */

#if HAVE_SELECT
static int32_t compact_lut[256][8]; /* lanes whose bit is set first (in order), then the others */

static int sample_pairs[SAMPLE * 16][2]; /* Batcher's odd-even merge sort on SAMPLE wires: 543 compare-exchanges */
static int sample_pair_count;

/* K. E. Batcher, "Sorting networks and their applications", AFIPS 1968: the odd-even merge sort's compare-exchanges
 * for a power of two of wires, in order. */
static void init_sample_network(void) {
    const int n = SAMPLE;
    sample_pair_count = 0;
    for (int p = 1; p < n; p <<= 1)
        for (int k = p; k >= 1; k >>= 1)
            for (int j = k % p; j + k < n; j += 2 * k)
                for (int i = 0; i < k && i + j + k < n; i++)
                    if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) {
                        sample_pairs[sample_pair_count][0] = i + j;
                        sample_pairs[sample_pair_count][1] = i + j + k;
                        sample_pair_count++;
                    }
}

static void init_lut(void) {
    for (int m = 0; m < 256; m++) {
        int idx[8], c = 0;
        for (int i = 0; i < 8; i++)
            if (m >> i & 1) idx[c++] = i;
        for (int i = 0; i < 8; i++)
            if (!(m >> i & 1)) idx[c++] = i;
        for (int i = 0; i < 8; i++) compact_lut[m][i] = idx[i];
    }
}

AVX2 static inline __m256i lut(int mask) { return _mm256_loadu_si256((const __m256i *)compact_lut[mask]); }

/* s0, s1 += the eight float32 lanes of w, in double (lanes 0-3 to s0, 4-7 to s1). */
AVX2 static inline void add_lanes(__m256d *s0, __m256d *s1, __m256 w) {
    *s0 = _mm256_add_pd(*s0, _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
    *s1 = _mm256_add_pd(*s1, _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)));
}

/* The lanes of v whose bit of mask is set, in order, stored at dst[count] (eight floats written); the new count. */
AVX2 static inline Py_ssize_t keep_lanes(float *dst, Py_ssize_t count, __m256 v, int mask) {
    _mm256_storeu_ps(dst + count, _mm256_permutevar8x32_ps(v, lut(mask)));
    return count + __builtin_popcount((unsigned)mask);
}

/* 8 rows x 8 columns of x (row stride ld) into 8 columns x 8 rows of t (column stride tld), NaN -> +Inf. */
AVX2 static inline void transpose8(const float *src, Py_ssize_t ld, float *dst, Py_ssize_t tld) {
    __m256 r[8], t[8], u[8];
    const __m256 inf = _mm256_set1_ps(INFINITY);
    for (int i = 0; i < 8; i++) {
        __m256 v = _mm256_loadu_ps(src + i * ld);
        r[i] = _mm256_blendv_ps(v, inf, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * tld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * tld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

static inline float nan_to_inf(float v) { return v != v ? INFINITY : v; }

/* Columns [j0, j0 + w) of rows [0, n) into t (column c at t + c * tld). */
AVX2 static void load_columns(const float *x, Py_ssize_t n, Py_ssize_t d, Py_ssize_t j0, int w, float *t,
                              Py_ssize_t tld) {
    Py_ssize_t i = 0;
    int c8 = w / 8 * 8;
    for (; i + 8 <= n; i += 8)
        for (int c = 0; c < c8; c += 8) transpose8(x + i * d + j0 + c, d, t + c * tld + i, tld);
    for (Py_ssize_t r = i; r < n; r++)
        for (int c = 0; c < c8; c++) t[c * tld + r] = nan_to_inf(x[r * d + j0 + c]);
    for (int c = c8; c < w; c++)
        for (Py_ssize_t r = 0; r < n; r++) t[c * tld + r] = nan_to_inf(x[r * d + j0 + c]);
}

/* src[0, m) into dst: values < p (le = 0) or <= p (le = 1) first, the others after; returns how many came first. */
AVX2 static Py_ssize_t partition(const float *src, float *dst, Py_ssize_t m, float p, int le) {
    Py_ssize_t lo = 0, hi = m, i = 0;
    const __m256 vp = _mm256_set1_ps(p);
    for (; m - i >= 16; i += 8) { /* 16: the two stores below never cover each other's kept lanes */
        __m256 v = _mm256_loadu_ps(src + i);
        __m256 c = le ? _mm256_cmp_ps(v, vp, _CMP_LE_OQ) : _mm256_cmp_ps(v, vp, _CMP_LT_OQ);
        int mask = _mm256_movemask_ps(c), count = __builtin_popcount((unsigned)mask);
        __m256 w = _mm256_permutevar8x32_ps(v, lut(mask));
        _mm256_storeu_ps(dst + hi - 8, w);
        _mm256_storeu_ps(dst + lo, w);
        lo += count;
        hi -= 8 - count;
    }
    for (; i < m; i++) { /* branch-free: both slots are in the free range [lo, hi); the one not kept is overwritten */
        float v = src[i];
        int first = le ? v <= p : v < p;
        dst[lo] = v;
        dst[hi - 1] = v;
        lo += first;
        hi -= !first;
    }
    return lo;
}

static inline float median3(float a, float b, float c) {
    float lo = a < b ? a : b, hi = a < b ? b : a, m = hi < c ? hi : c;
    return lo > m ? lo : m;
}

/* SplitMix64 (Steele, Lea & Flood, OOPSLA 2014): the call's stream of sample rows and pivot positions. */
static inline uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A position in [0, m) (m < 2^32), from the top 32 bits of the stream. */
static inline Py_ssize_t draw_below(uint64_t *state, Py_ssize_t m) {
    return (Py_ssize_t)(((splitmix64(state) >> 32) * (uint64_t)m) >> 32);
}

/* The value of rank k (0-based) of a[0, m), by counting: the value with #(< v) <= k < #(<= v). */
COUNTS static float rank_by_count(const float *a, Py_ssize_t m, Py_ssize_t k) {
    for (Py_ssize_t i = 0; i < m; i++) {
        float v = a[i];
        Py_ssize_t lt = 0, le = 0;
        for (Py_ssize_t j = 0; j < m; j++) {
            lt += a[j] < v;
            le += a[j] <= v;
        }
        if (lt <= k && k < le) return v;
    }
    return NAN; /* unreachable for 0 <= k < m: the k-th smallest value satisfies it */
}

/* The value of rank k of a[0, m) (a and b: scratch of m + 16 floats, a holds the values; both clobbered), the pivot
 * the median of three medians of three values at positions drawn from rng (an attacker who does not know the call's
 * seed cannot place values where the pivots are taken: expected linear work on any input). Returns 0
 * and sets *out, or -1 at the (BAD_STEPS + 1)-th partition that kept more than 3/4 of its values (an input crafted
 * against the pivots; steps on at most 64 values are not counted). Every step keeps fewer values than it had (the
 * pivot is one of them), and reads them at most twice, so at most 2 (4 + BAD_STEPS + 1) m + 64^2 values are read:
 * the good steps' sizes shrink geometrically (sum below 4 m), the bad ones are at most m each. */
AVX2 static int select_rank(float *a, float *b, Py_ssize_t m, Py_ssize_t k, uint64_t *rng, float *out) {
    int bad = 0;
    while (m > SMALL) {
        Py_ssize_t before = m;
        float v[9];
        for (int q = 0; q < 9; q++) v[q] = a[draw_below(rng, m)];
        float p = median3(median3(v[0], v[1], v[2]), median3(v[3], v[4], v[5]), median3(v[6], v[7], v[8]));
        if (p != p) return -1; /* a NaN would partition nothing off (loads make NaN +Inf: a guard, never met) */
        Py_ssize_t below = partition(a, b, m, p, 0);
        float *t = a;
        a = b;
        b = t;
        if (k < below) {
            m = below;
        } else if (below == 0) { /* p is the least value: split off the values equal to it */
            Py_ssize_t at_most = partition(a, b, m, p, 1);
            if (k < at_most) {
                *out = p;
                return 0;
            }
            t = a;
            a = b + at_most;
            b = t;
            m -= at_most;
            k -= at_most;
        } else {
            a += below;
            m -= below;
            k -= below;
        }
        if (before > 64 && 4 * m > 3 * before && ++bad > BAD_STEPS) return -1;
    }
    *out = rank_by_count(a, m, k);
    return 0;
}

/* The sample's values in order (ties by row: the rank of i is #(s_j < s_i) + #(s_j == s_i, j < i)). */
COUNTS static void sorted_sample(const float *col, const Py_ssize_t *rows, float *sorted) {
    float s[SAMPLE];
    for (int i = 0; i < SAMPLE; i++) s[i] = col[rows[i]];
    for (int i = 0; i < SAMPLE; i++) {
        float v = s[i];
        int r = 0;
        for (int j = 0; j < i; j++) r += s[j] <= v;
        for (int j = i + 1; j < SAMPLE; j++) r += s[j] < v;
        sorted[r] = v;
    }
}

/* The samples of 8 columns [j, j + 8) sorted together, one column per lane (NaN -> +Inf): sorted[c * SAMPLE + r]. */
AVX2 static void sorted_samples8(const float *x, const Py_ssize_t *rows, Py_ssize_t d, Py_ssize_t j, float *sorted) {
    __m256 v[SAMPLE];
    const __m256 inf = _mm256_set1_ps(INFINITY);
    for (int i = 0; i < SAMPLE; i++) {
        __m256 u = _mm256_loadu_ps(x + rows[i] * d + j);
        v[i] = _mm256_blendv_ps(u, inf, _mm256_cmp_ps(u, u, _CMP_UNORD_Q));
    }
    for (int q = 0; q < sample_pair_count; q++) {
        __m256 a = v[sample_pairs[q][0]], b = v[sample_pairs[q][1]];
        v[sample_pairs[q][0]] = _mm256_min_ps(a, b);
        v[sample_pairs[q][1]] = _mm256_max_ps(a, b);
    }
    float lanes[8];
    for (int i = 0; i < SAMPLE; i++) {
        _mm256_storeu_ps(lanes, v[i]);
        for (int c = 0; c < 8; c++) sorted[c * SAMPLE + i] = lanes[c];
    }
}

/* The bracket [*lo, *hi] of sample values around ranks [ka, kb] of n (-inf / +inf past the sample's ends). */
static void bracket(const float *sorted, Py_ssize_t n, Py_ssize_t ka, Py_ssize_t kb, float *lo, float *hi) {
    double ra = (ka + 0.5) * SAMPLE / (double)n - 0.5, rb = (kb + 0.5) * SAMPLE / (double)n - 0.5;
    int a = (int)floor(ra - SPREAD), b = (int)ceil(rb + SPREAD);
    *lo = a < 0 ? -INFINITY : sorted[a];
    *hi = b >= SAMPLE ? INFINITY : sorted[b];
}

AVX2 static inline double hsum(__m256d a, __m256d b) {
    double t[4], u[4];
    _mm256_storeu_pd(t, a);
    _mm256_storeu_pd(u, b);
    return (t[0] + t[1]) + (t[2] + t[3]) + ((u[0] + u[1]) + (u[2] + u[3]));
}

typedef struct {
    Py_ssize_t below1, in1, below2, in2; /* values below / inside each bracket */
    double between;                      /* sum of the values strictly between the brackets */
    uint32_t min_abs_bits;               /* smallest non-zero |value|'s bits, minus 1 (0xffffffff: none) */
} pass_result;

/* One pass: counts, the brackets' values copied to in1 / in2, the sum between them (trimmed mean only), and the
 * smallest non-zero |value|. Bracket 2 unused (in2 == NULL) for the median. */
AVX2 static pass_result bracket_pass(const float *col, Py_ssize_t n, float l1, float h1, float l2, float h2,
                                     float *in1, float *in2) {
    const __m256 vl1 = _mm256_set1_ps(l1), vh1 = _mm256_set1_ps(h1), vl2 = _mm256_set1_ps(l2);
    const __m256 vh2 = _mm256_set1_ps(h2);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), one = _mm256_set1_epi32(1);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    __m256i below1 = _mm256_setzero_si256(), below2 = below1, min_abs = _mm256_set1_epi32(-1);
    Py_ssize_t c1 = 0, c2 = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(col + i);
        __m256 lt1 = _mm256_cmp_ps(v, vl1, _CMP_LT_OQ), le1 = _mm256_cmp_ps(v, vh1, _CMP_LE_OQ);
        below1 = _mm256_sub_epi32(below1, _mm256_castps_si256(lt1));
        int m1 = _mm256_movemask_ps(_mm256_andnot_ps(lt1, le1));
        c1 = keep_lanes(in1, c1, v, m1);
        __m256i bits = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), abs_mask), one);
        min_abs = _mm256_min_epu32(min_abs, bits);
        if (in2 != NULL) {
            __m256 lt2 = _mm256_cmp_ps(v, vl2, _CMP_LT_OQ), le2 = _mm256_cmp_ps(v, vh2, _CMP_LE_OQ);
            below2 = _mm256_sub_epi32(below2, _mm256_castps_si256(lt2));
            int m2 = _mm256_movemask_ps(_mm256_andnot_ps(lt2, le2));
            c2 = keep_lanes(in2, c2, v, m2);
            __m256 w = _mm256_and_ps(v, _mm256_andnot_ps(le1, lt2));
            add_lanes(&s0, &s1, w);
        }
    }
    pass_result r;
    uint32_t b1[8], b2[8], ma[8];
    _mm256_storeu_si256((__m256i *)b1, below1);
    _mm256_storeu_si256((__m256i *)b2, below2);
    _mm256_storeu_si256((__m256i *)ma, min_abs);
    r.below1 = r.below2 = 0;
    r.min_abs_bits = 0xffffffffu;
    for (int j = 0; j < 8; j++) {
        r.below1 += b1[j];
        r.below2 += b2[j];
        if (ma[j] < r.min_abs_bits) r.min_abs_bits = ma[j];
    }
    r.between = hsum(s0, s1);
    for (; i < n; i++) {
        float v = col[i];
        uint32_t bits;
        memcpy(&bits, &v, 4);
        bits = (bits & 0x7fffffffu) - 1u;
        if (bits < r.min_abs_bits) r.min_abs_bits = bits;
        r.below1 += v < l1;
        if (v >= l1 && v <= h1) in1[c1++] = v;
        if (in2 != NULL) {
            r.below2 += v < l2;
            if (v >= l2 && v <= h2) in2[c2++] = v;
            if (v > h1 && v < l2) r.between += v;
        }
    }
    r.in1 = c1;
    r.in2 = c2;
    return r;
}

/* Sum of a[0, m) above t (above = 1) or below t (above = 0), in double; and how many are <= t (>= t). */
AVX2 static double sum_beyond(const float *a, Py_ssize_t m, float t, int above, Py_ssize_t *at_or_short) {
    const __m256 vt = _mm256_set1_ps(t);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    Py_ssize_t i = 0, beyond = 0;
    for (; i + 8 <= m; i += 8) {
        __m256 v = _mm256_loadu_ps(a + i);
        __m256 c = above ? _mm256_cmp_ps(v, vt, _CMP_GT_OQ) : _mm256_cmp_ps(v, vt, _CMP_LT_OQ);
        beyond += __builtin_popcount((unsigned)_mm256_movemask_ps(c));
        __m256 w = _mm256_and_ps(v, c);
        add_lanes(&s0, &s1, w);
    }
    double s = hsum(s0, s1);
    for (; i < m; i++) {
        float v = a[i];
        if (above ? v > t : v < t) {
            s += v;
            beyond++;
        }
    }
    *at_or_short = m - beyond;
    return s;
}

static inline int biased_exponent(float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    int e = (int)((bits >> 23) & 0xff);
    return e < 1 ? 1 : e;
}

static int ceil_log2(Py_ssize_t v) {
    int b = 0;
    while (((Py_ssize_t)1 << b) < v) b++;
    return b;
}

/* Whether the window's sum is exact in double in any order (the header's condition). */
static int exact_in_any_order(Py_ssize_t length, float lo, float hi, uint32_t min_abs_bits) {
    float top = fabsf(lo) > fabsf(hi) ? fabsf(lo) : fabsf(hi);
    if (top == 0.0f || min_abs_bits == 0xffffffffu) return 1; /* only zeros */
    uint32_t least_bits = min_abs_bits + 1u;
    float least;
    memcpy(&least, &least_bits, 4);
    return ceil_log2(length) + biased_exponent(top) - biased_exponent(least) + 24 <= 53;
}

/* The window [k1, k2] of the whole column from its end values lo (rank k1) < hi (rank k2): the values strictly
 * between, plus the copies of lo and hi the window has slots for; and the column's smallest non-zero |value|. */
AVX2 static double window_sum(const float *col, Py_ssize_t n, Py_ssize_t k1, Py_ssize_t k2, float lo, float hi,
                              uint32_t *min_abs_bits) {
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), one = _mm256_set1_epi32(1);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    __m256i le_lo = _mm256_setzero_si256(), lt_hi = le_lo, min_abs = _mm256_set1_epi32(-1);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(col + i);
        __m256 a = _mm256_cmp_ps(v, vlo, _CMP_LE_OQ), b = _mm256_cmp_ps(v, vhi, _CMP_LT_OQ);
        le_lo = _mm256_sub_epi32(le_lo, _mm256_castps_si256(a));
        lt_hi = _mm256_sub_epi32(lt_hi, _mm256_castps_si256(b));
        __m256 w = _mm256_and_ps(v, _mm256_andnot_ps(a, b));
        add_lanes(&s0, &s1, w);
        min_abs = _mm256_min_epu32(min_abs, _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), abs_mask), one));
    }
    uint32_t c1[8], c2[8], ma[8];
    _mm256_storeu_si256((__m256i *)c1, le_lo);
    _mm256_storeu_si256((__m256i *)c2, lt_hi);
    _mm256_storeu_si256((__m256i *)ma, min_abs);
    Py_ssize_t at_most_lo = 0, below_hi = 0;
    uint32_t least = 0xffffffffu;
    for (int j = 0; j < 8; j++) {
        at_most_lo += c1[j];
        below_hi += c2[j];
        if (ma[j] < least) least = ma[j];
    }
    double sum = hsum(s0, s1);
    for (; i < n; i++) {
        float v = col[i];
        uint32_t bits;
        memcpy(&bits, &v, 4);
        bits = (bits & 0x7fffffffu) - 1u;
        if (bits < least) least = bits;
        at_most_lo += v <= lo;
        below_hi += v < hi;
        if (v > lo && v < hi) sum += v;
    }
    *min_abs_bits = least;
    /* values <= lo hold ranks [0, at_most_lo), those >= k1 equal lo; values < hi hold ranks [0, below_hi), the
     * window's ranks from below_hi to k2 hold hi (lo < hi: at_most_lo <= k2 and below_hi > k1) */
    if (at_most_lo > k1) sum += (double)(at_most_lo - k1) * (double)lo;
    if (k2 + 1 > below_hi) sum += (double)(k2 + 1 - below_hi) * (double)hi;
    return sum;
}

/* The median from the values at its ranks, 0.5 a + 0.5 b in double as the network combines them; flagged (1) when
 * it is zero and the column holds zeros of both signs: which zero sits at a rank is then the network's order, not a
 * value, and selection does not reproduce it. */
static int median_of(const float *col, Py_ssize_t n, float va, float vb, float *out) {
    double m = 0.5 * (double)va + 0.5 * (double)vb;
    if (m == 0.0) {
        int negative = 0, positive = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (col[i] == 0.0f) {
                if (signbit(col[i])) negative = 1;
                else positive = 1;
            }
        if (negative && positive) return 1;
    }
    *out = (float)m;
    return 0;
}

/* The mean of `length` copies of v as the network's sum from +0.0 gives it: L v is an exact product, and +0.0 +
 * makes a zero +0.0, as that sum does. */
static inline float mean_of_copies(Py_ssize_t length, float v) {
    return (float)((0.0 + (double)length * (double)v) * (1.0 / (double)length));
}

/* The sum of the k smallest values of buf[0, c) (0 < k <= c) into *sum, the k-th of them into *kth: quickselect
 * (a, b: scratch of c + 16 floats), the values below it, then its copies. 0, or 1 when the quickselect gave up. */
AVX2 static int sum_smallest(const float *buf, Py_ssize_t c, Py_ssize_t k, float *a, float *b, uint64_t *rng,
                             double *sum, float *kth) {
    Py_ssize_t at_least;
    memcpy(a, buf, (size_t)c * sizeof(float));
    if (select_rank(a, b, c, k - 1, rng, kth) != 0) return 1;
    *sum = sum_beyond(buf, c, *kth, 0, &at_least); /* those below the k-th; at_least values are >= it */
    *sum += (double)(k - (c - at_least)) * (double)*kth;
    return 0;
}

/* A trimmed mean's column whose rank fell outside its bracket (or whose brackets meet): quickselect on the whole
 * column. */
AVX2 static int whole_column(const float *col, Py_ssize_t n, Py_ssize_t k1, Py_ssize_t k2, Py_ssize_t length,
                             int check_exact, float *a, float *b, uint64_t *rng, float *out) {
    float lo, hi;
    memcpy(a, col, (size_t)n * sizeof(float));
    if (select_rank(a, b, n, k1, rng, &lo) != 0) return 1;
    memcpy(a, col, (size_t)n * sizeof(float));
    if (k2 == k1) hi = lo;
    else if (select_rank(a, b, n, k2, rng, &hi) != 0) return 1;
    if (isinf(lo) || isinf(hi)) return 1;
    if (!(lo < hi)) { /* lo == hi: the window is `length` copies of lo */
        *out = mean_of_copies(length, lo);
        return 0;
    }
    uint32_t min_abs_bits;
    double sum = window_sum(col, n, k1, k2, lo, hi, &min_abs_bits);
    if (check_exact && !exact_in_any_order(length, lo, hi, min_abs_bits)) return 1;
    *out = (float)(sum * (1.0 / (double)length));
    return 0;
}

/* The value of rank k + 1 of a[0, m) given v, the value of rank k (k + 1 < m): v again if more than k + 1 values
 * are <= v, else the least value above v. */
AVX2 static float next_rank(const float *a, Py_ssize_t m, Py_ssize_t k, float v) {
    const __m256 vv = _mm256_set1_ps(v), inf = _mm256_set1_ps(INFINITY);
    __m256i at_most = _mm256_setzero_si256();
    __m256 least = inf;
    Py_ssize_t i = 0;
    for (; i + 8 <= m; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i), le = _mm256_cmp_ps(x, vv, _CMP_LE_OQ);
        at_most = _mm256_sub_epi32(at_most, _mm256_castps_si256(le));
        least = _mm256_min_ps(least, _mm256_blendv_ps(x, inf, le));
    }
    uint32_t c[8];
    float l[8], above = INFINITY;
    Py_ssize_t count = 0;
    _mm256_storeu_si256((__m256i *)c, at_most);
    _mm256_storeu_ps(l, least);
    for (int j = 0; j < 8; j++) {
        count += c[j];
        if (l[j] < above) above = l[j];
    }
    for (; i < m; i++) {
        if (a[i] <= v) count++;
        else if (a[i] < above) above = a[i];
    }
    return count > k + 1 ? v : above;
}

/* The values *va, *vb of ranks ka <= kb <= ka + 1 (the median's) and the column's smallest non-zero |value|: one
 * pass with a bracket around both ranks, quickselect inside it, or in the whole column when a rank fell outside.
 * 0, or 1 when a quickselect gave up (flag). in1, a, b: scratch of n + 16 floats. */
AVX2 static int rank_pair(const float *col, Py_ssize_t n, Py_ssize_t ka, Py_ssize_t kb, const float *sorted,
                          float *in1, float *a, float *b, uint64_t *rng, float *va, float *vb, uint32_t *min_abs_bits) {
    float l, h;
    bracket(sorted, n, ka, kb, &l, &h);
    pass_result p = bracket_pass(col, n, l, h, 0.0f, 0.0f, in1, NULL);
    *min_abs_bits = p.min_abs_bits;
    const float *from = in1;
    Py_ssize_t m = p.in1, qa = ka - p.below1, qb = kb - p.below1;
    if (qa < 0 || qb >= p.in1) { /* a rank outside the bracket */
        from = col;
        m = n;
        qa = ka;
        qb = kb;
    }
    memcpy(a, from, (size_t)m * sizeof(float));
    if (select_rank(a, b, m, qa, rng, va) != 0) return 1;
    if (qb == qa) {
        *vb = *va;
        return 0;
    }
    *vb = next_rank(from, m, qa, *va); /* qb = qa + 1: one scan, not a second quickselect */
    return 0;
}

#include "_cwselect_meamed.h"

/* One column: *out and 0, or 1 (flag: the caller runs the network). scratch: 4 arrays of n + 16 floats. */
AVX2 static int column(const float *col, Py_ssize_t n, int mode, Py_ssize_t trim, Py_ssize_t length, int check_exact,
                       const float *sorted, float *scratch, uint64_t *rng, float *out) {
    Py_ssize_t stride = n + 16;
    float *in1 = scratch, *in2 = scratch + stride, *a = scratch + 2 * stride, *b = scratch + 3 * stride;
    if (mode == 1) {
        float va, vb;
        uint32_t min_abs_bits;
        if (rank_pair(col, n, (n - 1) / 2, n / 2, sorted, in1, a, b, rng, &va, &vb, &min_abs_bits) != 0) return 1;
        return median_of(col, n, va, vb, out);
    }
    if (mode == 2) return meamed_column(col, n, length, check_exact, sorted, scratch, rng, out);
    Py_ssize_t k1 = trim, k2 = trim + length - 1;
    float l1, h1, l2, h2, lo, hi;
    bracket(sorted, n, k1, k1, &l1, &h1);
    bracket(sorted, n, k2, k2, &l2, &h2);
    if (!(h1 < l2)) return whole_column(col, n, k1, k2, length, check_exact, a, b, rng, out); /* brackets meet */
    pass_result p = bracket_pass(col, n, l1, h1, l2, h2, in1, in2);
    Py_ssize_t q1 = k1 - p.below1, q2 = k2 - p.below2;
    /* |lo| and |hi| are at least the brackets' distances from 0: a sum the condition already rejects with those is
     * flagged before any selection (one tiny value in a column would otherwise cost both selections too) */
    float near1 = l1 > 0.0f ? l1 : (h1 < 0.0f ? -h1 : 0.0f), near2 = l2 > 0.0f ? l2 : (h2 < 0.0f ? -h2 : 0.0f);
    if (check_exact && !isinf(near1) && !isinf(near2) && !exact_in_any_order(length, near1, near2, p.min_abs_bits))
        return 1;
    if (q1 < 0 || q1 >= p.in1 || q2 < 0 || q2 >= p.in2)
        return whole_column(col, n, k1, k2, length, check_exact, a, b, rng, out);
    memcpy(a, in1, (size_t)p.in1 * sizeof(float));
    if (select_rank(a, b, p.in1, q1, rng, &lo) != 0) return 1;
    memcpy(a, in2, (size_t)p.in2 * sizeof(float));
    if (select_rank(a, b, p.in2, q2, rng, &hi) != 0) return 1;
    if (isinf(lo) || isinf(hi)) return 1;
    if (check_exact && !exact_in_any_order(length, lo, hi, p.min_abs_bits)) return 1;
    Py_ssize_t at_most_lo, at_least_hi;
    double sum = p.between;
    sum += sum_beyond(in1, p.in1, lo, 1, &at_most_lo); /* in1's values above lo; at_most_lo of them are <= lo */
    sum += sum_beyond(in2, p.in2, hi, 0, &at_least_hi);
    Py_ssize_t copies_lo = at_most_lo - q1, copies_hi = q2 + 1 - (p.in2 - at_least_hi);
    if (copies_lo > 0) sum += (double)copies_lo * (double)lo;
    if (copies_hi > 0) sum += (double)copies_hi * (double)hi;
    *out = (float)(sum * (1.0 / (double)length));
    return 0;
}

AVX2 static void select_columns(const float *x, Py_ssize_t n, Py_ssize_t d, Py_ssize_t j0, Py_ssize_t j1, int mode,
                                Py_ssize_t trim, Py_ssize_t length, int check_exact, uint64_t seed, float *out,
                                unsigned char *flags, float *t, float *scratch) {
    Py_ssize_t tld = n + 16, rows[SAMPLE];
    float sorted[8 * SAMPLE];
    uint64_t draws = seed;
    for (int i = 0; i < SAMPLE; i++) rows[i] = draw_below(&draws, n); /* the same rows for every range of the call */
    for (int i = 1; i < SAMPLE; i++) /* in memory order */
        for (int j = i; j > 0 && rows[j - 1] > rows[j]; j--) {
            Py_ssize_t r = rows[j];
            rows[j] = rows[j - 1];
            rows[j - 1] = r;
        }
    /* Back-off: after a block with at least a quarter of its columns flagged (rows that defeat the exactness
     * condition, as one row of 1e-45 does everywhere), the next 1, 2, 4, ... 64 blocks are flagged without being
     * tried, so such rows cost about the network's time, not selection's and then the network's; a good block ends
     * the back-off. Honest Gaussian rows flag about 0.07 % of columns. */
    int skip = 0, backoff = 0;
    for (Py_ssize_t c0 = j0; c0 < j1; c0 += COLS) {
        int w = (int)(j1 - c0 < COLS ? j1 - c0 : COLS), flagged = 0;
        if (skip > 0) {
            memset(flags + c0, 1, (size_t)w);
            skip--;
            continue;
        }
        load_columns(x, n, d, c0, w, t, tld);
        for (int c = 0; c < w; c++) {
            if (c % 8 == 0 && c + 8 <= w) sorted_samples8(x, rows, d, c0 + c, sorted);
            const float *mine = sorted + (c % 8) * SAMPLE;
            if (c >= w / 8 * 8) {
                sorted_sample(t + c * tld, rows, sorted);
                mine = sorted;
            }
            uint64_t rng = seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(c0 + c + 1)); /* the column's own stream */
            flags[c0 + c] = (unsigned char)column(t + c * tld, n, mode, trim, length, check_exact, mine, scratch, &rng,
                                                  out + c0 + c);
            flagged += flags[c0 + c];
        }
        if (4 * flagged >= w) {
            backoff = backoff == 0 ? 1 : (backoff < 64 ? 2 * backoff : 64);
            skip = backoff;
        } else {
            backoff = 0;
        }
    }
}
#endif

static PyObject *py_available(PyObject *self, PyObject *noargs) {
#if HAVE_SELECT
    __builtin_cpu_init();
    return PyBool_FromLong(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt"));
#else
    Py_RETURN_FALSE;
#endif
}

/* select(x_ptr, n, d, j0, j1, mode, trim, length, out_ptr, flags_ptr, seed[, check_exact=1]): float32 x (n, d)
 * contiguous; columns [j0, j1); mode 0 (trimmed mean, window [trim, trim + length)), 1 (median) or 2 (MeaMed, trim
 * <= (n - 1) / 2, length = n - trim: _cwselect_meamed.h). Writes out[j] or
 * sets flags[j]. The seed draws the sampled rows and the pivots: the values written do not depend on it (they are
 * the network's), only the time and which columns are flagged. check_exact=0 skips the exactness condition: the
 * tests' mutant, never the rule's call. */
static PyObject *py_select(PyObject *self, PyObject *args) {
    unsigned long long xp, op, fp, seed;
    Py_ssize_t n, d, j0, j1, trim, length;
    int mode, check_exact = 1;
    if (!PyArg_ParseTuple(args, "KnnnninnKKK|i", &xp, &n, &d, &j0, &j1, &mode, &trim, &length, &op, &fp, &seed,
                          &check_exact))
        return NULL;
#if HAVE_SELECT
    if (n < SAMPLE || n > MAX_ROWS || d < 1 || j0 < 0 || j1 > d || j0 > j1 || mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "select: 64 <= n <= 2^24, 0 <= j0 <= j1 <= d and mode 0, 1 or 2");
        return NULL;
    }
    if (mode == 0 && (trim < 0 || length < 1 || trim + length > n)) {
        PyErr_SetString(PyExc_ValueError, "select: the window [trim, trim + length) must lie in [0, n)");
        return NULL;
    }
    if (mode == 2 && (trim < 0 || trim > (n - 1) / 2 || length != n - trim)) {
        PyErr_SetString(PyExc_ValueError, "select: MeaMed needs 0 <= trim <= (n - 1) / 2 and length = n - trim");
        return NULL;
    }
    if (!__builtin_cpu_supports("avx2")) {
        PyErr_SetString(PyExc_RuntimeError, "select: this CPU has no AVX2");
        return NULL;
    }
    if (j1 == j0) Py_RETURN_NONE;
    size_t tld = (size_t)n + 16, cols = (size_t)(j1 - j0 < COLS ? j1 - j0 : COLS); /* d = 1 at n = 2^24: one column */
    float *t = malloc(sizeof(float) * tld * cols), *scratch = malloc(sizeof(float) * tld * 4);
    if (t == NULL || scratch == NULL) {
        free(t);
        free(scratch);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    select_columns((const float *)(uintptr_t)xp, n, d, j0, j1, mode, trim, length, check_exact, (uint64_t)seed,
                   (float *)(uintptr_t)op,
                   (unsigned char *)(uintptr_t)fp, t, scratch);
    Py_END_ALLOW_THREADS
    free(t);
    free(scratch);
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "select: not built for this CPU");
    return NULL;
#endif
}

static PyMethodDef methods[] = {
    {"available", py_available, METH_NOARGS, "Whether select runs on this CPU (x86-64 with AVX2)."},
    {"select", py_select, METH_VARARGS, "Coordinate-wise median / trimmed mean / MeaMed of float32 columns by selection."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cwselect", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cwselect(void) {
#if HAVE_SELECT
    init_lut();
    init_sample_network();
#endif
    return PyModule_Create(&module);
}
