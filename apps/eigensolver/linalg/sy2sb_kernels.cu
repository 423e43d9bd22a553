// The band reduction's panel on one GPU (sy2sb_device.py): the Householder QR of the m x b panel
// below the band (LAPACK dgeqr2's reflectors, dlarfg's scalars) and the block reflector's T
// (I - V T V^T = H_0 H_1 ... H_{b-1}), in ONE cooperative launch instead of cuSOLVER's geqrf
// (a few kernels per column) and the dozen small launches of T.
//
// The grid's G blocks split the panel's rows: block c holds rows [c R, c R + R) of all b columns
// in shared memory (R = ceil(m / G)) from the first load to the final store.  Column j's step
// needs, of x = A[j+1:, j] (the column below the diagonal) and every column k, the products
//   s_k = x^T A[j+1:, k]:   s_j = |x|^2 (dlarfg's xnorm^2); for k > j, w_k = A[j][k] + s_k / (alpha - beta)
//   (v^T A[:, k], v = [1; x / (alpha - beta)]); for a < j, G[a][j] = A[j][a] + s_a / (alpha - beta)
//   (v_a^T v_j: column a holds v_a below its diagonal)
// and row j, A[j][k] for every k (alpha = A[j][j]).  So ONE grid barrier per column:
//   each block: its rows' partial s_k for every k -> part[c][k]; the block holding row j: row j
//                                                                                  grid sync
//   each block: s_k = sum over c of part[c][k] (the same order, so the same bits, in every block);
//   dlarfg's beta, tau = (beta - alpha) / beta, 1 / (alpha - beta); its rows of v_j scaled; its
//   rows of the trailing columns, A[i][k] += v_i (-tau w_k) (dlarf); then column j + 1's partials.
// (xnorm = 0: tau = 0, nothing changes, H_j = I.)  part and row j are kept twice, by the parity of
// j: a block writes column j + 1's while another may still read column j's.  Block 0 keeps the
// Gram matrix's columns and forms T at the end by dlarft's forward recurrence
//   T[c][c] = tau_c,   T[0:c, c] = -tau_c T[0:c, 0:c] G[0:c, c]
// (a reflector with tau = 0 gets a zero row and column of T: it drops out, as
// sy2sb.block_reflector's masking does).  Outputs: the panel itself (R on and above the diagonal,
// v below, as geqrf), tau, V dense (m x b column-major: zero above the diagonal, 1 on it) and T
// (b x b column-major, zero below the diagonal).
//
// Every sum runs in a fixed order (a thread's rows ascending, then the four threads of an entry
// in index order; the blocks' partials likewise): the same bits on every run.  The grid barrier
// needs every block resident at once: the launch is cooperative (cuLaunchCooperativeKernel
// refuses a grid that does not fit).

#define SY2SB_THREADS 256
#define SY2SB_BMAX 64
#define SY2SB_QUARTERS (SY2SB_THREADS / SY2SB_BMAX)   // threads per entry of a reduction

typedef long long i64;

#ifdef SY2SB_SIZES_ONLY   // the sizes below on the host alone (tests/unit: they are sy2sb_device.py's)
#define __host__
#define __device__
#define __forceinline__ inline
#endif

// The leading dimension of a block's rows in shared memory: R, odd (a warp reading one row of
// consecutive columns then meets each bank at most twice, the least for doubles)
__host__ __device__ __forceinline__ int sy2sb_panel_ld(int R)
{
    return R | 1;
}

// Dynamic shared memory of a launch (bytes): the rows (room for T at the end too), G's columns,
// the reductions' and the step's small arrays
__host__ __device__ __forceinline__ long long sy2sb_panel_smem(int R, int b)
{
    const long long rows = (long long)sy2sb_panel_ld(R) * b;
    return 8LL * ((rows > b * b ? rows : b * b) + SY2SB_BMAX * SY2SB_BMAX + SY2SB_THREADS + 4 * SY2SB_BMAX);
}

