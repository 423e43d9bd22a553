// Q2's kernels for q2_device.py.  Compiled for the GPU by NVRTC (raw_module); with Q2_HOST defined
// the group path (q2_group_T, q2_group_apply) is plain C++ that the CPU tests run
// (tests/unit/q2_emulation.cpp): each phase between two barriers over all Q2_THREADS thread
// indices in turn, and an mma as the sum over its k that each lane's outputs take.
//
// q2_level_factors (apply_q2_levels): the compact-WY factors of one level of its schedule.
// Block i of the level (blockIdx.x) is group q = q0 + i, step k = k0 + i.  Its reflectors lie in
// `flat` (sb2st.group_offsets' layout, group q's (K_q, b + 1, g) array in C order) from
// offsets[q] + k (b + 1) g:  R[r g + t] (r < b) is entry r of sweep q g + t's vector (the block's
// row t + r), R[b g + t] its tau (0: no reflector).  With h = b + g - 1 it writes, column-major
// h x g at V + i h g and at Y + i h g,
//   V[r + a h] = R[(r - a) g + a]  for 0 <= r - a < b and tau_a != 0, else 0  (the skewed columns)
//   Y = V T,  T (g x g, upper triangular) the UT transform's: I - V T V^T = H_0 H_1 ... H_{g-1}.
// T by LAPACK dlarft's forward columnwise recurrence (T = (striu(V^T V) + diag(1 / tau))^-1):
//   T[c][c] = tau_c,   T[0:c, c] = -tau_c T[0:c, 0:c] G[0:c, c],   G = V^T V (strict upper part).
// A reflector with tau_c = 0 is left out, as sy2sb.block_reflector does: V's column c is zero,
// hence G's row and column c, hence T's row and column c (T[c][c] = 0 starts the row, every
// later entry of the row sums products with it or with G[c][.]).
// Every sum runs in a fixed order: the factors are the same bits on every run.
//
// Launch: grid = the level's block count, any blockDim (256), dynamic shared memory
// (g g + g) doubles: S, g x g column-major, holds T on and above its diagonal and G[a][c]
// (a < c) mirrored below it at S[c + a g]; tau follows.  The recurrence writes T[.][c] (above
// the diagonal, column c) while it reads columns < c of T and row c of the mirrored G, so
// step c reads nothing it writes; __syncthreads() between steps publishes column c.

#ifdef Q2_HOST
#include <algorithm>
#define Q2_FN inline
#define Q2_RESTRICT
using std::max;
using std::min;
#else
#define Q2_FN __device__ __forceinline__
#define Q2_RESTRICT __restrict__

struct Q2DeviceExec {   // every thread of the block runs a phase; __syncthreads between phases
    template <class F>
    __device__ __forceinline__ void each(F f) const { f((int)threadIdx.x); }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};
#endif

// The UT transform's T of one block into S (g x g column-major, T on and above the diagonal, G
// mirrored below it) and tau into S + g g, by the recurrence above, with `nt` threads (x: the
// executor); S is complete when it returns.
template <class X>
Q2_FN void q2_block_T(const X& x, int nt, const double* Q2_RESTRICT R, double* S, int b, int g)
{
    double* tau = S + g * g;
    x.each([&](int th) {
        for (int t = th; t < g; t += nt)
            tau[t] = R[b * g + t];
    });
    x.sync();
    // G[a][c] for a < c: the skewed columns a and c share the rows c .. a + b - 1 (none when
    // c - a >= b), where v_a has entries lag .. b - 1 and v_c entries 0 .. b - 1 - lag
    x.each([&](int th) {
        for (int e = th; e < g * g; e += nt) {
            const int c = e % g, a = e / g;       // S[c + a g]: below the diagonal when a < c
            if (a < c) {
                const int lag = c - a;
                double s = 0.0;
                if (tau[a] != 0.0 && tau[c] != 0.0)
                    for (int r = 0; r < b - lag; ++r)
                        s += R[(r + lag) * g + a] * R[r * g + c];
                S[e] = s;
            }
        }
    });
    x.sync();
    for (int c = 0; c < g; ++c) {                 // T's column c from its columns 0 .. c - 1
        x.each([&](int th) {
            for (int a = th; a < c; a += nt) {
                double s = 0.0;
                for (int l = a; l < c; ++l)       // T[a][l] (zero for l < a) times G[l][c]
                    s += S[a + l * g] * S[c + l * g];
                S[a + c * g] = -tau[c] * s;
            }
            if (th == 0)
                S[c + c * g] = tau[c];
        });
        x.sync();
    }
}

