// sytrd_step.cu - one column of the distributed Householder tridiagonalization (LAPACK latrd
// style, 1-D column block-cyclic) as device kernels that read the column from device state,
// so that the same launches (and the same captured CUDA graph) serve every column of a panel.
// Driven by sytrd_device.py; the math is the host twin's there (sytrd_twin), step for step.
//
// Data (all float64 except st, cols, tick):
//   C     local columns, n x nloc, column-major (ld n); global column of local c is cols[c]
//   P     [V_p | W_p] of the panel, n x 2nb column-major: V column q at P + q n, W at P + (nb+q) n
//   bb    broadcast buffer, n + 4: [d_j, tau_j, e_j, 0, v (n, absolute rows: 0 at rows <= j,
//         1 at j+1)]; fixed size, so one captured Bcast serves every column
//   y, cv C v partial products and their Allreduce sum, 2n each: rows in [0, n), column
//         contributions of sytrd_symv (lower triangle) in [n, 2n) (zero with sytrd_gemv)
//   st    int64 state: st[0] = j (global column), st[1] = k (column in the panel),
//         st[2] = local index of column j on its owner, st[3] = block ticket of sytrd_col,
//         st[4] = block ticket of sytrd_w
//   tick  per-row-tile tickets of sytrd_gemv's / sytrd_symv's column chunks, ctick per-chunk
//         tickets of sytrd_symv's row tiles (zero at rest)
// Each step: [owner] sytrd_col | Bcast(bb) | sytrd_symv (or sytrd_gemv) | Allreduce(y, cv) |
// sytrd_w.
// sytrd_col and sytrd_w end in their grid's last block (a ticket), which does the step's
// serial part (the Householder vector; W's correction and the advance of st): one graph node
// each instead of two (the profile at 1e31d5d measured 14 and 25 us per column for the two
// pairs at n = 8192, mostly launch gaps and 32-block grids whose threads looped over the
// panel's 2k columns one load at a time).
// Every reduction runs in a fixed order (warps of a row tile in index order, blocks' partials
// by a fixed strided tree): the same inputs give the same bits on every rank and in every run,
// whichever block finishes last.
typedef long long i64;
#define TPB 256            // threads per block: a tile of 32 rows x NW warps
#define NW (TPB / 32)      // warps per block
#define GEMV_TARGET 1024   // sytrd_gemv aims at this many busy blocks (132 SMs x 8 resident)

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

// Butterfly sum over the warp: every lane gets the same bits (a + b == b + a).
__device__ __forceinline__ double warpSum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Sum of part[0..nparts) in a fixed order (strided per thread, then the block tree), read
// through L2 (other blocks wrote it in this launch).
__device__ __forceinline__ double sumParts(const double* part, int nparts, double* sh) {
  double s = 0.0;
  for (int b = threadIdx.x; b < nparts; b += blockDim.x) s += __ldcg(part + b);
  return blockSum(s, sh);
}

// sum over i in [i0, n) of x[i] y[i], this thread's share (i = i0 + threadIdx.x + m blockDim)
// with 8 independent partial sums, added in a fixed order: the loads of 8 iterations are in
// flight together (one running sum made each load wait for the previous add: ~32 L2 round
// trips at n = 8192, about 10 us of the product kernels' fixed cost)
__device__ __forceinline__ double columnDot(const double* x, const double* y, i64 i0, i64 n) {
  double p[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  const i64 step = blockDim.x;
  for (i64 b = i0 + threadIdx.x; b < n; b += 8 * step) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const i64 i = b + u * step;
      if (i < n) p[u] += x[i] * y[i];
    }
  }
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

// This warp's share of the delayed update of row r, (V W^T + W V^T)[r, j] with a = V[j, :],
// b = W[j, :] (read with a stride): the panel's columns q = warp, warp + NW, ... < k.  The
// warps' shares are added in warp order by tileSum.
__device__ __forceinline__ double panelCorrPart(const double* P, i64 n, int nb, i64 k, i64 r,
                                                const double* a, const double* b, i64 stride) {
  double c = 0.0;
#pragma unroll 4
  for (i64 q = threadIdx.x >> 5; q < k; q += NW) c += P[r + q * n] * b[q * stride] + P[r + (nb + q) * n] * a[q * stride];
  return c;
}

