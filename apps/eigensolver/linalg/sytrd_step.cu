// sytrd_step.cu - one column of the distributed Householder tridiagonalization (LAPACK latrd
// style, 1-D column block-cyclic) as device kernels that read the column from device state,
// so that the same launches (and the same captured CUDA graph) serve every column of a panel.
// Driven by sytrd_device.py; the math is the host twin's there (sytrd_twin), step for step,
// except that two scalings are applied where the values are read (below).
//
// Data (all float64 except st, tick, ctick):
//   C     local columns, n x nloc, column-major (ld n); local column c is global column
//         glob(c) = ((c / nb) P + rank) nb + c % nb (1-D block cyclic, P ranks, block nb)
//   P     [V_p | W_p] of the panel, n x 2nb column-major: V column q at P + q n, W column q
//         at P + (nb+q) n, stored RAW: the true W column is Wraw + al[q] V (see wAt)
//   al    W's correction per panel column, al[q] = -tau/2 (w . v) of LAPACK latrd
//   bb    broadcast buffer, n + 4: [d_j, tau_j, e_j, scale, x (n, absolute rows)] where x is
//         the owner's updated column j at rows >= j; the Householder vector is
//         v = HVec(bb, j).at(i): 0 at rows <= j, 1 at row j+1, x[i] scale below.  Fixed size, so
//         one captured Bcast serves every column
//   y, cv C v partial products and their Allreduce sum, 2n each: rows in [0, n), column
//         contributions of sytrd_symv (lower triangle) in [n, 2n)
//   st    int64 state: st[0] = j (global column), st[1] = k (column in the panel),
//         st[2] = local index of column j on its owner, st[3] = block ticket of sytrd_col,
//         st[4] = block ticket of sytrd_w, st[5] = next work item of sytrd_symv's persistent
//         launch, st[6] = its blocks done (both 0 at rest: the launch's last block resets them),
//         st[7] unused, st[8], st[9] = j, k of the column sytrd_w works on (deferred sums: the
//         symv's last block advances st[0..2] and leaves sytrd_w these)
//   tick  per-row-tile tickets of the product kernels, ctick per-column-chunk tickets of
//         sytrd_symv (zero at rest)
// Each step: [owner] sytrd_col | Bcast(bb) | sytrd_symv | Allreduce(y, cv) |
// sytrd_w.
// sytrd_col and sytrd_w end in their grid's last block (a ticket), which does the step's
// serial part: dlarfg's scalars, and W's correction scalar plus the advance of st.  Neither
// last block passes over the n rows any more: the scale of v and W's correction are applied
// by the readers (HVec, wAt), with the same floating-point operations a stored result would
// take (a single block's pass over the n rows would serialize every column's kernel on it).
// Every reduction runs in a fixed order (warps of a row tile in index order, blocks' partials
// in index order): the same inputs give the same bits on every rank and in every run,
// whichever block finishes last.
typedef long long i64;
#define HC_DTYPE 0         // HC_F64: hpccoll's headers (cuda/, on the include path) for doubles
#include "ll_buffer.cuh"   // Args, boundedPoll (every wait bounded, timeouts reported)
#include "proto_sentinel.cuh"
#include "sytrd_abi.h"     // TPB, NW, sytrd_symv's SY_* (shared with sytrd_device.py)
// `defer` (the kernels' argument, nonzero only on one rank without fused transfers, where
// nothing moves between the step's launches: sytrd_device.py's _Step.defer decides it): each
// kernel's grid-wide sums are finished by the next kernel instead of a last block.  Every block of sytrd_symv computes dlarfg's scalars from
// sytrd_col's partial sums, sytrd_w adds sytrd_symv's partials of its rows, and every block of
// the next column's sytrd_col (or of sytrd_wfix after a panel's last column) computes W's
// correction al[k] from sytrd_w's partial dots (`wpart`, apart from sytrd_col's own partials);
// the symv's last block, which exists anyway, advances st.  No kernel of the step then takes a
// fence, a ticket or a finishing sum.  The same additions in the same order: the same bits
// either way.

// The layout: global index of local column c, and how many local columns have global index
// <= j (= the first local column after j; cols ascend).  Arithmetic, no loads: a binary
// search over a column table would be a chain of dependent loads at the start of every product.
struct Layout {
  int nb, nprocs, rank;
  __device__ __forceinline__ i64 glob(i64 c) const { return ((c / nb) * nprocs + rank) * nb + c % nb; }
  __device__ __forceinline__ i64 firstAfter(i64 j) const {
    const i64 J = j + 1, B = J / nb;
    i64 cnt = ((B + nprocs - 1 - rank) / nprocs) * nb;
    if (B % nprocs == rank) cnt += J % nb;
    return cnt;
  }
};

