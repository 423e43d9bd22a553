// The band reduction's panel on one GPU (sy2sb_device.py): the Householder QR of the m x b panel
// below the band (LAPACK dgeqr2's reflectors, dlarfg's scalars) and the block reflector's T
// (I - V T V^T = H_0 H_1 ... H_{b-1}), in ONE cooperative launch instead of cuSOLVER's geqrf
// (a few kernels per column) and the dozen small launches of T.
//
// The grid's G blocks split the panel's rows: block c holds rows [c R, c R + R) of all b columns
// in shared memory (R = ceil(m / G)) from the first load to the final store.  Per column j:
//   A  every block: its partial sum of squares of column j below row j -> part_n[c]; the block
//      holding row j puts alpha = A[j][j] in aux[0]                                  grid sync
//   B  every block: xnorm^2 = sum over c of part_n[c] (the same order, so the same bits, in every
//      block), dlarfg's beta, tau, 1 / (alpha - beta); its rows of v_j scaled; its partial
//      w_k = sum_i v_i A[i][k] for k > j -> part_w[c][k]                              grid sync
//   C  every block: w_k = sum over c of part_w[c][k]; its rows A[i][k] += v_i (-tau w_k)
// (tau = 0, xnorm = 0 in every block alike: B's products and the second sync are skipped).
// Then the Gram matrix G = V^T V: each block its rows' part -> part_g[c] (sync), each block the
// total of a slice of G's entries -> gram (sync), and block 0 T by dlarft's forward recurrence
//   T[c][c] = tau_c,   T[0:c, c] = -tau_c T[0:c, 0:c] G[0:c, c]
// (a reflector with tau = 0 gets a zero row and column of T: it drops out, as
// sy2sb.block_reflector's masking does).  Outputs: the panel itself (R on and above the diagonal,
// v below, as geqrf), tau, V dense (m x b column-major: zero above the diagonal, 1 on it) and T
// (b x b column-major, zero below the diagonal).
//
// Every sum runs in a fixed order (a thread's rows ascending, then a warp's shfl_down tree, then
// the warps or the blocks in index order): the same bits on every run.  The grid barrier needs
// every block resident at once: the launch is cooperative (cuLaunchCooperativeKernel refuses a
// grid that does not fit).

#define SY2SB_THREADS 256
#define SY2SB_WARPS (SY2SB_THREADS / 32)
#define SY2SB_BMAX 64

typedef long long i64;

// The doubles of shared memory before the small arrays: the block's R x b rows, and at least
// T's and G's 2 b b for block 0's last phase
__host__ __device__ __forceinline__ int sy2sb_panel_doubles(int R, int b)
{
    return R * b > 2 * b * b ? R * b : 2 * b * b;
}

// Dynamic shared memory of a launch (bytes), and the work array's doubles for G blocks
__host__ __device__ __forceinline__ long long sy2sb_panel_smem(int R, int b)
{
    return 8LL * (sy2sb_panel_doubles(R, b) + SY2SB_WARPS + 2 * SY2SB_BMAX);
}
__host__ __device__ __forceinline__ long long sy2sb_panel_work(int G, int b)
{
    return 2LL * G + 2 + (long long)G * b + (long long)G * b * b + (long long)b * b;
}

// Grid barrier (cooperative groups' algorithm): block 0 adds 2^31 - (G - 1), the others 1, so
// the counter's top bit flips once all G have arrived and its low bits are as before (no reset
// between barriers or launches).  The fence before the add publishes the block's global writes;
// the acquiring load orders the reads after it.
__device__ __forceinline__ unsigned sy2sb_load_acquire(const unsigned* p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void sy2sb_grid_sync(unsigned* bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned inc = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        __threadfence();
        const unsigned old = atomicAdd(bar, inc);
        while (((old ^ sy2sb_load_acquire(bar)) & 0x80000000u) == 0) {
        }
    }
    __syncthreads();
}

