/* Squared Euclidean row norms of a float32 or float64 matrix, in float64: estimates in one streaming pass
 * (sqnorms), and the definition itself (exact_sqnorms, below).
 *
 * sqnorms is used by phalanx.aggregators._rowops.row_sqnorm_estimates (issue 37: the norm rules within 2.5x one
 * memory pass): its values are *estimates* with a rigorous error bound, never the definition of a norm (that is
 * _rowops.float64_row_norms, which exact_sqnorms computes). Every square of a float32 value is exact in float64;
 * the squares are added in float64 in a fixed order: each row is cut into column blocks of NORM_COLUMNS, a block is
 * summed in LANES4
 * interleaved partial sums (lane k takes columns k, k + LANES4, ...), the lanes are added in order, the tail
 * sequentially, and the blocks' sums are added in order. Summing d non-negative terms in any order errs by at
 * most gamma_{d-1} = (d-1)u/(1-(d-1)u) relatively (Higham, Accuracy and Stability of Numerical Algorithms, 2nd
 * ed., 4.2, Eq. 4.4), which is what _rowops states as the bound; the order is fixed only so that the same input
 * gives the same bits whatever the number of threads.
 *
 * Threads: the (group of four rows, block) tasks are shared out over an OpenMP team of at most `threads` (a static
 * loop), each writing its own partial sums; the partials are then added per row in block order -- the same bits
 * whatever team the runtime grants. Built without OpenMP, the loop runs on the calling thread. The GIL is released
 * meanwhile.
 * The float64 arithmetic is plain C99 (-std=c99: no contraction into FMA), so the AVX-512F, AVX2 and baseline
 * clones add the same values in the same order and give the same bits. The loops use GCC/Clang vector extensions;
 * another compiler fails to build the module, which is optional: torch then computes the same exact norms. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define LANES4 16
#define NORM_COLUMNS 32768

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTIVERSION
#endif

/* GCC/Clang vector extensions: sixteen lanes of float32 (v16f) widened to float64 (v16d); each
 * target_clones clone lowers them to its own registers (the scalar loops did not auto-vectorize inside the clones,
 * and sixteen-lane conversions compile to whole-register ones). Lanes only reorder exact additions (the folds) or
 * a maximum, or are the fixed lanes of the estimates, so they change no bit between clones. */
typedef float v16f __attribute__((vector_size(64)));
typedef double v16d __attribute__((vector_size(128)));
typedef int v16i __attribute__((vector_size(64)));
typedef long long v8l __attribute__((vector_size(64)));

#define WIDEN_f32(dst, src)                                                                                           \
    do {                                                                                                              \
        v16f f_;                                                                                                      \
        memcpy(&f_, (src), sizeof f_);                                                                                \
        (dst) = __builtin_convertvector(f_, v16d);                                                                    \
    } while (0)
#define WIDEN_f64(dst, src)                                                                                           \
    do {                                                                                                              \
        v16u b_;                                                                                                      \
        memcpy(&b_, (src), sizeof b_);                                                                                \
        v16u keep_ = ((((b_ >> 52) & 0x7ff) + (2048 - 543)) >> 11) & 1; /* 1 iff the exponent field >= 543 */         \
        (dst) = (v16d)(b_ & (0 - keep_));                                                                             \
    } while (0)

/* Float64 entries below TINY in magnitude count as 0 (both here and in _rowops): their squares would be subnormal,
 * and subnormal arithmetic is ~10x slower on x86 -- a Byzantine row of 1e-160s made the norm passes 10x slower.
 * Decided on the exponent bits with integer shifts (no floating-point comparison, which the clones did not
 * vectorize, and no arithmetic on a subnormal); with them gone every square is at least 2^-960, and every
 * fold's remainder a multiple of 2^-1012: normal. Float32 entries are never that small (2^-149 at least). */
typedef unsigned long long v16u __attribute__((vector_size(128)));
static inline double flush_tiny1(double v) { return fabs(v) < 0x1p-480 ? 0.0 : v; }
#define SCALAR_f32(v) ((double)(v))
#define SCALAR_f64(v) flush_tiny1(v)

