// lab_push.cu - bench/push_lab.py: how fast can one kernel push a buffer into the peer's memory
// over NVLink, by SM stores or by the Tensor Memory Accelerator's bulk copies?  Every rank pushes
// `bytes` from a local buffer into its peer's workspace at once (both directions, as an
// allreduce does).  Not used by the library.
#include "hc_common.cuh"

// SM stores, the library's way: thread t moves 16-byte packs t, t+T, ... (load, then a volatile
// store; loads pace the stores).
extern "C" __global__ void __launch_bounds__(512) hc_push_st(const char* src, char* dst, u64 bytes) {
  const u64 T = (u64)gridDim.x * blockDim.x, packs = bytes / 16;
  for (u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x; p < packs; p += T) {
    Pack v;
    v.u = ((const uint4*)src)[p];
    stVolatile(dst + p * 16, v);
  }
}

// SM stores, each block on its own contiguous share (the bulk copies' access pattern).
extern "C" __global__ void __launch_bounds__(512) hc_push_st_blk(const char* src, char* dst, u64 bytes) {
  const u64 per = bytes / gridDim.x, base = blockIdx.x * per;
  for (u64 o = threadIdx.x * 16ull; o < per; o += blockDim.x * 16ull) {
    Pack v;
    v.u = *(const uint4*)(src + base + o);
    stVolatile(dst + base + o, v);
  }
}

// Bulk copies: each block stages CH bytes at a time in shared memory (two buffers) and one
// thread sends them with cp.async.bulk to the peer.  The host makes bytes / gridDim.x a
// multiple of CH and launches 512 threads.
template <int CH>
__device__ __forceinline__ void pushTma(const char* src, char* dst, u64 bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ __align__(128) uint4 buf[2][CH / 16];
  const u64 per = bytes / gridDim.x, base = blockIdx.x * per;
  const int steps = (int)(per / CH);
  for (int s = 0; s < steps; ++s) {
    const int b = s & 1;
    if (s >= 2) {  // buffer b's copy of step s-2 must have read its source
      if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      __syncthreads();
    }
    for (int i = threadIdx.x; i < CH / 16; i += blockDim.x)
      buf[b][i] = *(const uint4*)(src + base + (u64)s * CH + i * 16ull);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic-proxy writes -> the copy's reads
    __syncthreads();
    if (threadIdx.x == 0) {
      const u32 sm = (u32)__cvta_generic_to_shared(&buf[b][0]);
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                   ::"l"(dst + base + (u64)s * CH), "r"(sm), "r"(CH) : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}
extern "C" __global__ void __launch_bounds__(512) hc_push_tma8k(const char* src, char* dst, u64 bytes) {
  pushTma<8192>(src, dst, bytes);
}
extern "C" __global__ void __launch_bounds__(512) hc_push_tma16k(const char* src, char* dst, u64 bytes) {
  pushTma<16384>(src, dst, bytes);
}
