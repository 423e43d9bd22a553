"""Householder tridiagonalization on the GPU with the column step as device kernels
(sytrd_step.cu), replayed as one CUDA graph per panel.

Why: the CuPy-op version of the column step (sytrd.sytrd_ops) issues ~20 Python-dispatched
operations per column, hundreds of microseconds of Python per column, while its two collectives
take about ten (docs/eigensolver.md).  Here the
column index lives in device memory (st[0]) and every launch has the same shape for every
column, so one captured graph of nb steps serves every full panel of the same owner:

    [owner] sytrd_col  ->  Bcast(bb, root=owner)  ->  sytrd_symv  ->  Allreduce(y, cv)  ->
    sytrd_w (advances st)

Both collectives have fixed sizes (n + 4 and n doubles), so they are captured once too.
Communicators that cannot run under stream capture (the host backend) run the same kernels
and collectives eagerly ("eager").

"fused" (auto's choice on hpccoll's deterministic sentinel communicator): no collective
launches at all.  sytrd_col stores the owner's column straight into every rank's symmetric
workspace and sytrd_symv its final sums, with hpccoll's sentinel protocol per element
(FusedWorkspace; sytrd_step.cu explains the buffers and why the double buffering is the
credit); the readers poll.  Three graph nodes per column instead of five, the same bits as
the sentinel Allreduce.  The math is sytrd_twin's, which the CPU tests check
against sytrd.sytrd_ops; every reduction runs in a fixed order, so the result is bitwise
reproducible on a deterministic communicator.

C v comes from the lower triangle of the local columns only (sytrd_symv: each stored element
read once), so C may hold anything above its diagonal.  When a panel is done its owner stores
the panel's reflectors in the panel's columns of C (sytrd.py's convention).

One rank runs the same kernels without either transfer (the Bcast is the identity, and sytrd_w
reads the rank's own product as the Allreduce's sum), and each kernel's grid-wide sums are
finished by the next kernel instead of a last block: sytrd_symv's blocks compute the column's
dlarfg scalars, sytrd_w adds the product's partial sums, the next sytrd_col's blocks W's
correction (`defer` in sytrd_step.cu).

The mode (sygvd's sytrd=): "auto" (fused on the sentinel communicator of several ranks up to
FUSED_MAX_N, graph on the other device communicators and on one rank, eager on the host),
"fused", "graph", "eager", or "ops" (the CuPy-op column step)."""
from __future__ import annotations

import re
import weakref
from pathlib import Path

import numpy as np

from ._xp import kept_streams, raw_module
from .householder import householder
from .layout import BlockCyclic
from .potrf import UPDATE_COLS, lower_update

MODES = ("auto", "fused", "graph", "eager", "ops")
ABI_HEADER = "sytrd_abi.h"  # the constants sytrd_step.cu shares with this module, its one source
_DEFINE = re.compile(r"^\s*#define\s+(\w+)\s+([\w\s()+\-*/]+?)\s*(?://.*)?$")