/* The largest of `count` magnitudes' bits and of a tail's, as the float it encodes (widened to a double). */
static double max_bits_f32(const int *lanes, int count, const float *tail, Py_ssize_t len) {
    int best = 0;
    for (int k = 0; k < count; k++) best = lanes[k] > best ? lanes[k] : best;
    for (Py_ssize_t j = 0; j < len; j++) {
        int b;
        memcpy(&b, tail + j, sizeof b);
        b &= 0x7fffffff;
        best = b > best ? b : best;
    }
    float v;
    memcpy(&v, &best, sizeof v);
    return (double)v;
}
static double max_bits_f64(const long long *lanes, int count, const double *tail, Py_ssize_t len) {
    long long best = 0;
    for (int k = 0; k < count; k++) best = lanes[k] > best ? lanes[k] : best;
    for (Py_ssize_t j = 0; j < len; j++) {
        long long b;
        memcpy(&b, tail + j, sizeof b);
        b &= 0x7fffffffffffffffLL;
        best = b > best ? b : best;
    }
    double v;
    memcpy(&v, &best, sizeof v);
    return v;
}

#include "_normkernel_narrow.h"

/* Which functions run: 1, the sixteen-lane ones below (AVX-512: one register per vector); 0, the four-lane ones
 * of _normkernel_narrow.h (AVX2 and the rest). The same bits either way. Set at import from the CPU; tests switch
 * it with vector_width(). */
static int wide_vectors = 0;
static int cpu_has_wide_vectors(void) {
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
#else
    return 0;
#endif
}

/* Largest magnitude by the bits: |x| of an IEEE number, read as a signed integer of its width, orders as the number
 * does, and a NaN reads above +inf; so the result is the largest |x|, or a NaN if the row holds one (as torch's amax
 * of the squares says). IMAX_f32/f64 fold one vector of a row into the running maximum `a`. */
#define IMAX_f32(a, src)                                                                                              \
    do {                                                                                                              \
        v16i b_;                                                                                                      \
        memcpy(&b_, (src), sizeof b_);                                                                                \
        b_ &= 0x7fffffff;                                                                                             \
        v16i m_ = b_ > (a);                                                                                           \
        (a) = (b_ & m_) | ((a) & ~m_);                                                                                \
    } while (0)
#define IMAX_f64(a, src)                                                                                              \
    do {                                                                                                              \
        v8l b_, c_;                                                                                                   \
        memcpy(&b_, (src), sizeof b_);                                                                                \
        memcpy(&c_, (const double *)(src) + 8, sizeof c_);                                                            \
        b_ &= 0x7fffffffffffffffLL;                                                                                   \
        c_ &= 0x7fffffffffffffffLL;                                                                                   \
        v8l m_ = b_ > c_;                                                                                             \
        b_ = (b_ & m_) | (c_ & ~m_);                                                                                  \
        m_ = b_ > (a);                                                                                                \
        (a) = (b_ & m_) | ((a) & ~m_);                                                                                \
    } while (0)
typedef v16i imax_f32_t;
typedef v8l imax_f64_t;

/* The largest |x| of a tail and of the running vector maximum, as a double (see IMAX_f32/f64). */
static double finish_max_f32(v16i a, const float *tail, Py_ssize_t len) {
    int lanes[16];
    memcpy(lanes, &a, sizeof lanes);
    return max_bits_f32(lanes, 16, tail, len);
}
static double finish_max_f64(v8l a, const double *tail, Py_ssize_t len) {
    long long lanes[8];
    memcpy(lanes, &a, sizeof lanes);
    return max_bits_f64(lanes, 8, tail, len);
}

/* Four rows at once (four streams in flight, as a column sum has); each row's sum depends on that row alone: its
 * LANES4 = 16 lanes (lane k takes columns k, k + 16, ...), then the lanes added in order,
 * then the tail in order. A group of fewer than four rows repeats its last row's pointer (the repeated sums are
 * dropped), so a row's bits do not depend on its neighbours. Each row's largest |x| comes out too (mx[4]: exact,
 * or a NaN; IMAX_f32/f64). */
