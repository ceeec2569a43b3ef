/*
 * MeaMed (mean around the median) of a float32 column by selection -- the same bits as the sorting network's
 * (_cwkernel.c, window_starts_ and finish_), or a flag asking for it. Included by _cwselect.c after its helpers.
 *
 * What the network computes. With the column sorted, x_(0) <= ... <= x_(n-1), trim <= (n - 1) / 2 and
 * L = n - trim: med = (float)(0.5 x_((n-1)/2) + 0.5 x_(n/2)) (in double); for each start s = 0 .. trim, in
 * float32, cost(s) = max(med - x_(s), x_(s+L-1) - med); the start is the first s of least cost (a window replaces
 * the best so far only on a strictly smaller cost, the best starting at +inf); the output is the window's L values
 * added in double from +0.0 in sorted order, times 1/L, rounded to float32.
 *
 * The same start, found by selection. Let D(v) = |v - med| rounded to float32 (fabsf of the float32 difference):
 * med - x_(s) = D(x_(s)) since x_(s) <= x_((n-1)/2) <= med (rounding is odd-symmetric), and likewise
 * x_(s+L-1) - med = D(x_(s+L-1)). Rounding is monotone, so D does not increase along the sorted ranks up to the
 * median and does not decrease after it: each set {D <= r} is a run of consecutive ranks around the median, and
 * the largest D over a window that holds the median's ranks (every window here does) is at one of its ends. Let
 * r* be the value of rank L - 1 among the n distances. Fewer than L values have D < r*, so every window holds one
 * with D >= r*: cost(s) >= r*. The run {D <= r*} = [p, q] holds at least L ranks, so the window at p costs r*
 * and every earlier one costs more (its first value has D > r*): the network's start is p, the window ranks
 * [p, p + L), the first L of the run in sorted order -- first the values below the median with D = r* (A of
 * them), then those with D < r* (B), then those above the median with D = r* (C), each in ascending order. So:
 *   A + B <= L: the window is the A + B values and the L - A - B smallest of the C (quickselect among those);
 *   A + B > L and r* = 0: the window is L copies of med (D = 0 only for v = med);
 *   A + B > L and r* > 0 (the window cuts the values with D < r*, e.g. behind a cluster of equal values at r*):
 *   the A values and the smallest L - A of the B, by quickselect on the whole column (A < L: at most n / 2 < L
 *   values lie below the median).
 * r* is selected like the other ranks here: the 64 sampled values' distances give a bracket around rank L - 1
 * (sample_distance_rank); one pass counts and adds (in double) the values with D below
 * it -- all in the window when A + B <= L -- and copies those inside it; quickselect there (or on the whole column
 * when the rank fell outside) gives r*. The sum is then exact in any order under the condition of _cwselect.c's
 * header (e_max: the window's largest |value|), tested on the median's values after the first pass and on the
 * values below the distance bracket after the second, before any quickselect; otherwise flagged. An infinite
 * median or r* (the window would hold an infinity) is flagged too.
 *
 * Cost: two passes (the median's bracket, the distances), three selections in small brackets, and the two
 * transposes and samples _cwselect.c shares with the other rules (benchmarks/cw_select.py).
 */

/* The value of rank k (0-based; -inf below 0, +inf past the end) among the sample's distances to med (sorted: the
 * sample ascending, along which D falls then rises): the k + 1 smallest distances fill a run of k + 1 consecutive
 * sample positions, so the value is the least over runs of their largest distance, max(D[l], D[l + k]) -- the
 * header's argument on 64 values, branch-free. */
COUNTS static float sample_distance_rank(const float *sorted, float med, int k) {
    if (k < 0) return -INFINITY;
    if (k >= SAMPLE) return INFINITY;
    float dist[SAMPLE], best = INFINITY;
    for (int i = 0; i < SAMPLE; i++) dist[i] = fabsf(sorted[i] - med);
    for (int l = 0; l + k < SAMPLE; l++) {
        float a = dist[l], b = dist[l + k], c = a > b ? a : b;
        best = c < best ? c : best;
    }
    return best;
}