// ---- the fused transfers (sygvd(sytrd="fused"), sytrd_device.FusedWorkspace) ----
// The Bcast of bb and the Allreduce of y as stores of the producing kernels straight into
// every rank's symmetric workspace, with hpccoll's sentinel protocol per 8-byte element
// (proto_sentinel.cuh: a receive word at rest holds Sentinel::kWord; data equal to it is sent
// as the canonical NaN), instead of two collective launches per column:
//   bbR[2][n + 4]          by parity of j: sytrd_col of the owner writes rows >= j + 2 of x
//                          and, from its last block, the 4 scalars, into every rank
//   yR[2][nranks][2n]      by parity of j and source rank: sytrd_symv's final row sums
//                          (rows > j) and column sums (its own columns > j)
// The readers poll each element until it is not the sentinel (bounded: a missing peer
// raises the workspace's error word, never a hang), and sytrd_w re-arms every element it
// read: each element written is read and re-armed by exactly one thread per rank.  The double
// buffering is the credit (ll_buffer.cuh): rank R writes parity j & 1 again only at column
// j + 2, after it has heard, through the owner of column j + 2, from every rank's sytrd_symv
// of column j + 1, which every rank runs after its sytrd_w of column j (stream order) has
// re-armed that parity.  w sums the sources in rank order, 0.0 for the ranks that do not own
// a column: the expression the sentinel Allreduce evaluates, so the bits do not change.
struct Fused {
  Args a;       // peers, timeoutNs, hostErr, rank, nranks: ll_buffer.cuh's bounded polls
  i64 bbOff;    // byte offset of bbR in every workspace
  i64 yOff;     // byte offset of yR
};

__device__ __forceinline__ u64 ldVol64(const double* p) { return *(const volatile u64*)p; }

// The element at p once it is no longer the sentinel (one load when it has arrived).
__device__ __noinline__ u64 pollSlow(const Fused* fz, const double* p, int coll, int peer) {
  u64 b = Sentinel::kWord;
  boundedPoll(fz->a, coll, [&] { return peer; }, (u64)(p - (const double*)fz->a.peers[fz->a.rank]),
              [&] { b = ldVol64(p); return b != Sentinel::kWord; });
  return b;
}

__device__ __forceinline__ double arrived(const Fused* fz, const double* p, u64 b, int coll, int peer) {
  if (b == Sentinel::kWord) b = pollSlow(fz, p, coll, peer);
  return __longlong_as_double(b);
}

// A value of bb: polled from bbR (sent by rank `owner`) when fused, else a plain load.
__device__ __forceinline__ double rdBB(const Fused* fz, const double* p, int owner) {
  return fz ? arrived(fz, p, ldVol64(p), HC_COLL_BCAST, owner) : *p;
}

__device__ __forceinline__ void rearm(double* p) { *(volatile u64*)p = Sentinel::kWord; }

// Store x at byte offset `off` of every rank's workspace (data never looks unwritten).
__device__ __forceinline__ void putAll(const Fused* fz, i64 off, double x) {
  u64 b = __double_as_longlong(x);
  b = b == Sentinel::kWord ? Sentinel::kCanon : b;
  for (int r = 0; r < fz->a.nranks; ++r)
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(fz->a.peers[r] + off), "l"(b) : "memory");
}

// Element offsets (in doubles) of bbR and of yR (source `src`) for column j.
__device__ __forceinline__ i64 bbAt(i64 n, i64 j) { return (j & 1) * (n + 4); }
__device__ __forceinline__ i64 yAt(const Fused* fz, i64 n, i64 j, int src) {
  return ((j & 1) * (i64)fz->a.nranks + src) * 2 * n;
}
// My receive buffer bbR of column j (fused), or the plain bb.
__device__ __forceinline__ const double* bbIn(const Fused* fz, const double* bb, i64 n, i64 j) {
  return fz ? (const double*)(fz->a.peers[fz->a.rank] + fz->bbOff) + bbAt(n, j) : bb;
}

// The Householder vector of column j in bb (layout above): at(i) = 0 at rows <= j, 1 at row
// j + 1, x[i] scale below (the product applied where it is read, not stored).  Fused, x is
// polled from bbR: load(i) issues the load (several can be in flight), value(i, bits) waits
// for it where it has not arrived yet.
struct HVec {
  const double* x;
  double scale;
  i64 j;
  const Fused* fz;
  int owner;  // of column j (fused: the rank polled, named in a timeout)
  __device__ __forceinline__ HVec(const double* bb, i64 j_, const Fused* fz_, int nb)
      : x(bb + 4), j(j_), fz(fz_), owner(fz_ ? (int)((j_ / nb) % fz_->a.nranks) : 0) {
    scale = scalar(3);
  }
  // Deferred sums (`defer`): the scale as this block computed it (bb's scalars are not stored yet).
  __device__ __forceinline__ HVec(const double* bb, i64 j_, double scale_)
      : x(bb + 4), scale(scale_), j(j_), fz(nullptr), owner(0) {}
  // bb[q], q < 4: d_j, tau_j, e_j, scale (polled when fused)
  __device__ __forceinline__ double scalar(int q) const { return rdBB(fz, x - 4 + q, owner); }
  __device__ __forceinline__ u64 load(i64 i) const {
    return i <= j + 1 ? 0ull : (fz ? ldVol64(x + i) : (u64)__double_as_longlong(x[i]));
  }
  __device__ __forceinline__ double value(i64 i, u64 b) const {
    if (i <= j) return 0.0;
    if (i == j + 1) return 1.0;
    return (fz ? arrived(fz, x + i, b, HC_COLL_BCAST, owner) : __longlong_as_double(b)) * scale;
  }
  __device__ __forceinline__ double at(i64 i) const { return value(i, load(i)); }
};

