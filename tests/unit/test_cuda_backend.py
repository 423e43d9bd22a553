"""The CUDA backend's host-side rules that need no GPU (hpccoll/backends/cuda/): the launch grid every
rank must share, the engine's block rule, the group rule."""
from __future__ import annotations

import pytest

from hpccoll.backends.cuda.kernels import Kernels, grid_block_cap


@pytest.mark.parametrize("devices,per_gpu,cap", [
    ([0, 1, 0], 2, 64),           # 3 ranks on 2 GPUs: rank 1 alone on GPU 1 took 128 blocks before
    ([0, 1, 0, 1], 2, 64),
    ([0, 0, 0, 1], 3, 42),
    ([0, 1], 1, 128),
    (list(range(8)), 1, 128),
])
def test_grid_cap_is_node_wide(devices, per_gpu, cap):
    """Every rank gets the same (ranks per GPU, block cap): a Bcast's block b waits for block b
    of every peer, so a rank with more blocks than a peer would time out."""
    assert grid_block_cap(devices, [132] * len(devices)) == (per_gpu, cap)
    # and the ranks sharing the busiest GPU fit on it at one block per SM
    assert per_gpu * cap <= 132


def test_grid_cap_fewest_sms_and_at_least_one_block():
    assert grid_block_cap([0, 1, 2], [132, 114, 132]) == (1, 114)
    assert grid_block_cap([0] * 16, [8] * 16) == (16, 1)


def test_engine_blocks_for_matches_the_kernels_rule():
    """Engine.blocks_for must agree with persistent.cu's blocksFor (ceil(packs / (PPT * 512)), at
    least one, at most the engine's blocks): the host waits for exactly those blocks' words.
    PPT = 2 and KEEP = 4 come from cuda/hc_abi.h, as the kernel's do."""
    from hpccoll.backends.cuda.engine import BLOCK, BYTES_PER_BLOCK, PACKS_KEPT, PACKS_PER_THREAD, Engine

    assert PACKS_PER_THREAD == 2 and PACKS_KEPT == 4  # the numbers below assume these
    assert BLOCK == 512 and BYTES_PER_BLOCK == 32 * 1024
    eng = object.__new__(Engine)  # no GPU: only the arithmetic
    eng.blocks, eng.esize = 4, 4  # fp32: 4 elements per 16-byte pack, 4096 per block
    assert [eng.blocks_for(n) for n in (0, 1, 4096, 4097, 8192, 8193, 12288, 12289, 65536)] == \
        [1, 1, 1, 2, 2, 3, 3, 4, 4]
    eng.esize = 2  # bf16: 8 elements per 16-byte pack
    assert [eng.blocks_for(n) for n in (8192, 8193, 1 << 20)] == [1, 2, 4]
    eng.blocks = 1
    assert eng.blocks_for(1 << 20) == 1


class _Arr:
    """The parts of a CuPy array the group rule reads."""

    def __init__(self, ptr: int, nbytes: int, itemsize: int = 4):
        self.data = type("D", (), {"ptr": ptr})()
        self.nbytes, self.itemsize, self.size = nbytes, itemsize, nbytes // itemsize


def _call(send_ptr, recv_ptr, nbytes, op="SUM", dtype="float32"):
    from hpccoll._validate import Call
    from hpccoll.ops import as_op

    class B:
        def __init__(self, ptr):
            self.flat = _Arr(ptr, nbytes)
            self.dtype, self.count, self.device, self.is_device = dtype, nbytes // 4, 0, True

    recv = B(recv_ptr)
    send = recv if send_ptr is None else B(send_ptr)
    return Call("Allreduce", send, recv, as_op(op), None, send_ptr is None)


class _Grouper:
    """The parts of a CudaBackend the group rule reads (no GPU)."""

    def __init__(self, picks):
        from hpccoll.backends.cuda.workspace import Layout

        self.device_id, self.layout = 0, Layout(2)
        self.resolve = lambda coll, dtype, op, nbytes, det, algorithm: algorithm if algorithm != "auto" else picks(nbytes)

    def _group_run(self, items, i):
        from hpccoll.backends.cuda.groups import _run_at

        return _run_at(self, items, i)