def read_abi(text: str) -> dict[str, int]:
    """The integer #defines of a header written as sytrd_abi.h (literals, and expressions of
    earlier names with + - * / and parentheses; / is C's integer division of positive values)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _DEFINE.match(line)
        if m:
            expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda w: str(out[w.group(0)]), m.group(2))
            out[m.group(1)] = int(eval(expr.replace("/", "//"), {"__builtins__": {}}))  # noqa: S307 - digits and operators only
    return out


ABI = read_abi((Path(__file__).resolve().parent / ABI_HEADER).read_text())
TPB = ABI["TPB"]            # threads per block: a tile of 32 rows
SY_R = ABI["SY_R"]          # sytrd_symv's rows per tile
SY_C = ABI["SY_C"]          # sytrd_symv's local columns per chunk
SY_MAXCH = ABI["SY_MAXCH"]  # sytrd_symv's chunks per column at most (its persistent work list)


def fusable(comm) -> str | None:
    """Why the fused transfers cannot serve `comm` (None: they can): they need hpccoll's CUDA
    backend (its symmetric workspace and peer mappings) and one rank per GPU."""
    inner = getattr(comm, "uncounted", comm)
    if getattr(inner, "backend", None) != "cuda":
        return f"backend {getattr(inner, 'backend', None)!r} is not hpccoll's cuda backend"
    import hpccoll.ext

    shared = hpccoll.ext.ranks_per_gpu(inner)
    if shared > 1:
        # a product kernel's hundreds of polling blocks could fill the GPU and starve the
        # owner's sytrd_col of another rank on it (the collectives cap their grids instead)
        return f"{shared} ranks share a GPU"
    return None


# hpccoll's algorithms (Communicator.algorithm, docs/api.md) whose Allreduce is the sentinel
# protocol's rank-order sum: the expression sytrd_w evaluates over the fused transfers.
SENTINEL_ALGORITHMS = ("oneshot_sentinel", "twoshot_sentinel", "sentinel")

# auto takes the fused transfers up to this n and the graphed collectives above it: the largest
# n at which the fused transfers are known to be the faster of the two.
FUSED_MAX_N = 8192


def mode_for(comm, n: int | None = None, want: str = "auto") -> str:
    """'fused', 'graph', 'eager' or 'ops' for this communicator, order n and wish `want`
    (one of MODES).

    auto: fused on hpccoll's deterministic sentinel communicator (the same bits as its
    Allreduce) up to FUSED_MAX_N, graph on the other device communicators and above it (the LL
    and LL128 paths keep their own collectives: LL128's atomics are what the report
    measures) and on one rank (which needs no transfers at all), eager on the host."""
    if want not in MODES:
        raise ValueError(f"sygvd: sytrd={want!r}: use {', '.join(map(repr, MODES))}")
    inner = getattr(comm, "uncounted", comm)
    backend = getattr(inner, "backend", None)
    if want == "fused":
        why = fusable(comm)
        if why:
            raise ValueError(f"sygvd: sytrd='fused': {why}; use 'auto' or 'graph'")
        return "fused"
    if want == "graph" and backend not in ("cuda", "nccl"):
        return "eager"
    if want == "auto":
        sentinel = bool(getattr(inner, "deterministic", False)) and getattr(inner, "algorithm", None) in SENTINEL_ALGORITHMS
        alone = getattr(inner, "size", 2) == 1
        if sentinel and not alone and fusable(comm) is None and (n is None or n <= FUSED_MAX_N):
            return "fused"
        return "graph" if backend in ("cuda", "nccl") else "eager"
    return want


class FusedWorkspace:
    """The fused transfers' symmetric memory (sytrd_step.cu's Fused), on hpccoll's extension API:
    a SymmetricMemory (its own control region with the abort flag and error record, peers mapped
    over CUDA IPC) holding bbR[2][n + 4] and yR[2][nranks][2n], every word armed with the
    sentinel; and the kernels' Fused struct (struct Args, then the two offsets) in device memory.
    One per (communicator, n), kept: opening it exchanges IPC handles."""

    def __init__(self, comm, n: int):
        import cupy as cp
        import hpccoll.ext

        inner = getattr(comm, "uncounted", comm)
        self.n, self.nranks = n, inner.size
        align = lambda b: -(-b // 256) * 256  # noqa: E731
        bb, y = 0, align(2 * (n + 4) * 8)
        self.sym = hpccoll.ext.SymmetricMemory(inner, y + align(2 * self.nranks * 2 * n * 8))
        self.bb_off, self.y_off = self.sym.data_offset + bb, self.sym.data_offset + y
        self.sym.arm(protocol="sentinel")  # collective: every rank's words armed before anyone writes
        raw = self.sym.kernel_args().tobytes() + np.array([self.bb_off, self.y_off], dtype=np.int64).tobytes()
        self.struct = cp.asarray(np.frombuffer(raw, dtype=np.uint8))

    def check(self) -> None:
        """Raise CollectiveTimeout where a poll of the last use timed out (after a sync)."""
        self.sym.check()

    def free(self) -> None:
        self.sym.free()


_KEPT = weakref.WeakKeyDictionary()  # communicator -> {n: FusedWorkspace}


def _kept(comm) -> dict:
    """n -> FusedWorkspace of this communicator (they go together: dropped with it)."""
    return _KEPT.setdefault(getattr(comm, "uncounted", comm), {})


def fused_workspace(comm, n: int) -> FusedWorkspace:
    """The kept FusedWorkspace of this communicator and n (collective on first use)."""
    kept = _kept(comm)
    fw = kept.get(n)
    if fw is None:
        fw = kept[n] = FusedWorkspace(comm, n)
    return fw


def release_fused(comm) -> None:
    """Free this communicator's fused workspaces (collective: every rank calls it)."""
    kept = _kept(comm)
    getattr(comm, "uncounted", comm).mpi_comm.Barrier()  # no rank still writes into them
    for fw in kept.values():
        fw.free()
    kept.clear()


