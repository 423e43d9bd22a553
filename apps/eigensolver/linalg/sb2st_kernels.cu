// Bulge chasing (band -> tridiagonal, sb2st.py's algorithm) in one persistent launch
// (sb2st_device.py).
//
// Block i runs sweeps i, i + gridDim.x, ... in order, each sweep's steps k = 0, 1, ... in order;
// a step is sb2st.chase_step's arithmetic on the working band A in global memory (column-major
// band storage of half-bandwidth w = 2b: A(r, c) at c (4b + 1) + r - c + 2b, as
// sb2st._SymmetricBand, of which the kernel reads and writes the lower triangle only: the
// diagonal block's upper part is its lower part's mirror image, where the host updates both
// triangles and they part by rounding), staged in shared memory: each step loads the blocks it reads in one
// round at its start, and keeps the block that the sweep's next step pivots on (all of it but
// the last row, which the next step reads again: the row deferred, below) and its reflector.
//
// The wavefront (sb2st.steps_needed, checked on the CPU by tests/unit/test_sb2st_schedule.py):
// before step k of sweep j, sweep j - 1 has finished min(k + SB_LAG + 1, K_{j-1}) steps.  A step
// that has a next step in its sweep (sb2st.defers) leaves the last of its rows below unchanged
// (its corner is the pivot of sweep j - 1's step k + 2, not yet run); the next step, which waits
// for that step, reads the row again and applies the kept reflector to it first.
// Progress: progress[j] = the steps sweep j has finished.  Release (after a step): every
// thread's stores, __syncthreads, then thread 0 stores the count with st.release.gpu.  Acquire
// (before a step): thread 0 polls the count with ld.acquire.gpu, then __syncthreads; the band is
// then read with ld.global.cg (L2, never a stale L1 line).  Acquire and release are what the
// pattern needs: a fence.sc (__threadfence) on each side costs about 4% of the kernel's time.
// Every poll is bounded (timeout_ns, globaltimer): on expiry err[0..4] = 1, sweep, step, count
// seen, count needed, and the block returns; blocks polling meanwhile see err[0] and return too.
//
// Deadlock freedom: a step waits only for a lower sweep, and a block runs its sweeps in
// ascending order, so the lowest unfinished sweep never waits, provided that every block of the
// grid is resident at once: the grid is at most the blocks the GPU holds (sb2st_device.py).
//
// Every sum runs in a fixed order (the products: four interleaved partials combined as
// (p0 + p1) + (p2 + p3); tree_sum: a halving tree over 64 slots), so two runs give the same bits.
// Every floating-point operation is one IEEE operation rounded to nearest (add, subtract, multiply,
// divide, sqrt; never contracted into an FMA, hypot by its formula): the GPU gives the bits of the
// CPU emulation, which the GPU tests compare.
//
// Compiled for the GPU by NVRTC (raw_module); with SB2ST_HOST defined it is plain C++ that the
// CPU tests run (tests/unit/sb2st_emulation.cpp: every phase over all 256 thread indices in turn,
// each sweep's shared memory kept from step to step as a block keeps it).

#ifdef SB2ST_HOST
#include <math.h>
#define SB_FN inline
#else
#define SB_FN __device__ __forceinline__
#endif

#define SB_TPB 256            // threads per block: 4 per output of a matrix-vector product
#define SB_BMAX 64            // the largest half-bandwidth b (the blocks are at most b x b)
#define SB_LDS (SB_BMAX + 1)  // leading dimension of the pivot block L (odd: fewer bank conflicts)
#define SB_LDP (2 * SB_BMAX + 1)  // of the panel: D's rows, then Y's
#define SB_PARTS (SB_TPB / SB_BMAX)
#define SB_LAG 1              // sb2st.LAG

static_assert(SB_PARTS == 4, "the products combine four partials per output");

struct Smem {
  double P[SB_BMAX * SB_LDP];         // the panel A[s:e2, s:e] = [D; Y], P[r + c SB_LDP]
  double L[SB_BMAX * SB_LDS];         // the pivot block A[s:e, lo:s], L[r + c SB_LDS]; after the
                                      // step the updated Y: the next step's pivot block (its last
                                      // row deferred, read again by the next step)
  double v[SB_BMAX], tv[SB_BMAX];     // the reflector v (v[0] = 1) and tau v, kept for the next
                                      // step where this one deferred (deferred)
  double u[SB_BMAX], p[SB_BMAX], w[SB_BMAX], y[SB_BMAX];
  double part[3][SB_PARTS][SB_BMAX];  // the products' partials (u, p, y)
  double red[SB_BMAX];                // tree_sum's slots
  double beta, tau, scal, yd;         // yd: the deferred row's product with tau v
  int skip;                           // nothing below the pivot: H = I
  int deferred;                       // this step left its last row below to the next
};
SB_FN int sb_min(int a, int b) { return a < b ? a : b; }

