"""Fixtures shared by the GPU test files."""
import pytest


@pytest.fixture(scope="module")
def cc():
    """A CUDA-backend Communicator over MPI.COMM_WORLD, one per test module."""
    import hpccoll

    c = hpccoll.Communicator(backend="cuda")
    assert c.backend == "cuda", "the CUDA backend did not open"
    yield c
    c.Free()