// The work array's doubles for G blocks: part and row j, twice each
__host__ __device__ __forceinline__ long long sy2sb_panel_work(int G)
{
    return 2LL * (G + 1) * SY2SB_BMAX;
}

#ifndef SY2SB_SIZES_ONLY
// Grid barrier (cooperative groups' algorithm): block 0 adds 2^31 - (G - 1), the others 1, so
// the counter's top bit flips once all G have arrived and its low bits are as before (no reset
// between barriers or launches).  The releasing add publishes the block's writes (ordered before
// it by __syncthreads), the acquiring load orders the block's later reads after the others'.
__device__ __forceinline__ void sy2sb_grid_sync(unsigned* bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned inc = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        unsigned old, now;
        asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(bar), "r"(inc) : "memory");
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(bar) : "memory");
        } while (((old ^ now) & 0x80000000u) == 0);
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(SY2SB_THREADS, 1)
sy2sb_panel(double* __restrict__ A, i64 lda, int m, int b, double* __restrict__ tau, double* __restrict__ V,
            double* __restrict__ T, double* __restrict__ work, unsigned* __restrict__ bar)
{
    extern __shared__ double smem[];
    const int G = (int)gridDim.x, blk = (int)blockIdx.x, th = (int)threadIdx.x;
    const int R = (m + G - 1) / G, ld = sy2sb_panel_ld(R);
    const int r0 = min(m, blk * R), r1 = min(m, r0 + R), rows = r1 - r0;
    const int kq = th % SY2SB_BMAX, qq = th / SY2SB_BMAX;     // a reduction's entry and quarter
    const i64 rows_dbl = (i64)ld * b;
    double* As = smem;                                  // rows r0 .. r1 - 1, column-major (ld)
    double* Gs = As + (rows_dbl > b * b ? rows_dbl : b * b);  // block 0: G[a][c] at a + c BMAX
    double* red = Gs + SY2SB_BMAX * SY2SB_BMAX;         // SY2SB_THREADS: the quarters' sums
    double* tot = red + SY2SB_THREADS;                  // BMAX: s_k
    double* ws = tot + SY2SB_BMAX;                      // BMAX: -tau w_k
    double* taus = ws + SY2SB_BMAX;                     // BMAX
    double* rowv = taus + SY2SB_BMAX;                   // BMAX: row j
    const int kmax = min(m, b);

    for (int e = th; e < rows * b; e += SY2SB_THREADS) {
        const int i = e % rows, k = e / rows;
        As[i + (i64)k * ld] = A[(i64)k * lda + r0 + i];
    }
    for (int k = th; k < SY2SB_BMAX; k += SY2SB_THREADS)
        taus[k] = 0.0;
    __syncthreads();

    // entry th's (th < BMAX) sum of its SY2SB_QUARTERS threads' values in red, in index order
    const auto quarters = [&]() {
        double t = red[th];
#pragma unroll
        for (int q = 1; q < SY2SB_QUARTERS; ++q)
            t += red[th + q * SY2SB_BMAX];
        return t;
    };

    // column jj's partials s_k (this block's rows below row jj) and, from the block holding it, row jj
    const auto partials = [&](int jj) {
        double* part = work + (i64)(jj & 1) * (G + 1) * SY2SB_BMAX;
        double s = 0.0;
        if (kq < b)
            for (int li = max(jj + 1 - r0, 0) + qq; li < rows; li += SY2SB_QUARTERS)
                s += As[li + (i64)jj * ld] * As[li + (i64)kq * ld];
        red[th] = s;
        __syncthreads();
        if (th < SY2SB_BMAX) {
            part[(i64)blk * SY2SB_BMAX + th] = quarters();
            if (r0 <= jj && jj < r1 && th < b)
                part[(i64)G * SY2SB_BMAX + th] = As[(jj - r0) + (i64)th * ld];
        }
    };

    if (kmax > 0)
        partials(0);
    for (int j = 0; j < kmax; ++j) {
        sy2sb_grid_sync(bar);
        const double* part = work + (i64)(j & 1) * (G + 1) * SY2SB_BMAX;
        {
            const double* rowj = part + (i64)G * SY2SB_BMAX;
            if (qq == 0 && kq < b)                     // row j, read beside the partials
                rowv[kq] = __ldcg(rowj + kq);
            double s = 0.0;
#pragma unroll 4
            for (int c = qq; c < G; c += SY2SB_QUARTERS)
                s += __ldcg(part + (i64)c * SY2SB_BMAX + kq);
            red[th] = s;
        }
        __syncthreads();
        if (th < SY2SB_BMAX)
            tot[th] = quarters();
        __syncthreads();
        const double alpha = rowv[j], xn2 = tot[j];
        double t = 0.0, beta = alpha, scal = 0.0;
        if (xn2 != 0.0) {                  // dlarfg (the matrix is scaled: no over- or underflow)
            beta = -copysign(sqrt(alpha * alpha + xn2), alpha);
            t = (beta - alpha) / beta;
            scal = 1.0 / (alpha - beta);
        }
        if (t != 0.0) {
            if (th < b) {
                const double vA = rowv[th] + scal * tot[th];    // v_j^T A[:, th] or G[th][j]
                if (th > j)
                    ws[th] = -t * vA;
                else if (th < j && blk == 0)
                    Gs[th + j * SY2SB_BMAX] = vA;
            }
            for (int li = max(j + 1 - r0, 0) + th; li < rows; li += SY2SB_THREADS)
                As[li + (i64)j * ld] *= scal;
            if (th == 0)
                taus[j] = t;
            __syncthreads();
            if (th == 0 && r0 <= j && j < r1)
                As[(j - r0) + (i64)j * ld] = beta;    // R's diagonal entry (v_j = 1 is implied)
            const int i0 = max(j - r0, 0), nr = rows - i0;
            for (int e = th; nr > 0 && e < nr * (b - j - 1); e += SY2SB_THREADS) {
                const int li = i0 + e % nr, k = j + 1 + e / nr;
                const double v = li + r0 == j ? 1.0 : As[li + (i64)j * ld];
                As[li + (i64)k * ld] += v * ws[k];
            }
            __syncthreads();
        }
        if (j + 1 < kmax)
            partials(j + 1);
    }

    // the panel back (R above, v below) and V dense
    for (int e = th; e < rows * b; e += SY2SB_THREADS) {
        const int li = e % rows, k = e / rows, i = r0 + li;
        const double a = As[li + (i64)k * ld];
        A[(i64)k * lda + i] = a;
        V[(i64)k * m + i] = i < k ? 0.0 : (i == k ? 1.0 : a);
    }
    if (blk != 0)
        return;
    // block 0: T by the recurrence over As (written out above), b x b column-major
    __syncthreads();
    double* Ts = As;
    for (int e = th; e < b * b; e += SY2SB_THREADS)
        Ts[e] = 0.0;
    __syncthreads();
    for (int c = 0; c < b; ++c) {
        const double tc = taus[c];
        for (int a = th; a < c; a += SY2SB_THREADS) {
            double s = 0.0;
            for (int l = a; l < c; ++l)          // T[a][l] (zero for l < a) times G[l][c]
                s += Ts[a + l * b] * Gs[l + c * SY2SB_BMAX];
            Ts[a + c * b] = -tc * s;
        }
        if (th == 0)
            Ts[c + c * b] = tc;
        __syncthreads();
    }
    for (int e = th; e < b * b; e += SY2SB_THREADS)
        T[e] = Ts[e];
    for (int k = th; k < b; k += SY2SB_THREADS)
        tau[k] = taus[k];
}
#endif  // SY2SB_SIZES_ONLY
