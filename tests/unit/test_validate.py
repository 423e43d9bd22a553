"""Argument validation (hpccoll/_validate.py, _buffers.py): bad inputs raise before any
communication, with a message that names the argument and the fix."""
from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll._validate import block_count, prepare


class _NoCommunication:
    """Stands in for the backend: any use means a bad call reached communication."""

    def __getattr__(self, name):
        raise AssertionError(f"backend.{name} was reached: validation must raise first")


@pytest.fixture
def comm():
    """A one-rank Communicator whose backends fail the test if reached."""
    c = hpccoll.Communicator(MPI.COMM_SELF, backend="host", check=False)
    real = c._host
    c._host = c._backend = _NoCommunication()
    yield c
    c._host = c._backend = real
    c.Free()


def f64(n):
    return np.zeros(n)


# -- size -------------------------------------------------------------------------------

def test_allreduce_size_mismatch(comm):
    with pytest.raises(ValueError, match="Allreduce: recvbuf has 1000 elements, sendbuf 999"):
        comm.Allreduce(f64(999), f64(1000))


def test_allgather_size_mismatch():
    with pytest.raises(ValueError, match=r"Allgather: recvbuf has 7 elements, sendbuf 3: .*3\*3 = 9"):
        prepare("Allgather", 3, f64(3), f64(7))


def test_allgather_in_place_not_multiple():
    with pytest.raises(ValueError, match="Allgather: recvbuf has 7 elements, not a multiple of size=3"):
        prepare("Allgather", 3, hpccoll.IN_PLACE, f64(7))


def test_reduce_scatter_block_size_mismatch():
    with pytest.raises(ValueError, match=r"Reduce_scatter_block: sendbuf has 8 elements, recvbuf 3: .*3\*3 = 9"):
        prepare("Reduce_scatter_block", 3, f64(8), f64(3), op=hpccoll.SUM)


def test_reduce_scatter_block_in_place_not_multiple():
    with pytest.raises(ValueError, match="IN_PLACE recvbuf .* multiple of size=3 elements, it has 8"):
        prepare("Reduce_scatter_block", 3, hpccoll.IN_PLACE, f64(8), op=hpccoll.SUM)


def test_block_counts_agree_between_in_place_and_not():
    assert block_count(prepare("Allgather", 3, f64(4), f64(12)), 3) == 4
    assert block_count(prepare("Allgather", 3, hpccoll.IN_PLACE, f64(12)), 3) == 4
    assert block_count(prepare("Reduce_scatter_block", 3, f64(12), f64(4), op="sum"), 3) == 4
    assert block_count(prepare("Reduce_scatter_block", 3, hpccoll.IN_PLACE, f64(12), op="sum"), 3) == 4


# -- dtype and layout -------------------------------------------------------------------

def test_dtype_mismatch(comm):
    with pytest.raises(TypeError, match="Allreduce: sendbuf is float32 but recvbuf is float64"):
        comm.Allreduce(np.zeros(4, np.float32), np.zeros(4, np.float64))


@pytest.mark.parametrize("dtype", [np.complex64, np.uint8, np.float128 if hasattr(np, "float128") else np.bool_])
def test_unsupported_dtype(comm, dtype):
    x = np.zeros(4, dtype)
    with pytest.raises(TypeError, match=rf"Allreduce: recvbuf's dtype {np.dtype(dtype).name} is not supported: use one of "
                                        "float64, float32, float16, bfloat16, int32, int64"):
        comm.Allreduce(x, x.copy())


def test_non_contiguous_sendbuf(comm):
    with pytest.raises(ValueError, match=r"Allreduce: sendbuf is not contiguous: pass np.ascontiguousarray\(sendbuf\)"):
        comm.Allreduce(np.zeros(8)[::2], np.zeros(4))


def test_non_contiguous_recvbuf(comm):
    with pytest.raises(ValueError, match="Allgather: recvbuf is not contiguous"):
        comm.Allgather(np.zeros(4), np.zeros((4, 2))[:, 0])