#ifndef Q2_HOST
extern "C" __global__ void q2_level_factors(const double* __restrict__ flat, const long long* __restrict__ offsets,
                                            int q0, int k0, int b, int g, double* __restrict__ V,
                                            double* __restrict__ Y)
{
    extern __shared__ double S[];
    double* tau = S + g * g;
    const int h = b + g - 1;
    const int q = q0 + (int)blockIdx.x, k = k0 + (int)blockIdx.x;
    const double* R = flat + offsets[q] + (long long)k * (b + 1) * g;
    double* Vi = V + (long long)blockIdx.x * h * g;
    double* Yi = Y + (long long)blockIdx.x * h * g;

    q2_block_T(Q2DeviceExec(), (int)blockDim.x, R, S, b, g);

    // V, dense and masked: entry (r, a) is v_a's entry r - a
    for (int e = threadIdx.x; e < h * g; e += blockDim.x) {
        const int r = e % h, a = e / h, d = r - a;
        Vi[e] = (d >= 0 && d < b && tau[a] != 0.0) ? R[d * g + a] : 0.0;
    }

    // Y[r][c] = sum_a V[r][a] T[a][c], a over V's nonzeros in row r (r - b < a <= r) and T's in
    // column c (a <= c)
    for (int e = threadIdx.x; e < h * g; e += blockDim.x) {
        const int r = e % h, c = e / h;
        const int lo = r - b + 1 > 0 ? r - b + 1 : 0, hi = r < c ? r : c;
        double s = 0.0;
        for (int a = lo; a <= hi; ++a)
            if (tau[a] != 0.0)
                s += R[(r - a) * g + a] * S[a + c * g];
        Yi[e] = s;
    }
}
#endif

// ---------------------------------------------------------------------------------------------
// Q2 Z group by group, every block of a group applied to Z's rows while they stay on chip.
//
// q2_group_T: group q's blocks' T factors, block k = blockIdx.x, g x g column-major at
// T + k g g (zero below the diagonal), by the recurrence above.  Launch: grid = K_q, any
// blockDim (256), (g g + g) doubles of dynamic shared memory.
//
// q2_group_apply: Z <- H_{q,K-1} ... H_{q,1} H_{q,0} Z for one group q, H_{q,k} = I - V T V^T
// the block of rows r_k = q g + 1 + k b .. r_k + h - 1 (h = b + g - 1, clipped at n).  Block x
// of the grid owns Z's columns 64 x .. 64 x + 63 (columns are independent: no block waits for
// another) and keeps a window of Q2_WIN = 128 rows on chip, a ring (row rho in slot rho & 127):
// rows r_k .. r_k + 127 during step k, of which the block's h rows change.  Rows r_k .. r_k + b - 1
// are final after step k (step k + 1 starts b rows lower), so they go back to Z and rows
// r_k + 128 .. r_k + 128 + b - 1 come in, read into registers while step k computes.  Per step,
// on the tensor cores (mma m16n8k8, fp64):
//   W  = V^T Zw         64 x 64, V^T's 32-row tiles only over the rows where V is nonzero
//   W2 = T W            T upper triangular: only l >= a (stored as -W2)
//   Zw = Zw - V W2      V's 32-row tiles only over the columns where V is nonzero
// with V[rho][t] = R[(rho - t) g + t] for 0 <= rho - t < b and tau_t != 0 (the skewed columns,
// kept on chip as R, not as a dense h x g V).  R, T and W are padded to 64 x 64 with zeros
// (b, g <= 64).  Rows at or past n are zero on chip and never written back; columns past ncols
// are zero and never written back.  Every sum runs in a fixed order: the same bits every run.
//
// Launch: grid = ceil(ncols / 64), blockDim Q2_THREADS, sizeof(Q2Smem) bytes of dynamic shared
// memory (q2_apply_smem_bytes), after q2_group_T of the same group on the same stream.

