/*
 * Coordinate-wise window means with a branch-free sorting network, vectorised across coordinates.
 *
 * For a block of B coordinates, the n values of each coordinate are copied into a local (n, B) buffer (NaN -> +Inf),
 * sorted by Batcher's odd-even merge sort network (a fixed list of compare-exchange pairs, K. E. Batcher, AFIPS
 * 1968) applied to whole rows of the block -- each compare-exchange is a SIMD min/max over B lanes -- and the mean
 * of a window of sorted positions is written out:
 *   mode 0 (trimmed mean): positions [trim, trim + length)
 *   mode 1 (median):       positions [(n-1)/2, (n-1)/2 + length), length 1 (odd n) or 2 (even n)
 *   mode 2 (MeaMed):       the n - trim values closest to the median: drop, trim times, the end farther from it.
 * Optionally each row's contribution (its share of the window, ties sharing their slots equally) is accumulated.
 *
 * The Python side (coordinatewise.py) splits the columns between threads and releases the GIL around each call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>

#define BLOCK 128

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

#define DEFINE_KERNEL(T, SUFFIX)                                                                                   \
    static Py_ssize_t window_start_##SUFFIX(const T *buf, Py_ssize_t n, Py_ssize_t j, int mode, int trim) {       \
        if (mode == 0) return trim;                                                                                \
        if (mode == 1) return (n - 1) / 2;                                                                         \
        T med = (n % 2 == 1) ? buf[(n / 2) * BLOCK + j]                                                            \
                             : (T)(0.5 * buf[(n / 2 - 1) * BLOCK + j] + 0.5 * buf[(n / 2) * BLOCK + j]);           \
        Py_ssize_t lo = 0, hi = n - 1;                                                                             \
        for (int t = 0; t < trim; t++) {                                                                           \
            if (med - buf[lo * BLOCK + j] > buf[hi * BLOCK + j] - med) lo++; else hi--;                            \
        }                                                                                                          \
        return lo;                                                                                                 \
    }                                                                                                              \
                                                                                                                   \
    MULTIVERSION static void network_##SUFFIX(T *buf, const long long *pairs, Py_ssize_t npairs) {                 \
        for (Py_ssize_t p = 0; p < npairs; p++) {                                                                  \
            T *restrict a = buf + pairs[2 * p] * BLOCK;                                                            \
            T *restrict b = buf + pairs[2 * p + 1] * BLOCK;                                                        \
            for (int j = 0; j < BLOCK; j++) {                                                                      \
                T u = a[j], v = b[j];                                                                              \
                a[j] = u < v ? u : v;                                                                              \
                b[j] = u < v ? v : u;                                                                              \
            }                                                                                                      \
        }                                                                                                          \
    }                                                                                                              \
                                                                                                                   \
    static void window_##SUFFIX(const T *x, Py_ssize_t n, Py_ssize_t d, Py_ssize_t j0, Py_ssize_t j1,              \
                                const long long *pairs, Py_ssize_t npairs, int mode, int trim, int length,         \
                                T *out, double *contrib, T *buf) {                                                 \
        double inv = 1.0 / (double)length;                                                                         \
        for (Py_ssize_t s = j0; s < j1; s += BLOCK) {                                                              \
            Py_ssize_t w = (j1 - s) < BLOCK ? (j1 - s) : BLOCK;                                                    \
            for (Py_ssize_t i = 0; i < n; i++) {                                                                   \
                const T *src = x + i * d + s;                                                                      \
                T *dst = buf + i * BLOCK;                                                                          \
                for (Py_ssize_t j = 0; j < w; j++) { T v = src[j]; dst[j] = (v != v) ? (T)INFINITY : v; }          \
                for (Py_ssize_t j = w; j < BLOCK; j++) dst[j] = (T)INFINITY;                                       \
            }                                                                                                      \
            network_##SUFFIX(buf, pairs, npairs);                                                                  \
            if (mode == 0) {                                                                                       \
                double acc[BLOCK];                                                                                 \
                for (int j = 0; j < BLOCK; j++) acc[j] = 0.0;                                                      \
                for (Py_ssize_t r = trim; r < trim + length; r++) {                                                \
                    const T *row = buf + r * BLOCK;                                                                \
                    for (int j = 0; j < BLOCK; j++) acc[j] += (double)row[j];                                      \
                }                                                                                                  \
                for (Py_ssize_t j = 0; j < w; j++) out[s + j] = (T)(acc[j] * inv);                                 \
            } else {                                                                                               \
                for (Py_ssize_t j = 0; j < w; j++) {                                                               \
                    Py_ssize_t st = window_start_##SUFFIX(buf, n, j, mode, trim);                                  \
                    double a = 0.0;                                                                                \
                    for (Py_ssize_t r = st; r < st + length; r++) a += (double)buf[r * BLOCK + j];                 \
                    out[s + j] = (T)(a * inv);                                                                     \
                }                                                                                                  \
            }                                                                                                      \
            if (contrib) {                                                                                         \
                /* Row weight: 1/length strictly inside the window; a value tied with a window boundary gets the */ \
                /* boundary value's window slots shared equally among all rows holding that value. O(n)/column.  */ \
                for (Py_ssize_t j = 0; j < w; j++) {                                                               \
                    Py_ssize_t st = window_start_##SUFFIX(buf, n, j, mode, trim), en = st + length;                \
                    T lo = buf[st * BLOCK + j], hi = buf[(en - 1) * BLOCK + j];                                    \
                    double lo_tot = 0, lo_in = 0, hi_tot = 0, hi_in = 0;                                           \
                    for (Py_ssize_t r = 0; r < n; r++) {                                                           \
                        T v = buf[r * BLOCK + j];                                                                  \
                        int inside = r >= st && r < en;                                                            \
                        if (v == lo) { lo_tot += 1; lo_in += inside; }                                             \
                        if (v == hi) { hi_tot += 1; hi_in += inside; }                                             \
                    }                                                                                              \
                    for (Py_ssize_t i = 0; i < n; i++) {                                                           \
                        T v = x[i * d + s + j];                                                                    \
                        if (v != v) v = (T)INFINITY;                                                               \
                        if (v > lo && v < hi) contrib[i] += inv;                                                   \
                        else if (v == lo) contrib[i] += lo_in / (lo_tot * length);                                 \
                        else if (v == hi) contrib[i] += hi_in / (hi_tot * length);                                 \
                    }                                                                                              \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
    }

