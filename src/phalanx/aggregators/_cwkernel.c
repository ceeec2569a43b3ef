/*
 * Coordinate-wise window means with a branch-free sorting network, vectorised across coordinates.
 *
 * For a block of B coordinates, the n values of each coordinate are copied into a local (n, B) buffer (NaN -> +Inf),
 * sorted by Batcher's odd-even merge sort network (a fixed list of compare-exchange pairs, K. E. Batcher, AFIPS
 * 1968) applied to whole rows of the block -- each compare-exchange is a SIMD min/max over B lanes -- and the mean
 * of a window of sorted positions is written out:
 *   mode 0 (trimmed mean): positions [trim, trim + length)
 *   mode 1 (median):       positions [(n-1)/2, (n-1)/2 + length), length 1 (odd n) or 2 (even n)
 *   mode 2 (MeaMed):       the n - trim values closest to the median: of the trim + 1 windows of that many
 *                          consecutive sorted values, the one whose farthest value from the median is nearest.
 * Optionally each row's contribution (its share of the window, ties sharing their slots equally) is accumulated.
 *
 * Speed (issue 37: within a few passes of x.sum(0)). The Python side hands the network over in a cache order
 * (_sortnet.cache_order, `tile_rows` below): runs of compare-exchanges stay inside tiles of rows that fit the L1
 * cache, instead of one sweep of the whole (n, B) buffer per stage -- the same comparators, each wire's in order,
 * so the same values. The hot functions are cloned for AVX-512F, AVX2 and the baseline ISA (target_clones, chosen
 * at load time; no -march). Every clone computes the same bits: min/max are exact, the window sums add the same
 * doubles in the same order, and -std=c99 (setup.py) keeps GCC from contracting a*b+c into an FMA.
 *
 * Load-time sort (issue 37): the pair loop is bound by its memory operations (two row loads and two row stores per
 * compare-exchange). Batcher's first stages never leave aligned groups of 128 (64, 32, 16, 8) wires, so the Python
 * side (_sortnet.load_plan) hands over a plan -- how many groups of 128, 64, 32, 16, then 8 rows, from row 0 on -- and
 * the kernel loads each group's rows straight into registers, runs Batcher's network on them there (1471, 543, 191,
 * 63 or 19 compare-exchanges; one load and one store per wire for 16 and 8; a group of 32 as two of 16, then its
 * merge in pieces of at most 8 rows, see M32_BLOCK; a group of 64 or 128 as two halves, then its merge, see
 * M64_STREAM) and stores them sorted; the pair loop then runs the rest. A group is only planned where the network's
 * first compare-exchanges on each of its wires are exactly the group network's, so every wire keeps its sequence of
 * compare-exchanges and its value bit for bit (cache_order's argument); one group alone may cover all n rows
 * padded with +Inf rows (`pad`, plan_ok). n = 64: all 543 compare-exchanges run at load. In the pair loop, two
 * consecutive compare-exchanges that share exactly one wire run as one on three rows in registers (`chain_`: three
 * row loads and stores instead of four); _sortnet.chain_order makes most of them consecutive without changing any
 * wire's sequence.
 * The pair loop writes min = u < w ? u : w and max = u > w ? u : w itself (no finite-math fmin/fmax): GCC emits
 * vminps/vmaxps for them, the semantics of the fminf/fmaxf build before it, ties and +-0 included. MeaMed's window
 * sum, when trim < length, adds its rows in three loops with one comparison a row (the same additions, same order).
 *
 * Threads: `window_parallel` splits the columns into a fixed number of contiguous chunks, shared out over an OpenMP
 * team (the result does not depend on how many threads the team actually has). Built with
 * -fopenmp and imported after torch, the extension resolves libgomp.so.1 to the copy torch already loaded, so the
 * team is torch's own intra-op team: no second pool of threads competing with torch's (which keep spinning for
 * ~10 ms after each parallel op -- measured: the pthread version ran 2x slower right after a matmul). Without
 * OpenMP, `window_parallel` runs on the calling thread and the Python side may split the columns between threads
 * and call `window` on each range itself. The GIL is released around both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#ifndef _WIN32
#include <unistd.h> /* sysconf: the L1 cache size */
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef BLOCK
#define BLOCK 128
#endif
#define SMALL_BLOCK 32
#define FINISH_LANES 16 /* lanes whose window sums stay in registers (finish_): 4 AVX2 vectors of double */
#define BUFFER_BYTES (320 * 1024)

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTIVERSION
#endif

/* The network must compile to branch-free SIMD min/max. Written as `a[j] = u < v ? u : v` straight into memory,
 * GCC turned the store of the unchanged value into a conditional store (a branch per vector), which mispredicts on
 * real data and cost 3x; the previous build used fmin/fmax under finite-math-only instead. Every compare-exchange
 * now reads both values into locals and stores both results unconditionally: min = u < w ? u : w and
 * max = u > w ? u : w, which GCC emits as vminps/vmaxps (min/maxps, min/maxpd) -- the semantics the fmin/fmax build
 * compiled to, the second operand on ties and +-0 (tests/test_cw_loadsort.py and the previous build compared bit for
 * bit on +-0, NaN and +-inf). NaN never reaches them (mapped to +Inf on load). */
/* Selects between computed values (`c ? a : 0.0`) vectorise only if the compiler may evaluate the comparison for
 * every lane; the default -ftrapping-math forbids that for ordered comparisons (they raise FE_INVALID on NaN), and
 * the loop stays scalar. No code here reads the floating-point exception flags, and the flag changes no value. */
#if defined(__GNUC__) && !defined(__clang__)
#define SELECTS __attribute__((optimize("no-trapping-math")))
#else
#define SELECTS
#endif
/* MeaMed's window search keeps, per lane, the best window so far: best[j] = better ? cost : best[j]. GCC may not
 * invent a store where the source stores conditionally (another thread could own the location), so it made that a
 * masked store behind a branch per vector (perf: about a quarter of MeaMed's finish at n = 16, mispredicted).
 * Those arrays are the function's own locals: allowing such stores there lets it store every lane. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#define SELECTS_LOCAL_STORES __attribute__((optimize("no-trapping-math", "allow-store-data-races")))
#else
#define SELECTS_LOCAL_STORES SELECTS
#endif
/* Load-time sort of whole groups of rows (issue 37). Batcher's network on 8, 16 or 32 wires, straight-line in
 * registers: each wire is a local variable, so a group's 19, 63 or 191 compare-exchanges cost one load and one store
 * per wire instead of two of each per compare-exchange (GCC spills a few of 32 wires). The lists are
 * batcher_pairs(8), (16) and (32) (_sortnet; the module exports them, `load_sort_network`, and the Python side only
 * hands a group over after checking that those are exactly the first compare-exchanges of each of its wires in the
 * network it was asked to run: the same per-wire order, so the same values). A compare-exchange keeps the pair
 * loop's semantics exactly: min = u < w ? u : w and max = u > w ? u : w, what its vminps/vmaxps compute (the second
 * operand on ties, +-0 included; tests/test_cw_loadsort.py compares the two bit for bit on +-0, NaN and +-inf). */
#define BATCHER8(X) X(0, 1) X(2, 3) X(4, 5) X(6, 7) X(0, 2) X(1, 3) X(4, 6) X(5, 7) X(1, 2) X(5, 6) X(0, 4) X(1, 5) \
    X(2, 6) X(3, 7) X(2, 4) X(3, 5) X(1, 2) X(3, 4) X(5, 6)