#ifdef SB2ST_HOST  // compiled with -ffp-contract=off
SB_FN double sb_add(double a, double b) { return a + b; }
SB_FN double sb_sub(double a, double b) { return a - b; }
SB_FN double sb_mul(double a, double b) { return a * b; }
SB_FN double sb_div(double a, double b) { return a / b; }
#else              // the _rn intrinsics are never contracted
SB_FN double sb_add(double a, double b) { return __dadd_rn(a, b); }
SB_FN double sb_sub(double a, double b) { return __dsub_rn(a, b); }
SB_FN double sb_mul(double a, double b) { return __dmul_rn(a, b); }
SB_FN double sb_div(double a, double b) { return __ddiv_rn(a, b); }
#endif

// sqrt(a^2 + b^2) without overflow (LAPACK dlapy2's formula; sqrt is correctly rounded on both)
SB_FN double sb_hypot(double a, double b) {
  a = fabs(a);
  b = fabs(b);
  const double big = a > b ? a : b, small = a > b ? b : a;
  if (small == 0.0) return big;
  const double q = sb_div(small, big);
  return sb_mul(big, sqrt(sb_add(1.0, sb_mul(q, q))));
}

// sb2st.sweep_steps: the steps of sweep j (reflector length >= 2)
SB_FN int sweep_steps(int n, int b, int j) { return j <= n - 3 ? (n - 3 - j) / b + 1 : 0; }

// sb2st.steps_needed: the steps of sweep j - 1 finished before step k of sweep j runs
SB_FN int steps_needed(int n, int b, int j, int k) {
  return j > 0 ? sb_min(k + SB_LAG + 1, sweep_steps(n, b, j - 1)) : 0;
}

// sb2st.defers: step k of sweep j leaves the last of its rows below to its step k + 1
SB_FN bool defers(int n, int b, int j, int k) { return k + 1 < sweep_steps(n, b, j); }

// A(r, c) in the band storage; |r - c| <= 2b (every block a step touches is within 2b - 1)
SB_FN long long at(int r, int c, int b) { return (long long)c * (4 * b + 1) + r - c + 2 * b; }

SB_FN double ld_band(const double* p) {
#ifdef SB2ST_HOST
  return *p;
#else
  return __ldcg(p);  // from L2: another block's stores, published by the acquire above, are there
#endif
}

// f(r, c) for every entry of a rows x cols block (rows <= R, R = SB_BMAX or 2 SB_BMAX): thread t
// takes row t % R and columns t / R, t / R + SB_TPB / R, ... (shifts, no integer division;
// consecutive threads, consecutive rows: coalesced along a column of the band storage)
template <int R, class F>
SB_FN void over_block(int t, int rows, int cols, F f) {
  static_assert(SB_TPB % R == 0, "R divides the block's threads");
  const int r = t % R;
  if (r >= rows) return;
  for (int c = t / R; c < cols; c += SB_TPB / R) f(r, c);
}

// The panel [D; Y] = A[s:e2, s:e] into sm.P: thread t takes row r = t % 128 (r < mp) and
// columns c = t / 128, t / 128 + 2, ... (over_block's entries), all loaded into registers before
// any is stored, so that the loads' latencies overlap.  Every load and store is unconditional,
// so that the compiler cannot move a load next to its store: where r < c (D's upper triangle,
// never read) the entry comes from the band's upper triangle, and where c >= m from column
// m - 1, into P's columns m .. SB_BMAX - 1, which the step never reads.
SB_FN void load_panel(int t, Smem& sm, const double* A, int b, int s, int m, int mp) {
  constexpr int R = 2 * SB_BMAX, STEP = SB_TPB / R, N = SB_BMAX / STEP;
  const int r = t % R, c0 = t / R;
  if (r >= mp) return;
  double v[N];
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = ld_band(A + at(s + r, s + sb_min(c0 + i * STEP, m - 1), b));
#pragma unroll
  for (int i = 0; i < N; ++i) sm.P[r + (c0 + i * STEP) * SB_LDP] = v[i];
}

// sm.red[0] = the sum of sm.red[0 .. 63] by a halving tree, run by the first warp alone
// (x.warp: its 32 threads, a warp barrier after each level).  Ends synchronized.
template <class X>
SB_FN void tree_sum(const X& x, Smem& sm) {
  for (int h = SB_BMAX / 2; h > 0; h /= 2)
    x.warp([&](int t) { if (t < h) sm.red[t] = sb_add(sm.red[t], sm.red[t + h]); });
  x.sync();
}