typedef struct {
    Py_ssize_t below, inside; /* values with D < lo; values with lo <= D <= hi (copied) */
    double sum;               /* sum of the values with D < lo */
    float top;                /* their largest |value| (0 if none) */
} distance_pass_result;

/* One pass over col: the values with D < lo counted, added and their largest |value| kept; those with
 * lo <= D <= hi copied to inside. */
AVX2 static distance_pass_result distance_pass(const float *col, Py_ssize_t n, float med, float lo, float hi,
                                               float *inside) {
    const __m256 vmed = _mm256_set1_ps(med), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    __m256i below = _mm256_setzero_si256();
    __m256 top = _mm256_setzero_ps();
    Py_ssize_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(col + i);
        __m256 dist = _mm256_andnot_ps(sign, _mm256_sub_ps(v, vmed));
        __m256 lt = _mm256_cmp_ps(dist, vlo, _CMP_LT_OQ), le = _mm256_cmp_ps(dist, vhi, _CMP_LE_OQ);
        below = _mm256_sub_epi32(below, _mm256_castps_si256(lt));
        __m256 w = _mm256_and_ps(v, lt);
        add_lanes(&s0, &s1, w);
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, w));
        int m = _mm256_movemask_ps(_mm256_andnot_ps(lt, le));
        c = keep_lanes(inside, c, v, m);
    }
    distance_pass_result r;
    uint32_t b[8];
    float t[8];
    _mm256_storeu_si256((__m256i *)b, below);
    _mm256_storeu_ps(t, top);
    r.below = 0;
    r.top = 0.0f;
    for (int j = 0; j < 8; j++) {
        r.below += b[j];
        if (t[j] > r.top) r.top = t[j];
    }
    r.sum = hsum(s0, s1);
    for (; i < n; i++) {
        float v = col[i], dist = fabsf(v - med);
        if (dist < lo) {
            r.below++;
            r.sum += v;
            if (fabsf(v) > r.top) r.top = fabsf(v);
        } else if (dist <= hi) {
            inside[c++] = v;
        }
    }
    r.inside = c;
    return r;
}

/* The window when A + B > L and r* > 0 (it cuts the values with D < r*), from the whole column: the A values
 * below the median with D == r* and the smallest k = L - A of the values with D < r*. Those below the median
 * come first and are all kept -- with the A values they are below med, at most n / 2 < L of them -- then the
 * copies of med, then the values above med: only these are selected, the smallest k' = k - (those below) -
 * (copies of med) of them when k' > 0, else the window ends in copies of med. buf, a, b: scratch of n + 16 floats.
 * The path of columns with few distinct values (rounded or quantised updates at a large trim) and of a cluster of
 * equal values at r*. */
