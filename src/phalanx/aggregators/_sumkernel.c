/* Column sums of a float32 or float64 matrix, its rows added in row order: out[j] = (...(((0 + x[0,j]) + x[1,j]) +
 * x[2,j]) + ...) + x[n-1,j], each addition rounded in the input's dtype (IEEE 754 round to nearest; the leading
 * 0 + only turns a column of -0.0 into +0.0, as a BLAS product gives).
 *
 * Used by phalanx.aggregators._rowops.column_mean (the `mean` rule and the attacks' honest mean; issue 37: `mean`
 * within one memory pass). The order is the definition: the same input gives the same bits whatever the number of
 * threads, the instruction set or the machine. It is also the order in which the BLAS product 1^T X (which
 * column_mean used before) added the rows on the development machine -- docs/benchmarks.md has the comparison;
 * tests/test_column_sums.py holds the kernel to the definition, computed by torch one addition at a time.
 *
 * Layout: the columns are cut into blocks of SUM_COLUMNS (16 KiB of float32 accumulators: they stay in the L1/L2
 * cache while the rows stream past); within a block four rows at a time are added into the accumulators
 * ((((acc + a) + b) + c) + e: four additions in row order per load and store of acc). Only additions of the same
 * column are chained, in row order, so vectorising across columns (each target_clones clone in its own registers)
 * changes no bit. Plain C99 (-std=c99, no -ffast-math): the compiler may not reassociate.
 *
 * Threads: the column blocks are shared out over an OpenMP team of at most `threads` (a static loop); each block
 * is summed by one thread, so the result does not depend on the team the runtime grants (as long as every thread
 * computes in the same floating-point mode: torch.set_flush_denormal sets the calling thread's only). Built without OpenMP,
 * the loop runs on the calling thread. The GIL is released meanwhile. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define SUM_COLUMNS 4096     /* columns per block below SUM_TALL rows: 16 KiB of float32 sums, in the L1 cache */
#define SUM_COLUMNS_TALL 16384 /* from SUM_TALL rows on, fewer blocks, each row read in longer runs (L2-resident) */
#define SUM_TALL 128

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTIVERSION
#endif

/* One group of g <= 8 consecutive rows added onto the running sum of one block (or starting it, `first`), the
 * sum divided by dv after the group's last row when `divide`. Always inlined with constant g, first and divide,
 * so each case compiles to its own branch-free, vectorised loop. */
#define DEFINE_GROUP(NAME, T)                                                                                         \
    static inline __attribute__((always_inline)) void NAME(const T *restrict x, Py_ssize_t stride, Py_ssize_t len,   \
                                                           const int g, const int first, const int divide, T dv,      \
                                                           T *restrict out) {                                         \
        const T *restrict r0 = x, *restrict r1 = x + (g > 1) * stride, *restrict r2 = x + (g > 2) * 2 * stride;       \
        const T *restrict r3 = x + (g > 3) * 3 * stride, *restrict r4 = x + (g > 4) * 4 * stride;                     \
        const T *restrict r5 = x + (g > 5) * 5 * stride, *restrict r6 = x + (g > 6) * 6 * stride;                     \
        const T *restrict r7 = x + (g > 7) * 7 * stride;                                                              \
        for (Py_ssize_t j = 0; j < len; j++) {                                                                        \
            T s = (first ? (T)0 : out[j]) + r0[j]; /* 0 + x0: a column of -0.0 sums to +0.0 */                                                                     \
            if (g > 1) s = s + r1[j];                                                                                 \
            if (g > 2) s = s + r2[j];                                                                                 \
            if (g > 3) s = s + r3[j];                                                                                 \
            if (g > 4) s = s + r4[j];                                                                                 \
            if (g > 5) s = s + r5[j];                                                                                 \
            if (g > 6) s = s + r6[j];                                                                                 \
            if (g > 7) s = s + r7[j];                                                                                 \
            out[j] = divide ? s / dv : s;                                                                             \
        }                                                                                                             \
    }

/* One block of columns: out[j] = the row-order sum of x[., j] over the block, divided by `divisor` when it is
 * not 0. The first group takes n mod 8 rows (8 if that is 0) and starts the sum without reading out; every later
 * group takes 8 rows, the last one dividing as it stores: at most ceil(n / 8) stores of the block, always in row
 * order. */