// four partials (interleaved over i) combined as (p0 + p1) + (p2 + p3)
SB_FN double combine(const double (&part)[SB_PARTS][SB_BMAX], int o) {
  return sb_add(sb_add(part[0][o], part[1][o]), sb_add(part[2][o], part[3][o]));
}

// Step k of sweep j (sb2st.chase_step).  x runs a phase on every thread index (each), on the
// first warp's (warp), and separates phases (sync); state that crosses phases lives in sm.  At
// k = 0 nothing is assumed of sm; at k >= 1 sm.L holds what step k - 1 of the same sweep left
// there (its updated Y, which is this step's pivot block A[s:e, lo:s]: no step of another sweep
// writes its rows but the last in between, tests/unit/test_sb2st_schedule.py), and where step
// k - 1 deferred (sm.deferred) sm.v and sm.tv hold its reflector.  Ends after a sync.
//
// Every block the step reads is loaded at its start, in one round: the panel [D; Y] =
// A[s:e2, s:e], D's lower triangle (at k = 0 the pivot column, at k >= 1 L's last row).  Where
// step k - 1 deferred, that row first: its product with step k - 1's tau v (the first warp, the
// sum grouped as y's below: the bits step k - 1 would have given it), then the row -= product
// v^T (stored).  Then: the reflector from L's first column; the three products with tau v in one
// phase, u = (tau v)^T L[:, 1:], p = D (tau v), y = Y (tau v); L -= v u^T and Y -= y v^T
// (stored; all rows of Y but a deferred last); w = p - (tau / 2)(p^T v) v; D -= v w^T + w v^T on
// D's lower triangle (stored), Y kept in sm.L for the next step.
template <class X>
SB_FN void chase_step(const X& x, Smem& sm, double* A, double* flat, const long long* goff,
                      int n, int b, int g, int j, int k) {
  const int s = j + 1 + k * b;       // the rows [s, e) of the reflector
  const int e = sb_min(s + b, n);
  const int lo = k == 0 ? j : s - b; // the pivot column: sweep's column j, then the bulge's first
  const int e2 = sb_min(e + b, n);   // the rows [e, e2) below
  const int m = e - s;               // 2 <= m <= b (sweep_steps counts these steps only)
  const int cl = s - lo;             // L = A[s:e, lo:s] has 1 column at k = 0, else b
  const int m2 = e2 - e;             // Y = A[e:e2, s:e] has 0 .. b rows
  const int my = defers(n, b, j, k) ? m2 - 1 : m2;  // the rows of Y this step updates
  const int mp = m + m2;             // the panel's rows
  const bool row = k > 0 && sm.deferred;  // step k - 1 left L's last row (m = cl = b then)
  // group j / g's (K, b + 1, g) array in C order: v[i] of this step at R[i g], tau at R[b g];
  // flat null: the reflectors are not kept (eigenvalues only)
  double* R = flat ? flat + goff[j / g] + (long long)k * (b + 1) * g + j % g : nullptr;

  x.each([&](int t) {
    load_panel(t, sm, A, b, s, m, mp);
    if (k == 0 && t < m) sm.L[t] = ld_band(A + at(s + t, j, b));
    if (k > 0 && t >= SB_TPB - SB_BMAX && t - (SB_TPB - SB_BMAX) < cl) {  // L's last row, again
      const int c = t - (SB_TPB - SB_BMAX);
      sm.L[m - 1 + c * SB_LDS] = ld_band(A + at(s + m - 1, lo + c, b));
    }
  });
  x.sync();
  if (row) {  // the deferred row's product with tau v: four partials over i = p, p + 4, ..., combined
    x.warp([&](int t) {
      if (t < SB_PARTS) {
        double a = 0.0;
        for (int i = t; i < cl; i += SB_PARTS) a = sb_add(a, sb_mul(sm.L[m - 1 + i * SB_LDS], sm.tv[i]));
        sm.red[t] = a;
      }
    });
    x.warp([&](int t) { if (t == 0) sm.yd = sb_add(sb_add(sm.red[0], sm.red[1]), sb_add(sm.red[2], sm.red[3])); });
    x.sync();
  }
  // the deferred row -= yd v^T (stored; its first entry, in the pivot column, by the thread that
  // squares it), and the pivot column x = L[:, 0]: |x[1:]|^2, then beta, tau and
  // 1 / (alpha - beta) as the host
  x.each([&](int t) {
    if (row && t > SB_TPB - SB_BMAX && t - (SB_TPB - SB_BMAX) < cl) {
      const int c = t - (SB_TPB - SB_BMAX);
      const double a = sb_sub(sm.L[m - 1 + c * SB_LDS], sb_mul(sm.yd, sm.v[c]));
      sm.L[m - 1 + c * SB_LDS] = a;
      A[at(s + m - 1, lo + c, b)] = a;
    }
    if (t < SB_BMAX) {
      double xi = (t >= 1 && t < m) ? sm.L[t] : 0.0;
      if (row && t == m - 1) {
        xi = sb_sub(xi, sb_mul(sm.yd, sm.v[0]));
        sm.L[t] = xi;
        A[at(s + t, lo, b)] = xi;
      }
      sm.red[t] = sb_mul(xi, xi);
    }
  });
  x.sync();
  tree_sum(x, sm);
  x.each([&](int t) {
    if (t == 0) {
      const double alpha = sm.L[0], xn2 = sm.red[0];
      sm.skip = xn2 == 0.0;
      if (!sm.skip) {
        const double beta = -copysign(sb_hypot(alpha, sqrt(xn2)), alpha);
        sm.beta = beta;
        sm.tau = sb_div(sb_sub(beta, alpha), beta);
        sm.scal = sb_div(1.0, sb_sub(alpha, beta));
      }
    }
  });
  x.sync();
  if (sm.skip) {                     // H = I: v[0] = 1, tau = 0 (flat starts zero); A unchanged;
    x.each([&](int t) {              // Y as loaded is the next pivot block; nothing deferred
      if (t == 0 && R) R[0] = 1.0;
      if (t == 0) sm.deferred = 0;
      over_block<SB_BMAX>(t, m2, m, [&](int r, int c) { sm.L[r + c * SB_LDS] = sm.P[m + r + c * SB_LDP]; });
    });
    x.sync();
    return;
  }
  // v, tau v, and the reflector into flat (entries m .. b - 1 of v stay zero)
  x.each([&](int t) {
    if (t < m) {
      const double vi = t == 0 ? 1.0 : sb_mul(sm.L[t], sm.scal);
      sm.v[t] = vi;
      sm.tv[t] = sb_mul(sm.tau, vi);
      if (R) R[(long long)t * g] = vi;
    }
    if (t == 0 && R) R[(long long)b * g] = sm.tau;
  });
  x.sync();
  // the three products: thread t sums output t % 64 over i = t / 64, t / 64 + 4, ... in order
  x.each([&](int t) {
    const int o = t % SB_BMAX, part = t / SB_BMAX;
    double au = 0.0, ap = 0.0, ay = 0.0;
    for (int i = part; i < m; i += SB_PARTS) {
      const double ti = sm.tv[i];
      if (o < cl - 1) au = sb_add(au, sb_mul(ti, sm.L[i + (o + 1) * SB_LDS]));
      if (o < m) ap = sb_add(ap, sb_mul(sm.P[o >= i ? o + i * SB_LDP : i + o * SB_LDP], ti));  // D(o, i)
      if (o < m2) ay = sb_add(ay, sb_mul(sm.P[m + o + i * SB_LDP], ti));
    }
    sm.part[0][part][o] = au;
    sm.part[1][part][o] = ap;
    sm.part[2][part][o] = ay;
  });
  x.sync();
  x.each([&](int t) {
    if (t < SB_BMAX) {
      sm.u[t] = combine(sm.part[0], t);
      sm.y[t] = combine(sm.part[2], t);
      const double pt = combine(sm.part[1], t);
      sm.p[t] = pt;
      sm.red[t] = t < m ? sb_mul(pt, sm.v[t]) : 0.0;
    }
  });
  x.sync();
  // from the left on L: the pivot column becomes (beta, 0, ...), L[:, 1:] -= v u^T; from the
  // right on Y (the next bulge): Y -= y v^T; both into A (lower triangle).  Then p^T v.
  x.each([&](int t) {
    over_block<SB_BMAX>(t, m, cl, [&](int r, int c) {
      const double a = c == 0 ? (r == 0 ? sm.beta : 0.0) : sb_sub(sm.L[r + c * SB_LDS], sb_mul(sm.v[r], sm.u[c - 1]));
      A[at(s + r, lo + c, b)] = a;
    });
    over_block<SB_BMAX>(t, my, m, [&](int r, int c) {   // all but a deferred last row
      double& a = sm.P[m + r + c * SB_LDP];
      a = sb_sub(a, sb_mul(sm.y[r], sm.v[c]));
      A[at(e + r, s + c, b)] = a;
    });
  });
  tree_sum(x, sm);
  // two-sided on the diagonal block D (its lower triangle): w = p - (tau / 2)(p^T v) v,
  // D -= v w^T, D -= w v^T; Y into sm.L
  x.each([&](int t) { if (t < m) sm.w[t] = sb_sub(sm.p[t], sb_mul(sb_mul(sb_mul(0.5, sm.tau), sm.red[0]), sm.v[t])); });
  x.sync();
  x.each([&](int t) {
    over_block<SB_BMAX>(t, m, m, [&](int r, int c) {
      if (r < c) return;
      double a = sm.P[r + c * SB_LDP];
      a = sb_sub(a, sb_mul(sm.v[r], sm.w[c]));
      a = sb_sub(a, sb_mul(sm.w[r], sm.v[c]));
      A[at(s + r, s + c, b)] = a;
    });
    over_block<SB_BMAX>(t, m2, m, [&](int r, int c) { sm.L[r + c * SB_LDS] = sm.P[m + r + c * SB_LDP]; });
    if (t == 0) sm.deferred = my < m2;   // v and tv stay for the next step
  });
  x.sync();
}

