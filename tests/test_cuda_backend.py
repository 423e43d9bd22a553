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