#define DEFINE_SUMSQ4(T, SUFFIX)                                                                                      \
    MULTIVERSION static void sumsq4_##SUFFIX(const T *restrict p0, const T *restrict p1, const T *restrict p2,      \
                                             const T *restrict p3, Py_ssize_t len, double *out, double *mx) {      \
        const T *restrict p[4] = {p0, p1, p2, p3};                                                                    \
        v16d acc[4] = {{0}, {0}, {0}, {0}};                                                                           \
        imax_##SUFFIX##_t big[4] = {{0}, {0}, {0}, {0}};                                                              \
        Py_ssize_t j = 0;                                                                                             \
        for (; j + LANES4 <= len; j += LANES4)                                                                        \
            for (int r = 0; r < 4; r++) {                                                                             \
                v16d v;                                                                                               \
                WIDEN_##SUFFIX(v, p[r] + j);                                                                          \
                acc[r] += v * v;                                                                                      \
                IMAX_##SUFFIX(big[r], p[r] + j);                                                                      \
            }                                                                                                         \
        for (int r = 0; r < 4; r++) {                                                                                 \
            double s = 0.0;                                                                                           \
            for (int k = 0; k < LANES4; k++) s += acc[r][k];                                                          \
            for (Py_ssize_t i = j; i < len; i++) {                                                                    \
                double v = SCALAR_##SUFFIX(p[r][i]);                                                                  \
                s += v * v;                                                                                           \
            }                                                                                                         \
            out[r] = s;                                                                                               \
            mx[r] = finish_max_##SUFFIX(big[r], p[r] + j, len - j);                                                   \
        }                                                                                                             \
    }

DEFINE_SUMSQ4(float, f32)
DEFINE_SUMSQ4(double, f64)
DEFINE_SUMSQ1(float, f32)
DEFINE_SUMSQ1(double, f64)

/* sqnorms(x_ptr, n, d, row_stride, is_double, out_ptr, threads[, max_ptr]): out[i] = sum_j x[i, j]^2 in float64
 * (n doubles); row_stride in elements, the columns contiguous. With max_ptr, also max[i] = max_j x[i, j]^2 in
 * float64, exactly (found in the same pass). */