#define BATCHER16(X) X(0, 1) X(2, 3) X(4, 5) X(6, 7) X(8, 9) X(10, 11) X(12, 13) X(14, 15) X(0, 2) X(1, 3) X(4, 6)    \
    X(5, 7) X(8, 10) X(9, 11) X(12, 14) X(13, 15) X(1, 2) X(5, 6) X(9, 10) X(13, 14) X(0, 4) X(1, 5) X(2, 6) X(3, 7) \
    X(8, 12) X(9, 13) X(10, 14) X(11, 15) X(2, 4) X(3, 5) X(10, 12) X(11, 13) X(1, 2) X(3, 4) X(5, 6) X(9, 10)       \
    X(11, 12) X(13, 14) X(0, 8) X(1, 9) X(2, 10) X(3, 11) X(4, 12) X(5, 13) X(6, 14) X(7, 15) X(4, 8) X(5, 9)       \
    X(6, 10) X(7, 11) X(2, 4) X(3, 5) X(6, 8) X(7, 9) X(10, 12) X(11, 13) X(1, 2) X(3, 4) X(5, 6) X(7, 8) X(9, 10)   \
    X(11, 12) X(13, 14)
#define BATCHER32(X) X(0, 1) X(2, 3) X(4, 5) X(6, 7) X(8, 9) X(10, 11) X(12, 13) X(14, 15) X(16, 17) X(18, 19)      \
    X(20, 21) X(22, 23) X(24, 25) X(26, 27) X(28, 29) X(30, 31) X(0, 2) X(1, 3) X(4, 6) X(5, 7) X(8, 10) X(9, 11)   \
    X(12, 14) X(13, 15) X(16, 18) X(17, 19) X(20, 22) X(21, 23) X(24, 26) X(25, 27) X(28, 30) X(29, 31) X(1, 2)     \
    X(5, 6) X(9, 10) X(13, 14) X(17, 18) X(21, 22) X(25, 26) X(29, 30) X(0, 4) X(1, 5) X(2, 6) X(3, 7) X(8, 12)     \
    X(9, 13) X(10, 14) X(11, 15) X(16, 20) X(17, 21) X(18, 22) X(19, 23) X(24, 28) X(25, 29) X(26, 30) X(27, 31)    \
    X(2, 4) X(3, 5) X(10, 12) X(11, 13) X(18, 20) X(19, 21) X(26, 28) X(27, 29) X(1, 2) X(3, 4) X(5, 6) X(9, 10)    \
    X(11, 12) X(13, 14) X(17, 18) X(19, 20) X(21, 22) X(25, 26) X(27, 28) X(29, 30) X(0, 8) X(1, 9) X(2, 10)        \
    X(3, 11) X(4, 12) X(5, 13) X(6, 14) X(7, 15) X(16, 24) X(17, 25) X(18, 26) X(19, 27) X(20, 28) X(21, 29)        \
    X(22, 30) X(23, 31) X(4, 8) X(5, 9) X(6, 10) X(7, 11) X(20, 24) X(21, 25) X(22, 26) X(23, 27) X(2, 4) X(3, 5)   \
    X(6, 8) X(7, 9) X(10, 12) X(11, 13) X(18, 20) X(19, 21) X(22, 24) X(23, 25) X(26, 28) X(27, 29) X(1, 2)         \
    X(3, 4) X(5, 6) X(7, 8) X(9, 10) X(11, 12) X(13, 14) X(17, 18) X(19, 20) X(21, 22) X(23, 24) X(25, 26)          \
    X(27, 28) X(29, 30) X(0, 16) X(1, 17) X(2, 18) X(3, 19) X(4, 20) X(5, 21) X(6, 22) X(7, 23) X(8, 24) X(9, 25)   \
    X(10, 26) X(11, 27) X(12, 28) X(13, 29) X(14, 30) X(15, 31) X(8, 16) X(9, 17) X(10, 18) X(11, 19) X(12, 20)     \
    X(13, 21) X(14, 22) X(15, 23) X(4, 8) X(5, 9) X(6, 10) X(7, 11) X(12, 16) X(13, 17) X(14, 18) X(15, 19)         \
    X(20, 24) X(21, 25) X(22, 26) X(23, 27) X(2, 4) X(3, 5) X(6, 8) X(7, 9) X(10, 12) X(11, 13) X(14, 16)           \
    X(15, 17) X(18, 20) X(19, 21) X(22, 24) X(23, 25) X(26, 28) X(27, 29) X(1, 2) X(3, 4) X(5, 6) X(7, 8) X(9, 10)  \
    X(11, 12) X(13, 14) X(15, 16) X(17, 18) X(19, 20) X(21, 22) X(23, 24) X(25, 26) X(27, 28) X(29, 30)
#define ROWS8(Y, A) Y(0, A) Y(1, A) Y(2, A) Y(3, A) Y(4, A) Y(5, A) Y(6, A) Y(7, A)
#define ROWS16(Y, A) ROWS8(Y, A) Y(8, A) Y(9, A) Y(10, A) Y(11, A) Y(12, A) Y(13, A) Y(14, A) Y(15, A)
#define ROWS32(Y, A) ROWS16(Y, A) Y(16, A) Y(17, A) Y(18, A) Y(19, A) Y(20, A) Y(21, A) Y(22, A) Y(23, A) Y(24, A)  \
    Y(25, A) Y(26, A) Y(27, A) Y(28, A) Y(29, A) Y(30, A) Y(31, A)
#include "_cwkernel_streams.h" /* ROWS64, ROWS128 and the merges' streams (scripts/gen_cw_streams.py) */
#define LS_DECL(i, A) v##i,
#define LS_LOAD(i, A) v##i = s##i[j]; v##i = (v##i != v##i) ? INFINITY : v##i;
#define LS_CX(i, k) u_ = v##i; w_ = v##k; v##i = u_ < w_ ? u_ : w_; v##k = u_ > w_ ? u_ : w_;
#define LS_STORE(i, A) d##i[j] = v##i;
/* Every row its own restrict pointer (a helper's parameters): pointers computed inside the function as src + i * ss
 * leave GCC unable to vectorise the lane loop. */
#define LS_SPARAM(i, T) const T *restrict s##i,
#define LS_DPARAM(i, T) T *restrict d##i,
#define LS_SARG(i, A) ((i) < real ? src + (i) * ss : pad), /* a padded group's rows from `real` on: +Inf */
#define LS_DARG(i, A) dst + (i) * ds,
#define LOAD_SORT_MAX 128
#define LOAD_SIZES 5 /* groups of 128, 64, 32, 16 and 8 rows: the plan's slots, in that order */
/* The 32-row load sort in pieces that fit AVX2's 16 vector registers (32 wires at once did not: GCC moved a vector
 * to or from the stack 429 times for its 191 compare-exchanges). Batcher's network on 32 wires is its network on
 * each half of 16, then its p = 16 merge stages k = 16, 8, 4, 2, 1. Those with k >= 4 never leave the 8 rows
 * r, r + 4, ..., r + 28 (r = 0 ... 3): M32_BLOCK is their order on such a block's local wires 0 ... 7. The k = 2
 * and k = 1 stages run as a stream over the rows in order (M32_TAIL: rows a ... e = 4m + 1 ... 4m + 5, row a loaded
 * by the step before), each row loaded once and stored once. Every wire keeps its sequence of compare-exchanges
 * (tests/test_cw_loadsort.py checks the schedule against BATCHER32), so every value keeps its bits. */