#ifndef SB2ST_HOST

struct DeviceExec {  // every thread of the block runs a phase; __syncthreads between phases
  template <class F>
  __device__ __forceinline__ void each(F f) const { f((int)threadIdx.x); }
  template <class F>   // the first warp runs a phase, then a warp barrier; the others go on
  __device__ __forceinline__ void warp(F f) const {
    if (threadIdx.x < 32) { f((int)threadIdx.x); __syncwarp(); }
  }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
};

// the kernel's dynamic shared memory: sizeof(Smem), more than the 48 KiB of static shared memory
extern "C" __global__ void sb2st_smem_bytes(long long* out) { *out = (long long)sizeof(Smem); }

__device__ __forceinline__ unsigned long long sb_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// progress[j] = v for the GPU, after every store this thread has seen (a release store: with
// the __syncthreads before it, every thread's stores of the step)
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

// progress[j] for the GPU; what was stored before a release store of the value seen is visible
// to this thread's later loads (an acquire load: with the __syncthreads after it, every thread's)
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Thread 0 waits until progress[j - 1] >= need (acquire), or for at most timeout_ns; the block
// learns which.  Returns false (the block must return) on a timeout here or anywhere.
__device__ bool wait_for(const int* progress, int* err, int j, int k, int need,
                         unsigned long long timeout_ns, int* stop) {
  if (threadIdx.x == 0) {
    const int* p = progress + (j - 1);
    const volatile int* failed = err;
    int bad = 0;
    if (load_acquire(p) < need) {
      const unsigned long long t0 = sb_globaltimer();
      for (unsigned spin = 1; load_acquire(p) < need; ++spin) {
        if ((spin & 255u) != 0) continue;
        if (*failed) { bad = 1; break; }
        if (sb_globaltimer() - t0 > timeout_ns) {
          bad = 1;
          if (atomicCAS(err, 0, 1) == 0) { err[1] = j; err[2] = k; err[3] = *(const volatile int*)p; err[4] = need; }
          break;
        }
      }
    }
    *stop = bad;
  }
  __syncthreads();
  return !*stop;
}

