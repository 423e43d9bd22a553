// stein_kernels.cu - a subset of a symmetric tridiagonal T's eigenpairs on the GPU: bisection on
// Sturm counts for the eigenvalues (LAPACK dstebz / dlaebz), inverse iteration for the vectors
// (LAPACK dstein with dlagtf / dlagts).  stein_device.py launches them; stein_twin.py is their
// NumPy twin, statement for statement.
//
// Every product is __dmul_rn and every sum __dadd_rn / __dsub_rn: none is contracted into a
// fused multiply-add, so each value is the IEEE double of the expression as written (division
// and sqrt are IEEE in double precision on the GPU).  With no atomics and every reduction in a
// fixed order, the results are the same bits on every run, on every GPU, and in the twin.
//
// Storage: T is d[0..n), e[0..n-1).  The LU factors of the batch's K vectors are n x K row-major
// (element (i, j) at i * K + j: a warp's threads read one row's consecutive elements); the
// iterates Y are n x K column-major (element (i, j) at j * n + i), the columns of the result.
// Vector j lives in the rows [rowFirst[j], rowEnd[j]) of its unreduced block of T.

#define MUL(a, b) __dmul_rn((a), (b))
#define ADD(a, b) __dadd_rn((a), (b))
#define SUB(a, b) __dsub_rn((a), (b))

// ---- bisection ------------------------------------------------------------------------------
// One step of the Sturm count of T' - x I = L D L^T (T' = T with the negligible e_i of dstebz
// set to zero; e2[i] = e_i^2, exactly 0 at those splits): the pivot
//     q_0 = d_0 - x,    q_i = (d_i - e2_{i-1} / q_{i-1}) - x,
// counted when q <= pivmin and then replaced by min(q, -pivmin) (dlaebz's guard: a pivot within
// pivmin of zero counts as negative and the next division stays finite).  At a split e2 = 0,
// so q = d_i - x: the count restarts and count(x) is the sum of the blocks' counts.
__device__ __forceinline__ double sturmStep(double q, double x, double pivmin, long long& c) {
  const double qx = SUB(q, x);
  if (qx <= pivmin) {
    ++c;
    return fmin(qx, -pivmin);
  }
  return qx;
}

// The number of eigenvalues of T' less than x (to pivmin): the negative pivots of T' - x I.
__device__ long long sturmCount(const double* d, const double* e2, long long n, double x, double pivmin) {
  long long c = 0;
  double q = sturmStep(d[0], x, pivmin, c);
  for (long long i = 1; i < n; ++i) q = sturmStep(SUB(d[i], e2[i - 1] / q), x, pivmin, c);
  return c;
}

// Bisection of (a, b] for the eigenvalue of index j of the matrix (d, e2) of n rows: keeps
// count(a) <= j < count(b) and stops as dlaebz does, when b - a < max(abstol, pivmin,
// reltol max(|a|, |b|)), or past itmax halvings (returns false).  ca: count(a), kept.
__device__ bool bisect(const double* d, const double* e2, long long n, long long j, double pivmin, double abstol,
                       double reltol, int itmax, double& a, double& b, long long& ca) {
  for (int it = 0;; ++it) {
    const double tol = fmax(fmax(abstol, pivmin), MUL(reltol, fmax(fabs(a), fabs(b))));
    if (SUB(b, a) < tol) return true;
    if (it == itmax) return false;
    const double mid = MUL(0.5, ADD(a, b));
    const long long c = sturmCount(d, e2, n, mid, pivmin);
    if (c <= j) {  // eigenvalue j is above mid
      a = mid;
      ca = c;
    } else {
      b = mid;
    }
  }
}