def _backend(picks=lambda nbytes: "oneshot_sentinel"):
    return _Grouper(picks)


def _item(call, det=True, algorithm="auto", stream=0):
    """(call, route, stream) as a group holds it (the route's backend and resolved algorithm are
    not read by the group rule)."""
    from hpccoll.backends.base import Route

    return call, Route(None, algorithm, algorithm, det), stream


def _items(calls, algorithm="auto", stream=0):
    return [_item(c, True, algorithm, stream) for c in calls]


MiB = 1 << 20


def test_group_run_takes_independent_calls_up_to_32():
    b = _backend()
    calls = [_call(1 * MiB + 4096 * k, 100 * MiB + 4096 * k, 4096) for k in range(40)]
    assert b._group_run(_items(calls), 0) == (32, "oneshot_sentinel")
    assert b._group_run(_items(calls), 32) == (40, "oneshot_sentinel")
    assert b._group_run(_items(calls), 39) == (40, None)  # one call alone: launched as usual


def test_group_run_stops_where_calls_depend_on_each_other():
    b = _backend()
    a = _call(0x100000, 0x200000, 4096)
    reads_a = _call(0x200000 + 1024, 0x300000, 4096)  # its input overlaps a's output
    writes_a_input = _call(0x400000, 0x100000 + 16, 64)  # its output overlaps a's input
    same_out = _call(0x500000, 0x200000, 4096)
    shared_input = _call(0x100000, 0x600000, 4096)  # reading a's input too is fine
    in_place = _call(None, 0x700000, 4096)
    for dep in (reads_a, writes_a_input, same_out):
        assert b._group_run(_items([a, dep]), 0) == (1, None)
    assert b._group_run(_items([a, shared_input, in_place, reads_a]), 0) == (3, "oneshot_sentinel")


def test_group_run_needs_one_dtype_op_policy_and_stream_not_alignment():
    b = _backend()
    a = _call(0x100000, 0x200000, 4096)
    assert b._group_run(_items([a, _call(0x300000, 0x400000, 4096, op="MAX")]), 0) == (1, None)
    assert b._group_run(_items([a, _call(0x300000, 0x400000, 4096, dtype="float64")]), 0) == (1, None)
    assert b._group_run([_item(a), _item(_call(0x300000, 0x400000, 4096), False)], 0) == (1, None)
    assert b._group_run([_item(a), _item(_call(0x300000, 0x400000, 4096), stream=7)], 0) == (1, None)
    # alignment is each rank's own: an unaligned call joins (through an aligned copy), so that
    # every rank makes the same launches
    assert b._group_run(_items([a, _call(0x300008, 0x400004, 4096)]), 0)[0] == 2
    assert b._group_run(_items([a, _call(0x300000, 0x400000, 4096)], "twoshot_sentinel"), 0) == (1, None)


def test_group_run_fits_the_launch_of_the_algorithm_chosen_for_its_total():
    # auto: one-shot LL up to 64 KiB, sentinel beyond, two-shot from 2 MiB (a made-up table)
    b = _backend(lambda n: "oneshot_ll" if n <= 64 * 1024 else "oneshot_sentinel" if n < 2 * MiB else "twoshot_sentinel")
    small = [_call(MiB * k, 200 * MiB + MiB * k, 4096) for k in range(10)]
    assert b._group_run(_items(small), 0) == (10, "oneshot_ll")
    big = [_call(MiB * k, 200 * MiB + MiB * k, 512 * 1024) for k in range(8)]
    assert b._group_run(_items(big), 0) == (3, "oneshot_sentinel")  # 4 x 512 KiB would pick two-shot
    # an explicit one-shot LL carries at most its 256 KiB per launch
    assert b._group_run(_items(big[:2], "oneshot_ll"), 0) == (1, None)
    assert b._group_run(_items(small, "oneshot_ll"), 0) == (10, "oneshot_ll")
    # the sentinel one-shot's 4 MiB: 8 x 512 KiB fit, a ninth does not
    b = _backend()
    nine = [_call(MiB * k, 200 * MiB + MiB * k, 512 * 1024) for k in range(9)]
    assert b._group_run(_items(nine), 0) == (8, "oneshot_sentinel")