AVX2 static int cut_window(const float *col, Py_ssize_t n, float med, float r, Py_ssize_t length, int check_exact,
                           uint32_t min_abs_bits, float *buf, float *a, float *b, uint64_t *rng, float *out) {
    const __m256 vmed = _mm256_set1_ps(med), vr = _mm256_set1_ps(r), sign = _mm256_set1_ps(-0.0f);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    __m256i kept_count = _mm256_setzero_si256(), med_count = kept_count;
    __m256 top = _mm256_setzero_ps();
    Py_ssize_t kept = 0, at_med = 0, c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(col + i);
        __m256 dist = _mm256_andnot_ps(sign, _mm256_sub_ps(x, vmed));
        __m256 below = _mm256_cmp_ps(x, vmed, _CMP_LT_OQ), above = _mm256_cmp_ps(x, vmed, _CMP_GT_OQ);
        /* below med with D <= r*: the A values and the nearer ones below, all in the window */
        __m256 keep = _mm256_and_ps(below, _mm256_cmp_ps(dist, vr, _CMP_LE_OQ));
        __m256 candidate = _mm256_and_ps(above, _mm256_cmp_ps(dist, vr, _CMP_LT_OQ));
        kept_count = _mm256_sub_epi32(kept_count, _mm256_castps_si256(keep));
        med_count = _mm256_sub_epi32(med_count, _mm256_castps_si256(_mm256_cmp_ps(x, vmed, _CMP_EQ_OQ)));
        __m256 w = _mm256_and_ps(x, keep);
        add_lanes(&s0, &s1, w);
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, w));
        int m = _mm256_movemask_ps(candidate);
        c = keep_lanes(buf, c, x, m);
    }
    uint32_t kc[8], mc[8];
    float tp[8], largest = 0.0f, v;
    _mm256_storeu_si256((__m256i *)kc, kept_count);
    _mm256_storeu_si256((__m256i *)mc, med_count);
    _mm256_storeu_ps(tp, top);
    for (int j = 0; j < 8; j++) {
        kept += kc[j];
        at_med += mc[j];
        if (tp[j] > largest) largest = tp[j];
    }
    double sum = hsum(s0, s1);
    for (; i < n; i++) {
        float x = col[i], dist = fabsf(x - med);
        if (x < med && dist <= r) {
            kept++;
            sum += x;
            if (fabsf(x) > largest) largest = fabsf(x);
        } else if (x > med && dist < r) {
            buf[c++] = x;
        }
        at_med += x == med;
    }
    Py_ssize_t copies = length - kept; /* of med, then values above it: kept < L */
    if (copies > at_med) copies = at_med;
    Py_ssize_t rest = length - kept - copies; /* the smallest `rest` values above med */
    if (copies > 0) {
        sum += (double)copies * (double)med;
        if (fabsf(med) > largest) largest = fabsf(med);
    }
    if (rest > c) return 1; /* not reached: A + B > L */
    if (rest > 0) {
        double part;
        if (sum_smallest(buf, c, rest, a, b, rng, &part, &v) != 0) return 1;
        sum += part;
        if (fabsf(v) > largest) largest = fabsf(v);
    }
    /* largest: the window's largest |value|. The selected values above med lie in (med, v]; when med < 0 and no
     * copy of med is in the window, the median's lower value m0 < med is kept, and |m0| > |x| for x in (med, 0] */
    if (check_exact && !exact_in_any_order(length, largest, largest, min_abs_bits)) return 1;
    *out = (float)(sum * (1.0 / (double)length));
    return 0;
}

/* The window from the candidates cand[0, m) (every value with D >= the bracket's low end, or the whole column)
 * once r* = rank q of their distances is known: out and 0, or 1 (flag). base: the values below the bracket.
 * a, b, high: scratch of m + 16 floats, none of them cand. */