// Thread t: eigenvalue j = lo + t (0-based, ascending) of T', in two bisections.
//  1. On the whole matrix from its widened Gershgorin interval (gl, gu] (counts 0 and n there:
//     flag bit 1 otherwise) to the tolerance abstol = ulp max(|gl|, |gu|).
//  2. The block: eigenvalues count(a)..count(b)-1 lie in (a, b]; the r-th of them (r = j -
//     count(a)) belongs to the first block, in row order, at which the blocks' counts in (a, b]
//     (count_B(b) - count_B(a)) summed pass r; it is that block's eigenvalue jB = count_B(a) +
//     (r - the sum before it) (flag bit 4 if no block is found).
//  3. On the block alone from (a, b] cut to the block's widened Gershgorin interval, to the
//     block's tolerance ulp max(|gl_B|, |gu_B|) as dstebz bisects block by block: a small block
//     split off a large matrix gets its eigenvalues to its own scale (its vectors need them so).
//     A block of one row: w = its d (dstebz).  Flag bit 8 if the counts at the cut interval's
//     ends do not hold jB.
// Flag bit 2: a bisection did not converge in itmax halvings.  w = (a + b) / 2; the rows
// [rowFirst, rowEnd) of the block.  Values of different blocks within the whole matrix's
// tolerance of each other may come out of order: the caller sorts.  Grid: ceil(k / blockDim.x).
extern "C" __global__ void stein_bisect(const double* d, const double* e, const double* e2, long long n, long long lo,
                                        long long k, double gl, double gu, double pivmin, double abstol,
                                        double reltol, double ulp, double fudge, int itmax, double* w,
                                        long long* rowFirst, long long* rowEnd, int* flag) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= k) return;
  const long long j = lo + t;
  int bad = 0;
  double a = gl, b = gu;
  long long ca = sturmCount(d, e2, n, a, pivmin);
  if (ca != 0 || sturmCount(d, e2, n, b, pivmin) != n) bad |= 1;
  if (!bisect(d, e2, n, j, pivmin, abstol, reltol, itmax, a, b, ca)) bad |= 2;
  // 2. the block
  const long long r = j - ca;
  long long inA = 0, inB = 0, seen = 0, start = 0, first = -1, end = -1, jB = 0;
  double qa = 0.0, qb = 0.0;
  for (long long i = 0; i < n; ++i) {
    const double di = d[i];
    qa = sturmStep(i == 0 ? di : SUB(di, e2[i - 1] / qa), a, pivmin, inA);
    qb = sturmStep(i == 0 ? di : SUB(di, e2[i - 1] / qb), b, pivmin, inB);
    if (i == n - 1 || e2[i] == 0.0) {  // the block [start, i] ends here
      if (seen + (inB - inA) > r) {
        first = start;
        end = i + 1;
        jB = inA + (r - seen);
        break;
      }
      seen += inB - inA;
      inA = inB = 0;
      start = i + 1;
    }
  }
  if (first < 0) {
    flag[t] = bad | 4;
    w[t] = MUL(0.5, ADD(a, b));
    rowFirst[t] = rowEnd[t] = -1;
    return;
  }
  // 3. the block alone: dstebz's Gershgorin interval of it, widened as dstebz widens a block's
  const long long m = end - first;
  double lo2 = d[first], hi2 = d[first], t1 = 0.0;
  for (long long i = first; i < end - 1; ++i) {
    const double t2 = fabs(e[i]);
    hi2 = fmax(hi2, ADD(ADD(d[i], t1), t2));
    lo2 = fmin(lo2, SUB(SUB(d[i], t1), t2));
    t1 = t2;
  }
  hi2 = fmax(hi2, ADD(d[end - 1], t1));
  lo2 = fmin(lo2, SUB(d[end - 1], t1));
  const double bnorm = fmax(fabs(lo2), fabs(hi2));
  const double widen = MUL(MUL(MUL(fudge, bnorm), ulp), (double)m);
  lo2 = SUB(SUB(lo2, widen), MUL(fudge, pivmin));
  hi2 = ADD(ADD(hi2, widen), MUL(fudge, pivmin));
  if (m == 1) {
    w[t] = d[first];
  } else {
    double a2 = fmax(a, lo2), b2 = fmin(b, hi2);
    long long c2 = sturmCount(d + first, e2 + first, m, a2, pivmin);
    if (c2 > jB || sturmCount(d + first, e2 + first, m, b2, pivmin) <= jB) bad |= 8;
    const double abstol2 = MUL(ulp, fmax(fabs(lo2), fabs(hi2)));
    if (!bisect(d + first, e2 + first, m, jB, pivmin, abstol2, reltol, itmax, a2, b2, c2)) bad |= 2;
    w[t] = MUL(0.5, ADD(a2, b2));
  }
  rowFirst[t] = first;
  rowEnd[t] = end;
  flag[t] = bad;
}

