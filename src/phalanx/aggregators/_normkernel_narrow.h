/* The norm kernel's passes on four-double (256-bit) vectors, for machines without AVX-512. Included by
 * _normkernel.c, which picks these or its sixteen-lane functions once, from the CPU (vector_width()).
 *
 * Why: GCC maps the sixteen-lane vectors of _normkernel.c onto whole registers only with AVX-512. On AVX2 it splits
 * each into pieces that do not fit the sixteen ymm registers, and the passes ran 5-10x slower than one memory pass
 * (docs/benchmarks.md, "The norm kernel on AVX2"). Here the same sixteen lanes are held as four vectors of four:
 * lane k of a sum is element k % 4 of vector k / 4, each lane adds the same values in the same order, and the lanes
 * are added in the same order at the end, so every sum has the bits of the wide function. The maxima compare the
 * same integers (any grouping gives the same maximum), and the exact folds are exact in any order anyway.
 * tests/test_norm_kernel_widths.py runs both widths where the CPU has AVX-512 (this path alone elsewhere); the
 * other suites (test_norm_kernel.py, test_exact_norms.py, test_cge.py) run the width the CPU picks. */

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION_NARROW __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION_NARROW
#endif

typedef float v4f __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
typedef long long v4l __attribute__((vector_size(32)));
typedef unsigned long long v4u __attribute__((vector_size(32)));

/* Four entries widened to float64; float64 entries below 2^-480 in magnitude read as 0 (as WIDEN_f64). */
#define NARROW_f32(dst, src) /* element by element: GCC 12 splits __builtin_convertvector(v4f, v4d) in two */      \
    do {                                                                                                              \
        v4f f_;                                                                                                       \
        memcpy(&f_, (src), sizeof f_);                                                                                \
        (dst) = (v4d){f_[0], f_[1], f_[2], f_[3]};                                                                    \
    } while (0)
#define NARROW_f64(dst, src)                                                                                          \
    do {                                                                                                              \
        v4u b_;                                                                                                       \
        memcpy(&b_, (src), sizeof b_);                                                                                \
        v4u keep_ = ((((b_ >> 52) & 0x7ff) + (2048 - 543)) >> 11) & 1; /* 1 iff the exponent field >= 543 */          \
        (dst) = (v4d)(b_ & (0 - keep_));                                                                              \
    } while (0)

/* Sixteen entries folded into the running maxima m0, m1 of their magnitudes' bits (see IMAX_f32/f64). */
#define SELECT_MAX(a, b)                                                                                              \
    do {                                                                                                              \
        __typeof__(a) m_ = (b) > (a);                                                                                 \
        (a) = ((b) & m_) | ((a) & ~m_);                                                                               \
    } while (0)
#define NMAX_f32(m0, m1, src)                                                                                         \
    do {                                                                                                              \
        v8i b_, c_;                                                                                                   \
        memcpy(&b_, (src), sizeof b_);                                                                                \
        memcpy(&c_, (const float *)(src) + 8, sizeof c_);                                                             \
        b_ &= 0x7fffffff;                                                                                             \
        c_ &= 0x7fffffff;                                                                                             \
        SELECT_MAX(m0, b_);                                                                                           \
        SELECT_MAX(m1, c_);                                                                                           \
    } while (0)
#define NMAX_f64(m0, m1, src)                                                                                         \
    do {                                                                                                              \
        v4l b_[4];                                                                                                    \
        memcpy(b_, (src), sizeof b_);                                                                                 \
        for (int k_ = 0; k_ < 4; k_++) b_[k_] &= 0x7fffffffffffffffLL;                                                \
        SELECT_MAX(b_[0], b_[1]);                                                                                     \
        SELECT_MAX(b_[2], b_[3]);                                                                                     \
        SELECT_MAX(m0, b_[0]);                                                                                        \
        SELECT_MAX(m1, b_[2]);                                                                                        \
    } while (0)
typedef v8i nmax_f32_t;
typedef v4l nmax_f64_t;

/* The largest |x| of the two running maxima and a tail, as a double (as finish_max_f32/f64). */
static double finish_nmax_f32(v8i m0, v8i m1, const float *tail, Py_ssize_t len) {
    int lanes[16];
    memcpy(lanes, &m0, sizeof m0);
    memcpy(lanes + 8, &m1, sizeof m1);
    return max_bits_f32(lanes, 16, tail, len);
}
static double finish_nmax_f64(v4l m0, v4l m1, const double *tail, Py_ssize_t len) {
    long long lanes[8];
    memcpy(lanes, &m0, sizeof m0);
    memcpy(lanes + 4, &m1, sizeof m1);
    return max_bits_f64(lanes, 8, tail, len);
}

