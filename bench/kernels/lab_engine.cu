// lab_engine.cu - bench/engine_lab.py: what a round trip through mapped host memory costs on this
// machine, the eager engine's (persistent.cu) signalling path without the collective.  Not used
// by the library.
#include "hc_common.cuh"

// One thread: n dependent loads of a mapped host word (each address depends on the last value);
// out[0] = ns per load.
extern "C" __global__ void hc_lab_sysread(const u64* host, int n, u64* out) {
  u64 v = 0;
  const u64 t0 = globaltimer();
  for (int i = 0; i < n; ++i) v = ldRelaxedSys(host + (v & 1));
  const u64 t1 = globaltimer();
  out[0] = (t1 - t0) / (u64)n;
  out[1] = v;
}

// Echo: block b's thread 0 waits until the host's words in[0..loads-1] all hold i, then (after a
// gpu-scope fence when `fence`) writes i into byte b of the host word `done` (bytes=1) or into
// done[b] (bytes=8).  The host times i = 1..n round trips.  in[8] = 0 stops the kernel.
extern "C" __global__ void hc_lab_echo(const u64* in, u64* done, int n, int loads, int fence, int bytes) {
  if (threadIdx.x != 0) return;
  for (int i = 1; i <= n; ++i) {
    for (;;) {
      bool all = true;
      u64 w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = k < loads ? ldRelaxedSys(in + k) : (u64)i;
#pragma unroll
      for (int k = 0; k < 4; ++k) all = all && w[k] == (u64)i;
      if (all) break;
    }
    if (fence) asm volatile("fence.acq_rel.gpu;" ::: "memory");
    if (bytes == 1)
      asm volatile("st.relaxed.sys.global.u8 [%0], %1;" ::"l"((unsigned char*)done + blockIdx.x), "r"((u32)i & 0xFF)
                   : "memory");
    else
      stRelaxedSys(done + blockIdx.x, (u64)i);
  }
}