def test_read_only_recvbuf(comm):
    out = np.zeros(4)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"Allreduce: recvbuf is read-only: pass a writable array"):
        comm.Allreduce(np.zeros(4), out)


def test_read_only_bcast_buffer(comm):
    buf = np.zeros(4)
    buf.flags.writeable = False
    with pytest.raises(ValueError, match="Bcast: buf is read-only"):
        comm.Bcast(buf, root=0)


def test_read_only_sendbuf_is_fine():
    x = np.ones(4)
    x.flags.writeable = False
    with hpccoll.Communicator(MPI.COMM_SELF, backend="host") as c:
        out = np.empty(4)
        c.Allreduce(x, out)
        assert np.array_equal(out, x)


def test_not_an_array(comm):
    with pytest.raises(TypeError, match="Allreduce: sendbuf must be a numpy array or a device array .* not list"):
        comm.Allreduce([1.0, 2.0], np.zeros(2))


# -- root, op, backend, algorithm -------------------------------------------------------

@pytest.mark.parametrize("root", [-1, 1, 1.5, True, None, "0", np.float64(0), np.int64(1)])
def test_bad_root(comm, root):
    with pytest.raises(ValueError, match=re.escape(f"Bcast: root={root!r} is not a rank of this communicator: use 0 <= root < 1")):
        comm.Bcast(np.zeros(3), root=root)


@pytest.mark.parametrize("op", ["AVG", None, 3, "sum!", np.add])
def test_bad_op(comm, op):
    with pytest.raises(ValueError, match=r"op=.* is not supported: use hpccoll.SUM, MAX, MIN or PROD"):
        comm.Allreduce(np.zeros(3), np.zeros(3), op=op)


def test_bad_op_reduce_scatter(comm):
    with pytest.raises(ValueError, match="op=.* is not supported"):
        comm.Reduce_scatter_block(np.zeros(3), np.zeros(3), op=MPI.LAND)


def test_bad_backend_name():
    with pytest.raises(ValueError, match="backend='gpu': use one of auto, host, cuda, nccl"):
        hpccoll.Communicator(MPI.COMM_SELF, backend="gpu")


def test_comm_must_be_mpi4py():
    with pytest.raises(TypeError, match="comm must be an mpi4py communicator, not int"):
        hpccoll.Communicator(3, backend="host")


@pytest.mark.parametrize("check", [False, True])
def test_bad_algorithm_on_host(check):
    with hpccoll.Communicator(MPI.COMM_SELF, backend="host", check=check) as c:
        with pytest.raises(ValueError, match="Allreduce: algorithm='ll128' is unknown: use 'auto' or 'mpi'"):
            c.Allreduce(np.zeros(3), np.zeros(3), algorithm="ll128")
        with pytest.raises(ValueError, match="Allreduce: algorithm='oneshot_ll' runs device buffers on the cuda "
                                             "backend; this call runs on the host backend"):
            c.Allreduce(np.zeros(3), np.zeros(3), algorithm="oneshot_ll")
        x = np.arange(3.0)  # and the communicator still works
        y = np.empty(3)
        c.Allreduce(x, y, algorithm="mpi")
        assert np.array_equal(x, y)


@pytest.mark.parametrize("name", ["HPCCOLL_TIMEOUT"])
@pytest.mark.parametrize("value", ["soon", "0", "-1"])
def test_bad_timeout_env(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="HPCCOLL_TIMEOUT|timeout="):
        hpccoll.Communicator(MPI.COMM_SELF, backend="host")


# -- what a valid call becomes ----------------------------------------------------------

def test_numpy_integer_root_is_a_rank():
    call = prepare("Bcast", 3, None, np.zeros(2), root=np.int32(2))
    assert call.root == 2 and type(call.root) is int


def test_prepare_in_place_uses_recvbuf():
    out = np.zeros(6, np.int32)
    call = prepare("Allreduce", 2, MPI.IN_PLACE, out, op=MPI.MAX)
    assert call.in_place and call.send is call.recv and call.op is hpccoll.MAX
    assert call.recv.dtype == "int32" and call.recv.count == 6 and not call.recv.is_device


