"""A randomized soak of the device collectives: batches of calls issued back to back with no
host synchronization between them (as an application issues them), every collective, algorithm,
dtype, op, root, size and in-place form mixed on the same communicator, some batches inside
`comm.group()`, some on a non-blocking stream, persistent requests (made once, fresh input
each Start) started among the calls; then the same on a hierarchical communicator of
two simulated nodes (even rank counts).  Only after a batch is synchronized are its
results read and checked: bitwise against the host's rank-order reference where the call
promises bits, within rounding for the LL128 atomics, and (Allreduce, Bcast, Allgather) the
same bits on every rank.

Every rank draws the same calls from one seed (rank 0's, fresh each run, printed with any
failure), and every rank regenerates every rank's inputs from it, so a reference needs no
communication.  HPCCOLL_SOAK_CALLS sets the number of calls (default 3000)."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from _gpu_checks import assert_bitwise, assert_close, random_data, reduce_by_nodes, world
from _gpu_checks import cc, hc  # noqa: F401 - the module's flat and hierarchical Communicators

import hpccoll
from hpccoll.ops import OPS, np_dtype, reduce_in_rank_order

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]

FLOATS = ("float64", "float32", "float16", "bfloat16")
DTYPES = FLOATS + ("int32", "int64")
ALGOS = ("auto", "oneshot_sentinel", "oneshot_ll", "twoshot_sentinel", "twoshot_ll", "twoshot_ll128")
KINDS = ("Allreduce",) * 4 + ("Bcast", "Allgather", "Reduce_scatter_block", "Alltoall")
HIER_KINDS = ("Allreduce",) * 4 + ("Bcast", "Allgather", "Reduce_scatter_block")  # no Alltoall, no groups
TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-2, "bfloat16": 5e-2}


def _draw(rng, size: int, kinds) -> dict:
    """One call, the same on every rank: kind, dtype, op, algorithm, policy, count, root, in place."""
    kind, dtype = str(rng.choice(kinds)), str(rng.choice(DTYPES))
    n = int(np.exp(rng.uniform(0.0, np.log(1 << 17))))  # 1 .. 128 Ki elements, log-uniform
    call = {"kind": kind, "dtype": dtype, "n": n, "in_place": bool(rng.integers(3) == 0), "op": "SUM",
            "algo": "auto", "det": True, "root": int(rng.integers(size))}
    if kind == "Allreduce":
        algo = str(rng.choice(ALGOS))
        ops = ["SUM"] if "ll128" in algo else ["SUM", "PROD", "MAX", "MIN"]
        if ("sentinel" in algo or "ll128" in algo) and dtype not in FLOATS:
            algo = "oneshot_ll"
        call.update(algo=algo, op=str(rng.choice(ops)),
                    det="ll128" not in algo and (algo != "auto" or bool(rng.integers(4))))
    return call


def _inputs(seed, b: int, i: int, call: dict, size: int):
    """Every rank's input of call i of batch b (each rank computes them all)."""
    n = call["n"] * (size if call["kind"] in ("Reduce_scatter_block", "Alltoall") else 1)
    return [random_data(np.random.default_rng([seed, b, i, r]), call["dtype"], n, call["op"]) for r in range(size)]


def _expected(call: dict, xs, rank: int, size: int, reduce):
    kind, n = call["kind"], call["n"]
    if kind == "Allreduce":
        return reduce(OPS[call["op"]], xs)
    if kind == "Bcast":
        return xs[call["root"]]
    if kind == "Allgather":
        return np.concatenate(xs)
    if kind == "Reduce_scatter_block":
        return reduce(OPS["SUM"], xs)[rank * n:(rank + 1) * n]
    return np.concatenate([xs[src][rank * n:(rank + 1) * n] for src in range(size)])  # Alltoall


def _issue(c, cp, call: dict, x, stream):
    """Issue one call on `stream`; returns the device array that holds its result once the
    stream is synchronized (its leading n elements for Reduce_scatter_block in place)."""
    kind, n, size, rank = call["kind"], call["n"], c.size, c.rank
    d = cp.asarray(x)
    if kind == "Bcast":
        c.Bcast(d, root=call["root"], stream=stream)
        return d
    if kind == "Allreduce":
        out = d if call["in_place"] else cp.empty_like(d)
        c.Allreduce(hpccoll.IN_PLACE if call["in_place"] else d, out, op=OPS[call["op"]],
                    algorithm=call["algo"], deterministic=call["det"], stream=stream)
        return out
    if kind == "Allgather":
        out = cp.empty(n * size, d.dtype)
        if call["in_place"]:
            out[rank * n:(rank + 1) * n] = d
            c.Allgather(hpccoll.IN_PLACE, out, stream=stream)
        else:
            c.Allgather(d, out, stream=stream)
        return out
    if kind == "Reduce_scatter_block":
        if call["in_place"]:
            c.Reduce_scatter_block(hpccoll.IN_PLACE, d, deterministic=True, stream=stream)
            return d[:n]
        out = cp.empty(n, d.dtype)
        c.Reduce_scatter_block(d, out, deterministic=True, stream=stream)
        return out
    if call["in_place"]:  # Alltoall
        c.Alltoall(hpccoll.IN_PLACE, d, stream=stream)
        return d
    out = cp.empty_like(d)
    c.Alltoall(d, out, stream=stream)
    return out


