// dc_kernels.cu - the O(k^2) passes of the divide and conquer's rank-one merge on the GPU, fused: one
// block per root (dc_secular) or per pole (dc_zhat) reads the k poles once per pass and reduces
// in a fixed order (a strided per-thread loop, then a fixed shared-memory tree), so every run
// gives the same bits.  The CuPy expressions they replace materialized ~12 k x k temporaries
// per pass (k = 8192: 0.5 GB each).  Same formulas as secular._secular / vectors._u_chunk.
#define TPB 256

// Tree-reduce NV values per thread across the block (sum or product); thread 0 gets them.
template <int NV, bool PROD>
__device__ void blockReduce(double (&v)[NV], double (*sh)[TPB]) {
  const int t = threadIdx.x;
#pragma unroll
  for (int c = 0; c < NV; ++c) sh[c][t] = v[c];
  __syncthreads();
  for (int w = TPB / 2; w > 0; w >>= 1) {
    if (t < w) {
#pragma unroll
      for (int c = 0; c < NV; ++c) sh[c][t] = PROD ? sh[c][t] * sh[c][t + w] : sh[c][t] + sh[c][t + w];
    }
    __syncthreads();
  }
#pragma unroll
  for (int c = 0; c < NV; ++c) v[c] = sh[c][0];
  __syncthreads();  // every thread has read the result before sh is written again
}

// Gu-Eisenstat: zhat_i^2 = (lam_i - d_i) / rho * prod_{j != i} (lam_j - d_i) / (d_j - d_i),
// lam_j - d_i = (d[origin_j] - d_i) + tau_j; zhat_i takes z_i's sign.  Grid: k blocks.
extern "C" __global__ void dc_zhat(const double* d, const long long* origin, const double* tau,
                                   const double* z, double rho, long long k, double* zhat) {
  __shared__ double sh[1][TPB];
  const long long i = blockIdx.x;
  const double di = d[i];
  double p[1] = {1.0};
  for (long long j = threadIdx.x; j < k; j += TPB)
    if (j != i) p[0] *= ((d[origin[j]] - di) + tau[j]) / (d[j] - di);
  blockReduce<1, true>(p, sh);
  if (threadIdx.x == 0) {
    const double z2 = p[0] * ((d[origin[i]] - di) + tau[i]) / rho;
    zhat[i] = copysign(sqrt(fabs(z2)), z[i]);
  }
}

// ---- the secular equation, one block per root: secular._secular's iteration, per root ----
// f(lam) = 1 + rho sum z_i^2 / (d_i - lam), d strictly increasing, rho > 0: root j lies in
// (d_j, d_j+1) (the last in (d_k-1, d_k-1 + wlast], wlast = rho |z|^2), kept as lam = d[origin]
// + tau with origin the nearer pole.  Every thread runs the same scalar steps on the same block
// sums, so the loop and its exit are block-uniform.  Same formulas as _secular, _middle_way,
// _origin_exact (see there for the derivations).

struct Parts { double psi, dpsi, phi, dphi; };

// psi, psi', phi, phi' of root j at d[o] + tau, for two taus in one pass over the poles.
__device__ void parts2(const double* d, const double* z2, long long k, long long j, long long o,
                       double ta, double tb, Parts& pa, Parts& pb, double (*sh)[TPB]) {
  double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  const double dO = d[o];
  for (long long i = threadIdx.x; i < k; i += TPB) {
    const double base = d[i] - dO;
    const double da = base - ta, db = base - tb;
    const double qa = z2[i] / da, qb = z2[i] / db;
    const int h = i <= j ? 0 : 2;  // psi (poles i <= j) or phi
    s[h] += qa; s[h + 1] += qa / da;
    s[4 + h] += qb; s[4 + h + 1] += qb / db;
  }
  blockReduce<8, false>(s, sh);
  pa = {s[0], s[1], s[2], s[3]};
  pb = {s[4], s[5], s[6], s[7]};
}