// ---- inverse iteration ----------------------------------------------------------------------
// Uniform in [-1, 1) from splitmix64 of (global eigenvalue index g, row i of its block): the
// start vector of eigenvalue g, the same whichever rank or batch computes it.
__device__ __forceinline__ double startValue(long long g, long long i) {
  unsigned long long x = ((unsigned long long)g << 32) + (unsigned long long)i + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return SUB(MUL(2.0, (double)(x >> 11) * 0x1p-53), 1.0);  // (x >> 11) 2^-53 is exact, in [0, 1)
}

// Thread j: dlagtf's LU factorization with partial pivoting of T_B - shift_j I (T_B the block of
// rows [r0, r1), m = r1 - r0 rows, local row k = i - r0):
//   a_k: U's diagonal, b_k: its first superdiagonal, dd_k: its second, c_k: L's multipliers,
//   piv_k: 1 where rows k and k+1 were interchanged.
// Row k is interchanged with k+1 when |c_k| / scale2 > |a_k| / scale1 (dlagtf's scaled pivot test;
// scale1, scale2: the 1-norms of the two rows).  Also: tol_j = eps max(|a|, |b|, |dd|) (dlagts'
// perturbation for JOB = -1; eps where that is 0), ulast_j = |a_{m-1}| (dstein's scale of the
// right-hand side), and with start the start vector in Y's column j (1 at row r0 for a block of
// one row).
extern "C" __global__ void stein_factor(const double* d, const double* e, long long n, long long K,
                                        const long long* rowFirst, const long long* rowEnd, const double* shift,
                                        const long long* index, int start, double eps, double* A, double* B,
                                        double* C, double* DD, signed char* piv, double* tolOut, double* ulast,
                                        double* Y) {
  const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= K) return;
  const long long r0 = rowFirst[j], m = rowEnd[j] - r0;
  double* y = Y + j * n + r0;
  if (m == 1) {
    y[0] = 1.0;
    return;
  }
  if (start)
    for (long long k = 0; k < m; ++k) y[k] = startValue(index[j], k);
  const double lam = shift[j];
  double ak = SUB(d[r0], lam);  // a_k as eliminated so far
  double bk = e[r0];            // b_k as eliminated so far
  double scale1 = ADD(fabs(ak), fabs(bk));
  double big = 0.0;             // max |a|, |b|, |dd| stored
  for (long long k = 0; k < m - 1; ++k) {
    double ck = e[r0 + k];
    double ak1 = SUB(d[r0 + k + 1], lam);
    double bk1 = k < m - 2 ? e[r0 + k + 1] : 0.0;
    double scale2 = ADD(fabs(ck), fabs(ak1));
    if (k < m - 2) scale2 = ADD(scale2, fabs(bk1));
    const double piv1 = ak == 0.0 ? 0.0 : fabs(ak) / scale1;
    double ddk = 0.0;
    signed char pk = 0;
    if (ck == 0.0) {
      scale1 = scale2;
    } else if (fabs(ck) / scale2 <= piv1) {  // no interchange: eliminate c_k with row k
      scale1 = scale2;
      ck = ck / ak;
      ak1 = SUB(ak1, MUL(ck, bk));
    } else {  // interchange rows k and k+1, then eliminate
      pk = 1;
      const double mult = ak / ck;
      ak = ck;
      const double temp = ak1;
      ak1 = SUB(bk, MUL(mult, temp));
      if (k < m - 2) {
        ddk = bk1;
        bk1 = -MUL(mult, ddk);
      }
      bk = temp;
      ck = mult;
    }
    const long long at = (r0 + k) * K + j;
    A[at] = ak;
    B[at] = bk;
    C[at] = ck;
    DD[at] = ddk;
    piv[at] = pk;
    big = fmax(big, fmax(fabs(ak), fmax(fabs(bk), fabs(ddk))));
    ak = ak1;
    bk = bk1;
  }
  A[(r0 + m - 1) * K + j] = ak;
  big = fmax(big, fabs(ak));
  const double tol = MUL(big, eps);
  tolOut[j] = tol == 0.0 ? eps : tol;
  ulast[j] = fabs(ak);
}