static PyObject *py_sqnorms(PyObject *self, PyObject *args) {
    Py_ssize_t xp, n, d, stride, op, mp = 0;
    int is_double, threads;
    if (!PyArg_ParseTuple(args, "nnnnpni|n", &xp, &n, &d, &stride, &is_double, &op, &threads, &mp)) return NULL;
    if (n < 1 || d < 1 || stride < d || threads < 1 || !xp || !op) {
        PyErr_SetString(PyExc_ValueError, "_normkernel.sqnorms: invalid arguments");
        return NULL;
    }
    Py_ssize_t blocks = (d + NORM_COLUMNS - 1) / NORM_COLUMNS;
    double *part = (double *)malloc((size_t)n * (size_t)blocks * sizeof(double) * (mp ? 2 : 1));
    if (!part) return PyErr_NoMemory();
    double *part_max = mp ? part + (size_t)n * (size_t)blocks : NULL, *max_out = (double *)mp;
    double *out = (double *)op;
    const int wide = wide_vectors; /* read once: vector_width() may switch it from another Python thread */
    Py_ssize_t groups = (n + 3) / 4, tasks = (wide ? groups : n) * blocks;
    Py_BEGIN_ALLOW_THREADS
    if (!wide) { /* (row, block) tasks in memory order: each thread streams one contiguous range */
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
        for (Py_ssize_t t = 0; t < tasks; t++) {
            Py_ssize_t i = t / blocks, b = t % blocks;
            Py_ssize_t j0 = b * NORM_COLUMNS, len = d - j0 < NORM_COLUMNS ? d - j0 : NORM_COLUMNS;
            double ignored, *pm = part_max ? part_max + t : &ignored;
            if (is_double) sumsq1_f64((const double *)xp + i * stride + j0, len, part + t, pm);
            else sumsq1_f32((const float *)xp + i * stride + j0, len, part + t, pm);
        }
    } else {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
        for (Py_ssize_t t = 0; t < tasks; t++) {
            Py_ssize_t g = t / blocks, b = t % blocks;
            Py_ssize_t j0 = b * NORM_COLUMNS, len = d - j0 < NORM_COLUMNS ? d - j0 : NORM_COLUMNS;
            Py_ssize_t r[4];
            double s4[4], m4[4];
            for (int k = 0; k < 4; k++) r[k] = 4 * g + k < n ? 4 * g + k : n - 1;
            if (is_double) {
                const double *x = (const double *)xp + j0;
                sumsq4_f64(x + r[0] * stride, x + r[1] * stride, x + r[2] * stride, x + r[3] * stride, len, s4, m4);
            } else {
                const float *x = (const float *)xp + j0;
                sumsq4_f32(x + r[0] * stride, x + r[1] * stride, x + r[2] * stride, x + r[3] * stride, len, s4, m4);
            }
            for (int k = 0; k < 4 && 4 * g + k < n; k++) {
                part[(4 * g + k) * blocks + b] = s4[k];
                if (part_max) part_max[(4 * g + k) * blocks + b] = m4[k];
            }
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        double s = 0.0, m = 0.0;
        for (Py_ssize_t b = 0; b < blocks; b++) s += part[i * blocks + b];
        out[i] = s;
        for (Py_ssize_t b = 0; part_max && b < blocks && m == m; b++) { /* a NaN block makes the row's NaN */
            double pm = part_max[i * blocks + b];
            m = (pm != pm || pm > m) ? pm : m;
        }
        if (max_out) max_out[i] = m * m;
    }
    Py_END_ALLOW_THREADS
    free(part);
    Py_RETURN_NONE;
}

/* ---- The definition of a float64 row norm: exact sums on pre-rounded grids (no order, no thread count) ----
 *
 * exact_sqnorms computes, bit for bit, what _rowops.float64_row_norms computes with torch (see its docstring for
 * the statement and the proof): with s_j = x_j^2 in float64, m = max_j s_j = f 2^e (frexp, f in [1/2, 1)), L the
 * headroom bits (d <= 2^L) and K folds, fold k pre-rounds the remainder onto the grid of M_k = 1.5 * 2^P_k
 * (P_1 = e + L + 1, P_k = P_{k-1} + L - 51, each at least GRID_FLOOR): r = (s + M_k) - M_k, s -= r, A_k += r.
 * Every r of fold k is a multiple of 2^(P_k - 52) and the |A_k| stay below 2^(P_k - 1), so each A_k is exact
 * whatever the order of its additions (Demmel & Nguyen, "Fast reproducible floating-point summation", ARITH 2013,
 * the pre-rounding idea). The squared norm is the float64 sum A_1 + ... + A_K in that order; a row with
 * P_1 > 1023 (or a non-finite m) gets +inf (NaN for NaN). Float64 entries below 2^-480 count as 0 (WIDEN_f64,
 * SCALAR_f64); m is taken from the row as it is, on both paths. */
#define GRID_FLOOR (-1000)
#define MAX_FOLDS 8

/* The largest |x_j| of a row as a double, or a NaN (see IMAX_f32/f64). */
#define DEFINE_ROW_MAX(T, SUFFIX)                                                                                     \
    MULTIVERSION static double rowmax_##SUFFIX(const T *restrict p, Py_ssize_t len) {                                 \
        imax_##SUFFIX##_t a = {0};                                                                                    \
        Py_ssize_t j = 0;                                                                                             \
        for (; j + 16 <= len; j += 16) IMAX_##SUFFIX(a, p + j);                                                       \
        return finish_max_##SUFFIX(a, p + j, len - j);                                                                \
    }

DEFINE_ROW_MAX(float, f32)
DEFINE_ROW_MAX(double, f64)
DEFINE_NARROW_ROW_MAX(float, f32)
DEFINE_NARROW_ROW_MAX(double, f64)

/* Any number of folds (d > 2^24, and fold2's tail), element by element. */
#define DEFINE_FOLDK(T, SUFFIX)                                                                                       \
    static void foldk_##SUFFIX(const T *restrict p, Py_ssize_t len, const double *m, int folds, double *acc) {        \
        for (int k = 0; k < folds; k++) acc[k] = 0.0;                                                                 \
        for (Py_ssize_t j = 0; j < len; j++) {                                                                        \
            double v = SCALAR_##SUFFIX(p[j]);                                                                         \
            double s = v * v;                                                                                         \
            for (int k = 0; k < folds; k++) {                                                                         \
                double r = (s + m[k]) - m[k];                                                                         \
                acc[k] += r;                                                                                          \
                s = s - r;                                                                                            \
            }                                                                                                         \
        }                                                                                                             \
    }