__device__ double middleWay(const Parts& q, double t, double pL, double pR, double Delta, double rho,
                            bool right, bool last) {
  const double S1 = (pL - t) * (pL - t) * q.dpsi, S2 = (pR - t) * (pR - t) * q.dphi;
  const double a = 1.0 + rho * (q.psi - S1 / (pL - t) + q.phi - S2 / (pR - t));
  const double C1 = rho * S1, C2 = rho * S2;
  if (last) return C1 / a;  // no pole on the right
  const double am = right ? -a : a, c0 = right ? C2 : C1, c1 = right ? C1 : C2;
  const double bq = am * Delta + c0 + c1;
  const double disc = sqrt(fabs(bq * bq - 4.0 * am * c0 * Delta));
  const double sig = bq <= 0.0 ? (bq - disc) / (2.0 * am) : 2.0 * c0 * Delta / (bq + disc);
  return right ? -sig : sig;
}

__device__ double originExact(const Parts& q, double t, double c_o, double rho, bool right) {
  const double A = 1.0 + rho * (q.psi + q.phi) + c_o / t;
  const double B = rho * (q.dpsi + q.dphi) - c_o / (t * t);
  const double p = A - B * t;
  const double sq = sqrt(p * p + 4.0 * B * c_o);
  if (right) return p >= 0.0 ? -(p + sq) / (2.0 * B) : -2.0 * c_o / (sq - p);
  return p <= 0.0 ? (sq - p) / (2.0 * B) : 2.0 * c_o / (p + sq);
}

// Grid: one block per root of j0, j0 + 1, ...; root j0 + b is written at originOut[b], tauOut[b]
// (a rank solves its share of the roots: secular._roots).
extern "C" __global__ void dc_secular(const double* d, const double* z2, long long k, long long j0, double rho,
                                      double wlast, double eps, int steps, long long* originOut, double* tauOut) {
  __shared__ double sh[8][TPB];
  const long long j = j0 + blockIdx.x;
  const bool last = j == k - 1;
  const double Delta = last ? wlast : d[j + 1] - d[j];
  const double mid = Delta / 2.0;
  Parts q, unused;
  parts2(d, z2, k, j, j, mid, mid, q, unused, sh);
  const bool right = (1.0 + rho * (q.psi + q.phi) <= 0.0) && !last;  // f(mid) <= 0: right half
  const long long o = right ? j + 1 : j;
  double lo = right ? -mid : 0.0, hi = right ? 0.0 : (last ? Delta : mid);
  double t = (lo + hi) / 2.0;
  const double pL = right ? -Delta : 0.0, pR = right ? 0.0 : Delta;
  const double c_o = rho * z2[o];
  parts2(d, z2, k, j, o, t, t, q, unused, sh);
  for (int it = 0; it < steps; ++it) {
    const double f = 1.0 + rho * (q.psi + q.phi);
    // converged: _secular's test (rounding of the terms, plus eps |tau| f')
    if (fabs(f) <= eps * (8.0 * (1.0 + rho * (fabs(q.psi) + fabs(q.phi))) + fabs(t) * rho * (q.dpsi + q.dphi))) break;
    if (f < 0.0) lo = t;  // f increases with lam (a NaN f moves neither end, as in _secular)
    if (f >= 0.0) hi = t;
    const double sMid = middleWay(q, t, pL, pR, Delta, rho, right, last);
    const double sOrg = originExact(q, t, c_o, rho, right);
    const double floorW = eps * eps * Delta;  // geometric bisection on the origin's side
    double split = sqrt(fmax(fabs(lo), floorW) * fmax(fabs(hi), floorW));
    split = right ? -split : split;
    const double c0 = (sMid >= lo && sMid <= hi && isfinite(sMid)) ? sMid : split;
    const double c1 = (sOrg >= lo && sOrg <= hi && isfinite(sOrg)) ? sOrg : split;
    Parts e0, e1;
    parts2(d, z2, k, j, o, c0, c1, e0, e1, sh);
    const double f0 = fabs(1.0 + rho * (e0.psi + e0.phi)), f1 = fabs(1.0 + rho * (e1.psi + e1.phi));
    const bool pick = f1 < f0;
    t = pick ? c1 : c0;
    q = pick ? e1 : e0;
  }
  if (threadIdx.x == 0) {
    originOut[blockIdx.x] = o;
    tauOut[blockIdx.x] = t;
  }
}

