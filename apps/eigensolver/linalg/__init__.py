"""The distributed generalized symmetric-definite eigensolver (sygvd) as a library: the phases
over a 1 x P column block-cyclic layout, each in the file a reader of LAPACK / ScaLAPACK looks
for, and a driver that composes them.  It imports nothing of the app around it.

  layout.py        BlockCyclic (the descriptor), distribute / gather, panel_bcast, rows_to_columns
  potrf.py         Cholesky B = L L^T and the back-substitution X = L^-T Y (trsm)
  sygst.py         C = L^-1 A L^-T
  sytrd.py         Householder tridiagonalization (array operations; householder.py: dlarfg)
  sytrd_device.py  its GPU column step: sytrd_step.cu, constants in sytrd_abi.h
  twostage.py      the two-stage tridiagonalization: sy2sb.py (dense -> band, BLAS-3), sb2st.py
                   (band -> tridiagonal by bulge chasing; on GPUs sb2st_device.py + sb2st_kernels.cu),
                   Q2's back-transformation (on GPUs q2_device.py + q2_kernels.cu)
  stedc/           the tridiagonal eigensolver by divide and conquer (dlaed0-dlaed4's steps)
  stein.py         a subset of the tridiagonal eigenpairs: bisection (dstebz), inverse iteration (dstein)
  ormtr.py         back-transformation Q Z by the reflectors
  driver.py        sygvd and GeneralizedSolver (B factored once, many A): the phases in order,
                   timed by the caller's Timer (timer.py)
  _xp.py           NumPy / CuPy helpers and the cuBLAS / cuSOLVER calls CuPy does not make"""
from .driver import PHASES, GeneralizedSolver, NotPositiveDefinite, sygvd
from .layout import BlockCyclic, distribute, gather, numroc
from .timer import NoTimer, Timer

__all__ = ["BlockCyclic", "GeneralizedSolver", "NoTimer", "NotPositiveDefinite", "PHASES", "Timer", "distribute", "gather", "numroc", "sygvd"]
