/* Squared Euclidean row norms summed in float64, one streaming pass over a float32 or float64 matrix.
 *
 * Used by phalanx.aggregators._rowops.row_sqnorm_estimates (issue 37: the norm rules within 2.5x one memory pass):
 * the values are *estimates* with a rigorous error bound, never the definition of a norm (that is
 * _rowops.float64_row_norms). Every square of a float32 value is exact in float64; the squares are added in
 * float64 in a fixed order: each row is cut into column blocks of NORM_COLUMNS, a block is summed in LANES4
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
 * clones add the same values in the same order and give the same bits. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
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

/* Four rows at once (four streams in flight, as a column sum has); each row's sum depends on that row alone: its
 * LANES4 lanes, then the lanes added in order, then the tail in order. A group of fewer than four rows repeats its
 * last row's pointer (the repeated sums are dropped), so a row's bits do not depend on its neighbours. */
#define DEFINE_SUMSQ4(T, SUFFIX)                                                                                      \
    MULTIVERSION static void sumsq4_##SUFFIX(const T *restrict p0, const T *restrict p1, const T *restrict p2,      \
                                             const T *restrict p3, Py_ssize_t len, double *out) {                  \
        double a0[LANES4] = {0}, a1[LANES4] = {0}, a2[LANES4] = {0}, a3[LANES4] = {0};                                \
        Py_ssize_t j = 0;                                                                                             \
        for (; j + LANES4 <= len; j += LANES4)                                                                        \
            for (int k = 0; k < LANES4; k++) {                                                                        \
                double v0 = (double)p0[j + k], v1 = (double)p1[j + k], v2 = (double)p2[j + k],                        \
                       v3 = (double)p3[j + k];                                                                        \
                a0[k] += v0 * v0;                                                                                     \
                a1[k] += v1 * v1;                                                                                     \
                a2[k] += v2 * v2;                                                                                     \
                a3[k] += v3 * v3;                                                                                     \
            }                                                                                                         \
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;                                                                \
        for (int k = 0; k < LANES4; k++) {                                                                            \
            s0 += a0[k];                                                                                              \
            s1 += a1[k];                                                                                              \
            s2 += a2[k];                                                                                              \
            s3 += a3[k];                                                                                              \
        }                                                                                                             \
        for (; j < len; j++) {                                                                                        \
            double v0 = (double)p0[j], v1 = (double)p1[j], v2 = (double)p2[j], v3 = (double)p3[j];                    \
            s0 += v0 * v0;                                                                                            \
            s1 += v1 * v1;                                                                                            \
            s2 += v2 * v2;                                                                                            \
            s3 += v3 * v3;                                                                                            \
        }                                                                                                             \
        out[0] = s0;                                                                                                  \
        out[1] = s1;                                                                                                  \
        out[2] = s2;                                                                                                  \
        out[3] = s3;                                                                                                  \
    }

DEFINE_SUMSQ4(float, f32)
DEFINE_SUMSQ4(double, f64)

/* sqnorms(x_ptr, n, d, row_stride, is_double, out_ptr, threads): out[i] = sum_j x[i, j]^2 in float64 (n doubles);
 * row_stride in elements, the columns contiguous. */
static PyObject *py_sqnorms(PyObject *self, PyObject *args) {
    Py_ssize_t xp, n, d, stride, op;
    int is_double, threads;
    if (!PyArg_ParseTuple(args, "nnnnpni", &xp, &n, &d, &stride, &is_double, &op, &threads)) return NULL;
    if (n < 1 || d < 1 || stride < d || threads < 1 || !xp || !op) {
        PyErr_SetString(PyExc_ValueError, "_normkernel.sqnorms: invalid arguments");
        return NULL;
    }
    Py_ssize_t blocks = (d + NORM_COLUMNS - 1) / NORM_COLUMNS;
    double *part = (double *)malloc((size_t)n * (size_t)blocks * sizeof(double));
    if (!part) return PyErr_NoMemory();
    double *out = (double *)op;
    Py_ssize_t groups = (n + 3) / 4, tasks = groups * blocks;
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (Py_ssize_t t = 0; t < tasks; t++) {
        Py_ssize_t g = t / blocks, b = t % blocks;
        Py_ssize_t j0 = b * NORM_COLUMNS, len = d - j0 < NORM_COLUMNS ? d - j0 : NORM_COLUMNS;
        Py_ssize_t r[4];
        double s4[4];
        for (int k = 0; k < 4; k++) r[k] = 4 * g + k < n ? 4 * g + k : n - 1;
        if (is_double) {
            const double *x = (const double *)xp + j0;
            sumsq4_f64(x + r[0] * stride, x + r[1] * stride, x + r[2] * stride, x + r[3] * stride, len, s4);
        } else {
            const float *x = (const float *)xp + j0;
            sumsq4_f32(x + r[0] * stride, x + r[1] * stride, x + r[2] * stride, x + r[3] * stride, len, s4);
        }
        for (int k = 0; k < 4 && 4 * g + k < n; k++) part[(4 * g + k) * blocks + b] = s4[k];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        double s = 0.0;
        for (Py_ssize_t b = 0; b < blocks; b++) s += part[i * blocks + b];
        out[i] = s;
    }
    Py_END_ALLOW_THREADS
    free(part);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sqnorms", py_sqnorms, METH_VARARGS, "Squared row norms summed in float64, one pass (see module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_normkernel", "Float64 squared row norms in one pass.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__normkernel(void) { return PyModule_Create(&module); }