#define M32_BLOCK(X) X(0, 4) X(1, 5) X(2, 6) X(3, 7) X(2, 4) X(3, 5) X(1, 2) X(3, 4) X(5, 6)
#define LS_LD(i) v##i = d##i[j];
#define LS_ST(i) d##i[j] = v##i;
#define M32_TAIL(L, X, S, a, b, c, d, e) L(b) L(c) L(d) L(e) X(b, d) X(c, e) X(a, b) X(c, d) S(a) S(b) S(c) S(d)
#define M32_STREAM(L, X, S) L(1) M32_TAIL(L, X, S, 1, 2, 3, 4, 5) M32_TAIL(L, X, S, 5, 6, 7, 8, 9)                     \
    M32_TAIL(L, X, S, 9, 10, 11, 12, 13) M32_TAIL(L, X, S, 13, 14, 15, 16, 17) M32_TAIL(L, X, S, 17, 18, 19, 20, 21) \
    M32_TAIL(L, X, S, 21, 22, 23, 24, 25) M32_TAIL(L, X, S, 25, 26, 27, 28, 29) L(30) X(29, 30) S(29) S(30)

/* The 64- and 128-row load sorts (issue 37): the load sort of half the rows on each half, then Batcher's merge of
 * level p = 32 or 64, whose stages k = p, p/2, p/4 never leave the 8 rows r, r + p/4, ..., r + 7p/4 (r < p/4:
 * M32_BLOCK again, on a stride of p/4) and whose later stages run as streams (M64_STREAM, M128_STREAM): each row
 * loaded once and stored once, at most 5 and 9 rows live. The streams were generated (scripts/gen_cw_streams.py
 * writes _cwkernel_streams.h); tests/test_cw_loadsort.py checks each whole schedule against Batcher's network wire by
 * wire, so every value keeps its bits. A 256-row group built the same way (two streams) gained nothing at n = 256
 * or 1,000 over groups of 128 (its 128 KB no longer fit the L1 cache the pair loop's tiles do) and took minutes to
 * compile: not built. */

/* The load sorts, one copy per element type (the lanes a call runs, BLOCK or SMALL_BLOCK, an argument: a copy per
 * block size as well doubled the build's time for nothing measurable). */
#define DEFINE_LOADSORT(T, SUFFIX)                                                                                 \
    /* Rows [0, 8) or [0, 16) of src (row stride ss; NaN -> +Inf) sorted by Batcher's network into dst.         */ \
    static inline __attribute__((always_inline)) void ls8_rows_##SUFFIX(ROWS8(LS_SPARAM, T) ROWS8(LS_DPARAM, T) int lanes) { \
        for (int j = 0; j < lanes; j++) {                                                                          \
            T ROWS8(LS_DECL, _) u_, w_;                                                                            \
            ROWS8(LS_LOAD, _) BATCHER8(LS_CX) ROWS8(LS_STORE, _)                                                   \
        }                                                                                                          \
    }                                                                                                              \
    static inline __attribute__((always_inline)) void ls16_rows_##SUFFIX(ROWS16(LS_SPARAM, T) ROWS16(LS_DPARAM, T) \
                                                                       int lanes) {                                \
        for (int j = 0; j < lanes; j++) {                                                                          \
            T ROWS16(LS_DECL, _) u_, w_;                                                                           \
            ROWS16(LS_LOAD, _) BATCHER16(LS_CX) ROWS16(LS_STORE, _)                                                \
        }                                                                                                          \
    }                                                                                                              \
    /* Batcher's 32-row network on rows sorted by halves of 16 (see M32_BLOCK): four blocks of 8, then the stream. */ \
    static inline __attribute__((always_inline)) void m32_block_##SUFFIX(ROWS8(LS_DPARAM, T) int lanes) {          \
        for (int j = 0; j < lanes; j++) {                                                                          \
            T ROWS8(LS_DECL, _) u_, w_;                                                                            \
            LS_LD(0) LS_LD(1) LS_LD(2) LS_LD(3) LS_LD(4) LS_LD(5) LS_LD(6) LS_LD(7)                                \
            M32_BLOCK(LS_CX) ROWS8(LS_STORE, _)                                                                    \
        }                                                                                                          \
    }                                                                                                              \
    static inline __attribute__((always_inline)) void m32_stream_##SUFFIX(ROWS32(LS_DPARAM, T) int lanes) {        \
        for (int j = 0; j < lanes; j++) {                                                                          \
            __attribute__((unused)) T ROWS32(LS_DECL, _) u_, w_; /* rows 0 and 31 are not in these stages */       \
            M32_STREAM(LS_LD, LS_CX, LS_ST)                                                                        \
        }                                                                                                          \
    }                                                                                                              \
    /* src: the group's first row (row stride ss); rows from `real` on are read from `pad`, a row of +Inf (a group \
     * padded past the last row). dst: where the sorted rows go (row stride ds). */                                \
    static inline __attribute__((always_inline)) void ls16_at_##SUFFIX(const T *src, Py_ssize_t ss, Py_ssize_t real, \
                                                                      const T *pad, T *dst, Py_ssize_t ds, int lanes) { \
        ls16_rows_##SUFFIX(ROWS16(LS_SARG, _) ROWS16(LS_DARG, _) lanes);                                           \
    }                                                                                                              \
    static inline __attribute__((always_inline)) void m32_block_at_##SUFFIX(T *dst, Py_ssize_t ds, int lanes) {    \
        m32_block_##SUFFIX(ROWS8(LS_DARG, _) lanes);                                                               \
    }                                                                                                              \
    static inline __attribute__((always_inline)) void ls32_at_##SUFFIX(const T *src, Py_ssize_t ss, Py_ssize_t real, \
                                                                      const T *pad, T *dst, Py_ssize_t ds, int lanes) { \
        ls16_at_##SUFFIX(src, ss, real, pad, dst, ds, lanes);                                                      \
        ls16_at_##SUFFIX(real > 16 ? src + 16 * ss : pad, ss, real - 16, pad, dst + 16 * ds, ds, lanes);           \
        for (int r = 0; r < 4; r++) m32_block_at_##SUFFIX(dst + r * ds, 4 * ds, lanes);                            \
        m32_stream_##SUFFIX(ROWS32(LS_DARG, _) lanes);                                                             \
    }                                                                                                              \
    static inline __attribute__((always_inline)) void m64_stream_##SUFFIX(ROWS64(LS_DPARAM, T) int lanes) {        \
        for (int j = 0; j < lanes; j++) {                                                                          \
            __attribute__((unused)) T ROWS64(LS_DECL, _) u_, w_; /* rows 0 and 63 are not in these stages */       \
            M64_STREAM(LS_LD, LS_CX, LS_ST)                                                                        \
        }                                                                                                          \
    }                                                                                                              \
    static inline __attribute__((always_inline)) void m128_stream_##SUFFIX(ROWS128(LS_DPARAM, T) int lanes) {      \
        for (int j = 0; j < lanes; j++) {                                                                          \
            __attribute__((unused)) T ROWS128(LS_DECL, _) u_, w_; /* rows 0 and 127 are not in these stages */     \
            M128_STREAM(LS_LD, LS_CX, LS_ST)                                                                       \
        }                                                                                                          \
    }                                                                                                              \
    MULTIVERSION SELECTS static void loadsort8_##SUFFIX(const T *src, Py_ssize_t ss, Py_ssize_t real, const T *pad, \
                                                        T *dst, Py_ssize_t ds, int lanes) {                        \
        ls8_rows_##SUFFIX(ROWS8(LS_SARG, _) ROWS8(LS_DARG, _) lanes);                                              \
    }                                                                                                              \
    MULTIVERSION SELECTS static void loadsort16_##SUFFIX(const T *src, Py_ssize_t ss, Py_ssize_t real, const T *pad, \
                                                         T *dst, Py_ssize_t ds, int lanes) {                       \
        ls16_at_##SUFFIX(src, ss, real, pad, dst, ds, lanes);                                                      \
    }                                                                                                              \
    MULTIVERSION SELECTS static void loadsort32_##SUFFIX(const T *src, Py_ssize_t ss, Py_ssize_t real, const T *pad, \
                                                         T *dst, Py_ssize_t ds, int lanes) {                       \
        ls32_at_##SUFFIX(src, ss, real, pad, dst, ds, lanes);                                                      \
    }                                                                                                              \
    /* 64 and 128 rows: the halves by calls (inlined, every size's body in the larger ones took the build from     \
     * under 1 to over 2 minutes), then the merge. */                                                              \
    MULTIVERSION SELECTS static void loadsort64_##SUFFIX(const T *src, Py_ssize_t ss, Py_ssize_t real, const T *pad, \
                                                         T *dst, Py_ssize_t ds, int lanes) {                       \
        loadsort32_##SUFFIX(src, ss, real, pad, dst, ds, lanes);                                                   \
        loadsort32_##SUFFIX(real > 32 ? src + 32 * ss : pad, ss, real - 32, pad, dst + 32 * ds, ds, lanes);        \
        for (int r = 0; r < 8; r++) m32_block_at_##SUFFIX(dst + r * ds, 8 * ds, lanes);                            \
        m64_stream_##SUFFIX(ROWS64(LS_DARG, _) lanes);                                                             \
    }                                                                                                              \
    MULTIVERSION SELECTS static void loadsort128_##SUFFIX(const T *src, Py_ssize_t ss, Py_ssize_t real, const T *pad, \
                                                          T *dst, Py_ssize_t ds, int lanes) {                      \
        loadsort64_##SUFFIX(src, ss, real, pad, dst, ds, lanes);                                                   \
        loadsort64_##SUFFIX(real > 64 ? src + 64 * ss : pad, ss, real - 64, pad, dst + 64 * ds, ds, lanes);        \
        for (int r = 0; r < 16; r++) m32_block_at_##SUFFIX(dst + r * ds, 16 * ds, lanes);                          \
        m128_stream_##SUFFIX(ROWS128(LS_DARG, _) lanes);                                                           \
    }