/* Two folds (d <= 2^24): sixteen lanes per accumulator, then the tail by foldk (exact sums, any order). */
#define DEFINE_FOLD2(T, SUFFIX)                                                                                       \
    MULTIVERSION static void fold2_##SUFFIX(const T *restrict p, Py_ssize_t len, double m1, double m2, double *acc) { \
        const v16d g1 = (v16d){0} + m1, g2 = (v16d){0} + m2;                                                          \
        v16d a1 = {0}, a2 = {0};                                                                                      \
        Py_ssize_t j = 0;                                                                                             \
        for (; j + 16 <= len; j += 16) {                                                                              \
            v16d v;                                                                                                   \
            WIDEN_##SUFFIX(v, p + j);                                                                                 \
            v16d s = v * v;                                                                                           \
            v16d r = (s + g1) - g1;                                                                                   \
            a1 += r;                                                                                                  \
            s = s - r;                                                                                                \
            a2 += (s + g2) - g2;                                                                                      \
        }                                                                                                             \
        double s1 = 0.0, s2 = 0.0;                                                                                    \
        for (int k = 0; k < 16; k++) {                                                                                \
            s1 += a1[k];                                                                                              \
            s2 += a2[k];                                                                                              \
        }                                                                                                             \
        const double grid[2] = {m1, m2};                                                                              \
        double tail[2];                                                                                               \
        foldk_##SUFFIX(p + j, len - j, grid, 2, tail);                                                                \
        acc[0] = s1 + tail[0];                                                                                        \
        acc[1] = s2 + tail[1];                                                                                        \
    }

DEFINE_FOLDK(float, f32)
DEFINE_FOLDK(double, f64)
DEFINE_FOLD2(float, f32)
DEFINE_FOLD2(double, f64)
DEFINE_NARROW_FOLD2(float, f32)
DEFINE_NARROW_FOLD2(double, f64)

static double exact_row(const void *row, int is_double, Py_ssize_t d, int headroom, int folds, double known_max) {
    double m = known_max;
    if (!(m >= 0.0)) { /* not given (or NaN, which it finds again): find it */
        if (wide_vectors) m = is_double ? rowmax_f64((const double *)row, d) : rowmax_f32((const float *)row, d);
        else m = is_double ? rowmax_narrow_f64((const double *)row, d) : rowmax_narrow_f32((const float *)row, d);
        m = m * m;
    }
    if (m != m) return m; /* the row holds a NaN */
    if (m > DBL_MAX) return (double)INFINITY;
    int e;
    frexp(m, &e);
    int p = e + headroom + 1;
    if (p > 1023) return (double)INFINITY;
    double grid[MAX_FOLDS], acc[MAX_FOLDS];
    for (int k = 0; k < folds; k++) {
        if (p < GRID_FLOOR) p = GRID_FLOOR;
        grid[k] = ldexp(1.5, p);
        p += headroom - 51;
    }
    if (folds == 2 && !wide_vectors) {
        if (is_double) fold2_narrow_f64((const double *)row, d, grid[0], grid[1], acc);
        else fold2_narrow_f32((const float *)row, d, grid[0], grid[1], acc);
    } else if (folds == 2) {
        if (is_double) fold2_f64((const double *)row, d, grid[0], grid[1], acc);
        else fold2_f32((const float *)row, d, grid[0], grid[1], acc);
    } else if (is_double) {
        foldk_f64((const double *)row, d, grid, folds, acc);
    } else {
        foldk_f32((const float *)row, d, grid, folds, acc);
    }
    double total = acc[0];
    for (int k = 1; k < folds; k++) total += acc[k];
    return total;
}

