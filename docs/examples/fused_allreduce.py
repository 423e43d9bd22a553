"""A custom collective on hpccoll's device-extension API: out = allreduce(x) + bias + residual in
one kernel (what a tensor-parallel layer does after its row-parallel matmul), bitwise equal to
`comm.Allreduce(x, t, deterministic=True)` followed by `t + bias + residual`.

    comm = hpccoll.Communicator(backend="cuda")
    fused = FusedAllreduceResidual(comm, max_count=1 << 16)      # collective
    fused(x, bias, residual, out)                                # on CuPy's current stream
    fused.free()                                                 # collective
"""
import cupy as cp

import hpccoll
import hpccoll.ext

SOURCE = r"""
#include "ll_buffer.cuh"
#include "proto_sentinel.cuh"

// One-shot: every rank sends its packs to every peer, then reduces in rank order (recvReduce),
// so every rank computes the same sum; the bias and the residual are added on the way out.
extern "C" __global__ void allreduce_bias_residual(const Args a, const T* bias, const T* residual, T* out) {
  const u64 e = epochBegin(a);
  const LLBuffer<Sentinel> buf(a, a.region, a.sub, e, HC_COLL_USER);
  const u64 packs = (a.count + HC_EPP - 1) / HC_EPP;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const T* x = (const T*)a.in;
  bool ok = !aborted(a);
  for (u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const int n = (int)min((u64)HC_EPP, a.count - p * HC_EPP);
    buf.bcast(p, ldPartial(x + p * HC_EPP, n, (T)0));
  }
  for (u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x; ok && p < packs; p += stride) {
    const u64 i0 = p * HC_EPP;
    const int n = (int)min((u64)HC_EPP, a.count - i0);
    Pack sum;
    ok = buf.recvReduce<HC_SUM>(p, ldPartial(x + i0, n, (T)0), sum);
    if (!ok) break;
    Pack y;
#pragma unroll
    for (int i = 0; i < HC_EPP; ++i) y.e[i] = i < n ? (sum.e[i] + bias[i0 + i]) + residual[i0 + i] : (T)0;
    stPartial(out + i0, y, n);
  }
  epochEnd(a, e, 1);
}
"""


class FusedAllreduceResidual:
    """float32 out = sum over ranks of x, + bias, + residual, for up to `max_count` elements."""

    def __init__(self, comm: hpccoll.Communicator, max_count: int):
        self.comm, self.max_count = comm, max_count
        self.sub = -(-max_count * 4 // 1024) * 1024          # one (parity, source) sub-buffer: 16 B per pack
        self.sym = hpccoll.ext.SymmetricMemory(comm, 2 * comm.size * self.sub)
        self.sym.arm(protocol="sentinel")                    # slots at rest before any rank writes
        mod = cp.RawModule(code=SOURCE, options=hpccoll.ext.compile_options("float32", comm.size))
        self.kernel = mod.get_function("allreduce_bias_residual")
        self.blocks = hpccoll.ext.max_blocks(comm)

    def __call__(self, x, bias, residual, out):
        n = x.size
        if not (n <= self.max_count and bias.size == residual.size == out.size == n):
            raise ValueError(f"FusedAllreduceResidual: sizes {x.size, bias.size, residual.size, out.size} "
                             f"must be equal and at most {self.max_count}")
        args = self.sym.kernel_args(sub=self.sub, count=n, inp=x.data.ptr)
        threads = 128
        blocks = max(1, min(self.blocks, -(-(-(-n // 4)) // threads)))  # a thread per 16-byte pack
        self.kernel((blocks,), (threads,), (args, bias, residual, out))

    def free(self):
        self.sym.free()