DEFINE_LOADSORT(float, f32)
DEFINE_LOADSORT(double, f64)

#define DEFINE_KERNEL(T, SUFFIX, BLK, TS)                                                                          \
    /* Window start of every lane of a sorted block, as a T (a small integer, exact). MeaMed: among the trim + 1 */ \
    /* windows of `length` consecutive sorted values, the one whose farthest value from the median is nearest   */ \
    /* (the first on ties): that window holds the n - trim values closest to the median. Branch-free across      */ \
    /* lanes; every array has the lane type T so that the compiler vectorises the selects.                        */ \
    static inline __attribute__((always_inline)) void window_starts_##SUFFIX(const T *buf, Py_ssize_t n, int mode, int trim, int length, T *st) {       \
        if (mode != 2) {                                                                                           \
            T s0 = (T)(mode == 0 ? trim : (int)((n - 1) / 2));                                                     \
            for (int j = 0; j < BLK; j++) st[j] = s0;                                                              \
            return;                                                                                                \
        }                                                                                                          \
        T med[BLK], best[BLK];                                                                                     \
        const T *m1 = buf + (n / 2) * BLK, *m0 = buf + ((n - 1) / 2) * BLK;                                        \
        for (int j = 0; j < BLK; j++) {                                                                            \
            med[j] = (T)(0.5 * m0[j] + 0.5 * m1[j]);                                                               \
            best[j] = (T)INFINITY;                                                                                 \
            st[j] = 0;                                                                                             \
        }                                                                                                          \
        for (int s = 0; s <= trim; s++) {                                                                          \
            const T *lo = buf + s * BLK, *hi = buf + (s + length - 1) * BLK;                                       \
            T sv = (T)s;                                                                                           \
            for (int j = 0; j < BLK; j++) {                                                                        \
                T a = med[j] - lo[j], b = hi[j] - med[j];                                                          \
                T cost = a > b ? a : b;                                                                            \
                int better = cost < best[j]; /* (SELECTS_LOCAL_STORES: every lane stored) */                       \
                best[j] = better ? cost : best[j];                                                                 \
                st[j] = better ? sv : st[j];                                                                       \
            }                                                                                                      \
        }                                                                                                          \
    }                                                                                                              \
                                                                                                                   \
    /* Two consecutive compare-exchanges sharing a wire, on three rows x, y, z, in registers: (x, y) then (x, z)  */ \
    /* (shape 1), (y, z) (2), (z, x) (3) or (z, y) (4). The same operations in the same order: 3 rows loaded and  */ \
    /* stored instead of 4.                                                                                       */ \
    static inline __attribute__((always_inline)) void chain_##SUFFIX(T *restrict x, T *restrict y, T *restrict z,   \
                                                                     int shape) {                                  \
        for (int j = 0; j < BLK; j++) {                                                                            \
            T u_, w_, vx = x[j], vy = y[j], vz = z[j];                                                             \
            LS_CX(x, y)                                                                                            \
            if (shape == 1) { LS_CX(x, z) }                                                                        \
            else if (shape == 2) { LS_CX(y, z) }                                                                   \
            else if (shape == 3) { LS_CX(z, x) }                                                                   \
            else { LS_CX(z, y) }                                                                                   \
            x[j] = vx; y[j] = vy; z[j] = vz;                                                                       \
        }                                                                                                          \
    }                                                                                                              \
    MULTIVERSION SELECTS static void network_##SUFFIX(T *buf, const long long *pairs, Py_ssize_t npairs) {         \
        for (Py_ssize_t p = 0; p < npairs; p++) {                                                                  \
            long long a = pairs[2 * p], b = pairs[2 * p + 1];                                                      \
            if (p + 1 < npairs) {                                                                                  \
                long long c = pairs[2 * p + 2], e = pairs[2 * p + 3];                                              \
                T *x = buf + a * BLK, *y = buf + b * BLK;                                                          \
                int shape = c == a ? (e == b ? 0 : 1) : c == b ? 2 : e == a ? 3 : e == b ? 4 : 0;                \
                if (shape) {                                                                                       \
                    T *z = buf + (shape == 1 || shape == 2 ? e : c) * BLK;                                         \
                    switch (shape) {                                                                               \
                        case 1: chain_##SUFFIX(x, y, z, 1); break;                                                 \
                        case 2: chain_##SUFFIX(x, y, z, 2); break;                                                 \
                        case 3: chain_##SUFFIX(x, y, z, 3); break;                                                 \
                        default: chain_##SUFFIX(x, y, z, 4); break;                                                \
                    }                                                                                              \
                    p++;                                                                                           \
                    continue;                                                                                      \
                }                                                                                                  \
            }                                                                                                      \
            T *restrict ra = buf + a * BLK;                                                                        \
            T *restrict rb = buf + b * BLK;                                                                        \
            for (int j = 0; j < BLK; j++) {                                                                        \
                T u_ = ra[j], w_ = rb[j];                                                                          \
                ra[j] = u_ < w_ ? u_ : w_;                                                                         \
                rb[j] = u_ > w_ ? u_ : w_;                                                                         \
            }                                                                                                      \
        }                                                                                                          \
    }                                                                                                              \
                                                                                                                   \
    /* One sorted block of BLK columns -> its w outputs. The window's values are added in sorted-position order, */ \
    /* in double, starting from +0.0 (MeaMed: the rows outside a lane's window add +0.0, which changes nothing). */ \
    MULTIVERSION SELECTS_LOCAL_STORES static void finish_##SUFFIX(const T *buf, Py_ssize_t n, int mode, int trim, int length, double inv, \
                                             T *out, Py_ssize_t w) {                                               \
        double acc[BLK];                                                                                           \
        if (mode == 1) { /* median: the middle value, or the midpoint of the two middle values */                \
            const T *m0 = buf + ((n - 1) / 2) * BLK, *m1 = buf + (n / 2) * BLK;                                    \
            for (Py_ssize_t j = 0; j < w; j++) out[j] = (T)(0.5 * (double)m0[j] + 0.5 * (double)m1[j]);            \
            return;                                                                                                \
        }                                                                                                          \
        /* Lanes FINISH_LANES at a time, their sums in registers across the rows (a whole block's 128 sums in      \
         * memory cost a load and a store of the sum per row and vector); each lane adds the same rows in the same \
         * order as before, so the same bits. */                                                                   \
        if (mode == 0) {                                                                                           \
            for (int j0 = 0; j0 < BLK; j0 += FINISH_LANES) {                                                       \
                double a[FINISH_LANES];                                                                            \
                for (int j = 0; j < FINISH_LANES; j++) a[j] = 0.0;                                                 \
                for (Py_ssize_t r = trim; r < trim + length; r++) {                                                \
                    const T *row = buf + r * BLK + j0;                                                             \
                    for (int j = 0; j < FINISH_LANES; j++) a[j] += (double)row[j];                                 \
                }                                                                                                  \
                for (int j = 0; j < FINISH_LANES; j++) acc[j0 + j] = a[j];                                         \
            }                                                                                                      \
        } else { /* window [st, st + length), st in [0, trim]: rows [trim, length) are in every lane's window */   \
            T st[BLK], en[BLK];                                                                                    \
            window_starts_##SUFFIX(buf, n, mode, trim, length, st);                                                \
            for (int j = 0; j < BLK; j++) {                                                                        \
                en[j] = st[j] + (T)length;                                                                         \
                acc[j] = 0.0;                                                                                      \
            }                                                                                                      \
            if (trim < length) { /* rows r < trim: in iff r >= st; [trim, length): always; r >= length: iff r < en */ \
                for (Py_ssize_t r = 0; r < trim; r++) { /* (selects: the whole block, its sums in memory) */       \
                    const T *row = buf + r * BLK;                                                                  \
                    T rv = (T)r;                                                                                   \
                    for (int j = 0; j < BLK; j++) acc[j] += rv >= st[j] ? (double)row[j] : 0.0;                    \
                }                                                                                                  \
                for (int j0 = 0; j0 < BLK; j0 += FINISH_LANES) { /* the rows every window holds: in registers */   \
                    double a[FINISH_LANES];                                                                        \
                    for (int j = 0; j < FINISH_LANES; j++) a[j] = acc[j0 + j];                                     \
                    for (Py_ssize_t r = trim; r < length; r++) {                                                   \
                        const T *row = buf + r * BLK + j0;                                                         \
                        for (int j = 0; j < FINISH_LANES; j++) a[j] += (double)row[j];                             \
                    }                                                                                              \
                    for (int j = 0; j < FINISH_LANES; j++) acc[j0 + j] = a[j];                                     \
                }                                                                                                  \
                for (Py_ssize_t r = length; r < n; r++) {                                                          \
                    const T *row = buf + r * BLK;                                                                  \
                    T rv = (T)r;                                                                                   \
                    for (int j = 0; j < BLK; j++) acc[j] += rv < en[j] ? (double)row[j] : 0.0;                     \
                }                                                                                                  \
            } else for (Py_ssize_t r = 0; r < n; r++) { /* Bulyan's trim >= length: no row in every window */      \
                const T *row = buf + r * BLK;                                                                      \
                T rv = (T)r;                                                                                       \
                for (int j = 0; j < BLK; j++) acc[j] += (rv >= st[j] && rv < en[j]) ? (double)row[j] : 0.0;        \
            }                                                                                                      \
        }                                                                                                          \
        for (Py_ssize_t j = 0; j < w; j++) out[j] = (T)(acc[j] * inv);                                             \
    }                                                                                                              \
                                                                                                                   \
    /* Row weights of one sorted block (see `contributions` below the macro), added to rowacc's lanes. */          \
    MULTIVERSION SELECTS_LOCAL_STORES static void contrib_##SUFFIX(const T *x, Py_ssize_t n, Py_ssize_t d, Py_ssize_t s, Py_ssize_t w,               \
                                 const T *buf, int mode, int trim, int length, double inv, double *rowacc) {       \
        /* Row weight: 1/length strictly inside the window; a value tied with a window boundary gets the */        \
        /* boundary value's window slots shared equally among all rows holding that value. Vectorised   */        \
        /* across the block's columns; O(n) per column.                                                 */        \
        T lo[BLK], hi[BLK], stf[BLK];                                                                              \
        int st[BLK];                                                                                               \
        double lo_tot[BLK], lo_in[BLK], hi_tot[BLK], hi_in[BLK], lo_w[BLK], hi_w[BLK];                             \
        window_starts_##SUFFIX(buf, n, mode, trim, length, stf);                                                   \
        for (int j = 0; j < BLK; j++) {                                                                            \
            st[j] = (int)stf[j];                                                                                   \
            lo[j] = buf[st[j] * BLK + j];                                                                          \
            hi[j] = buf[(st[j] + length - 1) * BLK + j];                                                           \
            lo_tot[j] = lo_in[j] = hi_tot[j] = hi_in[j] = 0.0;                                                     \
        }                                                                                                          \
        for (Py_ssize_t r = 0; r < n; r++) {                                                                       \
            const T *row = buf + r * BLK;                                                                          \
            for (int j = 0; j < BLK; j++) {                                                                        \
                double inside = (r >= st[j] && r < st[j] + length) ? 1.0 : 0.0;                                    \
                double eq_lo = row[j] == lo[j] ? 1.0 : 0.0, eq_hi = row[j] == hi[j] ? 1.0 : 0.0;                  \
                lo_tot[j] += eq_lo; lo_in[j] += eq_lo * inside;                                                    \
                hi_tot[j] += eq_hi; hi_in[j] += eq_hi * inside;                                                    \
            }                                                                                                      \
        }                                                                                                          \
        for (int j = 0; j < BLK; j++) {                                                                            \
            lo_w[j] = lo_in[j] / (lo_tot[j] * length);                                                             \
            hi_w[j] = hi_in[j] / (hi_tot[j] * length);                                                             \
        }                                                                                                          \
        for (Py_ssize_t i = 0; i < n; i++) {                                                                       \
            const T *src = x + i * d + s;                                                                          \
            double *acc = rowacc + i * BLK; /* per-lane sums: vectorisable, reduced once at the end */             \
            for (Py_ssize_t j = 0; j < w; j++) {                                                                   \
                T v = src[j];                                                                                      \
                v = (v != v) ? (T)INFINITY : v;                                                                    \
                double wt = (v > lo[j] && v < hi[j]) ? inv                                                         \
                          : (v == lo[j] ? lo_w[j] : (v == hi[j] ? hi_w[j] : 0.0));                                 \
                acc[j] += wt;                                                                                      \
            }                                                                                                      \
        }                                                                                                          \
    }                                                                                                              \
                                                                                                                   \
    /* Columns [j0, j1), one block of BLK columns at a time: copy the block's n rows into buf (NaN -> +Inf, the  */ \
    /* columns past j1 padded with +Inf, which never move), sort it, write its window means.                     */ \
    MULTIVERSION static void window_##SUFFIX(const T *x, Py_ssize_t n, Py_ssize_t d, Py_ssize_t j0, Py_ssize_t j1, \
                                             const long long *pairs, Py_ssize_t npairs, int mode, int trim,        \
                                             int length, T *out, double *contrib, T *buf, double *rowacc,          \
                                             const Py_ssize_t *plan) {                                             \
        double inv = 1.0 / (double)length;                                                                         \
        /* Past the block's n rows: LOAD_SORT_MAX rows a padded group's sorted +Inf rows land in, LOAD_SORT_MAX rows \
         * a partial block's group is copied to (its columns padded with +Inf), and a row of +Inf (`pad`). */      \
        T *scratch = buf + (n + LOAD_SORT_MAX) * BLK, *pad = buf + (n + 2 * LOAD_SORT_MAX) * BLK;                  \
        for (int j = 0; j < BLK; j++) pad[j] = (T)INFINITY;                                                        \
        for (Py_ssize_t s = j0; s < j1; s += BLK) {                                                                \
            Py_ssize_t w = (j1 - s) < BLK ? (j1 - s) : BLK;                                                        \
            Py_ssize_t first = 0; /* plan[k] groups of 128 >> k rows, from row 0: sorted as they are loaded */    \
            for (int k = 0; k < LOAD_SIZES; k++) {                                                                 \
                int rows = LOAD_SORT_MAX >> k;                                                                     \
                for (Py_ssize_t g = 0; g < plan[k]; g++, first += rows) {                                          \
                    const T *src = x + first * d + s;                                                              \
                    Py_ssize_t real = n - first < rows ? n - first : rows; /* a single group padded past row n */  \
                    Py_ssize_t ss = d;                                                                             \
                    if (w < BLK) {                                                                                 \
                        for (Py_ssize_t i = 0; i < real; i++) {                                                    \
                            for (Py_ssize_t j = 0; j < w; j++) scratch[i * BLK + j] = src[i * d + j];              \
                            for (Py_ssize_t j = w; j < BLK; j++) scratch[i * BLK + j] = (T)INFINITY;               \
                        }                                                                                          \
                        src = scratch;                                                                             \
                        ss = BLK;                                                                                  \
                    }                                                                                              \
                    if (rows == 128) loadsort128_##TS(src, ss, real, pad, buf + first * BLK, BLK, BLK);            \
                    else if (rows == 64) loadsort64_##TS(src, ss, real, pad, buf + first * BLK, BLK, BLK);         \
                    else if (rows == 32) loadsort32_##TS(src, ss, real, pad, buf + first * BLK, BLK, BLK);         \
                    else if (rows == 16) loadsort16_##TS(src, ss, real, pad, buf + first * BLK, BLK, BLK);         \
                    else loadsort8_##TS(src, ss, real, pad, buf + first * BLK, BLK, BLK);                          \
                }                                                                                                  \
            }                                                                                                      \
            for (Py_ssize_t i = first; i < n; i++) {                                                               \
                const T *src = x + i * d + s;                                                                      \
                T *dst = buf + i * BLK;                                                                            \
                if (w == BLK) {                                                                                    \
                    for (int j = 0; j < BLK; j++) { T v = src[j]; dst[j] = (v != v) ? (T)INFINITY : v; }          \
                } else {                                                                                           \
                    for (Py_ssize_t j = 0; j < w; j++) { T v = src[j]; dst[j] = (v != v) ? (T)INFINITY : v; }     \
                    for (Py_ssize_t j = w; j < BLK; j++) dst[j] = (T)INFINITY;                                     \
                }                                                                                                  \
            }                                                                                                      \
            network_##SUFFIX(buf, pairs, npairs);                                                                  \
            finish_##SUFFIX(buf, n, mode, trim, length, inv, out + s, w);                                          \
            if (contrib) contrib_##SUFFIX(x, n, d, s, w, buf, mode, trim, length, inv, rowacc);                    \
        }                                                                                                          \
        if (contrib) {                                                                                             \
            for (Py_ssize_t i = 0; i < n; i++) {                                                                   \
                double total = 0.0;                                                                                \
                for (int j = 0; j < BLK; j++) total += rowacc[i * BLK + j];                                        \
                contrib[i] += total;                                                                               \
            }                                                                                                      \
        }                                                                                                          \
    }