def test_prepare_multidimensional_is_a_flat_view():
    for order in "CF":
        out = np.zeros((3, 5), order=order)
        call = prepare("Allreduce", 2, np.ones((3, 5), order=order), out, op=hpccoll.SUM)
        assert call.recv.count == 15 and call.recv.flat.ndim == 1
        assert np.shares_memory(call.recv.flat, out)


def test_bfloat16_is_supported():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.zeros(4, ml_dtypes.bfloat16)
    assert prepare("Allreduce", 2, x, x.copy(), op="max").recv.dtype == "bfloat16"


def test_prepare_checks_its_dtypes():
    """prepare() is a no-op on the host backend, but its argument is checked like a collective's
    dtype, and a freed communicator refuses it."""
    c = hpccoll.Communicator(MPI.COMM_SELF, backend="host")
    c.prepare()
    c.prepare(("float64", np.int32))
    with pytest.raises(TypeError, match="prepare: dtypes='float64': pass a sequence"):
        c.prepare("float64")
    with pytest.raises(TypeError, match="complex128"):
        c.prepare(("complex128",))
    c.Free()
    with pytest.raises(hpccoll.HpccollError, match="prepare"):
        c.prepare()


def test_check_mode_names_ranks_whose_buffers_go_to_different_backends():
    """Host buffers on one rank and device buffers on another send the call to different
    backends (MPI on one, device kernels on the other), which never meet: check mode's
    signature carries the backend, and agree raises MismatchError naming it on every rank."""
    from hpccoll import MismatchError
    from hpccoll._validate import agree, signature

    x = np.arange(6, dtype=np.float32)
    call = prepare("Allreduce", 2, x, np.empty_like(x), op=hpccoll.SUM)
    sigs = [signature(call, 2, "auto", False, "host"), signature(call, 2, "auto", False, "cuda")]
    assert sigs[0][:-1] == sigs[1][:-1]
    for rank in (0, 1):
        with pytest.raises(MismatchError, match="ranks disagree on backend: rank 0 has host, rank 1 has cuda"):
            agree(lambda mine, name: [("ok", s, None) for s in sigs], rank, "Allreduce", sigs[rank])
    agree(lambda mine, name: [("ok", sigs[0], None)] * 2, 0, "Allreduce", sigs[0])  # alike: no error


def test_mpi4py_buffer_specifications_are_refused_with_the_fix(comm):
    """[array, MPI.DOUBLE] and friends: hpccoll takes arrays (their dtype is the datatype); the
    message says so instead of calling the list an unknown buffer type."""
    x, y = np.ones(4), np.empty(4)
    spec = r"is an mpi4py buffer specification .* pass the array itself"
    with pytest.raises(TypeError, match="Allreduce: sendbuf " + spec):
        comm.Allreduce([x, MPI.DOUBLE], y)
    with pytest.raises(TypeError, match="Allreduce: recvbuf " + spec):
        comm.Allreduce(x, (y, 4, MPI.DOUBLE))
    with pytest.raises(TypeError, match="Bcast: buf " + spec):
        comm.Bcast([x, MPI.DOUBLE])
    with pytest.raises(TypeError, match=r"Allreduce: sendbuf must be a numpy array .* not list"):
        comm.Allreduce([1.0, 2.0], y)  # a plain list is not a spec: the general message


def test_alltoallv_datatype_and_nested_forms_are_refused_with_the_fix(comm):
    x, y = np.ones(1), np.empty(1)
    form = r"datatype or nested form .* pass \(array, counts\) or \(array, counts, displs\)"
    with pytest.raises(TypeError, match="Alltoallv: sendbuf is given in mpi4py's " + form):
        comm.Alltoallv([x, [1], MPI.DOUBLE], (y, [1]))
    with pytest.raises(TypeError, match="Alltoallv: recvbuf is given in mpi4py's " + form):
        comm.Alltoallv((x, [1]), (y, ([1], [0])))
    with pytest.raises(TypeError, match="Alltoallv: sendbuf is given in mpi4py's " + form):
        comm.Alltoallv((x, (np.array([1]), np.array([0]))), (y, [1]))