#define Q2_COLS 64
#define Q2_WIN 128
#define Q2_LDZ 132      // the ring's column stride: 4 (mod 16) spreads a fragment's rows over banks
#define Q2_LDS 68       // R's, T's and W's row stride: 4 (mod 16), the same reason
#define Q2_PAD 64
#define Q2_THREADS 512
#define Q2_ITEMS (Q2_PAD * Q2_COLS / Q2_THREADS)   // 64 x 64 items, per thread

struct Q2Smem {
    double Z[Q2_COLS * Q2_LDZ];    // the ring: column c's row rho at c Q2_LDZ + (rho & 127)
    double R[Q2_PAD * Q2_LDS];     // R[d Q2_LDS + t]: entry d of reflector t (0 where tau_t = 0)
    double T[Q2_PAD * Q2_LDS];     // T[l Q2_LDS + a] = T_(a, l)
    double W[Q2_PAD * Q2_LDS];     // W[t Q2_LDS + c], then -W2
};

// What a thread keeps from one phase to a later one (registers on the GPU): the next block's R
// and T and the rows that come in, read while a step computes, and W2's tile across a barrier
struct Q2Thread {
    double fr[Q2_ITEMS], ft[Q2_ITEMS], fz[Q2_ITEMS];
    double acc[1][2][4];
};

#ifndef Q2_HOST
extern "C" __global__ void q2_apply_smem_bytes(long long* out) { *out = (long long)sizeof(Q2Smem); }
#endif

// m16n8k8 tiles, D += A B: a lane's fragments of A (rows row0 .., columns kk ..) and B (rows
// kk .., columns col0 ..), from a_of(row, k) and b_of(k, col).  On the GPU the lane holds, with
// g = lane / 4 and u = lane % 4, A[g][u], A[g + 8][u], A[g][u + 4], A[g + 8][u + 4], B[u][g],
// B[u + 4][g], and D[g][2u + j], D[g + 8][2u + j] (d[j], d[2 + j]) for j = 0, 1.  On the host a
// fragment keeps where its tile lies, and q2_mma sums the lane's outputs over k = 0 .. 7.
#ifdef Q2_HOST
struct Q2FragA { int row0, kk; };
struct Q2FragB { int col0, kk; };
template <class Op> inline Q2FragA q2_frag_a(int, int row0, int kk, Op) { return {row0, kk}; }
template <class Op> inline Q2FragB q2_frag_b(int, int col0, int kk, Op) { return {col0, kk}; }
template <class OpA, class OpB>
inline void q2_mma(double (&d)[4], int lane, const Q2FragA& a, const Q2FragB& b, OpA a_of, OpB b_of)
{
    const int lg = lane >> 2, lq = lane & 3;
    for (int x = 0; x < 4; ++x) {
        const int row = a.row0 + lg + 8 * (x >> 1), col = b.col0 + 2 * lq + (x & 1);
        double s = d[x];
        for (int k = 0; k < 8; ++k)
            s += a_of(row, a.kk + k) * b_of(a.kk + k, col);
        d[x] = s;
    }
}
#else
struct Q2FragA { double v[4]; };
struct Q2FragB { double v[2]; };
template <class Op>
__device__ __forceinline__ Q2FragA q2_frag_a(int lane, int row0, int kk, Op a_of)
{
    const int lg = lane >> 2, lq = lane & 3;
    Q2FragA f;
#pragma unroll
    for (int x = 0; x < 4; ++x)
        f.v[x] = a_of(row0 + lg + 8 * (x & 1), kk + lq + 4 * (x >> 1));
    return f;
}
template <class Op>
__device__ __forceinline__ Q2FragB q2_frag_b(int lane, int col0, int kk, Op b_of)
{
    const int lg = lane >> 2, lq = lane & 3;
    Q2FragB f;
#pragma unroll
    for (int x = 0; x < 2; ++x)
        f.v[x] = b_of(kk + lq + 4 * x, col0 + lg);
    return f;
}
template <class OpA, class OpB>
__device__ __forceinline__ void q2_mma(double (&d)[4], int, const Q2FragA& a, const Q2FragB& b, OpA, OpB)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                 : "d"(a.v[0]), "d"(a.v[1]), "d"(a.v[2]), "d"(a.v[3]), "d"(b.v[0]), "d"(b.v[1]));
}
#endif