DEFINE_KERNEL(float, f32, BLOCK, f32)
DEFINE_KERNEL(double, f64, BLOCK, f64)
DEFINE_KERNEL(float, f32_small, SMALL_BLOCK, f32)
DEFINE_KERNEL(double, f64_small, SMALL_BLOCK, f64)

/* The network's compute floor (issue 37 item 3; benchmarks/cw_floor.py): compare-exchanges in registers, the kernel's
 * own compare-exchange on the kernel's lanes (a block of BLOCK columns, whichever clone the CPU runs), eight passes
 * of Batcher's 8-wire network between one load and one store of each wire. Its time per compare-exchange and column
 * is the least the network can cost on this CPU: what is left above it is memory traffic. */
#define SPIN_PASS(i, A) BATCHER8(LS_CX)
#define DEFINE_SPIN(T, SUFFIX)                                                                                     \
    MULTIVERSION SELECTS static void spin_##SUFFIX(T *buf, long reps) {                                           \
        for (long r = 0; r < reps; r++) {                                                                          \
            for (int j = 0; j < BLOCK; j++) {                                                                      \
                T ROWS8(LS_DECL, _) u_, w_;                                                                        \
                v0 = buf[j]; v1 = buf[BLOCK + j]; v2 = buf[2 * BLOCK + j]; v3 = buf[3 * BLOCK + j];               \
                v4 = buf[4 * BLOCK + j]; v5 = buf[5 * BLOCK + j]; v6 = buf[6 * BLOCK + j]; v7 = buf[7 * BLOCK + j]; \
                ROWS8(SPIN_PASS, _)                                                                                \
                buf[j] = v7; buf[BLOCK + j] = v6; buf[2 * BLOCK + j] = v5; buf[3 * BLOCK + j] = v4;               \
                buf[4 * BLOCK + j] = v3; buf[5 * BLOCK + j] = v2; buf[6 * BLOCK + j] = v1; buf[7 * BLOCK + j] = v0; \
            }                                                                                                      \
        }                                                                                                          \
    }