class _Step:
    """Buffers, kernels and launch shapes of one tridiagonalization (one rank)."""

    def __init__(self, C, desc: BlockCyclic, rank: int, fused: FusedWorkspace | None = None, defer: bool = True):
        import cupy as cp

        n, nb = desc.n, desc.nb
        if not C.flags.f_contiguous or C.dtype != cp.float64:
            raise ValueError("sytrd_device: C must be a Fortran-ordered float64 CuPy array")
        self.n, self.nb, self.rank, self.desc = n, nb, rank, desc
        self.C = C
        cols = desc.local_cols(rank)
        self.cols_h = cols
        self.cols = cp.asarray(cols, dtype=cp.int64)
        self.nloc = int(cols.size)
        self.P = cp.zeros((n, 2 * nb), dtype=cp.float64, order="F")   # [V | raw W] (sytrd_step.cu)
        self.al = cp.zeros(nb, dtype=cp.float64)                       # W's correction per column
        self.bb = cp.zeros(n + 4, dtype=cp.float64)
        self.y = cp.zeros(2 * n, dtype=cp.float64)   # rows | columns (sytrd_step.cu)
        # one rank: the Bcast is the identity and the Allreduce's sum is y itself, so the column
        # step runs without them (two launches per column less) and sytrd_w reads y
        self.alone = desc.nprocs == 1
        self.cv = self.y if self.alone else cp.zeros(2 * n, dtype=cp.float64)
        self.s = cp.zeros(2 * nb, dtype=cp.float64)
        self.g1 = (n + 31) // 32                             # row tiles of 32
        self.part1 = cp.zeros(self.g1, dtype=cp.float64)    # per-tile partial sums (col, w)
        self.part2 = cp.zeros(self.g1, dtype=cp.float64)    # w's, where the next kernel adds them (defer)
        self.nt = (n + SY_R - 1) // SY_R
        self.nch = max(1, -(-self.nloc // SY_C))            # symv: column chunks at most
        self.ypart = cp.zeros(self.nch * n, dtype=cp.float64)        # per-chunk row sums
        self.cpart = cp.zeros(self.nt * max(self.nloc, 1), dtype=cp.float64)  # symv: per-tile column sums
        self.tick = cp.zeros(self.g1, dtype=cp.int64)                # per-tile tickets
        self.ctick = cp.zeros(self.nch, dtype=cp.int64)              # symv: per-chunk tickets
        self.st = cp.zeros(10, dtype=cp.int64)   # sytrd_step.cu's st
        self.d = cp.zeros(n, dtype=cp.float64)
        self.e = cp.zeros(max(n - 1, 1), dtype=cp.float64)
        self.tau = cp.zeros(n, dtype=cp.float64)
        mod = raw_module("sytrd_step.cu")
        self.k = {name: mod.get_function(f"sytrd_{name}") for name in ("init", "col", "symv", "w", "wfix")}
        self.n64, self.nb32 = np.int64(n), np.int32(nb)
        # the layout for the kernels' arithmetic (Layout in sytrd_step.cu; its Python twin is
        # layout_glob / layout_first_after below, tested against desc.local_cols)
        self.nloc64, self.np32, self.rank32 = np.int64(self.nloc), np.int32(desc.nprocs), np.int32(rank)
        if self.nch > SY_MAXCH:
            raise ValueError(f"sytrd_device: {self.nloc} local columns are more than sytrd_symv's work list "
                             f"holds ({SY_MAXCH} chunks of {SY_C}); use more ranks")
        self.symv_grid = resident_grid(self.k["symv"], TPB)   # persistent: the blocks the GPU holds at once
        self.fused = fused
        self.fz = fused.struct if fused is not None else np.uint64(0)   # Fused* (null: collectives)
        # one rank: the next kernel finishes each kernel's grid-wide sums (sytrd_step.cu's defer;
        # the persistent symv's last block advances the column).  defer=False: the last blocks
        # finish them, as on several ranks (the same bits: the GPU tests compare the two)
        self.defer = np.int32(self.alone and fused is None and defer)
        self.wpart = self.part2 if self.defer else self.part1

    def begin_panel(self, p0: int) -> None:
        lj0 = self.desc.local_index(p0) if self.desc.owner(p0) == self.rank else 0
        self.P.fill(0)
        self.k["init"]((1,), (1,), (self.st, np.int64(p0), np.int64(lj0)))

    def column(self, owner: int, comm) -> None:
        """One column step on the current stream; comm: anything with Bcast/Allreduce."""
        k, n, fused = self.k, self.n64, self.fused is not None
        if self.rank == owner:
            k["col"]((self.g1,), (TPB,), (self.C, n, self.P, self.nb32, self.al, self.st, self.part1, self.bb,
                                          self.fz, self.defer, self.part2))
        if not fused and not self.alone:
            comm.Bcast(self.bb, root=owner)
        layout = (self.nloc64, self.np32, self.rank32)
        k["symv"]((self.symv_grid,), (TPB,), (self.C, n, *layout, self.P, self.nb32, self.st, self.bb,
                                            self.y, self.ypart, self.cpart, self.tick, self.ctick, self.s,
                                            self.d, self.e, self.tau, self.fz, self.part1, self.defer))
        if not fused and not self.alone:
            comm.Allreduce(self.y, self.cv)
        k["w"]((self.g1,), (TPB,), (n, self.P, self.nb32, self.al, self.st, self.bb, self.cv, self.s,
                                    self.wpart, self.fz, self.defer, self.ypart, self.cpart))

    def end_panel(self, p0: int, p1: int) -> None:
        """The panel's reflectors into its columns of C (the owner's); the trailing update
        C -= V W^T + W V^T on owned columns > p1, accumulated in place on their lower part
        (potrf.lower_update: the rows above the diagonal are never read)."""
        import cupy as cp

        nb, pw = self.nb, p1 - p0
        self.k["wfix"]((min(1024, -(-self.n * pw // TPB)),), (TPB,), (self.n64, self.P, self.nb32, self.al,
                                                                    np.int64(pw), self.defer, self.bb, self.part2,
                                                                    np.int32(self.g1)))
        if self.desc.owner(p0) == self.rank:
            lj = self.desc.local_index(p0)
            self.C[:, lj:lj + pw] = self.P[:, :pw]
        lt = int(np.searchsorted(self.cols_h, p1))
        if lt < self.nloc:
            left = cp.asarray(np.r_[0:pw, nb:nb + pw])
            right = cp.asarray(np.r_[nb:nb + pw, 0:pw])
            rows = self.P[p1:]
            lower_update(self.C, rows[:, left], rows[:, right], self.cols_h, self.cols, lt, p1, UPDATE_COLS, cp)


def resident_grid(func, threads: int) -> int:
    """Blocks of `threads` threads of the kernel `func` that the current GPU holds at once (its
    SMs times the occupancy; 2 per SM, sytrd_symv's launch bound, where the driver cannot say)."""
    import cupy as cp

    sms = int(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"])
    try:
        per = int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, threads, 0))
    except Exception:  # noqa: BLE001 - an older CuPy without the call: the launch bound
        per = 2
    return sms * max(1, per)


def sytrd_device(C, desc: BlockCyclic, comm, mode: str = "graph", notify=(), *, defer: bool = True):
    """d, e, tau of C = Q T Q^T (as sytrd.sytrd_ops returns them); C (CuPy, F order, its
    lower triangle read) is overwritten, its panels' columns by their reflectors.  mode "fused", "graph" or "eager" (see the module doc); comm may be a
    CountingComm, whose `uncounted` communicator is captured (the collectives are then recorded
    in bulk, timed from a graph of the two collectives alone; fused transfers are recorded with
    no time: they happen inside the kernels).

    Runs on a stream of its own (the legacy default stream cannot be captured; the device's
    highest priority, so that work the caller queues meanwhile fills only the SMs the column
    steps leave idle), ordered after the caller's stream and synchronized at the end (one host
    sync per call).  notify: [(rows, fn)], fn(d, e) called on the caller's stream, from this
    host loop, once the device has finished T's first `rows` rows (an event after the panel
    that ends them, polled after each panel is queued and waited for after the last)."""
    import cupy as cp

    n, nb, rank = desc.n, desc.nb, comm.Get_rank()
    fused = fused_workspace(comm, n) if mode == "fused" else None
    st = _Step(C, desc, rank, fused, defer)
    panels = [(p0, min(p0 + nb, n)) for p0 in range(0, n, nb)]
    inner = getattr(comm, "uncounted", comm)
    outer = cp.cuda.get_current_stream()
    stream = kept_streams("sytrd", priority="high")[0]   # the legacy default stream cannot be captured
    stream.wait_event(outer.record())
    pending = sorted(notify, key=lambda hook: hook[0])
    marks = []   # (event after the panel that finishes the rows, fn)

    def called(wait: bool) -> None:
        while marks and (wait or marks[0][0].done):
            ev, fn = marks.pop(0)
            ev.synchronize()
            with outer:
                fn(st.d, st.e[:max(n - 1, 0)])

    with stream:
        graphs = _capture(st, inner, desc, panels, stream) if mode in ("graph", "fused") else None
        for p0, p1 in panels:
            st.begin_panel(p0)
            if graphs is None:
                for _ in range(p0, p1):
                    st.column(desc.owner(p0), comm)
            else:
                graphs[(desc.owner(p0), p1 - p0)].launch(stream=stream)
            while pending and pending[0][0] <= p1:
                marks.append((stream.record(), pending.pop(0)[1]))
            st.end_panel(p0, p1)
            called(wait=False)
        if fused is not None and hasattr(comm, "record"):
            comm.record("Bcast (fused into sytrd_col)", st.bb.nbytes, n, 0.0, estimated=True)
            comm.record("Allreduce (fused into sytrd_symv)", st.y.nbytes, n, 0.0, estimated=True)
        elif graphs is not None and hasattr(comm, "record") and not st.alone:
            per = _collective_seconds(st, inner, stream)
            comm.record("Bcast", st.bb.nbytes, n, per["Bcast"] * n, estimated=True)
            comm.record("Allreduce", st.y.nbytes, n, per["Allreduce"] * n, estimated=True)
    called(wait=True)
    stream.synchronize()
    if fused is not None:
        try:
            fused.check()
        except Exception:
            _kept(comm).pop(n, None)  # its words are in an unknown state
            raise
    return st.d, st.e[:max(n - 1, 0)], st.tau


def _capture(st: _Step, comm, desc: BlockCyclic, panels, stream):
    """{(owner, panel width): graph of that many column steps}, or None (every rank agrees)
    when the communicator cannot be captured."""
    from mpi4py import MPI

    wanted = sorted({(desc.owner(p0), p1 - p0) for p0, p1 in panels})
    graphs, why = {}, None
    for owner, width in wanted:
        try:
            stream.begin_capture()
            try:
                for _ in range(width):
                    st.column(owner, comm)
            finally:
                g = stream.end_capture()
            graphs[(owner, width)] = g
        except Exception as exc:  # noqa: BLE001 - any capture failure: run eagerly
            why = f"{type(exc).__name__}: {exc}"
            break
    ok = comm.mpi_comm.allreduce(int(why is None), op=MPI.MIN)
    if not ok:
        if why:
            print(f"sytrd (rank {comm.Get_rank()}): running the column steps eagerly ({why})", flush=True)
        return None
    return graphs


def _collective_seconds(st: _Step, comm, stream, reps: int = 16) -> dict:
    """Seconds per Bcast(bb) and per Allreduce(y, cv) inside a graph of `reps` of each alone:
    the collectives' share of the captured column steps (which cannot be timed one by one)."""
    import cupy as cp

    out = {}
    for name in ("Bcast", "Allreduce"):
        stream.begin_capture()
        try:
            for _ in range(reps):
                if name == "Bcast":
                    comm.Bcast(st.bb, root=0)
                else:
                    comm.Allreduce(st.y, st.cv)
        finally:
            g = stream.end_capture()
        g.launch(stream=stream)  # warm
        comm.mpi_comm.Barrier()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        stream.synchronize()
        e0.record(stream)
        g.launch(stream=stream)
        e1.record(stream)
        e1.synchronize()
        out[name] = cp.cuda.get_elapsed_time(e0, e1) * 1e-3 / reps
    return out


# -- host twins -------------------------------------------------------------------------------
def layout_glob(c: int, nb: int, nprocs: int, rank: int) -> int:
    """Global index of rank's local column c: sytrd_step.cu's Layout::glob."""
    return ((c // nb) * nprocs + rank) * nb + c % nb


def layout_first_after(j: int, nb: int, nprocs: int, rank: int) -> int:
    """Number of rank's local columns with global index <= j: sytrd_step.cu's Layout::firstAfter."""
    J = j + 1
    B = J // nb
    count = ((B + nprocs - 1 - rank) // nprocs) * nb
    if B % nprocs == rank:
        count += J % nb
    return count


def sytrd_twin(C_locals, desc: BlockCyclic):
    """NumPy twin of the kernels' math for all ranks in one process (tests only): the column
    step with absolute row indexing and zero masks exactly as sytrd_step.cu computes it, C v
    from the lower triangles alone as sytrd_symv sums it, so the CPU tests can check the
    formulation against sytrd.sytrd_ops.  Returns d, e, V (n x n), tau."""
    n, nb, nprocs = desc.n, desc.nb, desc.nprocs
    Cs = [np.array(c, dtype=np.float64, order="F") for c in C_locals]
    cols = [desc.local_cols(r) for r in range(nprocs)]
    d, e, tau = np.zeros(n), np.zeros(max(n - 1, 0)), np.zeros(n)
    V = np.zeros((n, n), order="F")
    for p0 in range(0, n, nb):
        p1 = min(p0 + nb, n)
        owner = desc.owner(p0)
        P = np.zeros((n, 2 * nb), order="F")
        for j in range(p0, p1):
            k = j - p0
            # sytrd_col (owner)
            col = Cs[owner][j:, desc.local_index(j)] - (P[j:, :k] @ P[j, nb:nb + k] + P[j:, nb:nb + k] @ P[j, :k])
            bb = np.zeros(n + 4)                      # [d_j, tau_j, e_j, 0, v at absolute rows]
            m = n - j - 1
            if m > 0:
                buf = np.zeros(m + 3)                 # householder's packing: [v (m), d_j, tau, beta]
                householder(np, col, buf, np.zeros(1))
                bb[:3] = buf[m:]
                bb[4 + j + 1:] = buf[:m]
            else:
                bb[0] = col[0]
            v = bb[4:]
            # Bcast; sytrd_symv (every rank, then the Allreduce sum): each local column g > j
            # adds its lower part, rows g.. times v[g], and (transposed) rows g+1.. dotted with v
            cv = np.zeros(n)
            for r in range(nprocs):
                for c in np.nonzero(cols[r] > j)[0]:
                    g = cols[r][c]
                    cv[g:] += Cs[r][g:, c] * v[g]
                    cv[g] += Cs[r][g + 1:, c] @ v[g + 1:]
            P[:, k] = v
            d[j] = bb[0]
            if j + 1 < n:
                tau[j], e[j] = bb[1], bb[2]
            s = np.zeros(2 * nb)
            s[:k] = P[j + 1:, :k].T @ v[j + 1:]
            s[nb:nb + k] = P[j + 1:, nb:nb + k].T @ v[j + 1:]
            # sytrd_w
            w = np.zeros(n)
            w[j + 1:] = bb[1] * (cv[j + 1:] - (P[j + 1:, :k] @ s[nb:nb + k] + P[j + 1:, nb:nb + k] @ s[:k]))
            alpha_w = -0.5 * bb[1] * float(w @ v)
            P[:, nb + k] = 0.0
            P[j + 1:, nb + k] = w[j + 1:] + alpha_w * v[j + 1:]
        pw = p1 - p0
        V[:, p0:p1] = P[:, :pw]
        left, right = np.r_[0:pw, nb:nb + pw], np.r_[nb:nb + pw, 0:pw]
        for r in range(nprocs):
            lt = int(np.searchsorted(cols[r], p1))
            if lt < cols[r].size:
                Cs[r][p1:, lt:] -= P[p1:][:, left] @ P[cols[r][lt:]][:, right].T
    return d, e, V, tau

