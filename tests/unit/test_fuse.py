"""The capture fusion's bookkeeping (hpccoll/backends/cuda/fusion.py), without a GPU: which calls may join a
chain node, and where each call's input comes from in the kernel."""
from __future__ import annotations

import pytest

from hpccoll._abi import CHAIN_MAX, Args
from hpccoll.backends.cuda.fusion import SRC_FWD, SRC_KEEP, SRC_LOAD, Node

KEY = ("float32", "oneshot_sentinel", "SUM", 1000)
NB = 4000  # bytes of every call's buffers
A, B, C = 1 << 20, 2 << 20, 3 << 20  # disjoint buffers


def node():
    return Node(KEY, None, Args(), (8, 128), 1000, NB)


def test_sources_follow_the_previous_call():
    n = node()
    calls = [(A, B), (B, B), (B, C), (B, A), (C, C), (A, B)]
    for i, o in calls:
        assert n.takes(KEY, i, o)
        n.add(i, o)
    assert [n.chain.src[j] for j in range(len(calls))] == [SRC_LOAD, SRC_FWD, SRC_FWD, SRC_KEEP, SRC_LOAD, SRC_LOAD]
    assert n.chain.n == len(calls) and n.args.iters == 1 and n.chain.count == 1000
    assert [n.chain.in_[j] for j in range(3)] == [A, B, B]


def test_keep_only_where_the_previous_call_did_not_write_the_input():
    n = node()
    n.add(A, A)  # in place
    n.add(A, B)  # input = the previous output: forwarded, not kept
    assert n.chain.src[1] == SRC_FWD
    n.add(A, C)  # input = the previous input, which it did not write
    assert n.chain.src[2] == SRC_KEEP


@pytest.mark.parametrize("offset", [4, 16, NB - 16, -16, -(NB - 4)])
def test_a_partly_overlapping_buffer_does_not_join(offset):
    n = node()
    n.add(A, B)
    assert not n.takes(KEY, A + offset, C)
    assert not n.takes(KEY, C, B + offset)
    assert n.takes(KEY, A + NB, C) and n.takes(KEY, C, B - NB)  # adjacent: disjoint


def test_a_call_overlapping_itself_does_not_join():
    n = node()
    n.add(A, B)
    assert not n.takes(KEY, C, C + 64)
    assert n.takes(KEY, C, C)


def test_other_keys_and_a_full_node_do_not_join():
    n = node()
    n.add(A, B)
    for other in [("bfloat16",) + KEY[1:], KEY[:1] + ("oneshot_ll",) + KEY[2:], KEY[:2] + ("MAX", 1000), KEY[:3] + (999,)]:
        assert not n.takes(other, A, B)
    for _ in range(CHAIN_MAX - 1):
        assert n.takes(KEY, B, B)
        n.add(B, B)
    assert n.chain.n == CHAIN_MAX and not n.takes(KEY, B, B)