DEFINE_SPIN(float, f32)
DEFINE_SPIN(double, f64)

/* compare_exchange_spin(reps, is_double) -> compare-exchanges x columns done (reps x 8 passes x 19 x BLOCK). The
 * stores reverse the wires, so every pass sorts values that are not yet in order. */
static PyObject *py_compare_exchange_spin(PyObject *self, PyObject *args) {
    long reps;
    int is_double;
    if (!PyArg_ParseTuple(args, "lp", &reps, &is_double)) return NULL;
    if (reps < 1) {
        PyErr_SetString(PyExc_ValueError, "_cwkernel.compare_exchange_spin: reps must be >= 1");
        return NULL;
    }
    size_t elem = is_double ? sizeof(double) : sizeof(float);
    void *raw = malloc(8 * BLOCK * elem + 64);
    if (!raw) return PyErr_NoMemory();
    void *buf = (void *)(((size_t)raw + 63) / 64 * 64);
    for (int i = 0; i < 8 * BLOCK; i++) {
        double v = (double)((i * 7919) % 8191) - 4095.0;
        if (is_double) ((double *)buf)[i] = v;
        else ((float *)buf)[i] = (float)v;
    }
    Py_BEGIN_ALLOW_THREADS
    if (is_double) spin_f64((double *)buf, reps);
    else spin_f32((float *)buf, reps);
    Py_END_ALLOW_THREADS
    free(raw);
    return PyLong_FromLongLong((long long)reps * 8 * 19 * BLOCK);
}