#define FIRST_CASE(G, GROUP)                                                                                          \
    case G:                                                                                                           \
        if (divide)                                                                                                   \
            GROUP(x, stride, len, G, 1, 1, dv, out);                                                                  \
        else                                                                                                          \
            GROUP(x, stride, len, G, 1, 0, dv, out);                                                                  \
        break;
#define DEFINE_BLOCK_SUM(NAME, GROUP, T)                                                                              \
    MULTIVERSION static void NAME(const T *restrict x, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t len,              \
                                  double divisor, T *restrict out) {                                                  \
        const T dv = (T)divisor;                                                                                      \
        Py_ssize_t g = n % 8 ? n % 8 : 8;                                                                             \
        int divide = g == n && divisor != 0.0;                                                                        \
        switch (g) {                                                                                                  \
            FIRST_CASE(1, GROUP) FIRST_CASE(2, GROUP) FIRST_CASE(3, GROUP) FIRST_CASE(4, GROUP)                       \
            FIRST_CASE(5, GROUP) FIRST_CASE(6, GROUP) FIRST_CASE(7, GROUP) FIRST_CASE(8, GROUP)                       \
        }                                                                                                             \
        for (Py_ssize_t i = g; i < n; i += 8) {                                                                       \
            if (i + 8 == n && divisor != 0.0)                                                                         \
                GROUP(x + i * stride, stride, len, 8, 0, 1, dv, out);                                                 \
            else                                                                                                      \
                GROUP(x + i * stride, stride, len, 8, 0, 0, dv, out);                                                 \
        }                                                                                                             \
    }

DEFINE_GROUP(group_f32, float)
DEFINE_GROUP(group_f64, double)
DEFINE_BLOCK_SUM(block_sum_f32, group_f32, float)
DEFINE_BLOCK_SUM(block_sum_f64, group_f64, double)

/* column_sums(x_ptr, n, d, row_stride, is_double, divisor, out_ptr, threads[, columns]): out[j] = the row-order
 * sum of column j, divided by `divisor` in the dtype of x unless it is 0 (torch's `div_` by a scalar: the same bits).
 * x: n rows of d contiguous entries, row i starting row_stride entries after row i - 1; out: d entries of the
 * same dtype, not overlapping x. `columns` (0: chosen here) only sets the block size. */
static PyObject *py_column_sums(PyObject *self, PyObject *args) {
    Py_ssize_t xp, n, d, stride, op, cols = 0;
    int is_double, threads;
    double divisor;
    if (!PyArg_ParseTuple(args, "nnnnpdni|n", &xp, &n, &d, &stride, &is_double, &divisor, &op, &threads, &cols))
        return NULL;
    if (n < 1 || d < 1 || stride < d || threads < 1 || !xp || !op || cols < 0) {
        PyErr_SetString(PyExc_ValueError, "_sumkernel.column_sums: invalid arguments");
        return NULL;
    }
    if (cols > d) cols = d; /* one block at most (and no overflow of d + cols - 1 below) */
    if (cols == 0) { /* the block size changes no bit (each column is summed whole by one thread): speed only */
        cols = n < SUM_TALL ? SUM_COLUMNS : SUM_COLUMNS_TALL;
        Py_ssize_t share = (d / (4 * (Py_ssize_t)threads) + 63) / 64 * 64; /* >= 4 blocks per thread when split */
        if (threads > 1 && share < cols) cols = share > SUM_COLUMNS ? share : SUM_COLUMNS;
        if (cols > d) cols = d;
    }
    Py_ssize_t blocks = (d + cols - 1) / cols;
    if (threads > blocks) threads = (int)blocks;
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
    for (Py_ssize_t b = 0; b < blocks; b++) {
        Py_ssize_t j0 = b * cols, len = d - j0 < cols ? d - j0 : cols;
        if (is_double)
            block_sum_f64((const double *)xp + j0, n, stride, len, divisor, (double *)op + j0);
        else
            block_sum_f32((const float *)xp + j0, n, stride, len, divisor, (float *)op + j0);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"column_sums", py_column_sums, METH_VARARGS, "Column sums, the rows added in row order (see module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sumkernel", "Column sums added in row order.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__sumkernel(void) { return PyModule_Create(&module); }
