"""A randomized soak of the device collectives: batches of calls issued back to back with no
host synchronization between them (as an application issues them), every collective, algorithm,
dtype, op, root, size and in-place form mixed on the same communicator, some batches inside
`comm.group()`, some on a non-blocking stream; then the same on a hierarchical communicator of
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
from hpccoll.ops import OPS, reduce_in_rank_order

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
    done, b, counts = 0, 0, {}
    while done < calls:
        rng = np.random.default_rng([seed, b])
        batch = [_draw(rng, size, kinds) for _ in range(int(rng.integers(1, 33)))]
        grouped, on_side = groups and bool(rng.integers(4) == 0), bool(rng.integers(3) == 0)
        stream = side if on_side else None
        xs = [_inputs(seed, b, i, call, size) for i, call in enumerate(batch)]
        with side if on_side else cp.cuda.Stream.null:  # the batch's arrays are made on its stream
            if grouped:
                with c.group():
                    outs = [_issue(c, cp, call, x[rank], stream) for call, x in zip(batch, xs)]
            else:
                outs = [_issue(c, cp, call, x[rank], stream) for call, x in zip(batch, xs)]
        c.synchronize(stream)
        digest = hashlib.sha256()
        for i, (call, x, out) in enumerate(zip(batch, xs, outs)):
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
            counts[key] = counts.get(key, 0) + 1
        assert len(set(world().allgather(digest.hexdigest()))) == 1, f"seed {seed} batch {b}: results differ across ranks"
        done += len(batch)
        b += 1
    if rank == 0:
        print(f"\nsoak ({c.backend}): {done} calls in {b} batches, seed {seed}, {size} ranks: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