/* Columns per block: the (n, block) buffer the network sorts must stay in the core's L2 cache. Measured on an AMD
 * EPYC (float32, d = 79,510, trimmed mean, one thread; L2 = 512 KB), before the L1 tiles: BLOCK = 128 is faster up
 * to n = 500 (256 KB buffer; 32-column blocks take 1.1-1.7x longer there), SMALL_BLOCK = 32 from n = 750 (384 KB:
 * 1.4x faster) and at n = 1000 (512 KB: 1.1-1.4x faster). Kept as it was: the block also fixes the order in which
 * the contributions' per-lane sums are added, so changing it would change their last bits. */
static Py_ssize_t block_for(Py_ssize_t n, int is_double) {
    size_t elem = is_double ? sizeof(double) : sizeof(float);
    return (size_t)n * BLOCK * elem <= BUFFER_BYTES ? BLOCK : SMALL_BLOCK;
}

/* Rows of a block per L1 tile, for the order of the compare-exchanges (_sortnet.cache_order): the largest power
 * of two whose rows of one block fill at most two thirds of this core's L1 data cache (sysconf; 32 KiB where the
 * system does not say), at least 2. Only the order of the compare-exchanges depends on it, never a value. */
static long l1_bytes(void) {
    static long cached = 0;
    if (cached == 0) {
        long v = -1;
#ifdef _SC_LEVEL1_DCACHE_SIZE
        v = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
        cached = v > 0 ? v : 32 * 1024;
    }
    return cached;
}

static PyObject *py_tile_rows(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    int is_double;
    if (!PyArg_ParseTuple(args, "np", &n, &is_double)) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "_cwkernel.tile_rows: n must be >= 1");
        return NULL;
    }
    size_t row = (size_t)block_for(n, is_double) * (is_double ? sizeof(double) : sizeof(float));
    long rows = 2;
    while ((size_t)rows * 2 * row <= (size_t)l1_bytes() * 2 / 3) rows *= 2;
    return PyLong_FromLong(rows);
}

static void window_any(int is_double, Py_ssize_t blk, Py_ssize_t xp, Py_ssize_t n, Py_ssize_t d, Py_ssize_t j0,
                       Py_ssize_t j1, Py_ssize_t pp, Py_ssize_t npairs, int mode, int trim, int length, Py_ssize_t op,
                       double *contrib, void *buf, double *rowacc, const Py_ssize_t *plan) {
    const long long *pairs = (const long long *)pp;
    if (is_double && blk == BLOCK)
        window_f64((const double *)xp, n, d, j0, j1, pairs, npairs, mode, trim, length, (double *)op, contrib,
                   (double *)buf, rowacc, plan);
    else if (is_double)
        window_f64_small((const double *)xp, n, d, j0, j1, pairs, npairs, mode, trim, length, (double *)op, contrib,
                         (double *)buf, rowacc, plan);
    else if (blk == BLOCK)
        window_f32((const float *)xp, n, d, j0, j1, pairs, npairs, mode, trim, length, (float *)op, contrib,
                   (float *)buf, rowacc, plan);
    else
        window_f32_small((const float *)xp, n, d, j0, j1, pairs, npairs, mode, trim, length, (float *)op, contrib,
                         (float *)buf, rowacc, plan);
}

/* The (n, blk) block buffer, its first row on a 64-byte boundary (*raw is what to free), and, with contributions,
 * the per-lane row sums; NULL if out of memory (then nothing is left allocated). */
static void *alloc_buffers(Py_ssize_t n, Py_ssize_t blk, int is_double, int want, void **raw, double **rowacc) {
    size_t elem = is_double ? sizeof(double) : sizeof(float);
    *raw = malloc(((size_t)n + 2 * LOAD_SORT_MAX + 1) * blk * elem + 64); /* + the load sort's rows (window_) */
    *rowacc = want ? (double *)calloc((size_t)n * blk, sizeof(double)) : NULL;
    if (!*raw || (want && !*rowacc)) {
        free(*raw);
        free(*rowacc);
        *raw = NULL;
        *rowacc = NULL;
        return NULL;
    }
    return (void *)(((size_t)*raw + 63) / 64 * 64);
}

/* The load plan: plan[k] groups of 128 >> k rows (128, 64, 32, 16, 8), from row 0 on, sorted as they are loaded:
 * whole groups within the n rows, or one group alone that covers them all, padded (rows / 2 < n < rows: the rows past n
 * hold +Inf, which never moves, so every real wire ends as in Batcher's network on n wires). Valid? */
static int plan_ok(Py_ssize_t n, const Py_ssize_t *plan) {
    Py_ssize_t rows = 0, groups = 0, largest = 0;
    for (int k = 0; k < LOAD_SIZES; k++) {
        if (plan[k] < 0 || plan[k] > n) return 0;
        rows += plan[k] * (LOAD_SORT_MAX >> k);
        groups += plan[k];
        if (plan[k] && !largest) largest = LOAD_SORT_MAX >> k;
    }
    return rows <= n || (groups == 1 && 2 * n > largest);
}

/* The window lies within the n sorted rows: [trim, trim + length) (mode 0), the median's one (odd n) or two (even n)
 * positions from (n - 1) / 2 (mode 1), each of MeaMed's trim + 1 windows [s, s + length), s <= trim (mode 2). Read
 * past row n, a window would add the load sort's scratch rows, or memory past the buffer. */
static int window_ok(Py_ssize_t n, int mode, int trim, int length) {
    if (mode < 0 || mode > 2 || trim < 0 || length < 1) return 0;
    if (mode == 1) return length == (n % 2 ? 1 : 2);
    return (Py_ssize_t)trim + length <= n;
}

/* window(x_ptr, n, d, j0, j1, pairs_ptr, npairs, mode, trim, length, out_ptr, contrib_ptr_or_0, is_double
 *        [, groups128, groups64, groups32, groups16, groups8]) */
static PyObject *py_window(PyObject *self, PyObject *args) {
    Py_ssize_t xp, n, d, j0, j1, pp, npairs, op, cp, plan[LOAD_SIZES] = {0, 0, 0, 0, 0};
    int mode, trim, length, is_double;
    if (!PyArg_ParseTuple(args, "nnnnnnniiinnp|nnnnn", &xp, &n, &d, &j0, &j1, &pp, &npairs, &mode, &trim, &length, &op,
                          &cp, &is_double, &plan[0], &plan[1], &plan[2], &plan[3], &plan[4]))
        return NULL;
    if (n < 1 || d < 1 || j0 < 0 || j1 > d || j0 > j1 || !window_ok(n, mode, trim, length) || !plan_ok(n, plan)) {
        PyErr_SetString(PyExc_ValueError, "_cwkernel.window: invalid arguments");
        return NULL;
    }
    Py_ssize_t blk = block_for(n, is_double);
    void *raw;
    double *rowacc;
    void *buf = alloc_buffers(n, blk, is_double, cp != 0, &raw, &rowacc);
    if (!buf) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    window_any(is_double, blk, xp, n, d, j0, j1, pp, npairs, mode, trim, length, op, (double *)cp, buf, rowacc, plan);
    Py_END_ALLOW_THREADS
    free(raw);
    free(rowacc);
    Py_RETURN_NONE;
}

/* window_parallel(x_ptr, n, d, pairs_ptr, npairs, mode, trim, length, out_ptr, contrib_ptr_or_0, is_double,
 *                 threads[, groups128, ..., groups8]) -> chunks. The columns are cut into `chunks` = min(threads, blocks) equal runs of whole
 * blocks, fixed by the arguments alone; contrib, when given, has `chunks` rows of n: row k gets the sums of chunk k's
 * columns (the caller adds the rows, in order). The chunks are shared out over an OpenMP team of at most `threads`
 * (a static loop), so every chunk is computed, by whichever thread, whatever team the runtime actually grants: a
 * smaller one (OMP_DYNAMIC=true under load, OMP_THREAD_LIMIT, a nested region) runs the same chunks with fewer
 * threads, and the output and the contributions are the same bit for bit (tests/test_determinism.py). Splitting by
 * omp_get_thread_num() instead left the columns of threads that never ran unwritten. */