// V[rho][t] of the block whose R is on chip
Q2_FN double q2_v(const double* R, int rho, int t, int b)
{
    const int d = rho - t;
    return (unsigned)d < (unsigned)b ? R[d * Q2_LDS + t] : 0.0;
}

// A warp's RI x CJ tiles of m16n8k8 (rows row0 + 16 ri, columns col0 + 8 cj): acc += A B over
// kk = k0 .. k1 - 1 in steps of 8 (k1 - k0 rounded up to 8)
template <int RI, int CJ, class OpA, class OpB>
Q2_FN void q2_tiles(double (&acc)[RI][CJ][4], int lane, int row0, int col0, int k0, int k1, OpA a_of, OpB b_of)
{
#pragma unroll 1   // unrolled, q2_group_apply's 128 registers a thread (512 threads) spill
    for (int kk = k0; kk < k1; kk += 8) {
        Q2FragA a[RI];
        Q2FragB bv[CJ];
#pragma unroll
        for (int ri = 0; ri < RI; ++ri)
            a[ri] = q2_frag_a(lane, row0 + 16 * ri, kk, a_of);
#pragma unroll
        for (int cj = 0; cj < CJ; ++cj)
            bv[cj] = q2_frag_b(lane, col0 + 8 * cj, kk, b_of);
#pragma unroll
        for (int ri = 0; ri < RI; ++ri)
#pragma unroll
            for (int cj = 0; cj < CJ; ++cj)
                q2_mma(acc[ri][cj], lane, a[ri], bv[cj], a_of, b_of);
    }
}

// f(row, col, acc[ri][cj][x]) for each output a lane holds of its RI x CJ tiles
template <int RI, int CJ, class F>
Q2_FN void q2_each_output(int lane, int row0, int col0, F f)
{
    const int lg = lane >> 2, lq = lane & 3;
#pragma unroll
    for (int ri = 0; ri < RI; ++ri)
#pragma unroll
        for (int cj = 0; cj < CJ; ++cj)
#pragma unroll
            for (int x = 0; x < 4; ++x)
                f(ri, cj, x, row0 + 16 * ri + lg + 8 * (x >> 1), col0 + 8 * cj + 2 * lq + (x & 1));
}

// group q's block k's R and T into a thread's registers: item i is (row e >> 6, column e & 63)
// for e = th + i Q2_THREADS
Q2_FN void q2_fetch_factors(int th, const double* Q2_RESTRICT Rg, const double* Q2_RESTRICT Tg, int b, int g,
                            double* r, double* t)
{
#pragma unroll
    for (int i = 0; i < Q2_ITEMS; ++i) {
        const int e = th + i * Q2_THREADS, row = e >> 6, col = e & 63;
        r[i] = (row < b && col < g && Rg[b * g + col] != 0.0) ? Rg[row * g + col] : 0.0;
        t[i] = (row < g && col < g) ? Tg[row * g + col] : 0.0;
    }
}

Q2_FN void q2_store_factors(int th, Q2Smem& s, const double* r, const double* t)
{
#pragma unroll
    for (int i = 0; i < Q2_ITEMS; ++i) {
        const int e = th + i * Q2_THREADS, row = e >> 6, col = e & 63;
        s.R[row * Q2_LDS + col] = r[i];
        s.T[row * Q2_LDS + col] = t[i];
    }
}

// q2_group_T's block k: its T, with nt threads
template <class X>
Q2_FN void q2_group_T_block(const X& x, int nt, const double* Q2_RESTRICT flat, const long long* Q2_RESTRICT offsets,
                            int q, int b, int g, double* Q2_RESTRICT T, int k, double* S)
{
    q2_block_T(x, nt, flat + offsets[q] + (long long)k * (b + 1) * g, S, b, g);
    double* Tk = T + (long long)k * g * g;
    x.each([&](int th) {
        for (int e = th; e < g * g; e += nt) {
            const int a = e % g, c = e / g;
            Tk[e] = a <= c ? S[e] : 0.0;
        }
    });
    x.sync();
}