AVX2 static int meamed_window(const float *col, Py_ssize_t n, const float *cand, Py_ssize_t m, Py_ssize_t q,
                              distance_pass_result base, float med, Py_ssize_t length, int check_exact,
                              uint32_t min_abs_bits, float *a, float *b, float *high, uint64_t *rng, float *out) {
    const __m256 vmed = _mm256_set1_ps(med), sign = _mm256_set1_ps(-0.0f);
    Py_ssize_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(a + i, _mm256_andnot_ps(sign, _mm256_sub_ps(_mm256_loadu_ps(cand + i), vmed)));
    for (; i < m; i++) a[i] = fabsf(cand[i] - med);
    float r;
    if (select_rank(a, b, m, q, rng, &r) != 0) return 1;
    if (isinf(r)) return 1; /* the window would hold an infinity */
    /* the candidates with D < r (B) and those at or below med with D == r (A): in the window; those above med
     * with D == r: copied to high */
    const __m256 vr = _mm256_set1_ps(r);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    __m256i taken = _mm256_setzero_si256();
    __m256 top = _mm256_setzero_ps();
    Py_ssize_t c = 0;
    for (i = 0; i + 8 <= m; i += 8) {
        __m256 v = _mm256_loadu_ps(cand + i);
        __m256 dist = _mm256_andnot_ps(sign, _mm256_sub_ps(v, vmed));
        __m256 lt = _mm256_cmp_ps(dist, vr, _CMP_LT_OQ), eq = _mm256_cmp_ps(dist, vr, _CMP_EQ_OQ);
        __m256 low = _mm256_cmp_ps(v, vmed, _CMP_LE_OQ);
        __m256 in = _mm256_or_ps(lt, _mm256_and_ps(eq, low));
        taken = _mm256_sub_epi32(taken, _mm256_castps_si256(in));
        __m256 w = _mm256_and_ps(v, in);
        add_lanes(&s0, &s1, w);
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, w));
        int hm = _mm256_movemask_ps(_mm256_andnot_ps(low, eq));
        c = keep_lanes(high, c, v, hm);
    }
    uint32_t tk[8];
    float tp[8];
    _mm256_storeu_si256((__m256i *)tk, taken);
    _mm256_storeu_ps(tp, top);
    Py_ssize_t in_window = base.below; /* A + B */
    float largest = base.top;
    for (int j = 0; j < 8; j++) {
        in_window += tk[j];
        if (tp[j] > largest) largest = tp[j];
    }
    double sum = base.sum + hsum(s0, s1);
    for (; i < m; i++) {
        float v = cand[i], dist = fabsf(v - med);
        int low = v <= med;
        if (dist < r || (dist == r && low)) {
            in_window++;
            sum += v;
            if (fabsf(v) > largest) largest = fabsf(v);
        } else if (dist == r) {
            high[c++] = v;
        }
    }
    if (in_window > length) { /* A + B > L: the window cuts the ties below the median or the values with D < r* */
        if (r != 0.0f)
            return cut_window(col, n, med, r, length, check_exact, min_abs_bits, high, a, b, rng, out);
        *out = mean_of_copies(length, med); /* L copies of med */
        return 0;
    }
    Py_ssize_t need = length - in_window; /* the smallest `need` values above med with D == r* */
    if (need > c) return 1;               /* not reached: A + B + C >= L by r*'s rank */
    if (need > 0) {
        double part;
        float v;
        if (sum_smallest(high, c, need, a, b, rng, &part, &v) != 0) return 1;
        sum += part;
        if (fabsf(v) > largest) largest = fabsf(v);
    }
    if (check_exact && !exact_in_any_order(length, largest, largest, min_abs_bits)) return 1;
    *out = (float)(sum * (1.0 / (double)length));
    return 0;
}

/* MeaMed of one column (the header's method): *out and 0, or 1 (flag). scratch: 4 arrays of n + 16 floats. */
AVX2 static int meamed_column(const float *col, Py_ssize_t n, Py_ssize_t length, int check_exact, const float *sorted,
                              float *scratch, uint64_t *rng, float *out) {
    Py_ssize_t stride = n + 16;
    float *in1 = scratch, *in2 = scratch + stride, *a = scratch + 2 * stride, *b = scratch + 3 * stride;
    float m0, m1, lo, hi;
    uint32_t min_abs_bits;
    if (rank_pair(col, n, (n - 1) / 2, n / 2, sorted, in1, a, b, rng, &m0, &m1, &min_abs_bits) != 0) return 1;
    if (isinf(m0) || isinf(m1)) return 1;
    float med = (float)(0.5 * (double)m0 + 0.5 * (double)m1);
    /* the window holds the median's ranks: a sum the condition rejects with their values is flagged now */
    float near = fabsf(m0) > fabsf(m1) ? fabsf(m0) : fabsf(m1);
    if (check_exact && !exact_in_any_order(length, near, near, min_abs_bits)) return 1;
    double rank = (length - 0.5) * SAMPLE / (double)n - 0.5; /* rank L - 1's expected sample rank, as bracket() */
    lo = sample_distance_rank(sorted, med, (int)floor(rank - SPREAD));
    hi = sample_distance_rank(sorted, med, (int)ceil(rank + SPREAD));
    distance_pass_result base = distance_pass(col, n, med, lo, hi, in2);
    Py_ssize_t q = length - 1 - base.below;
    if (q < 0 || q >= base.inside) { /* r* outside the bracket: every value is a candidate */
        distance_pass_result none = {0, 0, 0.0, 0.0f};
        return meamed_window(col, n, col, n, length - 1, none, med, length, check_exact, min_abs_bits, a, b, in1, rng,
                             out);
    }
    if (check_exact && base.top > near && !exact_in_any_order(length, base.top, base.top, min_abs_bits)) return 1;
    return meamed_window(col, n, in2, base.inside, q, base, med, length, check_exact, min_abs_bits, a, b, in1, rng,
                         out);
}