def test_grid_small_blocks():
    """HPCCOLL_SMALL_BLOCK: launches that fit the block cap in blocks of that many threads use
    them (spread over more SMs); larger ones keep 512-thread blocks; 512 is the old rule."""
    k = object.__new__(Kernels)
    k.grid_cap, k.small_block = 128, 512
    assert [k.grid(n) for n in (1, 64, 512, 513, 20000, 1 << 20)] == \
        [(1, 32), (1, 64), (1, 512), (2, 512), (40, 512), (128, 512)]
    k.small_block = 128
    assert [k.grid(n) for n in (1, 64, 512, 513, 16384, 16385, 1 << 20)] == \
        [(1, 32), (1, 64), (4, 128), (5, 128), (128, 128), (33, 512), (128, 512)]
    assert k.grid(100, 8) == (7, 128)  # LL128: 8 threads per line


def test_engine_slots_rest_as_their_protocol():
    """An engine's region is filled before every start with its slots' idle pattern
    (cuda/persistent.cu EngineProto): the sentinel for floating types, zero for LL (integers)."""
    from hpccoll._abi import SENTINEL_U32
    from hpccoll.backends.cuda.engines import engine_rest

    for dtype in ("float64", "float32", "float16", "bfloat16"):
        assert engine_rest(dtype) == SENTINEL_U32
    for dtype in ("int32", "int64"):
        assert engine_rest(dtype) == 0


def test_nccl_names_the_ranks_that_share_a_gpu():
    from hpccoll.backends.topology import shared_gpus

    assert shared_gpus([("a", "0000:01:00.0"), ("a", "0000:02:00.0")]) is None
    assert shared_gpus([("a", "0000:01:00.0"), ("b", "0000:01:00.0")]) is None   # two hosts
    assert shared_gpus([("a", "0000:01:00.0")] * 3) == "ranks 0, 1, 2 share GPU 0000:01:00.0 on a"
    got = shared_gpus([("a", "x"), ("a", "y"), ("a", "x"), ("b", "y"), ("b", "y")])
    assert got == "ranks 0, 2 share GPU x on a; ranks 3, 4 share GPU y on b"
    assert shared_gpus([None, None, ("a", "x")]) is None   # unknown GPUs are never counted as shared


def test_nccl_tells_hosts_apart_by_nccl_hostid_where_set(monkeypatch):
    """NCCL_HOSTID replaces the host name in NCCL's host hash: ranks given distinct ids count as
    on different hosts (the GPU tests' NCCL loopback mode), an empty one does not count."""
    import socket

    from hpccoll.backends.topology import nccl_host

    monkeypatch.delenv("NCCL_HOSTID", raising=False)
    assert nccl_host() == socket.gethostname()
    monkeypatch.setenv("NCCL_HOSTID", "")
    assert nccl_host() == socket.gethostname()
    monkeypatch.setenv("NCCL_HOSTID", "box-rank1")
    assert nccl_host() == "box-rank1"


def test_ranks_that_number_their_gpus_differently_are_refused_with_the_fix():
    from hpccoll.backends.cuda.backend import gpu_numbering_mismatch

    assert gpu_numbering_mismatch([0, 1, 0, 1], ["A", "B", "A", "B"]) is None   # MPS: two ranks per GPU
    assert gpu_numbering_mismatch([0, 0, 0], ["A", "A", "A"]) is None
    # CUDA_VISIBLE_DEVICES=<local rank> per rank: every rank's only GPU is its GPU 0
    why = gpu_numbering_mismatch([0, 0], ["A", "B"])
    assert "rank 0: GPU 0 = A, rank 1: GPU 0 = B" in why and "CUDA_VISIBLE_DEVICES" in why
    assert "--gpus-per-node" in why
    # the same GPU under two ordinals (CUDA_VISIBLE_DEVICES=1,0 on one rank, 0,1 on another)
    assert gpu_numbering_mismatch([0, 1], ["A", "A"]) is not None