static PyObject *py_window_parallel(PyObject *self, PyObject *args) {
    Py_ssize_t xp, n, d, pp, npairs, op, cp, plan[LOAD_SIZES] = {0, 0, 0, 0, 0};
    int mode, trim, length, is_double, threads;
    if (!PyArg_ParseTuple(args, "nnnnniiinnpi|nnnnn", &xp, &n, &d, &pp, &npairs, &mode, &trim, &length, &op, &cp,
                          &is_double, &threads, &plan[0], &plan[1], &plan[2], &plan[3], &plan[4]))
        return NULL;
    if (n < 1 || d < 1 || !window_ok(n, mode, trim, length) || threads < 1 || !plan_ok(n, plan)) {
        PyErr_SetString(PyExc_ValueError, "_cwkernel.window_parallel: invalid arguments");
        return NULL;
    }
    Py_ssize_t blk = block_for(n, is_double);
    Py_ssize_t blocks = (d + blk - 1) / blk;
    int chunks = threads > blocks ? (int)blocks : threads;
    Py_ssize_t per = (blocks + chunks - 1) / chunks * blk; /* columns per chunk, a multiple of the block */
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel for num_threads(chunks) schedule(static) reduction(| : failed)
#endif
    for (int k = 0; k < chunks; k++) {
        Py_ssize_t j0 = (Py_ssize_t)k * per, j1 = j0 + per < d ? j0 + per : d;
        if (j0 < j1) {
            void *raw;
            double *rowacc;
            void *buf = alloc_buffers(n, blk, is_double, cp != 0, &raw, &rowacc);
            if (!buf) {
                failed = 1;
            } else {
                double *crow = cp ? (double *)cp + (size_t)k * n : NULL;
                window_any(is_double, blk, xp, n, d, j0, j1, pp, npairs, mode, trim, length, op, crow, buf, rowacc,
                           plan);
            }
            free(raw);
            free(rowacc);
        }
    }
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    return PyLong_FromLong(chunks);
}

/* load_sort_schedule([rows]) -> a load-time group's compare-exchanges in the order the kernel runs them (rows 32, the
 * default, 64 or 128: the pieces above M32_BLOCK and the streams of _cwkernel_streams.h); tests/test_cw_loadsort.py checks that every wire has
 * Batcher's sequence. load_sort_network(rows) -> the compare-exchanges a group of `rows` (8 ... 128) runs as it
 * is loaded: Batcher's list for 8, 16 and 32; the schedule for 64 and 128 (the same compare-exchanges and the same sequence
 * on every wire, which is what the Python side's plan checks). load_sort_sizes() -> the plan's group sizes, in the
 * order of window's plan arguments. */
#define LS_PAIR(a, b) if (ok) { PyObject *t = Py_BuildValue("(ii)", a, b); ok = t && PyList_Append(list, t) == 0; Py_XDECREF(t); }
#define LS_NONE(i)
#define LS_PAIR_OFF(a, b) LS_PAIR(off + (a), off + (b))
#define LS_PAIR_BLOCK(a, b) LS_PAIR(off + r + stride * (a), off + r + stride * (b))
static int schedule32(PyObject *list, int off) {
    int ok = 1, stride = 4, base = off;
    BATCHER16(LS_PAIR_OFF)
    off = base + 16;
    BATCHER16(LS_PAIR_OFF)
    off = base;
    for (int r = 0; r < 4; r++) { M32_BLOCK(LS_PAIR_BLOCK) }
    M32_STREAM(LS_NONE, LS_PAIR_OFF, LS_NONE)
    return ok;
}

static int schedule64(PyObject *list, int off) {
    int ok = schedule32(list, off) && schedule32(list, off + 32), stride = 8;
    for (int r = 0; r < 8; r++) { M32_BLOCK(LS_PAIR_BLOCK) }
    M64_STREAM(LS_NONE, LS_PAIR_OFF, LS_NONE)
    return ok;
}

static int schedule128(PyObject *list) {
    int ok = schedule64(list, 0) && schedule64(list, 64), off = 0, stride = 16;
    for (int r = 0; r < 16; r++) { M32_BLOCK(LS_PAIR_BLOCK) }
    M128_STREAM(LS_NONE, LS_PAIR, LS_NONE)
    return ok;
}

static PyObject *py_load_sort_schedule(PyObject *self, PyObject *args) {
    int rows = 32, ok;
    if (!PyArg_ParseTuple(args, "|i", &rows)) return NULL;
    if (rows != 32 && rows != 64 && rows != 128) {
        PyErr_SetString(PyExc_ValueError, "_cwkernel.load_sort_schedule: rows must be 32, 64 or 128");
        return NULL;
    }
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    ok = rows == 32 ? schedule32(list, 0) : rows == 64 ? schedule64(list, 0) : schedule128(list);
    if (!ok) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

static PyObject *py_load_sort_network(PyObject *self, PyObject *args) {
    int rows, ok = 1;
    if (!PyArg_ParseTuple(args, "i", &rows)) return NULL;
    if (rows != 8 && rows != 16 && rows != 32 && rows != 64 && rows != 128) {
        PyErr_SetString(PyExc_ValueError, "_cwkernel.load_sort_network: rows must be 8, 16, 32, 64 or 128");
        return NULL;
    }
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    if (rows == 8) { BATCHER8(LS_PAIR) } else if (rows == 16) { BATCHER16(LS_PAIR) }
    else if (rows == 32) { BATCHER32(LS_PAIR) } else if (rows == 64) { ok = schedule64(list, 0); }
    else { ok = schedule128(list); }
    if (!ok) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

static PyObject *py_load_sort_sizes(PyObject *self, PyObject *noargs) {
    PyObject *sizes = PyTuple_New(LOAD_SIZES);
    if (!sizes) return NULL;
    for (int k = 0; k < LOAD_SIZES; k++) {
        PyObject *v = PyLong_FromLong(LOAD_SORT_MAX >> k);
        if (!v) {
            Py_DECREF(sizes);
            return NULL;
        }
        PyTuple_SET_ITEM(sizes, k, v);
    }
    return sizes;
}

static PyObject *py_has_openmp(PyObject *self, PyObject *noargs) {
#ifdef _OPENMP
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"window", py_window, METH_VARARGS, "Coordinate-wise window mean over a column range (see module source)."},
    {"window_parallel", py_window_parallel, METH_VARARGS,
     "Coordinate-wise window mean over all columns, split between the threads of an OpenMP team."},
    {"tile_rows", py_tile_rows, METH_VARARGS, "Rows of a block per L1 tile (the order of the compare-exchanges)."},
    {"has_openmp", py_has_openmp, METH_NOARGS, "Whether window_parallel runs on an OpenMP team."},
    {"compare_exchange_spin", py_compare_exchange_spin, METH_VARARGS,
     "Compare-exchanges in registers, the network's compute floor (benchmarks/cw_floor.py)."},
    {"load_sort_network", py_load_sort_network, METH_VARARGS,
     "The compare-exchanges a group of 8, 16, 32, 64 or 128 rows runs as it is loaded (Batcher's network)."},
    {"load_sort_schedule", py_load_sort_schedule, METH_VARARGS,
     "The 32-, 64- or 128-row load sort's compare-exchanges in the order the kernel runs them."},
    {"load_sort_sizes", py_load_sort_sizes, METH_NOARGS, "The load plan's group sizes, in its arguments' order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cwkernel", "Sorting-network coordinate-wise kernel.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__cwkernel(void) { return PyModule_Create(&module); }
