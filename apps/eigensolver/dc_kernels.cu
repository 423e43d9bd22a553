// dc_kernels.cu - the O(k^2) passes of tridiag_dc.py's rank-one merge on the GPU, fused: one
// block per root (dc_parts) or per pole (dc_zhat) reads the k poles once and reduces in a fixed
// order (a strided per-thread loop, then a fixed shared-memory tree), so every run gives the
// same bits.  The CuPy expressions they replace materialized ~12 k x k temporaries per pass
// (k = 8192: 0.5 GB each).  Same formulas as tridiag_dc._parts / _vectors (see there).
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
}

// psi, psi', phi, phi' of root j at lam = d[origin_j] + tau_j: psi sums z_i^2/(d_i - lam) over
// the poles i <= j, phi over i > j; d_i - lam formed as (d_i - d_origin) - tau.
// out: 4 rows of m (psi, dpsi, phi, dphi).  Grid: m blocks of TPB threads.
extern "C" __global__ void dc_parts(const double* d, const double* z2, const long long* origin,
                                    const double* tau, long long k, long long m, double* out) {
  __shared__ double sh[4][TPB];
  const long long j = blockIdx.x;
  const double dO = d[origin[j]], t = tau[j];
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  for (long long i = threadIdx.x; i < k; i += TPB) {
    const double delta = (d[i] - dO) - t;
    const double q = z2[i] / delta, q2 = q / delta;
    if (i <= j) { s[0] += q; s[1] += q2; } else { s[2] += q; s[3] += q2; }
  }
  blockReduce<4, false>(s, sh);
  if (threadIdx.x == 0)
    for (int c = 0; c < 4; ++c) out[c * m + j] = s[c];
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
