// sytrd_step.cu - one column of the distributed Householder tridiagonalization (LAPACK latrd
// style, 1-D column block-cyclic) as device kernels that read the column from device state,
// so that the same launches (and the same captured CUDA graph) serve every column of a panel.
// Driven by sytrd_device.py; the math is the host twin's there (sytrd_twin), step for step.
//
// Data (all float64 except st, cols):
//   C     local columns, n x nloc, column-major (ld n); global column of local c is cols[c]
//   P     [V_p | W_p] of the panel, n x 2nb column-major: V column q at P + q n, W at P + (nb+q) n
//   bb    broadcast buffer, n + 4: [d_j, tau_j, e_j, 0, v (n, absolute rows: 0 at rows <= j,
//         1 at j+1)]; fixed size, so one captured Bcast serves every column
//   y, cv C v partial products (n, zero at rows <= j) and their Allreduce sum
//   st    int64 state: st[0] = j (global column), st[1] = k (column in the panel),
//         st[2] = local index of column j on its owner, st[3] = block ticket of sytrd_w2
// Each step: [owner] sytrd_col, sytrd_hh | Bcast(bb) | sytrd_gemv | Allreduce(y, cv) |
// sytrd_w1, sytrd_w2 (whose last block advances st).  Every reduction runs in a fixed order
// (block tree of fixed size, then the blocks' partials in index order): the same inputs give
// the same bits on every rank and in every run.
typedef long long i64;
#define TPB 256         // threads per block of the multi-block kernels (a power of two)
#define GEMV_TPB 1024   // sytrd_gemv: 32 warps per 32-row tile (loads in flight: see there)