/* exact_sqnorms(x_ptr, n, d, row_stride, is_double, rows_ptr, n_rows, headroom, folds, out_ptr, threads[, max_ptr]):
 * out[i] = the defined squared norm of row rows[i] (rows_ptr: int64 indices, or 0 for rows 0..n-1); max_ptr: the
 * rows' largest squares as sqnorms gives them (n_rows doubles, exact), which saves the pass that finds them. */
static PyObject *py_exact_sqnorms(PyObject *self, PyObject *args) {
    Py_ssize_t xp, n, d, stride, rp, n_rows, op, mp = 0;
    int is_double, headroom, folds, threads;
    if (!PyArg_ParseTuple(args, "nnnnpnniini|n", &xp, &n, &d, &stride, &is_double, &rp, &n_rows, &headroom, &folds,
                          &op, &threads, &mp))
        return NULL;
    if (n < 1 || d < 1 || stride < d || n_rows < 0 || threads < 1 || !xp || !op || headroom < 1 || headroom > 40 ||
        ((Py_ssize_t)1 << headroom) < d || folds < 2 || folds > MAX_FOLDS) {
        PyErr_SetString(PyExc_ValueError, "_normkernel.exact_sqnorms: invalid arguments");
        return NULL;
    }
    const long long *rows = (const long long *)rp;
    for (Py_ssize_t i = 0; rows && i < n_rows; i++)
        if (rows[i] < 0 || rows[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "_normkernel.exact_sqnorms: row index out of range");
            return NULL;
        }
    double *out = (double *)op;
    size_t width = is_double ? sizeof(double) : sizeof(float);
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
#endif
    for (Py_ssize_t i = 0; i < n_rows; i++) {
        Py_ssize_t r = rows ? (Py_ssize_t)rows[i] : i;
        out[i] = exact_row((const char *)xp + (size_t)r * (size_t)stride * width, is_double, d, headroom, folds,
                           mp ? ((const double *)mp)[i] : -1.0);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---- Denormals are zero, on every thread of the OpenMP team (the one torch and its BLAS run on) ----
 *
 * denormals_zero(threads) -> saved: sets the x86 MXCSR bits FTZ (results that would be subnormal are 0) and DAZ
 * (subnormal operands read as 0) on every thread of an OpenMP team of `threads` -- the calling thread is thread 0,
 * the others are the pool torch's intra-op loops and MKL's products run on (this module is imported after torch, so
 * it shares torch's libgomp) -- and returns each thread's previous FTZ/DAZ bits, indexed by thread number, as bytes.
 * denormals_restore(saved) puts them back, thread by thread (libgomp gives a team of the same size the same pool
 * threads in the same order). denormals_zero_threads(threads) -> how many threads of such a team have both bits set
 * (for the tests). Elsewhere than x86-64 they do nothing (saved is empty; the count is 0). */
#define MAX_TEAM 1024
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define MXCSR_FTZ_DAZ 0x8040u
static unsigned int swap_ftz_daz(unsigned int bits) {
    unsigned int c = _mm_getcsr();
    _mm_setcsr((c & ~MXCSR_FTZ_DAZ) | (bits & MXCSR_FTZ_DAZ));
    return c & MXCSR_FTZ_DAZ;
}
static int has_ftz_daz(void) { return (_mm_getcsr() & MXCSR_FTZ_DAZ) == MXCSR_FTZ_DAZ; }
#define HAVE_MXCSR 1
#else
static unsigned int swap_ftz_daz(unsigned int bits) { (void)bits; return 0; }
static int has_ftz_daz(void) { return 0; }
#define HAVE_MXCSR 0
#endif

static PyObject *py_denormals_zero(PyObject *self, PyObject *args) {
    int threads;
    if (!PyArg_ParseTuple(args, "i", &threads)) return NULL;
    if (threads < 1 || threads > MAX_TEAM) {
        PyErr_SetString(PyExc_ValueError, "_normkernel.denormals_zero: threads must be in 1..1024");
        return NULL;
    }
    if (!HAVE_MXCSR) return PyBytes_FromStringAndSize(NULL, 0);
    unsigned short saved[MAX_TEAM];
    int team = 1;
    /* The caller's bits change inside the parallel region, not before it: the first region of a process starts the
     * pool's threads, and a new thread starts with its creator's MXCSR, so a caller that had set the modes first
     * would hand them to threads that then "saved" them as their previous state and kept them after the restore. */
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int i = omp_get_thread_num(); /* thread 0 is the caller */
            saved[i] = (unsigned short)swap_ftz_daz(MXCSR_FTZ_DAZ);
#pragma omp single
            team = omp_get_num_threads();
        }
    } else
#endif
        saved[0] = (unsigned short)swap_ftz_daz(MXCSR_FTZ_DAZ);
    return PyBytes_FromStringAndSize((const char *)saved, (Py_ssize_t)team * (Py_ssize_t)sizeof(unsigned short));
}

static PyObject *py_denormals_restore(PyObject *self, PyObject *args) {
    const char *buf;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "y#", &buf, &len)) return NULL;
    if (len % (Py_ssize_t)sizeof(unsigned short) || len / (Py_ssize_t)sizeof(unsigned short) > MAX_TEAM) {
        PyErr_SetString(PyExc_ValueError, "_normkernel.denormals_restore: not a saved state");
        return NULL;
    }
    int team = (int)(len / (Py_ssize_t)sizeof(unsigned short));
    if (team == 0) Py_RETURN_NONE;
    unsigned short saved[MAX_TEAM];
    memcpy(saved, buf, (size_t)len);
    swap_ftz_daz(saved[0]);