/* Sixteen entries from src as four vectors of four float64 (lanes 0-3, 4-7, 8-11, 12-15). */
#define NARROW16(SUFFIX, v0, v1, v2, v3, src)                                                                         \
    do {                                                                                                              \
        NARROW_##SUFFIX(v0, (src));                                                                                   \
        NARROW_##SUFFIX(v1, (src) + 4);                                                                               \
        NARROW_##SUFFIX(v2, (src) + 8);                                                                               \
        NARROW_##SUFFIX(v3, (src) + 12);                                                                              \
    } while (0)

/* The sixteen lanes a0..a3 added in lane order onto s (as the wide functions' `for k < 16: s += acc[k]`). */
static inline double add_lanes(double s, v4d a0, v4d a1, v4d a2, v4d a3) {
    for (int k = 0; k < 4; k++) s += a0[k];
    for (int k = 0; k < 4; k++) s += a1[k];
    for (int k = 0; k < 4; k++) s += a2[k];
    for (int k = 0; k < 4; k++) s += a3[k];
    return s;
}

/* One row's squared norm estimate and largest |x| (sumsq4's per-row result, one row at a time: four rows of
 * four-double accumulators would not fit the registers). */
#define DEFINE_SUMSQ1(T, SUFFIX)                                                                                      \
    MULTIVERSION_NARROW static void sumsq1_##SUFFIX(const T *restrict p, Py_ssize_t len, double *out, double *mx) {  \
        v4d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                                                   \
        nmax_##SUFFIX##_t m0 = {0}, m1 = {0};                                                                         \
        Py_ssize_t j = 0;                                                                                             \
        for (; j + 16 <= len; j += 16) {                                                                              \
            v4d v0, v1, v2, v3;                                                                                       \
            NARROW16(SUFFIX, v0, v1, v2, v3, p + j);                                                                  \
            a0 += v0 * v0;                                                                                            \
            a1 += v1 * v1;                                                                                            \
            a2 += v2 * v2;                                                                                            \
            a3 += v3 * v3;                                                                                            \
            NMAX_##SUFFIX(m0, m1, p + j);                                                                             \
        }                                                                                                             \
        double s = add_lanes(0.0, a0, a1, a2, a3);                                                                    \
        for (Py_ssize_t i = j; i < len; i++) {                                                                        \
            double v = SCALAR_##SUFFIX(p[i]);                                                                         \
            s += v * v;                                                                                               \
        }                                                                                                             \
        *out = s;                                                                                                     \
        *mx = finish_nmax_##SUFFIX(m0, m1, p + j, len - j);                                                           \
    }

/* The largest |x_j| of a row as a double, or a NaN (rowmax_f32/f64). */
#define DEFINE_NARROW_ROW_MAX(T, SUFFIX)                                                                              \
    MULTIVERSION_NARROW static double rowmax_narrow_##SUFFIX(const T *restrict p, Py_ssize_t len) {                  \
        nmax_##SUFFIX##_t m0 = {0}, m1 = {0};                                                                         \
        Py_ssize_t j = 0;                                                                                             \
        for (; j + 16 <= len; j += 16) NMAX_##SUFFIX(m0, m1, p + j);                                                  \
        return finish_nmax_##SUFFIX(m0, m1, p + j, len - j);                                                          \
    }

/* Two folds (fold2_f32/f64): sixteen lanes per accumulator as four vectors of four, then the tail by foldk. */
#define NARROW_FOLD(v, a, b)                                                                                          \
    do {                                                                                                              \
        v4d s_ = (v) * (v);                                                                                           \
        v4d r_ = (s_ + g1) - g1;                                                                                      \
        (a) += r_;                                                                                                    \
        s_ = s_ - r_;                                                                                                 \
        (b) += (s_ + g2) - g2;                                                                                        \
    } while (0)
#define DEFINE_NARROW_FOLD2(T, SUFFIX)                                                                                \
    MULTIVERSION_NARROW static void fold2_narrow_##SUFFIX(const T *restrict p, Py_ssize_t len, double m1, double m2, \
                                                          double *acc) {                                              \
        const v4d g1 = (v4d){0} + m1, g2 = (v4d){0} + m2;                                                             \
        v4d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};                           \
        Py_ssize_t j = 0;                                                                                             \
        for (; j + 16 <= len; j += 16) {                                                                              \
            v4d v0, v1, v2, v3;                                                                                       \
            NARROW16(SUFFIX, v0, v1, v2, v3, p + j);                                                                  \
            NARROW_FOLD(v0, a0, b0);                                                                                  \
            NARROW_FOLD(v1, a1, b1);                                                                                  \
            NARROW_FOLD(v2, a2, b2);                                                                                  \
            NARROW_FOLD(v3, a3, b3);                                                                                  \
        }                                                                                                             \
        const double grid[2] = {m1, m2};                                                                              \
        double tail[2];                                                                                               \
        foldk_##SUFFIX(p + j, len - j, grid, 2, tail);                                                                \
        acc[0] = add_lanes(0.0, a0, a1, a2, a3) + tail[0];                                                            \
        acc[1] = add_lanes(0.0, b0, b1, b2, b3) + tail[1];                                                            \
    }