__device__ __forceinline__ double blockSum(double x, double* sh) {
  sh[threadIdx.x] = x;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

// sum over the panel's first k columns q of V[r, q] b[q] + W[r, q] a[q] (a, b read with a
// stride): with a = V[j, :], b = W[j, :] it is the delayed update (V W^T + W V^T)[r, j].
__device__ __forceinline__ double panelCorr(const double* P, i64 n, int nb, i64 k, i64 r,
                                            const double* a, const double* b, i64 stride) {
  double c = 0.0;
  for (i64 q = 0; q < k; ++q) c += P[r + q * n] * b[q * stride] + P[r + (nb + q) * n] * a[q * stride];
  return c;
}

// Panel start: st = {j0, 0, lj0, 0}.
extern "C" __global__ void sytrd_init(i64* st, i64 j0, i64 lj0) {
  st[0] = j0;
  st[1] = 0;
  st[2] = lj0;
  st[3] = 0;
}

// Owner: colbuf[r] = C[r, j] - (V W^T + W V^T)[r, j] for r >= j; part[b] = block b's sum of
// colbuf[r]^2 over r >= j + 2 (the Householder tail's squared norm).
extern "C" __global__ void __launch_bounds__(TPB) sytrd_col(const double* C, i64 n, const double* P, int nb,
                                                            const i64* st, double* colbuf, double* part) {
  __shared__ double sh[TPB];
  const i64 j = st[0], k = st[1], lj = st[2];
  const i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  double x = 0.0;
  if (r >= j && r < n) {
    x = C[r + lj * n] - panelCorr(P, n, nb, k, r, P + j, P + j + nb * n, n);
    colbuf[r] = x;
  }
  const double s = blockSum(r >= j + 2 && r < n ? x * x : 0.0, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// Owner, one block: LAPACK dlarfg on colbuf[j+1:], packed into bb (layout above).
extern "C" __global__ void sytrd_hh(i64 n, const i64* st, const double* colbuf, const double* part,
                                    int nparts, double* bb) {
  __shared__ double scaleSh;
  const i64 j = st[0];
  if (threadIdx.x == 0) {
    double tau = 0.0, beta = 0.0, scale = 0.0;
    if (j + 1 < n) {
      double xn2 = 0.0;
      for (int b = 0; b < nparts; ++b) xn2 += part[b];
      const double alpha = colbuf[j + 1];
      const double xnorm = sqrt(xn2);
      const bool flat = xnorm == 0.0;
      beta = flat ? alpha : -copysign(hypot(alpha, xnorm), alpha);
      tau = flat ? 0.0 : (beta - alpha) / beta;
      scale = flat ? 0.0 : 1.0 / (alpha - beta);
    }
    bb[0] = colbuf[j];
    bb[1] = tau;
    bb[2] = beta;
    bb[3] = 0.0;
    scaleSh = scale;
  }
  __syncthreads();
  const double scale = scaleSh;
  for (i64 r = threadIdx.x; r < n; r += blockDim.x)
    bb[4 + r] = r <= j ? 0.0 : (r == j + 1 ? 1.0 : colbuf[r] * scale);
}

// Every rank, after the Bcast.  Blocks [0, RT): y = C_local v over the local columns > j, 32
// rows per block (a lane per row, the 32 warps split the columns, summed in warp order); they
// also store v as P's V column k and (block 0) d_j, tau_j, e_j.  Blocks [RT, RT + 2nb): one
// s[q] = P[:, q] . v each over the panel's used columns (0 for the others).
// The gemv reads the trailing local matrix once per column (the phase's memory traffic):
// 32 warps x 4 unrolled 256-byte loads per block keep enough bytes in flight per SM.
extern "C" __global__ void __launch_bounds__(GEMV_TPB) sytrd_gemv(
    const double* C, i64 n, const i64* cols, i64 nloc, double* P, int nb, const i64* st,
    const double* bb, double* y, double* s, double* d, double* e, double* tau) {
  __shared__ double sh[GEMV_TPB];
  const i64 j = st[0], k = st[1];
  const double* v = bb + 4;
  const i64 RT = (n + 31) / 32;
  if (blockIdx.x < RT) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const i64 r = (i64)blockIdx.x * 32 + lane;
    i64 lo = 0, hi = nloc;  // first local column with global index > j
    while (lo < hi) {
      const i64 mid = (lo + hi) >> 1;
      if (cols[mid] <= j) lo = mid + 1; else hi = mid;
    }
    double acc = 0.0;
    if (r > j && r < n) {
#pragma unroll 4
      for (i64 c = lo + warp; c < nloc; c += nwarps) acc += C[r + c * n] * v[cols[c]];
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    if (warp == 0 && r < n) {
      double sum = 0.0;
      for (int w = 0; w < nwarps; ++w) sum += sh[w * 32 + lane];
      y[r] = sum;  // 0 at rows <= j
    } else if (warp == 1 && r < n) {
      P[r + k * n] = v[r];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      d[j] = bb[0];
      if (j + 1 < n) {
        tau[j] = bb[1];
        e[j] = bb[2];
      }
    }
    return;
  }
  const i64 q = blockIdx.x - RT;  // V column q < nb, W column q - nb
  const bool used = q < nb ? q < k : q - nb < k;
  double acc = 0.0;
  if (used)
    for (i64 r = j + 1 + threadIdx.x; r < n; r += blockDim.x) acc += P[r + q * n] * v[r];
  acc = blockSum(acc, sh);
  if (threadIdx.x == 0) s[q] = acc;
}

// Every rank, after the Allreduce: w = tau (C v - (V W^T + W V^T) v) at rows > j (0 above);
// part[b] = block b's sum of w . v.
extern "C" __global__ void __launch_bounds__(TPB) sytrd_w1(i64 n, const double* P, int nb, const i64* st,
                                                           const double* bb, const double* cv, const double* s,
                                                           double* wtmp, double* part) {
  __shared__ double sh[TPB];
  const i64 j = st[0], k = st[1];
  const double t = bb[1];
  const double* v = bb + 4;
  const i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  double w = 0.0;
  if (r > j && r < n) w = t * (cv[r] - panelCorr(P, n, nb, k, r, s, s + nb, 1));
  if (r < n) wtmp[r] = w;
  const double dot = blockSum(r < n ? w * v[r] : 0.0, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = dot;
}

// Every rank: W column k = w - (tau/2)(w . v) v (LAPACK latrd's correction); the block that
// finishes last advances st to the next column (every block has read st before it takes a ticket).
extern "C" __global__ void __launch_bounds__(TPB) sytrd_w2(i64 n, double* P, int nb, i64* st, const double* bb,
                                                           const double* wtmp, const double* part, int nparts) {
  __shared__ double alphaSh;
  __shared__ i64 jk[2];
  if (threadIdx.x == 0) {
    double dot = 0.0;
    for (int b = 0; b < nparts; ++b) dot += part[b];
    alphaSh = -0.5 * bb[1] * dot;
    jk[0] = st[0];
    jk[1] = st[1];
  }
  __syncthreads();
  const i64 j = jk[0], k = jk[1];
  const i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (r < n) P[r + (nb + k) * n] = r > j ? wtmp[r] + alphaSh * bb[4 + r] : 0.0;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long ticket = atomicAdd((unsigned long long*)(st + 3), 1ull);
    if (ticket == gridDim.x - 1) {  // the last block: everyone has read st
      st[0] = j + 1;
      st[1] = k + 1;
      st[2] += 1;
      st[3] = 0;
    }
  }
}
