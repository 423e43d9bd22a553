"""The CUDA backend's host-side rules that need no GPU: the launch grid every rank must share."""
from __future__ import annotations

import pytest

from hpccoll.backends.cuda import grid_block_cap


@pytest.mark.parametrize("devices,per_gpu,cap", [
    ([0, 1, 0], 2, 64),           # 3 ranks on 2 GPUs: rank 1 alone on GPU 1 took 128 blocks before
    ([0, 1, 0, 1], 2, 64),
    ([0, 0, 0, 1], 3, 42),
    ([0, 1], 1, 128),
    (list(range(8)), 1, 128),
])
def test_grid_cap_is_node_wide(devices, per_gpu, cap):
    """Every rank gets the same (ranks per GPU, block cap): a Bcast's block b waits for block b
    of every peer, so a rank with more blocks than a peer times out (a32dcd6, 3 ranks, 2xH200)."""
    assert grid_block_cap(devices, [132] * len(devices)) == (per_gpu, cap)
    # and the ranks sharing the busiest GPU fit on it at one block per SM
    assert per_gpu * cap <= 132


def test_grid_cap_fewest_sms_and_at_least_one_block():
    assert grid_block_cap([0, 1, 2], [132, 114, 132]) == (1, 114)
    assert grid_block_cap([0] * 16, [8] * 16) == (16, 1)


def test_engine_blocks_for_matches_the_kernels_rule():
    """Engine.blocks_for must agree with persistent.cu's blocksFor (ceil(packs / 512), at least
    one, at most the engine's blocks): the host waits for exactly those blocks' words."""
    from hpccoll._engine import Engine

    eng = object.__new__(Engine)  # no GPU: only the arithmetic
    eng.blocks, eng.esize = 4, 4
    assert [eng.blocks_for(n) for n in (0, 1, 2048, 2049, 4096, 4097, 6144, 6145, 65536)] == \
        [1, 1, 1, 2, 2, 3, 3, 4, 4]
    eng.esize = 2  # bf16: 8 elements per 16-byte pack
    assert [eng.blocks_for(n) for n in (4096, 4097, 1 << 20)] == [1, 2, 4]
    eng.blocks = 1
    assert eng.blocks_for(1 << 20) == 1