// ---- the deflation rotations (deflation._rotate), a thread per row of Q ----
// Q column-major (rows h, leading dimension ld); rotation r: column a <- c a + s b, column b <-
// c b - s a (dlaed2's DROT), in list order, each product and sum rounded on its own (no fma): a
// row's values go through the same operations in the same order in every run.  The rotations
// form chains (deflation._rotate checks it): each column is the b of at most one rotation and
// was not touched before it, and an a is either the previous rotation's b (carried in a
// register) or a column not touched before.  So every load a row needs is of a value no earlier
// rotation changed, and the loads of RPF rotations ahead are in flight together (one L2 round
// trip per rotation made a clustered spectrum's thousands of rotations latency-bound).
#define RPF 8
extern "C" __global__ void dc_rotate(double* Q, long long h, long long ld, const long long* ra, const long long* rb,
                                     const double* rc, const double* rs, long long R) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= h) return;
  double* row = Q + i;
  double xa[RPF], yb[RPF];
  const auto fetch = [&](long long r, int u) {  // the values rotation r reads (its a only when not chained)
    if (r < R) {
      xa[u] = (r > 0 && ra[r] == rb[r - 1]) ? 0.0 : row[ra[r] * ld];
      yb[u] = row[rb[r] * ld];
    }
  };
#pragma unroll
  for (int u = 0; u < RPF; ++u) fetch(u, u);
  double carry = 0.0;
  long long prevB = -1;
  for (long long r0 = 0; r0 < R; r0 += RPF) {
#pragma unroll
    for (int u = 0; u < RPF; ++u) {
      const long long r = r0 + u;
      if (r >= R) break;
      const long long a = ra[r], b = rb[r];
      const double x = a == prevB ? carry : xa[u], y = yb[u];
      const double c = rc[r], s = rs[r];
      const double na = __dadd_rn(__dmul_rn(c, x), __dmul_rn(s, y));
      const double nb = __dsub_rn(__dmul_rn(c, y), __dmul_rn(s, x));
      row[a * ld] = na;
      row[b * ld] = nb;
      carry = nb;
      prevB = b;
      fetch(r + RPF, u);  // slot u is free again
    }
  }
}

// ---- the eigenvectors of the rank-one problem, straight into the rows the GEMMs read ----
// Column j (c0 <= j < c0 + gridDim.x, one block each): u_i = zhat_i / (d_i - lam_j) =
// -zhat_i / ((d[origin_j] - d_i) + tau_j) over the k poles, normalized by its 2-norm (a
// fixed-order block sum); written as rows rowsL of UL (nL x cols, column-major) and rows
// rowsR of UR: the rows that meet the left child's rows of Q and the right child's.  Same
// formula as vectors._u_chunk; the U chunk, its norms and the two row gathers were seven
// k x cols passes there.
extern "C" __global__ void dc_vectors(const double* d, const double* zhat, const long long* origin, const double* tau,
                                      long long k, long long c0, const long long* rowsL, long long nL, double* UL,
                                      const long long* rowsR, long long nR, double* UR) {
  __shared__ double sh[1][TPB];
  const long long j = c0 + blockIdx.x;
  const double dO = d[origin[j]], tj = tau[j];
  double s[1] = {0.0};
  for (long long i = threadIdx.x; i < k; i += TPB) {
    const double u = -zhat[i] / ((dO - d[i]) + tj);
    s[0] += u * u;
  }
  blockReduce<1, false>(s, sh);
  const double nrm = sqrt(s[0]);
  for (long long r = threadIdx.x; r < nL; r += TPB) {
    const long long i = rowsL[r];
    UL[r + nL * blockIdx.x] = (-zhat[i] / ((dO - d[i]) + tj)) / nrm;
  }
  for (long long r = threadIdx.x; r < nR; r += TPB) {
    const long long i = rowsR[r];
    UR[r + nR * blockIdx.x] = (-zhat[i] / ((dO - d[i]) + tj)) / nrm;
  }
}

// Column copies between column-major matrices (merge._copy_cols): column t of the copy is
// dst[:, didx[t]] = src[:, sidx[t]] over `rows` rows (a null index array: t itself).  What
// CuPy's advanced indexing does for a gather, a scatter or both at once, from one launch whose
// Python side costs a few microseconds instead of tens.  Grid: (row blocks, columns).
extern "C" __global__ void dc_copy_cols(const double* src, long long lds, const long long* sidx, double* dst,
                                        long long ldd, const long long* didx, long long rows, long long cols) {
  for (long long t = blockIdx.y; t < cols; t += gridDim.y) {
    const long long sc = sidx ? sidx[t] : t, dc = didx ? didx[t] : t;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += step)
      dst[r + dc * ldd] = src[r + sc * lds];
  }
}