class _Persistent:
    """A persistent request of the soak, made once: its buffers stay bound, and each use writes
    fresh input into them (on CuPy's default stream, the request's) before Start."""

    def __init__(self, c, cp, call: dict):
        kind, n, size, rank = call["kind"], call["n"], c.size, c.rank
        ip, self.call = call["in_place"], call
        dt = cp.asarray(np.zeros(1, np_dtype(call["dtype"]))).dtype  # as CuPy takes a host array's
        src = hpccoll.IN_PLACE
        if kind == "Allreduce":
            self.inp = cp.empty(n, dt)
            self.out = self.inp if ip else cp.empty(n, dt)
            self.req = c.Allreduce_init(src if ip else self.inp, self.out, op=OPS[call["op"]],
                                        algorithm=call["algo"], deterministic=call["det"])
        elif kind == "Bcast":
            self.inp = self.out = cp.empty(n, dt)
            self.req = c.Bcast_init(self.inp, root=call["root"])
        elif kind == "Allgather":
            self.out = cp.empty(n * size, dt)
            self.inp = self.out[rank * n:(rank + 1) * n] if ip else cp.empty(n, dt)
            self.req = c.Allgather_init(src if ip else self.inp, self.out)
        else:  # Reduce_scatter_block
            self.inp = cp.empty(n * size, dt)
            self.out = self.inp[:n] if ip else cp.empty(n, dt)
            self.req = c.Reduce_scatter_block_init(src, self.inp, deterministic=True) if ip else \
                c.Reduce_scatter_block_init(self.inp, self.out, deterministic=True)

    def start(self, cp, x):
        self.inp[...] = cp.asarray(x)
        self.req.Start()
        return self.out


def test_soak_back_to_back_mixed_calls(cc):
    _soak(cc, KINDS, True, reduce_in_rank_order)


def test_soak_hierarchical(hc):
    """The same on two simulated nodes: the node phases' kernels, MPI or NCCL between nodes,
    reductions by node first (each node in local-rank order, then the nodes in order)."""
    rank_of = hc._backend.layout.rank_of
    _soak(hc, HIER_KINDS, False, lambda op, xs: reduce_by_nodes(op, xs, rank_of))


def _soak(c, kinds, groups: bool, reduce):
    import cupy as cp

    calls = int(os.environ.get("HPCCOLL_SOAK_CALLS", "3000"))
    seed = world().bcast(int(np.random.SeedSequence().entropy % (1 << 63)) if c.rank == 0 else None)
    size, rank = c.size, c.rank
    side = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng([seed, 1 << 40])
    reqs = [_Persistent(c, cp, _draw(rng, size, [k for k in kinds if k != "Alltoall"])) for _ in range(4)]
    done, b, counts = 0, 0, {}
    while done < calls:
        rng = np.random.default_rng([seed, b])
        batch = [_draw(rng, size, kinds) for _ in range(int(rng.integers(1, 33)))]
        grouped, on_side = groups and bool(rng.integers(4) == 0), bool(rng.integers(3) == 0)
        stream = side if on_side else None
        # requests (bound to the default stream) join the batches on it, each at most once
        used = [] if on_side else [q for q in reqs if rng.integers(3) == 0]
        for q in used:
            batch.insert(int(rng.integers(len(batch) + 1)), q)
        calls_of = [e.call if isinstance(e, _Persistent) else e for e in batch]
        xs = [_inputs(seed, b, i, call, size) for i, call in enumerate(calls_of)]

        def issue(e, x):
            return e.start(cp, x[rank]) if isinstance(e, _Persistent) else _issue(c, cp, e, x[rank], stream)

        with side if on_side else cp.cuda.Stream.null:  # the batch's arrays are made on its stream
            if grouped:
                with c.group():
                    outs = [issue(e, x) for e, x in zip(batch, xs)]
            else:
                outs = [issue(e, x) for e, x in zip(batch, xs)]
        c.synchronize(stream)
        for q in used:
            q.req.Wait()
        digest = hashlib.sha256()
        for i, (call, x, out) in enumerate(zip(calls_of, xs, outs)):
            got, ref = cp.asnumpy(out), _expected(call, x, rank, size, reduce)
            what = f"seed {seed} batch {b} call {i} {call} grouped={grouped} side={on_side} rank {rank}"
            if call["det"] or call["dtype"] not in FLOATS:
                assert_bitwise(got, ref, what)
            else:
                tol = TOL[call["dtype"]]
                assert_close(got, ref, rtol=tol, atol=tol * size * 4, err_msg=what)
            if call["kind"] in ("Allreduce", "Bcast", "Allgather"):  # the others' results differ by rank
                digest.update(np.ascontiguousarray(got).tobytes())
            key = call["kind"] if call["kind"] != "Allreduce" else f"Allreduce {call['algo']}"
            key += " (request)" if isinstance(batch[i], _Persistent) else ""
            counts[key] = counts.get(key, 0) + 1
        assert len(set(world().allgather(digest.hexdigest()))) == 1, f"seed {seed} batch {b}: results differ across ranks"
        done += len(batch)
        b += 1
    for q in reqs:
        q.req.Free()
    if rank == 0:
        print(f"\nsoak ({c.backend}): {done} calls in {b} batches, seed {seed}, {size} ranks: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