// True W element (r, q) of the panel: Wraw + al[q] V, one fma (the stored form's rounding).
__device__ __forceinline__ double wAtWith(const double* P, i64 n, int nb, double a, i64 r, i64 q) {
  return fma(a, P[r + q * n], P[r + (nb + q) * n]);
}
__device__ __forceinline__ double wAt(const double* P, i64 n, int nb, const double* al, i64 r, i64 q) {
  return wAtWith(P, n, nb, al[q], r, q);
}

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

// A deferred column's al (-t/2 times its w.v, t = bb[1]) from its sytrd_w's partial dots, summed
// in sumParts' fixed order as that kernel's last block would have; block 0 stores it at *slot.
__device__ __forceinline__ double deferredAl(const double* bb, const double* wpart, int nparts, double* sh,
                                             double* slot) {
  const double a = -0.5 * bb[1] * sumParts(wpart, nparts, sh);
  if (blockIdx.x == 0 && threadIdx.x == 0) *slot = a;
  return a;
}

// sum over i in [j + 1, n) of x[i] v[i], this thread's share (i = v.j + 1 +
// threadIdx.x + m blockDim) with 8 independent partial sums, added in a fixed order: the
// loads of 8 iterations are in flight together (one running sum made each load wait for the
// previous add: ~32 L2 round trips at n = 8192).
__device__ __forceinline__ double dotV(const double* x, const HVec& v, i64 n) {
  double p[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  const i64 step = blockDim.x;
  for (i64 b = v.j + 1 + threadIdx.x; b < n; b += 8 * step) {
    double xs[8];
    u64 vb[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const i64 i = b + u * step;
      xs[u] = i < n ? x[i] : 0.0;
      vb[u] = i < n ? v.load(i) : 0ull;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const i64 i = b + u * step;
      if (i < n) p[u] += xs[u] * v.value(i, vb[u]);
    }
  }
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
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

// One thread: take a ticket on `*ticket` of `blocks` takers (after a fence); true for the
// last taker, which resets the ticket (nobody else takes it in this launch).
__device__ __forceinline__ bool takeTicket(i64* ticket, unsigned long long blocks) {
  const bool last = atomicAdd((unsigned long long*)ticket, 1ull) == blocks - 1;
  if (last) *ticket = 0;
  return last;
}

// Take a ticket on `*ticket` after this block's global writes; true in the grid's last block,
// which then sees every block's writes (read them with __ldcg).
__device__ __forceinline__ bool lastBlock(i64* ticket, unsigned int blocks) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = takeTicket(ticket, blocks);
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// Sum of `count` values base[0], base[stride], ... in index order, W loads in flight (the
// same additions in the same order whatever W: W only sets how many L2 round trips the sum
// waits for, count / W).
template <int W = 16>
__device__ __forceinline__ double orderedSum(const double* base, i64 count, i64 stride) {
  double t = 0.0;
  for (i64 q0 = 0; q0 < count; q0 += W) {
    double x[W];
#pragma unroll
    for (int u = 0; u < W; ++u) x[u] = q0 + u < count ? __ldcg(base + (q0 + u) * stride) : 0.0;
#pragma unroll
    for (int u = 0; u < W; ++u)
      if (q0 + u < count) t += x[u];
  }
  return t;
}

// The step's scalars (d_j, tau_j, e_j) into d, tau, e; e and tau below the last column only
// (one thread).
__device__ __forceinline__ void storeScalarValues(i64 j, i64 n, double dj, double tj, double ej, double* d, double* e,
                                                  double* tau) {
  d[j] = dj;
  if (j + 1 < n) {
    tau[j] = tj;
    e[j] = ej;
  }
}

// The step's scalars from bb (one thread).
__device__ __forceinline__ void storeScalars(const HVec& v, i64 n, double* d, double* e, double* tau) {
  storeScalarValues(v.j, n, v.scalar(0), v.scalar(1), v.scalar(2), d, e, tau);
}

// LAPACK dlarfg's scalars of column j from sytrd_col's x (bb[4 + r], r >= j) and its tiles'
// partial sums of x[r]^2 over r >= j + 2 (part[0..nparts)): sc = {d_j, tau, beta, scale}, the
// same in every block that computes them (sumParts' fixed order; every thread returns them).
__device__ __forceinline__ void dlarfgScalars(const double* bb, const double* part, int nparts, i64 n, i64 j,
                                              double* sh, double sc[4]) {
  const double xn2 = sumParts(part, nparts, sh);
  double tau = 0.0, beta = 0.0, scale = 0.0;
  if (j + 1 < n) {
    const double alpha = __ldcg(bb + 4 + j + 1);
    const double xnorm = sqrt(xn2);
    const bool flat = xnorm == 0.0;
    beta = flat ? alpha : -copysign(hypot(alpha, xnorm), alpha);
    tau = flat ? 0.0 : (beta - alpha) / beta;
    scale = flat ? 0.0 : 1.0 / (alpha - beta);
  }
  sc[0] = __ldcg(bb + 4 + j);
  sc[1] = tau;
  sc[2] = beta;
  sc[3] = scale;
}

// sytrd_symv's 2nb panel-dot blocks: s[q] = P[:, q] . v over rows > j (V column q < nb, RAW W
// column q - nb: sytrd_w adds al[q] times the V dot), 0 for the panel's columns not yet used.
__device__ __forceinline__ void panelDot(const double* P, i64 n, int nb, i64 k, const HVec& v, double* s, i64 q,
                                         double* sh) {
  const bool used = q < nb ? q < k : q - nb < k;
  const double acc = blockSum(used ? dotV(P + q * n, v, n) : 0.0, sh);
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

// Owner, grid of (n + 31) / 32 row tiles: x[r] = C[r, j] - (V W^T + W V^T)[r, j] for r >= j
// into bb (the panel's first k columns; a warp takes every NW-th, added in warp order), and
// each tile's sum of x[r]^2 over r >= j + 2 (the Householder tail's squared norm); the last
// block then does LAPACK dlarfg's scalars and stores them in bb[0..4).  With `defer`:
// no last block; every block of sytrd_symv computes the scalars from the same partial sums.
extern "C" __global__ void __launch_bounds__(TPB) sytrd_col(const double* C, i64 n, const double* P, int nb,
                                                            double* al, i64* st, double* part,
                                                            double* bb, const Fused* fz, int defer,
                                                            const double* wpart) {
  __shared__ double sh[TPB];
  const i64 j = st[0], k = st[1], lj = st[2];
  const int lane = threadIdx.x & 31;
  const i64 r = (i64)blockIdx.x * 32 + lane;
  const bool row = r >= j && r < n;
  // Deferred: the previous column's al[k - 1] from its sytrd_w's partial dots (same grid), as
  // that kernel's last block had it; block 0 stores it for the later kernels.
  const bool prev = defer && k > 0;
  const double alPrev = prev ? deferredAl(bb, wpart, gridDim.x, sh, al + k - 1) : 0.0;
  double c = 0.0;
  if (row) {
#pragma unroll 4
    for (i64 q = threadIdx.x >> 5; q < k; q += NW) {
      const double a = prev && q == k - 1 ? alPrev : al[q];
      c += P[r + q * n] * wAtWith(P, n, nb, a, j, q) + wAtWith(P, n, nb, a, r, q) * P[j + q * n];
    }
  }
  const double corr = tileSum(c, sh);
  if (threadIdx.x < 32) {
    double x = 0.0;
    if (row) {
      x = C[r + lj * n] - corr;
      bb[4 + r] = x;
      if (fz && r >= j + 2) putAll(fz, fz->bbOff + 8 * (bbAt(n, j) + 4 + r), x);  // what HVec reads
    }
    const double sq = warpSum(r >= j + 2 && r < n ? x * x : 0.0);
    if (lane == 0) part[blockIdx.x] = sq;
  }
  if (defer) return;  // sytrd_symv's blocks finish the column
  if (!lastBlock(st + 3, gridDim.x)) return;
  double sc[4];
  dlarfgScalars(bb, part, gridDim.x, n, j, sh, sc);
  if (threadIdx.x == 0) {
    for (int q = 0; q < 4; ++q) bb[q] = sc[q];
    if (fz)
      for (int q = 0; q < 4; ++q) putAll(fz, fz->bbOff + 8 * (bbAt(n, j) + q), sc[q]);
  }
}

// Every rank, after the Bcast: y = C v over the local columns > j from the LOWER triangle of
// the local columns only (C is symmetric and only its lower triangle is kept current: sygst
// forms no other part, and the trailing updates' rows above the diagonal are never read), so
// each stored element is read once - the phase's memory traffic.  Element (i, g) with i > g of
// local column c (global g > j) adds C[i, g] v[g] to row i and C[i, g] v[i] to column g; the
// diagonal adds C[g, g] v[g] once.  Rows go to y[:n], columns to y[n:] (by global index), and
// the Allreduce sums both halves over the ranks: (C v)[r] = cv[r] + cv[n+r].
//
// Work units: a tile of SY_R rows (8 per lane: a warp reads 2 KiB of a column per step) times
// a chunk of SY_C (2 SY_C early: SY_WIDE; 4 SY_C earlier: SY_WIDER) trailing local columns
// below the diagonal, a work list that shrinks with the trailing matrix.  The launch is
// persistent: about as many blocks as fit on the GPU at once, taking the list's
// items from a counter.  (A block per unit of column 0's rectangle, one captured launch shape
// for every column, would spend the late columns' time on blocks that exit at once.)  A busy
// unit reads at most SY_R x 2 SY_C x 8 = 256 KiB (twice that with SY_WIDER), so hundreds of
// units share the SMs evenly at the start of a run.  A warp takes
// the chunk's columns warp, warp + NW, ... SY_G at a time (24 loads per lane in flight), up to
// the tile's last row (the triangle), and writes each column's sum over the tile's rows to
// cpart; the unit writes its row sums to ypart.  The last unit of a tile (ticket tick[tile],
// over the tile's busy chunks) adds its rows' partials in chunk order; the last unit of a chunk
// (ticket ctick[chunk], over the chunk's busy tiles) adds each column's partials in tile
// order.  Unit (tile, chunk 0) also stores the tile's rows of v as P's V column k, and zeroes
// its rows of y where no chunk reaches the tile.  The list's first 2nb items compute
// s[q] = P[:, q] . v over the panel's used columns (panelDot).  Both halves of y hold stale
// values at rows <= j, which nothing reads.
// The constants SY_R, SY_C, SY_G, SY_WIDE, SY_WIDER, SY_SUMW, SY_MAXCH, SY_MINB are in
// sytrd_abi.h.  Chunks are 2 SY_C wide while at least SY_WIDE trailing local columns remain
// (fewer, longer units: their fixed cost matters less early; late in the reduction the narrow
// chunks keep more units busy), and 4 SY_C wide while at least SY_WIDER remain: with the
// persistent launch the early columns keep enough units at that width (each unit's fixed cost -
// its v loads, barriers, fence and tickets - is then spread over twice the bytes).  SY_SUMW
// loads are in flight in the last units' sums of partials (up to NT per column, nch per row:
// 32-64 at n = 8192-16384, i.e. 2-4 dependent L2 round trips at 16); the same additions in the
// same order whatever its value.  The columns go straight to registers (24 loads per lane in
// flight), not through shared memory.
#define SY_CW_MAX (SY_WIDER ? 4 * SY_C : 2 * SY_C)  // the widest chunk
static_assert(SY_CW_MAX <= TPB, "sytrd_symv loads v at a chunk's columns with a thread per column");
static_assert(TPB == SY_R, "sytrd_symv sums a tile's rows with a thread per row");

// This column's chunk width for m trailing local columns (every unit and sytrd_w agree).
__device__ __forceinline__ i64 chunkWidth(i64 m) {
  return SY_WIDER && m >= SY_WIDER ? 4 * SY_C : m >= SY_WIDE ? 2 * SY_C : SY_C;
}

// Chunks whose columns reach tile a's rows (their units add to the tile's rows).
__device__ __forceinline__ i64 rowUnitsOf(const Layout& L, i64 n, i64 a, i64 lo, i64 cw) {
  const i64 tileEnd = min(n, (a + 1) * SY_R) - 1;
  return (L.firstAfter(tileEnd) - lo + cw - 1) / cw;
}

// The persistent launch's work list: the 2nb panel dots, then the busy units
// chunk by chunk, tile-fastest within a chunk.  Chunk 0 has a unit on every trailing tile (those
// below its columns' diagonal zero their rows of y); chunk ch > 0 on the tiles from the one
// holding its first column's diagonal on, colUnits of the finalizer.  pre[ch] = units before
// chunk ch (pre[nch] = all): each thread counts a run of chunks, then a scan over the threads.
__device__ __forceinline__ void chunkPrefix(int* pre, int* scan, const Layout& L, i64 nch, i64 lo, i64 cw,
                                            i64 NT, i64 t0) {
  const i64 per = (nch + TPB - 1) / TPB, c0 = threadIdx.x * per, c1 = min(nch, c0 + per);
  const auto units = [&](i64 ch) { return (int)(ch == 0 ? NT - t0 : NT - L.glob(lo + ch * cw) / SY_R); };
  int mine = 0;
  for (i64 ch = c0; ch < c1; ++ch) mine += units(ch);
  scan[threadIdx.x] = mine;
  __syncthreads();
  for (int off = 1; off < TPB; off <<= 1) {  // inclusive scan over the threads' counts
    const int x = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
    __syncthreads();
    scan[threadIdx.x] += x;
    __syncthreads();
  }
  int at = scan[threadIdx.x] - mine;
  for (i64 ch = c0; ch < c1; ++ch) {
    pre[ch] = at;
    at += units(ch);
  }
  if (threadIdx.x == TPB - 1) pre[nch] = scan[TPB - 1];
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(TPB, SY_MINB) sytrd_symv(
    const double* C, i64 n, i64 nloc, int nprocs, int rank, double* P, int nb, i64* st,
    const double* bb, double* y, double* ypart, double* cpart, i64* tick, i64* ctick, double* s,
    double* d, double* e, double* tau, const Fused* fz, const double* colPart, int deferArg) {
  __shared__ double sh[TPB];
  __shared__ double rowsSh[NW][SY_R];
  __shared__ double vrSh[SY_R];
  __shared__ double vcSh[SY_CW_MAX];
  __shared__ bool lastSh[2];
  const Layout L{nb, nprocs, rank};
  const i64 j = st[0], k = st[1];
  // see `defer` at the top; nprocs and fz restated, though implied, because without them the
  // compiler's registers for the unit loop spill (ptxas: 8 bytes)
  const bool defer = deferArg && nprocs == 1 && !fz;
  __shared__ double scSh[3];  // deferred: d_j, tau, beta as sytrd_col's last block had them (thread 0's)
  double scale = 0.0;
  if (defer) {
    double sc[4];
    dlarfgScalars(bb, colPart, (int)((n + 31) / 32), n, j, sh, sc);
    scale = sc[3];
    if (threadIdx.x == 0) {  // read back by this thread only (storeScalarValues below)
      for (int q = 0; q < 3; ++q) scSh[q] = sc[q];
      if (blockIdx.x == 0)  // bb's scalars for sytrd_w (this launch's readers use their own)
        for (int q = 0; q < 4; ++q) ((double*)bb)[q] = sc[q];
    }
  }
  const HVec v = defer ? HVec(bb, j, scale) : HVec(bbIn(fz, bb, n, j), j, fz, nb);
  // Fused: a final value of y also goes to every rank's yR (rows > j only: w reads no others).
  const auto putY = [&](i64 idx, double val) {
    y[idx] = val;
    if (fz && (idx >= n || idx > j)) putAll(fz, fz->yOff + 8 * (yAt(fz, n, j, rank) + idx), val);
  };
  const i64 NT = (n + SY_R - 1) / SY_R;
  const i64 t0 = j / SY_R;
  const i64 lo = L.firstAfter(j), m = nloc - lo;
  const i64 cw = chunkWidth(m);
  const i64 nch = max((i64)1, (m + cw - 1) / cw);

  // Unit (tile a, chunk ch); `first`: the column's first unit, (t0, 0).  Uniform over the block.
  const auto unit = [&](i64 a, i64 ch, bool first) {
    const i64 rbase = a * SY_R, tileEnd = min(n, rbase + SY_R) - 1;
    const i64 c0 = lo + ch * cw, c1 = min(nloc, c0 + cw);
    const i64 rowUnits = rowUnitsOf(L, n, a, lo, cw);
    const i64 i = rbase + threadIdx.x;  // TPB == SY_R: a thread per row of the tile
    if (ch >= rowUnits && !(ch == 0 && rowUnits == 0)) return;  // the unit lies above the diagonal
    // The tile's rows of v, and v at the chunk's columns (shared: registers are short; both
    // loads in flight together, then waited for where fused).
    const i64 cv0 = c0 + threadIdx.x, gv = cv0 < c1 ? L.glob(cv0) : 0;
    const u64 vbRow = i < n ? v.load(i) : 0ull, vbCol = cv0 < c1 ? v.load(gv) : 0ull;
    const double vi = i < n ? v.value(i, vbRow) : 0.0;
    if (cv0 < c1) vcSh[threadIdx.x] = v.value(gv, vbCol);
    vrSh[threadIdx.x] = vi;
    if (ch == 0) {
      if (i < n) P[i + k * n] = vi;
      if (first && threadIdx.x == 0) {
        if (defer) storeScalarValues(j, n, scSh[0], scSh[1], scSh[2], d, e, tau); else storeScalars(v, n, d, e, tau);
      }
      if (rowUnits == 0) {  // no trailing local column reaches this tile: its rows of C v are 0
        if (i < n) putY(i, 0.0);
        return;
      }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = (int)min((i64)SY_R, n - rbase);
    double racc[SY_U];
#pragma unroll
    for (int u = 0; u < SY_U; ++u) racc[u] = 0.0;
    __syncthreads();
    // Row offsets within the tile in 32 bits (lane + 32 u), one address per column: 64-bit row
    // indices per element needed 170 registers, one block per SM.
    for (i64 cg = c0 + warp; cg < c1; cg += SY_G * NW) {
      int gd[SY_G];  // column's diagonal offset in the tile (-1: the whole tile lies below it)
      bool on[SY_G];
      double vg[SY_G], x[SY_G][SY_U];
#pragma unroll
      for (int q = 0; q < SY_G; ++q) {
        const i64 c = cg + q * NW, g = L.glob(c);
        on[q] = c < c1 && g <= tileEnd;  // columns ascend: the rest lie above the tile
        gd[q] = on[q] ? (int)max(g - rbase, (i64)-1) : SY_R;
        vg[q] = on[q] ? vcSh[c - c0] : 0.0;
        const double* col = C + c * n + rbase + lane;
#pragma unroll
        for (int u = 0; u < SY_U; ++u) {
          const int o = lane + 32 * u;
          x[q][u] = o >= gd[q] && o < rows ? col[32 * u] : 0.0;
        }
      }
#pragma unroll
      for (int q = 0; q < SY_G; ++q) {
        double cs = 0.0;
#pragma unroll
        for (int u = 0; u < SY_U; ++u) {
          racc[u] += x[q][u] * vg[q];
          if (lane + 32 * u > gd[q]) cs += x[q][u] * vrSh[lane + 32 * u];
        }
        cs = warpSum(cs);
        if (on[q] && lane == 0) cpart[a * nloc + cg + q * NW] = cs;
      }
      if (!on[SY_G - 1]) break;
    }
#pragma unroll
    for (int u = 0; u < SY_U; ++u) rowsSh[warp][lane + 32 * u] = racc[u];
    __syncthreads();
    double rsum = 0.0;
    for (int w = 0; w < NW; ++w) rsum += rowsSh[w][threadIdx.x];
    if (i < n) {
      if (rowUnits == 1 && !defer) putY(i, rsum); else ypart[ch * n + i] = rsum;
    }
    if (defer) return;
    // The chunk's busy tiles are those from the one holding its first column's diagonal on.
    const i64 colUnits = NT - max(t0, L.glob(c0) / SY_R);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {  // both tickets after one fence (lastBlock's, taken twice)
      lastSh[0] = rowUnits > 1 && takeTicket(tick + a, rowUnits);
      lastSh[1] = colUnits > 1 && takeTicket(ctick + ch, colUnits);
    }
    __syncthreads();
    const bool lastRow = lastSh[0], lastCol = colUnits == 1 || lastSh[1];
    if (lastRow || lastCol) __threadfence();
    if (lastRow && i < n) putY(i, orderedSum<SY_SUMW>(ypart + i, rowUnits, n));
    if (lastCol)
      for (i64 c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        const i64 g = L.glob(c);
        const i64 a0 = g / SY_R;  // the tiles that reach column g's diagonal
        putY(n + g, orderedSum<SY_SUMW>(cpart + a0 * nloc + c, NT - a0, nloc));
      }
  };

  // A grid of about as many blocks as fit on the GPU at once taking the items of the work list
  // (chunkPrefix) in order from a counter (st[5]): the same units as below, none launched for
  // nothing, and a block that finishes early takes the next item (a fixed share, every
  // gridDim-th item per block, would leave blocks idle while others still work).
  // A block asks for its next item before it works on the current one (the atomic's round trip
  // overlaps the unit); each block's last ask is past the list, and the last block done (st[6])
  // resets both counters for the next launch, when no block asks any more.
  __shared__ int pre[SY_MAXCH + 1];
  __shared__ int scan[TPB];
  __shared__ i64 itemSh;
  const auto ask = [&] { return (i64)atomicAdd((unsigned long long*)(st + 5), 1ull); };
  if (threadIdx.x == 0) itemSh = ask();
  chunkPrefix(pre, scan, L, nch, lo, cw, NT, t0);  // ends in __syncthreads
  const i64 items = 2 * nb + pre[nch];
  i64 w = itemSh;
  while (w < items) {
    const i64 next = threadIdx.x == 0 ? ask() : 0;  // waited for after the unit
    if (w < 2 * nb) {
      panelDot(P, n, nb, k, v, s, w, sh);
    } else {
      const int u = (int)(w - 2 * nb);
      i64 ch = 0, hi = nch;  // the chunk of unit u: the last ch with pre[ch] <= u
      while (hi - ch > 1) {
        const i64 mid = (ch + hi) / 2;
        if (pre[mid] <= u) ch = mid; else hi = mid;
      }
      const i64 a = (ch == 0 ? t0 : L.glob(lo + ch * cw) / SY_R) + (u - pre[ch]);
      unit(a, ch, u == 0);
    }
    __syncthreads();  // every thread is done with the item (shared memory, itemSh)
    if (threadIdx.x == 0) itemSh = next;
    __syncthreads();
    w = itemSh;
  }
  if (threadIdx.x == 0 && atomicAdd((unsigned long long*)(st + 6), 1ull) == gridDim.x - 1) {
    st[5] = 0;
    st[6] = 0;
    if (deferArg && nprocs == 1 && !fz) {  // every block has read st: the next column's, and sytrd_w's copy
      const i64 jc = st[0], kc = st[1];  // (read again: no register held across the units)
      st[8] = jc;
      st[9] = kc;
      st[0] = jc + 1;
      st[1] = kc + 1;
      st[2] += 1;
    }
  }
}

// Deferred sums (one rank): row r's half of C v from sytrd_symv's partials, the rows half (ypart
// over the chunks reaching r's tile) or the columns half (cpart over the tiles from r's on):
// the finishing units' sums, in their order.  Out of line: its loads in flight would otherwise
// raise sytrd_w's registers for every warp.
__device__ __noinline__ double deferredHalf(const double* ypart, const double* cpart, i64 n, int nb, i64 j, i64 r,
                                            bool rows) {
  const i64 a = r / SY_R, lo = j + 1;
  if (!rows) return orderedSum<SY_SUMW>(cpart + a * n + r, (n + SY_R - 1) / SY_R - a, n);
  const i64 units = rowUnitsOf(Layout{nb, 1, 0}, n, a, lo, chunkWidth(n - lo));
  return units == 1 ? __ldcg(ypart + r) : orderedSum<SY_SUMW>(ypart + r, units, n);
}

// Every rank, after the Allreduce (of 2n: C v = cv[:n] + cv[n:], see sytrd_symv), grid of
// (n + 31) / 32 row tiles (deferred sums, one rank: warps 1 and 2 first add sytrd_symv's partials of
// the tile's rows, ypart over the chunks and cpart over the tiles, as its finishing units would
// have: the same sums in the same order): w = tau (C v - (V W^T + W V^T) v) at rows > j (0 above), stored as
// W's raw column k, and each tile's sum of w . v; the last block then stores W's correction
// al[k] = -(tau/2)(w . v) (LAPACK latrd's w - (tau/2)(w . v) v, applied by wAt) and advances st
// to the next column (every block has read st before it took its ticket).  (W^T v)[q] =
// s[nb + q] + al[q] s[q]: the raw dot plus the correction's.
extern "C" __global__ void __launch_bounds__(TPB) sytrd_w(i64 n, double* P, int nb, double* al, i64* st,
                                                          const double* bb, const double* cv, const double* s,
                                                          double* part, const Fused* fz, int defer,
                                                          const double* ypart, const double* cpart) {
  __shared__ double sh[TPB];
  __shared__ double cvSh[2][32];  // deferred: the rows and columns halves of C v at the tile's rows
  const i64 j = st[defer ? 8 : 0], k = st[defer ? 9 : 1];  // deferred: st[0..2] already advanced
  double* bbr = (double*)bbIn(fz, bb, n, j);
  const HVec v(bbr, j, fz, nb);
  const double t = v.scalar(1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 r = (i64)blockIdx.x * 32 + lane;
  const bool row = r > j && r < n;
  if (defer && (warp == 1 || warp == 2)) {  // one rank: local column r is global column r
    const double x = row ? deferredHalf(ypart, cpart, n, nb, j, r, warp == 1) : 0.0;
    cvSh[warp - 1][lane] = x;  // read by warp 0 after tileSum's barrier
  }
  // This row's v and (fused) its sums from every rank: loads issued now, waited for below.
  const bool mine = threadIdx.x < 32 && r < n;
  const u64 vb = mine ? v.load(r) : 0ull;
  const int nr = fz ? fz->a.nranks : 1, own = fz ? (int)((r / nb) % nr) : 0;
  double* yr = fz ? (double*)(fz->a.peers[fz->a.rank] + fz->yOff) + yAt(fz, n, j, 0) + r : nullptr;
  u64 yb[HC_MAX_RANKS], cb = 0;
  if (fz && mine && row) {
#pragma unroll
    for (int q = 0; q < HC_MAX_RANKS; ++q)
      if (q < nr) yb[q] = ldVol64(yr + q * 2 * n);
    cb = ldVol64(yr + own * 2 * n + n);
  }
  double c = 0.0;
  if (row) {
#pragma unroll 4
    for (i64 q = threadIdx.x >> 5; q < k; q += NW)
      c += P[r + q * n] * fma(al[q], s[q], s[nb + q]) + wAt(P, n, nb, al, r, q) * s[q];
  }
  const double corr = tileSum(c, sh);
  if (threadIdx.x < 32) {
    double cvr = 0.0, cvc = 0.0;  // the Allreduce's two halves at row r
    if (row && fz) {
      // rank order, 0.0 from the ranks that do not own column r: the Allreduce's expression
      const double cown = arrived(fz, yr + own * 2 * n + n, cb, HC_COLL_ALLREDUCE, own);
#pragma unroll
      for (int q = 0; q < HC_MAX_RANKS; ++q) {
        if (q >= nr) break;
        const double x = arrived(fz, yr + q * 2 * n, yb[q], HC_COLL_ALLREDUCE, q);
        cvr = q == 0 ? x : cvr + x;
        cvc = q == 0 ? (own == 0 ? cown : 0.0) : cvc + (q == own ? cown : 0.0);
        rearm(yr + q * 2 * n);
      }
      rearm(yr + own * 2 * n + n);
    } else if (row && defer) {
      cvr = cvSh[0][lane];
      cvc = cvSh[1][lane];
    } else if (row) {
      cvr = cv[r];
      cvc = cv[n + r];
    }
    const double w = row ? t * ((cvr + cvc) - corr) : 0.0;  // rows + columns halves (sytrd_symv)
    if (r < n) P[r + (nb + k) * n] = w;
    const double dot = warpSum(mine ? w * v.value(r, vb) : 0.0);
    if (fz && r >= j + 2 && r < n) rearm(bbr + 4 + r);  // read (value) above: x[r] of bbR
    if (lane == 0) part[blockIdx.x] = dot;
  }
  if (defer) return;  // al[k]: the next sytrd_col's blocks (or sytrd_wfix) from `part`
  if (!lastBlock(st + 4, gridDim.x)) return;
  // Every block has read bbR's scalars (t, v's scale) before its ticket: re-arm them.
  if (fz && threadIdx.x < 4) rearm(bbr + threadIdx.x);
  const double dot = sumParts(part, gridDim.x, sh);
  if (threadIdx.x == 0) {
    al[k] = -0.5 * t * dot;
    st[0] = j + 1;
    st[1] = k + 1;
    st[2] += 1;
  }
}

// After a panel's columns: W's columns q < width made true in place, W = Wraw + al[q] V (the
// fma of wAt), for the trailing update's GEMM.  Grid over the n x width elements.  Deferred
// (`defer`): the last column's al from its sytrd_w's partial dots (wparts of them) first, as
// sytrd_col does for the others.
extern "C" __global__ void __launch_bounds__(TPB) sytrd_wfix(i64 n, double* P, int nb, double* al, i64 width,
                                                             int defer, const double* bb, const double* wpart,
                                                             int wparts) {
  __shared__ double sh[TPB];
  const double alLast = defer && width > 0 ? deferredAl(bb, wpart, wparts, sh, al + width - 1) : 0.0;
  for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < n * width; t += (i64)gridDim.x * blockDim.x) {
    const i64 r = t % n, q = t / n;
    P[r + (nb + q) * n] = wAtWith(P, n, nb, defer && q == width - 1 ? alLast : al[q], r, q);
  }
}
