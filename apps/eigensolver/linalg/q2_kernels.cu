// The compact-WY factors of Q2's blocks for q2_device.py: one launch per level of its schedule.
//
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

    for (int t = threadIdx.x; t < g; t += blockDim.x)
        tau[t] = R[b * g + t];
    __syncthreads();

    // V, dense and masked: entry (r, a) is v_a's entry r - a
    for (int e = threadIdx.x; e < h * g; e += blockDim.x) {
        const int r = e % h, a = e / h, d = r - a;
        Vi[e] = (d >= 0 && d < b && tau[a] != 0.0) ? R[d * g + a] : 0.0;
    }
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
