// persistent.cu - the eager engine: one resident kernel per (communicator, dtype) that runs the
// host's blocking Allreduce calls without a kernel launch or a stream synchronize per call.
//
// Why: on the 2xH200 machine a blocking call made of a launch and a stream synchronize costs
// 13-14 us before any work is done (bench/NOTES.md), where the collective itself takes ~1.3 us.
// Here the kernel is already running.  The host posts a call into mapped host memory (the
// doorbell); one thread of block 0 polls it over PCIe and relays the call to the other blocks
// through device memory; the blocks run a one-shot LL Allreduce (collectives.cu, the same device
// code as the library's kernel), and every block writes its completion back into mapped host
// memory, where the host spins.
//
// Mapped host memory of one engine (written by the host, except `done`), three cache lines:
//   bell  [0, 8):    seq * 2 + changed        the doorbell: call `seq` is posted
//   desc  [64, 96):  { in, out, count, cmd }  the call, rewritten only when it differs from the
//                                             last one (then changed = 1)
//   done  [128, 136): byte b = low byte of the last call block b finished
// One poller and one polled word: bench/engine_lab.py measured a host-to-GPU-to-host round trip
// of 2.5 us with one thread polling one word, 8.5 us with one thread polling four words of a
// line the host was writing, and 32 us with four blocks doing so (the host's stores wait for the
// line while the GPU's reads keep taking it).  The host writes desc before bell (x86 stores are
// seen in order) and the poller's acquire load of bell orders its desc loads after it.
// Relay (device memory, per engine): { in, out, count, cmd, seq }: block 0 writes the call and
// then releases seq; the other blocks acquire it.  Block 0 leaving on a timeout releases
// HC_RELAY_DEAD instead, so that the others leave too (else they would wait for it forever, and
// so would the host's stop).  Every block handles every call in order, and
// the host posts call s+1 only after every block has finished call s, so the relay is never
// rewritten while a block still reads it.  A block whose poll timed out writes nothing more and
// leaves: the host sees the mapped error word instead.
//
// Memory ordering.  All data stays in device memory; the host only signals.
// - Before posting, the host waits until the caller's stream has completed (its kernels wrote
//   the input).  The acquire loads (doorbell, relay) invalidate the SM's L1 (no stale input
//   lines from an earlier call), and the block barrier orders every thread's loads after them.
// - After the Allreduce, the block barrier and a release fence by thread 0 make the block's
//   output stores performed in device memory before its completion byte leaves; later work
//   that reads the output (kernels, copies) reads device memory.
// - Between calls the LL slots need no fence: their flags are epochs, and one thread owns a slot
//   across calls (collectives.cu, oneShotLoopFence), as in the in-kernel loop.
#define HC_NO_ENTRY_POINTS 1
#include "collectives.cu"

#define HC_ENGINE_STOP 0xFF  // cmd: leave the loop; otherwise cmd = the reduction (HC_SUM..HC_MIN)
#define HC_RELAY_DEAD (~0ull)

struct EngineArgs {
  const u64* host;       // device address of the engine's mapped host memory (bell, desc, done)
  const u64* bell;       // the doorbell block 0 polls: host + 0 (mapped host memory, written by
                         // the host), or a word of device memory written by the caller's stream
                         // (cuStreamWriteValue64: hpccoll/_engine.py, doorbell "stream")
  u64* relay;            // device memory: { in, out, count, cmd, seq }
  u64 seq0;              // the last call posted before this launch
  u64 epoch0;            // epochs of the engine's region consumed by earlier launches
};

__device__ __forceinline__ u64 ldAcquireSys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u64 ldAcquireGpu(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u64 ldRelaxedSys(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void stReleaseGpu(u64* p, u64 v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void stRelaxedSysByte(unsigned char* p, u32 v) {
  asm volatile("st.relaxed.sys.global.u8 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Thread 0 of every block: the fields of call `seq` (block 0 from the host, the others from
// block 0's relay).  `cur`: this thread's copy of the last call's fields.
// False: block 0 has left (the call is not coming).
__device__ __forceinline__ bool awaitCall(const EngineArgs& g, u64 seq, u64 cur[4]) {
  if (blockIdx.x == 0) {
    u64 w;
    do w = ldAcquireSys(g.bell); while ((w >> 1) != seq);
    if (w & 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) cur[i] = ldRelaxedSys(g.host + 8 + i);  // desc, in flight together
    }
    if (gridDim.x > 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) g.relay[i] = cur[i];
      stReleaseGpu(g.relay + 4, seq);
    }
  } else {
    u64 v;
    while ((v = ldAcquireGpu(g.relay + 4)) != seq)
      if (v == HC_RELAY_DEAD) return false;
#pragma unroll
    for (int i = 0; i < 4; ++i) cur[i] = *(volatile u64*)(g.relay + i);
  }
  return true;
}

template <int OP>
__device__ __forceinline__ bool engineAllreduce(const Args& a, u64 e, bool ok) {
  const u64 packs = packsOf(a.count);
  const Pack first = loadFirst(a, packs);
  return allreduceOneShotFrom<LL, OP>(a, packs, first, e, ok);
}

extern "C" __global__ void __launch_bounds__(HC_MAX_THREADS) hc_engine(const Args a0, const EngineArgs g) {
  __shared__ u64 field[4];
  u64 cur[4] = {0, 0, 0, 0};  // thread 0's copy of the last call
  unsigned char* done = (unsigned char*)(g.host + 16);
  Args a = a0;  // in, out, count change per call; iters is 1
  for (u64 seq = g.seq0 + 1;; ++seq) {
    if (threadIdx.x == 0) {
      if (!awaitCall(g, seq, cur)) cur[3] = HC_ENGINE_STOP;
#pragma unroll
      for (int i = 0; i < 4; ++i) field[i] = cur[i];
    }
    __syncthreads();
    const u64 cmd = field[3];
    if (cmd == HC_ENGINE_STOP) return;
    a.in = (const void*)field[0];
    a.out = (void*)field[1];
    a.count = field[2];
    const u64 e = g.epoch0 + (seq - g.seq0 - 1);
    // No abort check up front (an L2 trip per call): a running engine's polls see the flag
    // within 256 spins, and a block that timed out has left.
    bool ok = true;
    switch ((int)cmd) {
      case HC_SUM: ok = engineAllreduce<HC_SUM>(a, e, ok); break;
      case HC_PROD: ok = engineAllreduce<HC_PROD>(a, e, ok); break;
      case HC_MAX: ok = engineAllreduce<HC_MAX>(a, e, ok); break;
      default: ok = engineAllreduce<HC_MIN>(a, e, ok); break;
    }
    ok = __syncthreads_and(ok);  // also: every thread of the block has stored its output and read `field`
    if (!ok) {                   // a poll timed out (or the communicator was aborted)
      if (blockIdx.x == 0 && threadIdx.x == 0) stReleaseGpu(g.relay + 4, HC_RELAY_DEAD);
      return;
    }
    if (threadIdx.x == 0) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      stRelaxedSysByte(done + blockIdx.x, (u32)(seq & 0xFF));
    }
  }
}