DEFINE_KERNEL(float, f32)
DEFINE_KERNEL(double, f64)

/* window(x_ptr, n, d, j0, j1, pairs_ptr, npairs, mode, trim, length, out_ptr, contrib_ptr_or_0, is_double) */
static PyObject *py_window(PyObject *self, PyObject *args) {
    Py_ssize_t xp, n, d, j0, j1, pp, npairs, op, cp;
    int mode, trim, length, is_double;
    if (!PyArg_ParseTuple(args, "nnnnnnniiinnp", &xp, &n, &d, &j0, &j1, &pp, &npairs, &mode, &trim, &length, &op,
                          &cp, &is_double))
        return NULL;
    if (n < 1 || d < 1 || j0 < 0 || j1 > d || j0 > j1 || length < 1 || mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "_cwkernel.window: invalid arguments");
        return NULL;
    }
    size_t elem = is_double ? sizeof(double) : sizeof(float);
    void *buf = malloc((size_t)n * BLOCK * elem);
    if (!buf) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    if (is_double)
        window_f64((const double *)xp, n, d, j0, j1, (const long long *)pp, npairs, mode, trim, length,
                   (double *)op, (double *)cp, (double *)buf);
    else
        window_f32((const float *)xp, n, d, j0, j1, (const long long *)pp, npairs, mode, trim, length,
                   (float *)op, (double *)cp, (float *)buf);
    Py_END_ALLOW_THREADS
    free(buf);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"window", py_window, METH_VARARGS, "Coordinate-wise window mean over a column range (see module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cwkernel", "Sorting-network coordinate-wise kernel.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__cwkernel(void) { return PyModule_Create(&module); }
