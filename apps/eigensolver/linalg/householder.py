"""The Householder reflector of one column (LAPACK dlarfg) and latrd's correction of W's
column, the tridiagonalization's small fused steps.

On the GPU each is one CuPy ElementwiseKernel (one launch instead of ~10 for the scalar
chain); on the host the same arithmetic in NumPy, in the same order.  HH_SCALARS_BODY is plain
C so tests/unit/test_eigensolver_gpu_code.py can compile it with NVRTC without a GPU."""
from __future__ import annotations

from ._xp import is_device

HH_SCALARS_BODY = """
    double xnorm = sqrt(xn2);
    bool flat = xnorm == 0.0;
    double b = flat ? alpha : -copysign(hypot(alpha, xnorm), alpha);
    tau = flat ? 0.0 : (b - alpha) / b;
    scale = flat ? 0.0 : 1.0 / (alpha - b);
    beta = b;
    dout = din;
    one = 1.0;
"""
W_UPDATE_BODY = "out = w + ((-0.5 * t) * dot) * v;"

_kernels: dict = {}


def _ew(name: str):
    k = _kernels.get(name)
    if k is None:
        import cupy

        if name == "hh":
            k = cupy.ElementwiseKernel(
                "float64 alpha, float64 xn2, float64 din",
                "float64 tau, float64 beta, float64 scale, float64 dout, float64 one",
                HH_SCALARS_BODY, "hpccoll_eig_hh_scalars")
        else:
            k = cupy.ElementwiseKernel("float64 w, float64 t, float64 dot, float64 v", "float64 out",
                                       W_UPDATE_BODY, "hpccoll_eig_w_update")
        _kernels[name] = k
    return k


def householder(xp, col, buf, scale) -> None:
    """LAPACK dlarfg on col[1:] (col = [d_j, alpha, x...], length m + 1 >= 2), packed into the
    broadcast buffer buf = [v (m), d_j, tau, beta]: v[0] = 1, v[1:] = x * scale.  Scalars stay
    on the device (no host sync).  `scale` is a 1-element scratch array."""
    m = col.size - 1
    x = col[2:]
    xn2 = x @ x if m > 1 else xp.zeros((), dtype=col.dtype)   # numpy norm = sqrt(x . x)
    if is_device(xp):
        _ew("hh")(col[1], xn2, col[0], buf[m + 1:m + 2], buf[m + 2:m + 3], scale, buf[m:m + 1], buf[0:1])
    else:  # the same arithmetic, one array op at a time
        alpha = col[1]
        xnorm = xp.sqrt(xn2)
        flat = xnorm == 0
        beta = xp.where(flat, alpha, -xp.copysign(xp.hypot(alpha, xnorm), alpha))
        buf[m + 1] = xp.where(flat, 0.0, (beta - alpha) / xp.where(flat, 1.0, beta))
        buf[m + 2] = beta
        scale[0] = xp.where(flat, 0.0, 1.0 / xp.where(flat, 1.0, alpha - beta))
        buf[m] = col[0]
        buf[0] = 1.0
    if m > 1:
        xp.multiply(x, scale[0], out=buf[1:m])


def w_update(xp, w, t, v, out) -> None:
    """out = w + (-0.5 t (w . v)) v  (LAPACK latrd's w correction), one fused kernel on the GPU."""
    dot = w @ v
    if is_device(xp):
        _ew("w")(w, t, dot, v, out)
    else:
        out[...] = w + ((-0.5 * t) * dot) * v