#ifdef _OPENMP
    if (team > 1) {
#pragma omp parallel num_threads(team)
        {
            int i = omp_get_thread_num();
            if (i > 0 && i < team) swap_ftz_daz(saved[i]);
        }
    }
#endif
    Py_RETURN_NONE;
}

static PyObject *py_denormals_zero_threads(PyObject *self, PyObject *args) {
    int threads, count = 0;
    if (!PyArg_ParseTuple(args, "i", &threads)) return NULL;
    if (threads < 1 || threads > MAX_TEAM) {
        PyErr_SetString(PyExc_ValueError, "_normkernel.denormals_zero_threads: threads must be in 1..1024");
        return NULL;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : count)
    count += has_ftz_daz();
#else
    count = has_ftz_daz();
#endif
    return PyLong_FromLong(count);
}

/* vector_width(w=0) -> the width in use before the call (16 or 4 float64 lanes per vector); w = 4 or 16 switches
 * (16 only where the CPU has AVX-512: ValueError elsewhere). The bits are the same either way (for the tests). */
static PyObject *py_vector_width(PyObject *self, PyObject *args) {
    int w = 0, before = wide_vectors ? 16 : 4;
    if (!PyArg_ParseTuple(args, "|i", &w)) return NULL;
    if (w == 16 && !cpu_has_wide_vectors()) {
        PyErr_SetString(PyExc_ValueError, "_normkernel.vector_width: 16 needs AVX-512F, which this CPU lacks");
        return NULL;
    }
    if (w != 0 && w != 4 && w != 16) {
        PyErr_SetString(PyExc_ValueError, "_normkernel.vector_width: w must be 0 (ask), 4 or 16");
        return NULL;
    }
    if (w) wide_vectors = w == 16;
    return PyLong_FromLong(before);
}

static PyMethodDef methods[] = {
    {"sqnorms", py_sqnorms, METH_VARARGS, "Squared row norms summed in float64, one pass (see module source)."},
    {"exact_sqnorms", py_exact_sqnorms, METH_VARARGS, "The defined float64 squared row norms (see module source)."},
    {"denormals_zero", py_denormals_zero, METH_VARARGS, "Set FTZ/DAZ on the OpenMP team, return its state (source)."},
    {"denormals_restore", py_denormals_restore, METH_VARARGS, "Put the team's FTZ/DAZ state back (see source)."},
    {"denormals_zero_threads", py_denormals_zero_threads, METH_VARARGS, "Threads with FTZ/DAZ set (see source)."},
    {"vector_width", py_vector_width, METH_VARARGS, "The float64 lanes per vector in use; switch them (source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_normkernel", "Float64 squared row norms in one pass.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__normkernel(void) {
    wide_vectors = cpu_has_wide_vectors();
    return PyModule_Create(&module);
}