// Warp 0, lane l gets the sum over warps (in order) of x at lane l.
__device__ __forceinline__ double tileSum(double x, double* sh) {
  sh[threadIdx.x] = x;
  __syncthreads();
  double s = 0.0;
  if (threadIdx.x < 32)
    for (int w = 0; w < NW; ++w) s += sh[w * 32 + threadIdx.x];
  __syncthreads();
  return s;
}

// Take a ticket on `*ticket` after this block's global writes; true in the grid's last block,
// which then sees every block's writes (read them with __ldcg) and resets the ticket.
__device__ __forceinline__ bool lastBlock(i64* ticket, unsigned int blocks) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long t = atomicAdd((unsigned long long*)ticket, 1ull);
    last = t == blocks - 1;
    if (last) *ticket = 0;  // nobody else takes this ticket in this launch
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// Sum of `count` values base[0], base[stride], ... in index order, 8 loads in flight.
__device__ __forceinline__ double orderedSum(const double* base, i64 count, i64 stride) {
  double t = 0.0;
  for (i64 q0 = 0; q0 < count; q0 += 8) {
    double x[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) x[u] = q0 + u < count ? __ldcg(base + (q0 + u) * stride) : 0.0;
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (q0 + u < count) t += x[u];
  }
  return t;
}

// The first local column whose global index is > j (cols ascend).
__device__ __forceinline__ i64 firstAfter(const i64* cols, i64 nloc, i64 j) {
  i64 lo = 0, hi = nloc;
  while (lo < hi) {
    const i64 mid = (lo + hi) >> 1;
    if (cols[mid] <= j) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Column chunks per row tile of the product kernels: about `target` busy blocks over `tiles`
// tiles, at least `minCols` of the m trailing local columns per chunk, 1..smax.
__device__ __forceinline__ i64 chunksFor(i64 target, i64 tiles, i64 m, i64 minCols, int smax) {
  const i64 S = min(target / tiles, (m + minCols - 1) / minCols);
  return max((i64)1, min(S, (i64)smax));
}

// The step's scalars from bb: d_j, and tau_j, e_j below the last column (one thread).
__device__ __forceinline__ void storeScalars(const double* bb, i64 j, i64 n, double* d, double* e, double* tau) {
  d[j] = bb[0];
  if (j + 1 < n) {
    tau[j] = bb[1];
    e[j] = bb[2];
  }
}

// The product kernels' last 2nb blocks: s[q] = P[:, q] . v over rows > j (V column q < nb, W
// column q - nb), 0 for the panel's columns not yet used.
__device__ __forceinline__ void panelDot(const double* P, i64 n, int nb, i64 j, i64 k, const double* v,
                                         double* s, i64 q, double* sh) {
  const bool used = q < nb ? q < k : q - nb < k;
  const double acc = blockSum(used ? columnDot(P + q * n, v, j + 1, n) : 0.0, sh);
  if (threadIdx.x == 0) s[q] = acc;
}

// Panel start: st = {j0, 0, lj0, 0, 0}.
extern "C" __global__ void sytrd_init(i64* st, i64 j0, i64 lj0) {
  st[0] = j0;
  st[1] = 0;
  st[2] = lj0;
  st[3] = 0;
  st[4] = 0;
}

// Owner, grid of (n + 31) / 32 row tiles: colbuf[r] = C[r, j] - (V W^T + W V^T)[r, j] for
// r >= j, and each tile's sum of colbuf[r]^2 over r >= j + 2 (the Householder tail's squared
// norm); the last block then does LAPACK dlarfg on colbuf[j+1:] and packs bb (layout above).
extern "C" __global__ void __launch_bounds__(TPB) sytrd_col(const double* C, i64 n, const double* P, int nb,
                                                            i64* st, double* colbuf, double* part, double* bb) {
  __shared__ double sh[TPB];
  __shared__ double scaleSh;
  const i64 j = st[0], k = st[1], lj = st[2];
  const int lane = threadIdx.x & 31;
  const i64 r = (i64)blockIdx.x * 32 + lane;
  const bool row = r >= j && r < n;
  const double corr = tileSum(row ? panelCorrPart(P, n, nb, k, r, P + j, P + j + nb * n, n) : 0.0, sh);
  if (threadIdx.x < 32) {
    double x = 0.0;
    if (row) {
      x = C[r + lj * n] - corr;
      colbuf[r] = x;
    }
    const double sq = warpSum(r >= j + 2 && r < n ? x * x : 0.0);
    if (lane == 0) part[blockIdx.x] = sq;
  }
  if (!lastBlock(st + 3, gridDim.x)) return;
  const double xn2 = sumParts(part, gridDim.x, sh);
  if (threadIdx.x == 0) {
    double tau = 0.0, beta = 0.0, scale = 0.0;
    if (j + 1 < n) {
      const double alpha = __ldcg(colbuf + j + 1);
      const double xnorm = sqrt(xn2);
      const bool flat = xnorm == 0.0;
      beta = flat ? alpha : -copysign(hypot(alpha, xnorm), alpha);
      tau = flat ? 0.0 : (beta - alpha) / beta;
      scale = flat ? 0.0 : 1.0 / (alpha - beta);
    }
    bb[0] = __ldcg(colbuf + j);
    bb[1] = tau;
    bb[2] = beta;
    bb[3] = 0.0;
    scaleSh = scale;
  }
  __syncthreads();
  const double scale = scaleSh;
  // 8 loads in flight per thread before their stores (a load after a store to a possibly
  // aliasing pointer would wait for it: one L2 round trip per element, ~5 us at n = 8192)
  for (i64 i0 = threadIdx.x; i0 < n; i0 += 8 * blockDim.x) {
    double x[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const i64 i = i0 + u * blockDim.x;
      x[u] = i < n ? __ldcg(colbuf + i) : 0.0;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const i64 i = i0 + u * blockDim.x;
      if (i < n) bb[4 + i] = i <= j ? 0.0 : (i == j + 1 ? 1.0 : x[u] * scale);
    }
  }
}

// Every rank, after the Bcast.  y = C_local v over the local columns > j, at rows >= j (0 at
// row j; rows below were zeroed by earlier columns).  Blocks [0, nblk - 2nb) take row tiles
// of 32 rows from row tile j / 32 on, each tile's local columns split into S chunks so that
// about GEMV_TARGET blocks are busy whatever j is (a shrinking trailing matrix kept only a
// few SMs busy: 1.5 TB/s at j = n/2 with one block per tile); a warp reads 256 contiguous
// bytes of a column per load.  With S > 1 each chunk writes its partial rows to ypart and the
// tile's last chunk (a ticket per tile) adds them in chunk order.  The rest of those blocks
// exit at once.  Split-0 blocks also store v as P's V column k; block 0 stores d_j, tau_j,
// e_j.  Blocks [nblk - 2nb, nblk): one s[q] = P[:, q] . v each over the panel's used columns.
extern "C" __global__ void __launch_bounds__(TPB) sytrd_gemv(
    const double* C, i64 n, const i64* cols, i64 nloc, double* P, int nb, const i64* st,
    const double* bb, double* y, double* ypart, i64* tick, int smax, double* s, double* d, double* e,
    double* tau) {
  __shared__ double sh[TPB];
  const i64 j = st[0], k = st[1];
  const double* v = bb + 4;
  const i64 RT = (n + 31) / 32;
  const i64 gemvBlocks = (i64)gridDim.x - 2 * nb;
  if (blockIdx.x < gemvBlocks) {
    const i64 t0 = j / 32, tiles = RT - t0;
    const i64 lo = firstAfter(cols, nloc, j), m = nloc - lo;
    const i64 S = chunksFor(GEMV_TARGET, tiles, m, 4 * NW, smax);  // one unrolled pass of 4 columns per warp
    const i64 b = blockIdx.x;
    if (b >= tiles * S) return;
    const i64 tile = t0 + b / S, split = b % S;
    const i64 chunk = (m + S - 1) / S;
    const i64 c0 = lo + split * chunk, c1 = min(nloc, c0 + chunk);
    const int lane = threadIdx.x & 31;
    const i64 r = tile * 32 + lane;
    double acc = 0.0;
    if (r > j && r < n) {
#pragma unroll 4
      for (i64 c = c0 + (threadIdx.x >> 5); c < c1; c += NW) acc += C[r + c * n] * v[cols[c]];
    }
    const double sum = tileSum(acc, sh);  // warp 0 holds the chunk's rows
    if (split == 0 && threadIdx.x >= 32 && threadIdx.x < 64 && r < n) P[r + k * n] = v[r];
    if (b == 0 && threadIdx.x == 0) storeScalars(bb, j, n, d, e, tau);
    if (S == 1) {
      if (threadIdx.x < 32 && r < n) y[r] = sum;
      return;
    }
    if (threadIdx.x < 32 && r < n) ypart[split * n + r] = sum;
    if (lastBlock(tick + tile, S) && threadIdx.x < 32 && r < n) y[r] = orderedSum(ypart + r, S, n);
    return;
  }
  panelDot(P, n, nb, j, k, v, s, blockIdx.x - gemvBlocks, sh);
}

// Every rank, after the Bcast: the same product as sytrd_gemv from the LOWER triangle of the
// local columns only (C is symmetric; the trailing updates keep rows >= the column current),
// which halves the bytes read - the phase's memory traffic.  Element (i, g) with i > g of
// local column c (global g = cols[c] > j) adds C[i, g] v[g] to row i and C[i, g] v[i] to
// column g; the diagonal adds C[g, g] v[g] once.  Rows go to y[:n], columns to y[n:] (by
// global index), and the Allreduce sums both halves over the ranks: (C v)[r] = cv[r] + cv[n+r].
// Blocks [0, nblk - 2nb): tiles of SY_R rows (8 per lane: a warp reads 2 KiB of a column per
// step) from row tile j / SY_R on, times S chunks of the trailing local columns (S chosen so
// about SY_TARGET blocks work).  A warp takes every NW-th column of its chunk up to the tile's
// last row (the triangle) and writes the column's sum over the tile's rows to cpart; the
// block writes its row sums to ypart (or y when S = 1).  The last chunk of a tile (ticket
// tick[tile]) adds its rows' S partials in chunk order; the last tile of a chunk (ticket
// ctick[chunk]) adds its columns' partials in tile order.  Blocks [nblk - 2nb, nblk): s[q]
// as in sytrd_gemv.  Both halves of y hold stale values at rows <= j, which nothing reads.
#define SY_R 256
#define SY_U (SY_R / 32)
#define SY_TARGET 512

extern "C" __global__ void __launch_bounds__(TPB) sytrd_symv(
    const double* C, i64 n, const i64* cols, i64 nloc, double* P, int nb, const i64* st,
    const double* bb, double* y, double* ypart, double* cpart, i64* tick, i64* ctick, int smax,
    double* s, double* d, double* e, double* tau) {
  __shared__ double sh[TPB];
  __shared__ double rowsSh[NW][SY_R];
  const i64 j = st[0], k = st[1];
  const double* v = bb + 4;
  const i64 NT = (n + SY_R - 1) / SY_R;
  const i64 symvBlocks = (i64)gridDim.x - 2 * nb;
  if (blockIdx.x < symvBlocks) {
    const i64 t0 = j / SY_R, tiles = NT - t0;
    const i64 lo = firstAfter(cols, nloc, j), m = nloc - lo;
    const i64 S = chunksFor(SY_TARGET, tiles, m, 2 * NW, smax);  // at least two columns per warp
    const i64 b = blockIdx.x;
    if (b >= tiles * S) return;
    const i64 a = t0 + b / S, sp = b % S;
    const i64 chunk = (m + S - 1) / S;
    const i64 c0 = lo + sp * chunk, c1 = min(nloc, c0 + chunk);
    const i64 rbase = a * SY_R, tileEnd = min(n, rbase + SY_R) - 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double racc[SY_U], vr[SY_U];
#pragma unroll
    for (int u = 0; u < SY_U; ++u) {
      const i64 i = rbase + lane + 32 * u;
      racc[u] = 0.0;
      vr[u] = i < n ? v[i] : 0.0;
    }
#pragma unroll 2
    for (i64 c = c0 + warp; c < c1; c += NW) {
      const i64 g = cols[c];
      if (g > tileEnd) break;  // columns ascend: this warp's next ones lie above the tile
      const double vg = v[g];
      const double* col = C + c * n;
      double x[SY_U];
#pragma unroll
      for (int u = 0; u < SY_U; ++u) {
        const i64 i = rbase + lane + 32 * u;
        x[u] = i >= g && i < n ? col[i] : 0.0;
      }
      double cs = 0.0;
#pragma unroll
      for (int u = 0; u < SY_U; ++u) {
        const i64 i = rbase + lane + 32 * u;
        racc[u] += x[u] * vg;
        if (i > g) cs += x[u] * vr[u];
      }
      cs = warpSum(cs);
      if (lane == 0) cpart[a * nloc + c] = cs;
    }
#pragma unroll
    for (int u = 0; u < SY_U; ++u) rowsSh[warp][lane + 32 * u] = racc[u];
    __syncthreads();
    const i64 i = rbase + threadIdx.x;  // TPB == SY_R: a thread per row of the tile
    double rsum = 0.0;
    for (int w = 0; w < NW; ++w) rsum += rowsSh[w][threadIdx.x];
    if (sp == 0 && i < n) P[i + k * n] = v[i];
    if (b == 0 && threadIdx.x == 0) storeScalars(bb, j, n, d, e, tau);
    if (i < n) {
      if (S == 1) y[i] = rsum; else ypart[sp * n + i] = rsum;
    }
    const bool lastRow = S > 1 && lastBlock(tick + a, S);  // S is the same in every block
    const bool lastCol = lastBlock(ctick + sp, tiles);
    if (lastRow && i < n) y[i] = orderedSum(ypart + i, S, n);
    if (lastCol)
      for (i64 c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        const i64 g = cols[c];
        const i64 a0 = g / SY_R;  // the tiles that reach column g's diagonal
        y[n + g] = orderedSum(cpart + a0 * nloc + c, NT - a0, nloc);
      }
    return;
  }
  panelDot(P, n, nb, j, k, v, s, blockIdx.x - symvBlocks, sh);
}

// Every rank, after the Allreduce (of 2n: C v = cv[:n] + cv[n:], see sytrd_symv), grid of
// (n + 31) / 32 row tiles: w = tau (C v - (V W^T +
// W V^T) v) at rows > j (0 above) and each tile's sum of w . v; the last block then writes
// W column k = w - (tau/2)(w . v) v (LAPACK latrd's correction) and advances st to the next
// column (every block has read st before it took its ticket).
extern "C" __global__ void __launch_bounds__(TPB) sytrd_w(i64 n, double* P, int nb, i64* st, const double* bb,
                                                          const double* cv, const double* s, double* wtmp,
                                                          double* part) {
  __shared__ double sh[TPB];
  __shared__ double alphaSh;
  const i64 j = st[0], k = st[1];
  const double t = bb[1];
  const double* v = bb + 4;
  const int lane = threadIdx.x & 31;
  const i64 r = (i64)blockIdx.x * 32 + lane;
  const bool row = r > j && r < n;
  const double corr = tileSum(row ? panelCorrPart(P, n, nb, k, r, s, s + nb, 1) : 0.0, sh);
  if (threadIdx.x < 32) {
    const double w = row ? t * ((cv[r] + cv[n + r]) - corr) : 0.0;  // rows + columns halves (sytrd_symv)
    if (r < n) wtmp[r] = w;
    const double dot = warpSum(r < n ? w * v[r] : 0.0);
    if (lane == 0) part[blockIdx.x] = dot;
  }
  if (!lastBlock(st + 4, gridDim.x)) return;
  const double dot = sumParts(part, gridDim.x, sh);
  if (threadIdx.x == 0) alphaSh = -0.5 * t * dot;
  __syncthreads();
  const double alpha = alphaSh;
  for (i64 i0 = threadIdx.x; i0 < n; i0 += 8 * blockDim.x) {  // loads first (see sytrd_col)
    double x[8], vi[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const i64 i = i0 + u * blockDim.x;
      x[u] = i < n ? __ldcg(wtmp + i) : 0.0;
      vi[u] = i < n ? v[i] : 0.0;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const i64 i = i0 + u * blockDim.x;
      if (i < n) P[i + (nb + k) * n] = i > j ? x[u] + alpha * vi[u] : 0.0;
    }
  }
  if (threadIdx.x == 0) {
    st[0] = j + 1;
    st[1] = k + 1;
    st[2] += 1;
  }
}
