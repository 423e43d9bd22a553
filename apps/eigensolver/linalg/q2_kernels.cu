// Q2's kernels for q2_device.py.
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

// A block's tau into S + g g, every thread of the block calling it (S as described above)
__device__ __forceinline__ void q2_block_tau(const double* __restrict__ R, double* S, int b, int g)
{
    double* tau = S + g * g;
    for (int t = threadIdx.x; t < g; t += blockDim.x)
        tau[t] = R[b * g + t];
    __syncthreads();
}

// Then its G (mirrored below the diagonal) and T (on and above it) into S by the recurrence
// above, every thread of the block calling it; S is complete when it returns
__device__ __forceinline__ void q2_block_T(const double* __restrict__ R, double* S, int b, int g)
{
    const double* tau = S + g * g;
    // G[a][c] for a < c: the skewed columns a and c share the rows c .. a + b - 1 (none when
    // c - a >= b), where v_a has entries lag .. b - 1 and v_c entries 0 .. b - 1 - lag
    for (int e = threadIdx.x; e < g * g; e += blockDim.x) {
        const int c = e % g, a = e / g;           // S[c + a g]: below the diagonal when a < c
        if (a < c) {
            const int lag = c - a;
            double s = 0.0;
            if (tau[a] != 0.0 && tau[c] != 0.0)
                for (int r = 0; r < b - lag; ++r)
                    s += R[(r + lag) * g + a] * R[r * g + c];
            S[e] = s;
        }
    }
    __syncthreads();

    for (int c = 0; c < g; ++c) {                 // T's column c from its columns 0 .. c - 1
        for (int a = threadIdx.x; a < c; a += blockDim.x) {
            double s = 0.0;
            for (int l = a; l < c; ++l)           // T[a][l] (zero for l < a) times G[l][c]
                s += S[a + l * g] * S[c + l * g];
            S[a + c * g] = -tau[c] * s;
        }
        if (threadIdx.x == 0)
            S[c + c * g] = tau[c];
        __syncthreads();
    }
}