// A warp's sum of v over its lanes by a shfl_down tree, every lane getting lane 0's total
__device__ __forceinline__ double sy2sb_warp_sum(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

// The block's sum of each thread's v, the same value in every thread (red: SY2SB_WARPS doubles)
__device__ __forceinline__ double sy2sb_block_sum(double v, double* red)
{
    v = sy2sb_warp_sum(v);
    __syncthreads();                   // red's previous use is over
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
#pragma unroll
    for (int w = 0; w < SY2SB_WARPS; ++w)
        s += red[w];
    return s;
}

// sum over blocks c < G of p[c * stride], by one warp (lane l: c = l, l + 32, ... in order, then
// the tree), in every lane; read through L2 (other blocks wrote p in this launch)
__device__ __forceinline__ double sy2sb_grid_total(const double* p, int G, int stride)
{
    double s = 0.0;
    for (int c = (int)(threadIdx.x & 31); c < G; c += 32)
        s += __ldcg(p + (i64)c * stride);
    return sy2sb_warp_sum(s);
}

extern "C" __global__ void __launch_bounds__(SY2SB_THREADS, 1)
sy2sb_panel(double* __restrict__ A, i64 lda, int m, int b, double* __restrict__ tau, double* __restrict__ V,
            double* __restrict__ T, double* __restrict__ work, unsigned* __restrict__ bar)
{
    extern __shared__ double smem[];
    const int G = (int)gridDim.x, blk = (int)blockIdx.x, th = (int)threadIdx.x;
    const int lane = th & 31, wid = th >> 5;
    const int R = (m + G - 1) / G;
    const int r0 = min(m, blk * R), r1 = min(m, r0 + R), rows = r1 - r0;
    double* As = smem;                          // R x b, column-major (ld R): rows r0 .. r1 - 1
    double* red = As + sy2sb_panel_doubles(R, b);   // SY2SB_WARPS
    double* ws = red + SY2SB_WARPS;             // b: -tau w
    double* taus = ws + SY2SB_BMAX;             // b
    // part_n and aux twice, by the parity of j: with tau_j = 0 a block goes on to column j + 1
    // without a second barrier while another may still read column j's
    double* part_n = work;                      // 2 x G
    double* aux = part_n + 2 * G;               // 2 (alpha)
    double* part_w = aux + 2;                   // G x b
    double* part_g = part_w + (i64)G * b;       // G x b b
    double* gram = part_g + (i64)G * b * b;     // b b
    const int kmax = min(m, b);

    for (int e = th; e < rows * b; e += SY2SB_THREADS) {
        const int i = e % rows, k = e / rows;
        As[i + (i64)k * R] = A[(i64)k * lda + r0 + i];
    }
    for (int k = th; k < b; k += SY2SB_THREADS)
        taus[k] = 0.0;
    __syncthreads();

    for (int j = 0; j < kmax; ++j) {
        // A: the partial sum of squares of column j below row j, and alpha
        {
            double s = 0.0;
            for (int i = max(j + 1, r0) + th; i < r1; i += SY2SB_THREADS) {
                const double x = As[(i - r0) + (i64)j * R];
                s += x * x;
            }
            s = sy2sb_block_sum(s, red);
            if (th == 0)
                part_n[(j & 1) * G + blk] = s;
            if (th == 0 && r0 <= j && j < r1)
                aux[j & 1] = As[(j - r0) + (i64)j * R];
        }
        sy2sb_grid_sync(bar);
        // B: dlarfg's scalars in every block alike
        const double xn2 = sy2sb_grid_total(part_n + (j & 1) * G, G, 1);
        const double alpha = __ldcg(aux + (j & 1));
        double t = 0.0, beta = alpha, scal = 0.0;
        if (xn2 != 0.0) {
            beta = -copysign(sqrt(alpha * alpha + xn2), alpha);
            t = (beta - alpha) / beta;
            scal = 1.0 / (alpha - beta);
        }
        if (th == 0)
            taus[j] = t;
        if (t == 0.0)                            // H_j = I: nothing changes (every block skips)
            continue;
        for (int i = max(j + 1, r0) + th; i < r1; i += SY2SB_THREADS)
            As[(i - r0) + (i64)j * R] *= scal;
        __syncthreads();
        // w_k's partial for k > j: warp wid takes k = j + 1 + wid, + SY2SB_WARPS, ...; v_j = 1
        for (int k = j + 1 + wid; k < b; k += SY2SB_WARPS) {
            double s = 0.0;
            for (int i = max(j, r0) + lane; i < r1; i += 32) {
                const double v = i == j ? 1.0 : As[(i - r0) + (i64)j * R];
                s += v * As[(i - r0) + (i64)k * R];
            }
            s = sy2sb_warp_sum(s);
            if (lane == 0)
                part_w[(i64)blk * b + k] = s;
        }
        sy2sb_grid_sync(bar);
        // C: -tau w_k, then the block's rows of the trailing columns (dlarf: A += v (-tau w)^T)
        for (int k = j + 1 + wid; k < b; k += SY2SB_WARPS) {
            const double w = sy2sb_grid_total(part_w + k, G, b);
            if (lane == 0)
                ws[k] = -t * w;
        }
        if (th == 0 && r0 <= j && j < r1)
            As[(j - r0) + (i64)j * R] = beta;    // R's diagonal entry (v_j = 1 is implied)
        __syncthreads();
        const int i0 = max(j, r0) - r0, nr = r1 - r0 - i0;
        for (int e = th; nr > 0 && e < nr * (b - j - 1); e += SY2SB_THREADS) {
            const int li = i0 + e % nr, k = j + 1 + e / nr;
            const double v = li + r0 == j ? 1.0 : As[li + (i64)j * R];
            As[li + (i64)k * R] += v * ws[k];
        }
        __syncthreads();
    }
    // the panel back (R above, v below), V dense
    for (int e = th; e < rows * b; e += SY2SB_THREADS) {
        const int li = e % rows, k = e / rows, i = r0 + li;
        const double a = As[li + (i64)k * R];
        A[(i64)k * lda + i] = a;
        V[(i64)k * m + i] = i < k ? 0.0 : (i == k ? 1.0 : a);
    }
    // the Gram matrix's partial of the block's rows: entry (a, c), a < c, at a + c b
    for (int e = th; e < b * b; e += SY2SB_THREADS) {
        const int a = e % b, c = e / b;
        double s = 0.0;
        if (a < c)
            for (int i = max(c, r0); i < r1; ++i) {          // v_a and v_c both nonzero from row c
                const double va = As[(i - r0) + (i64)a * R];
                const double vc = i == c ? 1.0 : As[(i - r0) + (i64)c * R];
                s += va * vc;
            }
        part_g[(i64)blk * b * b + e] = s;
    }
    sy2sb_grid_sync(bar);
    // each block the total of entries blk, blk + G, ..., one warp an entry at a time
    for (int e = blk + G * wid; e < b * b; e += G * SY2SB_WARPS) {
        const double s = sy2sb_grid_total(part_g + e, G, b * b);
        if (lane == 0)
            gram[e] = s;
    }
    sy2sb_grid_sync(bar);
    if (blk != 0)
        return;
    // block 0: T by the recurrence, in shared memory (T and G, b x b column-major each, over As:
    // sy2sb_panel_doubles leaves room for both)
    double* Ts = As;
    double* Gs = As + b * b;
    for (int e = th; e < b * b; e += SY2SB_THREADS) {
        Gs[e] = __ldcg(gram + e);
        Ts[e] = 0.0;
    }
    __syncthreads();
    for (int c = 0; c < b; ++c) {
        const double tc = taus[c];
        for (int a = th; a < c; a += SY2SB_THREADS) {
            double s = 0.0;
            for (int l = a; l < c; ++l)          // T[a][l] (zero for l < a) times G[l][c]
                s += Ts[a + l * b] * Gs[l + c * b];
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
