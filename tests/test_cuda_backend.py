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


def test_capture_chain_chains_only_right_after_its_own_launch():
    """CaptureChain's rule without a GPU: chained only while capturing, and only when the
    stream's single dependency is the node of this communicator's previous launch."""
    from hpccoll._driver import CHAINED, RELEASE, CaptureChain

    ch = object.__new__(CaptureChain)  # no libcuda: feed the capture state by hand
    ch._last, ch.chained, ch.enabled = {}, 0, True
    state = {"s": (0, None)}
    ch._query = lambda stream: state["s"]

    def launch(before_state, after_node, stream=7):
        state["s"] = before_state
        flags = ch.before(stream)
        state["s"] = (before_state[0], after_node) if before_state[0] else (0, None)
        ch.after(stream, flags)
        return flags

    assert launch((0, None), None) == 0                      # eager: never chained, no release
    assert launch((5, None), 100) == RELEASE                 # first node of a capture
    assert launch((5, 100), 101) == CHAINED | RELEASE        # right after our own node
    assert launch((5, 999), 102) == RELEASE                  # a user kernel came in between
    assert launch((5, 102), 103) == CHAINED | RELEASE
    assert launch((6, 103), 104) == RELEASE                  # a new capture (another id), same node value
    assert launch((6, None), 105) == RELEASE                 # a join: several dependencies
    assert launch((6, 105), 106, stream=8) == RELEASE        # another stream has no history
    ch.enabled = False
    assert launch((6, 106), 107, stream=8) == 0              # switched off: the grid boundary, no release
    ch.enabled = True
    assert launch((6, 107), 108, stream=8) == RELEASE        # and the history was dropped meanwhile
    assert ch.chained == 2