// Thread j (where active[j]): one step of dstein's inverse iteration on column j of Y:
//   1. scale y to ||y||_inf = m onenrm_j max(ulp, ulast_j)           (dstein's SCL)
//   2. y := (T_B - shift_j I)^-1 y by dlagts, JOB = -1: L^-1 P forward, then U^-1 backward, a
//      pivot that would overflow the quotient perturbed by +-tol, 2 tol, 4 tol, ... in turn
//   3. y := y 2^-e with ||y||_inf in [1/2, 1), e kept in expo[j]     (exact: a power of two)
extern "C" __global__ void stein_solve(long long n, long long K, const long long* rowFirst, const long long* rowEnd,
                                       const double* A, const double* B, const double* C, const double* DD,
                                       const signed char* piv, const double* tol, const double* ulast,
                                       const double* onenrm, const int* active, double ulp, double sfmin,
                                       double bignum, double* Y, int* expo) {
  const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= K || !active[j]) return;
  const long long r0 = rowFirst[j], m = rowEnd[j] - r0;
  if (m == 1) return;
  double* y = Y + j * n + r0;
  double ymax = 0.0;
  for (long long k = 0; k < m; ++k) ymax = fmax(ymax, fabs(y[k]));
  const double scl = MUL(MUL((double)m, onenrm[j]), fmax(ulp, ulast[j])) / ymax;
  for (long long k = 0; k < m; ++k) y[k] = MUL(y[k], scl);
  // forward: for k = 1..m-1, rows k-1 and k interchanged where piv, then y_k -= c_{k-1} y_{k-1}
  double prev = y[0];
  for (long long k = 1; k < m; ++k) {
    const long long at = (r0 + k - 1) * K + j;
    double cur = y[k];
    if (piv[at] == 0) {
      cur = SUB(cur, MUL(C[at], prev));
    } else {
      const double yk = cur;
      cur = SUB(prev, MUL(C[at], yk));
      prev = yk;
    }
    y[k - 1] = prev;
    prev = cur;
  }
  y[m - 1] = prev;
  // backward: y_k = (y_k - b_k y_{k+1} - dd_k y_{k+2}) / a_k, k = m-1..0
  const double tj = tol[j];
  double y1 = 0.0, y2 = 0.0;  // y_{k+1}, y_{k+2} as solved
  for (long long k = m - 1; k >= 0; --k) {
    const long long at = (r0 + k) * K + j;
    double temp = y[k];
    if (k <= m - 2) temp = SUB(temp, MUL(B[at], y1));
    if (k <= m - 3) temp = SUB(temp, MUL(DD[at], y2));
    double ak = A[at];
    double pert = copysign(tj, ak);
    for (;;) {
      const double absak = fabs(ak);
      if (absak < 1.0) {
        if (absak < sfmin) {
          if (absak == 0.0 || MUL(fabs(temp), sfmin) > absak) {
            ak = ADD(ak, pert);
            pert = MUL(2.0, pert);
            continue;
          }
          temp = MUL(temp, bignum);
          ak = MUL(ak, bignum);
        } else if (fabs(temp) > MUL(absak, bignum)) {
          ak = ADD(ak, pert);
          pert = MUL(2.0, pert);
          continue;
        }
      }
      break;
    }
    const double yk = temp / ak;
    y[k] = yk;
    y2 = y1;
    y1 = yk;
  }
  ymax = 0.0;
  for (long long k = 0; k < m; ++k) ymax = fmax(ymax, fabs(y[k]));
  int ex = 0;
  if (ymax > 0.0 && isfinite(ymax)) {
    frexp(ymax, &ex);
    for (long long k = 0; k < m; ++k) y[k] = ldexp(y[k], -ex);
  }
  expo[j] = ex;
}