// A: the working band (n (4b + 1) doubles, initialised from the band); flat: every group's
// reflectors (zeroed; layout sb2st.group_offsets, goff[q] where group q starts), or null; progress: n - 2
// zeroed counts; err: 5 zeroed ints.  2 <= b <= SB_BMAX, g >= 1, n >= 3; blockDim.x = SB_TPB;
// dynamic shared memory sizeof(Smem) (sb2st_smem_bytes).
extern "C" __global__ void __launch_bounds__(SB_TPB)
sb2st_chase(double* A, double* flat, const long long* goff, int* progress, int* err,
            int n, int b, int g, unsigned long long timeout_ns) {
  extern __shared__ __align__(16) unsigned char sb_dynamic[];
  Smem& sm = *reinterpret_cast<Smem*>(sb_dynamic);
  __shared__ int stop;
  const DeviceExec x;
  for (int j = blockIdx.x; j < n - 2; j += gridDim.x) {
    const int K = sweep_steps(n, b, j);
    for (int k = 0; k < K; ++k) {
      if (j > 0 && !wait_for(progress, err, j, k, steps_needed(n, b, j, k), timeout_ns, &stop)) return;
      chase_step(x, sm, A, flat, goff, n, b, g, j, k);
      __syncthreads();  // release: every thread's stores of the step ...
      if (threadIdx.x == 0) store_release(progress + j, k + 1);  // ... before the count
    }
  }
}

#endif  // SB2ST_HOST
