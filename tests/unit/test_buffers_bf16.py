"""bfloat16 tensors that arrive as raw 2-byte elements (torch through DLPack into CuPy) are
re-typed from the source's dtype, and nothing else is."""
import numpy as np
import pytest

from hpccoll._buffers import _typed_bfloat16
from hpccoll.ops import BFLOAT16, dtype_name

pytestmark = pytest.mark.skipif(BFLOAT16 is None, reason="ml_dtypes not installed")


class _Src:
    def __init__(self, dtype):
        self.dtype = dtype


def test_void16_from_a_bfloat16_source_becomes_bfloat16():
    bits = np.array([0x3F80, 0xC000, 0x7FC0], dtype=np.uint16)  # 1.0, -2.0, NaN
    raw = bits.view("V2")
    out = _typed_bfloat16(raw, _Src("torch.bfloat16"))
    assert dtype_name(out.dtype) == "bfloat16"
    assert np.array_equal(out.view(np.uint16), bits)  # same bits, no conversion
    assert out.astype(np.float32)[:2].tolist() == [1.0, -2.0]


@pytest.mark.parametrize("src", ["torch.float16", "torch.int16", None])
def test_other_sources_are_left_alone(src):
    raw = np.zeros(3, dtype="V2")
    assert _typed_bfloat16(raw, _Src(src)).dtype == raw.dtype
    with pytest.raises(TypeError, match="not supported"):
        dtype_name(raw.dtype)


def test_typed_arrays_are_left_alone():
    x = np.ones(3, dtype=np.float16)
    assert _typed_bfloat16(x, _Src("torch.bfloat16")) is x