// Sum (SUM) or maximum of one value per thread over the block, in a fixed tree: partial[t] +=
// partial[t + s] for s = blockDim.x / 2, ..., 1 (blockDim.x a power of two); every thread gets it.
template <bool SUM>
__device__ double blockReduce(double v, double* sh) {
  const int t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) sh[t] = SUM ? ADD(sh[t], sh[t + s]) : fmax(sh[t], sh[t + s]);
    __syncthreads();
  }
  const double out = sh[0];
  __syncthreads();  // every thread has read sh[0] before sh is written again
  return out;
}

// One block per cluster c (where active[c] and it has fewer than qrFrom vectors; the larger ones
// are orthonormalized by Householder QR, stein_device.py): modified Gram-Schmidt of the cluster's
// columns of Y in order, as dstein reorthogonalizes, then each column normalized:
//   y_j -= (q_i . y_j) q_i for i = first..j-1;  nrmchk[j] += (||y_j||_inf >= dtpcrt_j 2^-expo_j);
//   q_j = y_j / ||y_j||_2.
// The growth test is dstein's ||x||_inf >= sqrt(0.1 / m) on the unscaled iterate x = y 2^expo.
// Thread t handles local rows t, t + blockDim.x, ... (partial sums in that order, then
// blockReduce); each row is written and read by its own thread only.  Shared: blockDim.x doubles.
extern "C" __global__ void stein_orth(long long n, const long long* cFirst, const long long* cEnd,
                                      const int* active, long long qrFrom, const long long* rowFirst,
                                      const long long* rowEnd, const double* dtpcrt, const int* expo,
                                      int* nrmchk, double* Y) {
  extern __shared__ double sh[];
  const long long c = blockIdx.x;
  const long long j0 = cFirst[c], j1 = cEnd[c];
  if (!active[c] || j1 - j0 >= qrFrom) return;
  const long long r0 = rowFirst[j0], m = rowEnd[j0] - r0;
  for (long long j = j0; j < j1; ++j) {
    double* y = Y + j * n + r0;
    for (long long i = j0; i < j; ++i) {
      const double* q = Y + i * n + r0;
      double s = 0.0;
      for (long long r = threadIdx.x; r < m; r += blockDim.x) s = ADD(s, MUL(q[r], y[r]));
      s = blockReduce<true>(s, sh);
      for (long long r = threadIdx.x; r < m; r += blockDim.x) y[r] = SUB(y[r], MUL(s, q[r]));
    }
    double mx = 0.0, ss = 0.0;
    for (long long r = threadIdx.x; r < m; r += blockDim.x) {
      mx = fmax(mx, fabs(y[r]));
      ss = ADD(ss, MUL(y[r], y[r]));
    }
    mx = blockReduce<false>(mx, sh);
    ss = blockReduce<true>(ss, sh);
    if (threadIdx.x == 0 && mx >= ldexp(dtpcrt[j], -expo[j])) nrmchk[j] += 1;
    const double rn = 1.0 / sqrt(ss);
    for (long long r = threadIdx.x; r < m; r += blockDim.x) y[r] = MUL(y[r], rn);
  }
}

// Thread j: the accepted vector, as dstein leaves it: its largest entry (the first of them)
// positive; all NaN where the growth test did not pass `done` times (no convergence).
extern "C" __global__ void stein_finish(long long n, long long K, const long long* rowFirst, const long long* rowEnd,
                                        const int* nrmchk, int done, double* Y) {
  const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= K) return;
  const long long r0 = rowFirst[j], m = rowEnd[j] - r0;
  if (m == 1) return;
  double* y = Y + j * n + r0;
  if (nrmchk[j] < done) {
    for (long long k = 0; k < m; ++k) y[k] = __longlong_as_double(0x7ff8000000000000ll);  // NaN
    return;
  }
  long long at = 0;
  for (long long k = 1; k < m; ++k)
    if (fabs(y[k]) > fabs(y[at])) at = k;
  if (y[at] < 0.0)
    for (long long k = 0; k < m; ++k) y[k] = -y[k];
}