// q2_group_apply's block `blk` (its columns 64 blk ..): x the executor, state(th) thread th's
// Q2Thread
template <class X, class State>
Q2_FN void q2_group_apply_block(const X& x, State state, Q2Smem& s, const double* Q2_RESTRICT flat,
                                const long long* Q2_RESTRICT offsets, const double* Q2_RESTRICT T, int q, int K,
                                int n, int b, int g, double* Q2_RESTRICT Z, long long ldz, int ncols, int blk)
{
    const int c_base = blk * Q2_COLS;
    const int r_first = q * g + 1;
    const double* R0 = flat + offsets[q];

    x.each([&](int th) {    // ring: rows r_first .. r_first + 127; block 0's factors
        for (int e = th; e < Q2_WIN * Q2_COLS; e += Q2_THREADS) {
            const int c = e >> 7, i = e & 127, rho = r_first + i, col = c_base + c;
            s.Z[c * Q2_LDZ + (rho & 127)] = (rho < n && col < ncols) ? Z[(long long)col * ldz + rho] : 0.0;
        }
        Q2Thread& h = state(th);
        q2_fetch_factors(th, R0, T, b, g, h.fr, h.ft);
        q2_store_factors(th, s, h.fr, h.ft);
    });
    x.sync();

    for (int k = 0; k < K; ++k) {
        const int r = r_first + k * b;
        const int valid = min(Q2_WIN, n - r);          // window rows that lie in Z
        const auto v_of = [&](int rho, int t) { return q2_v(s.R, rho, t, b); };
        const auto zw_of = [&](int rho, int c) { return s.Z[c * Q2_LDZ + ((r + rho) & 127)]; };
        const auto w_of = [&](int l, int c) { return s.W[l * Q2_LDS + c]; };
        x.each([&](int th) {
            Q2Thread& h = state(th);
            const int lane = th & 31, wid = th >> 5;
            // the rows that come in after this step, and the next block's factors
#pragma unroll
            for (int i = 0; i < Q2_ITEMS; ++i) {
                const int e = th + i * Q2_THREADS, c = e >> 6, row = e & 63;
                const int rho = r + Q2_WIN + row, col = c_base + c;
                h.fz[i] = (row < b && rho < n && col < ncols) ? Z[(long long)col * ldz + rho] : 0.0;
            }
            if (k + 1 < K)
                q2_fetch_factors(th, R0 + (long long)(k + 1) * (b + 1) * g, T + (long long)(k + 1) * g * g, b, g,
                                 h.fr, h.ft);
            // W = V^T Zw: warp (tw, cw) owns W[tw .. tw + 15][cw .. cw + 15], tw = 16 (wid / 4).
            // The warps of a scheduler (wid mod 4) take the four tw, so that the triangular
            // W2 = T W below (work 4 - wid / 4 tiles) is spread evenly
            const int tw = 16 * (wid >> 2), cw = 16 * (wid & 3);
            if (tw < g) {
                double acc[1][2][4] = {};
                q2_tiles(acc, lane, tw, cw, tw, min(tw + 15 + b, valid), [&](int t, int rho) { return v_of(rho, t); },
                         zw_of);
                q2_each_output<1, 2>(lane, tw, cw, [&](int ri, int cj, int xx, int t, int c) {
                    s.W[t * Q2_LDS + c] = acc[ri][cj][xx];
                });
            }
        });
        x.sync();
        x.each([&](int th) {    // W2 = T W (T upper triangular): the same tiles, l from tw
            Q2Thread& h = state(th);
            const int lane = th & 31, wid = th >> 5;
            const int tw = 16 * (wid >> 2), cw = 16 * (wid & 3);
            q2_each_output<1, 2>(lane, tw, cw, [&](int ri, int cj, int xx, int, int) { h.acc[ri][cj][xx] = 0.0; });
            if (tw < g)
                q2_tiles(h.acc, lane, tw, cw, tw, g, [&](int a, int l) { return s.T[l * Q2_LDS + a]; }, w_of);
        });
        x.sync();
        x.each([&](int th) {    // -W2 into W, once every warp has read W
            Q2Thread& h = state(th);
            const int lane = th & 31, wid = th >> 5;
            const int tw = 16 * (wid >> 2), cw = 16 * (wid & 3);
            if (tw < g)
                q2_each_output<1, 2>(lane, tw, cw, [&](int ri, int cj, int xx, int t, int c) {
                    s.W[t * Q2_LDS + c] = -h.acc[ri][cj][xx];
                });
        });
        x.sync();
        // Zw += V (-W2): warp (p0, cb) owns Zw rows p0 .. p0 + 15, columns cb .. cb + 31.  (W holds
        // -W2, negated once per entry where it is stored rather than in every fragment of V:
        // (-v) w and v (-w) are the same double.)  V's
        // nonzero columns in those rows are max(0, p0 - b + 1) .. min(g, p0 + 16) - 1: at
        // b = g = 64, 16, 32, 48, 64, 64, 48, 32, 16 of them for p0 / 16 = 0 .. 7.  Scheduler s
        // (wid mod 4) takes row tiles {0, 3}, {1, 2}, {4, 7}, {5, 6}, each at both cb: 20 k-steps
        // of 8 apiece
        x.each([&](int th) {
            const int lane = th & 31, wid = th >> 5, sc = wid & 3, m = wid >> 2;
            const int p0 = 16 * (4 * (sc >> 1) + ((sc & 1) ? 1 + (m >> 1) : 3 * (m >> 1))), cb = 32 * (m & 1);
            if (p0 < valid) {
                double acc[1][4][4];
                q2_each_output<1, 4>(lane, p0, cb, [&](int ri, int cj, int xx, int rho, int c) {
                    acc[ri][cj][xx] = zw_of(rho, c);
                });
                const int lo = max(0, p0 - b + 1) & ~7, hi = min(g, p0 + 16);
                q2_tiles(acc, lane, p0, cb, lo, hi, v_of, w_of);
                q2_each_output<1, 4>(lane, p0, cb, [&](int ri, int cj, int xx, int rho, int c) {
                    if (rho < valid)
                        s.Z[c * Q2_LDZ + ((r + rho) & 127)] = acc[ri][cj][xx];
                });
            }
        });
        x.sync();
        x.each([&](int th) {    // rows r .. r + b - 1 back to Z, rows r + 128 .. in; the next factors
            Q2Thread& h = state(th);
#pragma unroll
            for (int i = 0; i < Q2_ITEMS; ++i) {
                const int e = th + i * Q2_THREADS, c = e >> 6, row = e & 63;
                const int rho = r + row, col = c_base + c;
                if (row < b) {
                    double& slot = s.Z[c * Q2_LDZ + (rho & 127)];
                    if (rho < n && col < ncols)
                        Z[(long long)col * ldz + rho] = slot;
                    slot = h.fz[i];
                }
            }
            if (k + 1 < K)
                q2_store_factors(th, s, h.fr, h.ft);
        });
        x.sync();
    }
    const int r_end = r_first + K * b;
    x.each([&](int th) {    // the ring's rows r_K .. r_K + 127 back to Z
        for (int e = th; e < Q2_WIN * Q2_COLS; e += Q2_THREADS) {
            const int c = e >> 7, i = e & 127, rho = r_end + i, col = c_base + c;
            if (rho < n && col < ncols)
                Z[(long long)col * ldz + rho] = s.Z[c * Q2_LDZ + (rho & 127)];
        }
    });
    x.sync();
}

#ifndef Q2_HOST
extern "C" __global__ void q2_group_T(const double* __restrict__ flat, const long long* __restrict__ offsets,
                                      int q, int b, int g, double* __restrict__ T)
{
    extern __shared__ double S[];
    q2_group_T_block(Q2DeviceExec(), (int)blockDim.x, flat, offsets, q, b, g, T, (int)blockIdx.x, S);
}

extern "C" __global__ void __launch_bounds__(Q2_THREADS, 1)
q2_group_apply(const double* __restrict__ flat, const long long* __restrict__ offsets, const double* __restrict__ T,
               int q, int K, int n, int b, int g, double* __restrict__ Z, long long ldz, int ncols)
{
    extern __shared__ __align__(16) unsigned char q2_raw[];
    struct One {        // the thread's own Q2Thread, in registers
        Q2Thread* h;
        __device__ __forceinline__ Q2Thread& operator()(int) const { return *h; }
    };
    Q2Thread h;
    q2_group_apply_block(Q2DeviceExec(), One{&h}, *reinterpret_cast<Q2Smem*>(q2_raw),
                         flat, offsets, T, q, K, n, b, g, Z, ldz, ncols, (int)blockIdx.x);
}
#endif