extern "C" __global__ void q2_level_factors(const double* __restrict__ flat, const long long* __restrict__ offsets,
                                            int q0, int k0, int b, int g, double* __restrict__ V,
                                            double* __restrict__ Y)
{
    extern __shared__ double S[];
    const double* tau = S + g * g;
    const int h = b + g - 1;
    const int q = q0 + (int)blockIdx.x, k = k0 + (int)blockIdx.x;
    const double* R = flat + offsets[q] + (long long)k * (b + 1) * g;
    double* Vi = V + (long long)blockIdx.x * h * g;
    double* Yi = Y + (long long)blockIdx.x * h * g;

    q2_block_tau(R, S, b, g);

    // V, dense and masked: entry (r, a) is v_a's entry r - a
    for (int e = threadIdx.x; e < h * g; e += blockDim.x) {
        const int r = e % h, a = e / h, d = r - a;
        Vi[e] = (d >= 0 && d < b && tau[a] != 0.0) ? R[d * g + a] : 0.0;
    }
    q2_block_T(R, S, b, g);

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

// ---------------------------------------------------------------------------------------------
// Q2 Z group by group, every block of a group applied to Z's rows while they stay on chip.
//
// q2_group_T: group q's blocks' T factors, block k = blockIdx.x, g x g column-major at
// T + k g g (zero below the diagonal), by the recurrence above (q2_block_tau, q2_block_T).
// Launch: grid = K_q, any blockDim (256), (g g + g) doubles of dynamic shared memory.
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
//   W2 = T W            T upper triangular: only l >= a
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
#define Q2_THREADS 256
#define Q2_ITEMS (Q2_PAD * Q2_COLS / Q2_THREADS)   // 64 x 64 items, per thread

struct Q2Smem {
    double Z[Q2_COLS * Q2_LDZ];    // the ring: column c's row rho at c Q2_LDZ + (rho & 127)
    double R[Q2_PAD * Q2_LDS];     // R[d Q2_LDS + t]: entry d of reflector t (0 where tau_t = 0)
    double T[Q2_PAD * Q2_LDS];     // T[l Q2_LDS + a] = T_(a, l)
    double W[Q2_PAD * Q2_LDS];     // W[t Q2_LDS + c], then W2
};

extern "C" __global__ void q2_apply_smem_bytes(long long* out) { *out = (long long)sizeof(Q2Smem); }

__device__ __forceinline__ void q2_mma(double* d, const double* a, const double* b)
{
    // D = A B + D, m16n8k8: with g = lane / 4, u = lane % 4, the lane holds A[g][u], A[g + 8][u],
    // A[g][u + 4], A[g + 8][u + 4] (a[0..3]), B[u][g], B[u + 4][g] (b[0..1]), and D[g][2u + j],
    // D[g + 8][2u + j] (d[j], d[2 + j]) for j = 0, 1
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                 : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
}

// V[rho][t] of the block whose R is on chip
__device__ __forceinline__ double q2_v(const double* R, int rho, int t, int b)
{
    const int d = rho - t;
    return (unsigned)d < (unsigned)b ? R[d * Q2_LDS + t] : 0.0;
}

// A warp's 32 x 16 tile of W (rows t0 .., columns cb ..) as two by two m16n8k8 tiles:
// acc += A[t0 .. t0 + 31][kk] B[kk][cb .. cb + 15] over kk = k0 .. k1 - 1 in steps of 8 (k1 - k0
// rounded up to 8; a(row, kk) and b(kk, col) give the operands' entries), then into W
template <class OpA, class OpB>
__device__ __forceinline__ void q2_tile_w(double (&acc)[2][2][4], int t0, int cb, int k0, int k1, OpA a_of, OpB b_of)
{
    const int lane = threadIdx.x & 31, lg = lane >> 2, lq = lane & 3;
#pragma unroll 2
    for (int kk = k0; kk < k1; kk += 8) {
        double a[2][4], bv[2][2];
#pragma unroll
        for (int ti = 0; ti < 2; ++ti)
#pragma unroll
            for (int x = 0; x < 4; ++x)
                a[ti][x] = a_of(t0 + 16 * ti + lg + 8 * (x & 1), kk + lq + 4 * (x >> 1));
#pragma unroll
        for (int cj = 0; cj < 2; ++cj)
#pragma unroll
            for (int x = 0; x < 2; ++x)
                bv[cj][x] = b_of(kk + lq + 4 * x, cb + 8 * cj + lg);
#pragma unroll
        for (int ti = 0; ti < 2; ++ti)
#pragma unroll
            for (int cj = 0; cj < 2; ++cj)
                q2_mma(acc[ti][cj], a[ti], bv[cj]);
    }
}

__device__ __forceinline__ void q2_put_w(double* W, const double (&acc)[2][2][4], int t0, int cb)
{
    const int lane = threadIdx.x & 31, lg = lane >> 2, lq = lane & 3;
#pragma unroll
    for (int ti = 0; ti < 2; ++ti)
#pragma unroll
        for (int cj = 0; cj < 2; ++cj)
#pragma unroll
            for (int x = 0; x < 4; ++x)
                W[(t0 + 16 * ti + lg + 8 * (x >> 1)) * Q2_LDS + cb + 8 * cj + 2 * lq + (x & 1)] = acc[ti][cj][x];
}

// group q's block k's R and T into registers: item i is (row e >> 6, column e & 63) for
// e = threadIdx.x + i Q2_THREADS
__device__ __forceinline__ void q2_fetch_factors(const double* __restrict__ Rg, const double* __restrict__ Tg,
                                                 int b, int g, double* r, double* t)
{
#pragma unroll
    for (int i = 0; i < Q2_ITEMS; ++i) {
        const int e = threadIdx.x + i * Q2_THREADS, row = e >> 6, col = e & 63;
        r[i] = (row < b && col < g && Rg[b * g + col] != 0.0) ? Rg[row * g + col] : 0.0;
        t[i] = (row < g && col < g) ? Tg[row * g + col] : 0.0;
    }
}

__device__ __forceinline__ void q2_store_factors(Q2Smem& s, const double* r, const double* t)
{
#pragma unroll
    for (int i = 0; i < Q2_ITEMS; ++i) {
        const int e = threadIdx.x + i * Q2_THREADS, row = e >> 6, col = e & 63;
        s.R[row * Q2_LDS + col] = r[i];
        s.T[row * Q2_LDS + col] = t[i];
    }
}

extern "C" __global__ void q2_group_T(const double* __restrict__ flat, const long long* __restrict__ offsets,
                                      int q, int b, int g, double* __restrict__ T)
{
    extern __shared__ double S[];
    const int k = (int)blockIdx.x;
    const double* R = flat + offsets[q] + (long long)k * (b + 1) * g;
    q2_block_tau(R, S, b, g);
    q2_block_T(R, S, b, g);
    double* Tk = T + (long long)k * g * g;
    for (int e = threadIdx.x; e < g * g; e += blockDim.x) {
        const int a = e % g, c = e / g;
        Tk[e] = a <= c ? S[e] : 0.0;
    }
}

extern "C" __global__ void __launch_bounds__(Q2_THREADS, 1)
q2_group_apply(const double* __restrict__ flat, const long long* __restrict__ offsets, const double* __restrict__ T,
               int q, int K, int n, int b, int g, double* __restrict__ Z, long long ldz, int ncols)
{
    extern __shared__ __align__(16) unsigned char q2_raw[];
    Q2Smem& s = *reinterpret_cast<Q2Smem*>(q2_raw);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, lg = lane >> 2, lq = lane & 3;
    const int c_base = (int)blockIdx.x * Q2_COLS;
    const int r_first = q * g + 1;
    const double* R0 = flat + offsets[q];

    // ring: rows r_first .. r_first + 127
    for (int e = threadIdx.x; e < Q2_WIN * Q2_COLS; e += Q2_THREADS) {
        const int c = e >> 7, i = e & 127, rho = r_first + i, col = c_base + c;
        s.Z[c * Q2_LDZ + (rho & 127)] = (rho < n && col < ncols) ? Z[(long long)col * ldz + rho] : 0.0;
    }
    double fr[Q2_ITEMS], ft[Q2_ITEMS], fz[Q2_ITEMS];
    q2_fetch_factors(R0, T, b, g, fr, ft);
    q2_store_factors(s, fr, ft);
    __syncthreads();

    for (int k = 0; k < K; ++k) {
        const int r = r_first + k * b;
        const int valid = min(Q2_WIN, n - r);          // window rows that lie in Z
        // the rows that come in after this step, and the next block's factors
#pragma unroll
        for (int i = 0; i < Q2_ITEMS; ++i) {
            const int e = threadIdx.x + i * Q2_THREADS, c = e >> 6, row = e & 63;
            const int rho = r + Q2_WIN + row, col = c_base + c;
            fz[i] = (row < b && rho < n && col < ncols) ? Z[(long long)col * ldz + rho] : 0.0;
        }
        if (k + 1 < K)
            q2_fetch_factors(R0 + (long long)(k + 1) * (b + 1) * g, T + (long long)(k + 1) * g * g, b, g, fr, ft);

        // W = V^T Zw: warp (t0, cb) owns W[t0 .. t0 + 31][cb .. cb + 15].  Warps w and w + 4 share
        // a scheduler (w mod 4): one of them takes t0 = 0, the other t0 = 32, so that the
        // triangular W2 = T W below (twice the work at t0 = 0) is spread evenly
        const int tw = 32 * ((wid ^ (wid >> 2)) & 1), cw = 16 * (wid >> 1);
        if (tw < g) {
            double acc[2][2][4] = {};
            q2_tile_w(acc, tw, cw, tw, min(tw + 31 + b, valid),
                      [&](int t, int rho) { return q2_v(s.R, rho, t, b); },
                      [&](int rho, int c) { return s.Z[c * Q2_LDZ + ((r + rho) & 127)]; });
            q2_put_w(s.W, acc, tw, cw);
        }
        __syncthreads();
        // W2 = T W (T upper triangular): same tiles, l from t0; into W once every warp has read it
        {
            double acc[2][2][4] = {};
            if (tw < g)
                q2_tile_w(acc, tw, cw, tw, g, [&](int a, int l) { return s.T[l * Q2_LDS + a]; },
                          [&](int l, int c) { return s.W[l * Q2_LDS + c]; });
            __syncthreads();
            if (tw < g)
                q2_put_w(s.W, acc, tw, cw);
        }
        __syncthreads();
        // Zw -= V W2: warp (p0, cb) owns Zw rows p0 .. p0 + 31, columns cb .. cb + 31; V's nonzero
        // columns span 32 there at p0 = 0 and 96, 64 at p0 = 32 and 64: the scheduler's two warps
        // take one of each
        {
            const int p0 = 32 * ((wid & 3) ^ (wid >> 2)), cb = 32 * (wid >> 2);
            if (p0 < valid) {
                double acc[2][4][4];
#pragma unroll
                for (int ri = 0; ri < 2; ++ri)
#pragma unroll
                    for (int cj = 0; cj < 4; ++cj)
#pragma unroll
                        for (int x = 0; x < 4; ++x)
                            acc[ri][cj][x] = s.Z[(cb + 8 * cj + 2 * lq + (x & 1)) * Q2_LDZ
                                                 + ((r + p0 + 16 * ri + lg + 8 * (x >> 1)) & 127)];
                const int lo = max(0, p0 - b + 1) & ~7, hi = min(g, p0 + 32);
#pragma unroll 2
                for (int t = lo; t < hi; t += 8) {
                    double a[2][4], bw[4][2];
#pragma unroll
                    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
                        for (int x = 0; x < 4; ++x)
                            a[ri][x] = -q2_v(s.R, p0 + 16 * ri + lg + 8 * (x & 1), t + lq + 4 * (x >> 1), b);
#pragma unroll
                    for (int cj = 0; cj < 4; ++cj)
#pragma unroll
                        for (int x = 0; x < 2; ++x)
                            bw[cj][x] = s.W[(t + lq + 4 * x) * Q2_LDS + cb + 8 * cj + lg];
#pragma unroll
                    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
                        for (int cj = 0; cj < 4; ++cj)
                            q2_mma(acc[ri][cj], a[ri], bw[cj]);
                }
#pragma unroll
                for (int ri = 0; ri < 2; ++ri)
#pragma unroll
                    for (int x = 0; x < 4; ++x) {
                        const int rho = p0 + 16 * ri + lg + 8 * (x >> 1);
                        if (rho < valid)
#pragma unroll
                            for (int cj = 0; cj < 4; ++cj)
                                s.Z[(cb + 8 * cj + 2 * lq + (x & 1)) * Q2_LDZ + ((r + rho) & 127)] = acc[ri][cj][x];
                    }
            }
        }
        __syncthreads();
        // rows r .. r + b - 1 back to Z, rows r + 128 .. in; the next block's factors on chip
#pragma unroll
        for (int i = 0; i < Q2_ITEMS; ++i) {
            const int e = threadIdx.x + i * Q2_THREADS, c = e >> 6, row = e & 63;
            const int rho = r + row, col = c_base + c;
            if (row < b) {
                double& slot = s.Z[c * Q2_LDZ + (rho & 127)];
                if (rho < n && col < ncols)
                    Z[(long long)col * ldz + rho] = slot;
                slot = fz[i];
            }
        }
        if (k + 1 < K)
            q2_store_factors(s, fr, ft);
        __syncthreads();
    }
    // the ring's rows r_K .. r_K + 127 back to Z
    const int r_end = r_first + K * b;
    for (int e = threadIdx.x; e < Q2_WIN * Q2_COLS; e += Q2_THREADS) {
        const int c = e >> 7, i = e & 127, rho = r_end + i, col = c_base + c;
        if (rho < n && col < ncols)
            Z[(long long)col * ldz + rho] = s.Z[c * Q2_LDZ + (rho & 127)];
    }
}
