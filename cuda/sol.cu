// sol.cu - microbenchmarks for the speed-of-light model of the paper:
//   SoL = 2 * L_L2_RTT + (L_pingpong - 2 * L_L2_RTT) / 2
// L_L2_RTT: latency of one __threadfence(); L_pingpong: GPU<->GPU flag round trip.
#include "hc_common.cuh"

// Average ns of one __threadfence() (one thread, `iters` in a row).
extern "C" __global__ void hc_sol_fence(u64* out, int iters) {
  const u64 t0 = globaltimer();
  for (int i = 0; i < iters; ++i) __threadfence();
  out[0] = (globaltimer() - t0);
}

// Flag ping-pong between rank 0 and rank 1 (one thread each): rank 0 writes i into rank 1's
// word and waits for i back in its own.  out[0] = total ns on rank 0 for `iters` round trips.
// Volatile store / poll: the same instructions the protocols use.
extern "C" __global__ void hc_sol_pingpong(const Args a, u64* out) {
  const u64 off = HC_OFF_PINGPONG;
  volatile u64* mine = (volatile u64*)(a.peers[a.rank] + off);
  volatile u64* theirs = (volatile u64*)(a.peers[1 - a.rank] + off);
  const u64 base = *mine;  // both words hold the same count from the previous run
  const u64 t0 = globaltimer();
  for (int i = 1; i <= a.iters; ++i) {
    const u64 v = base + i;
    if (a.rank == 0) {
      *theirs = v;
      for (u64 n = 0; *mine < v; ++n) if ((n & 0xFFFFF) == 0 && globaltimer() - t0 > a.timeoutNs) return;
    } else {
      for (u64 n = 0; *mine < v; ++n) if ((n & 0xFFFFF) == 0 && globaltimer() - t0 > a.timeoutNs) return;
      *theirs = v;
    }
  }
  out[0] = globaltimer() - t0;
}

// The kernel boundary, for the graph column's floor: replayed back to back in a CUDA graph,
// these cost per launch what no collective launched once per op can go below.
// hc_sol_empty: the collectives' entry (streamOrderBegin) and nothing else.
extern "C" __global__ void hc_sol_empty(const Args a) { streamOrderBegin(); }

// hc_sol_store: the same plus one volatile store into the next rank's scratch word, so the
// grid cannot complete before an NVLink store is acknowledged (a collective's last sends).
extern "C" __global__ void hc_sol_store(const Args a) {
  streamOrderBegin();
  if (threadIdx.x == 0)
    *(volatile u64*)(a.peers[(a.rank + 1) % a.nranks] + HC_OFF_FLOOR) = (u64)a.iters;
}
