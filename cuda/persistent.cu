// persistent.cu - the eager engine: one resident kernel per (communicator, dtype) that runs the
// host's blocking Allreduce calls without a kernel launch or a stream synchronize per call.
//
// Why: on the 2xH200 machine a blocking call made of a launch and a stream synchronize costs
// 13-14 us before any work is done (bench/NOTES.md), where the collective itself takes ~1.3 us.
// Here the kernel is already running.  The host posts a call into mapped host memory (the
// doorbell); one thread per block polls it over PCIe, the blocks run a one-shot LL Allreduce
// (collectives.cu, the same device code as the library's kernel), and every block writes its
// completion back into mapped host memory, where the host spins.
//
// The doorbell: four u64 words of pinned, mapped host memory, written by the host only:
//   { in, out, count, cmd }, each with the call's 16-bit sequence tag in bits 48-63.
// An aligned 8-byte load is single-copy atomic, so a word whose tag matches the call holds that
// call's field, whatever order the words arrive in.  The host rewrites all four words for every
// call, and posts call s+1 only after every block has finished call s (so after every block has
// read s's words): a matching tag can never be 65536 calls old.
// Completion: byte b of `done` is the low byte of the last call block b finished.  A block whose
// poll timed out writes nothing more and leaves: the host sees the mapped error word instead.
//
// Memory ordering.  All data stays in device memory; the host only signals.
// - Before posting, the host waits until the caller's stream has completed (its kernels wrote
//   the input).  After seeing the doorbell, the polling thread's acquire fence invalidates its
//   SM's L1 (no stale input lines from an earlier call), and the block barrier orders every
//   thread's loads after it.
// - After the Allreduce, the block barrier and a release fence by thread 0 make the block's
//   output stores performed in device memory before its completion byte leaves; later work
//   that reads the output (kernels, copies) reads device memory.
// - Between calls the LL slots need no fence: their flags are epochs, and one thread owns a slot
//   across calls (collectives.cu, oneShotLoopFence), as in the in-kernel loop.
// gpu scope suffices for both fences: the data's writers and readers are all on this GPU (or
// its peers, ordered by the LL flags), and the mapped words are single-copy atomic on their own.
#define HC_NO_ENTRY_POINTS 1
#include "collectives.cu"

#define HC_TAG_SHIFT 48
#define HC_FIELD_MASK ((1ull << HC_TAG_SHIFT) - 1)
#define HC_ENGINE_STOP 0xFF  // cmd: leave the loop; otherwise cmd = the reduction (HC_SUM..HC_MIN)

struct EngineArgs {
  const u64* bell;       // device address of the mapped doorbell words
  unsigned char* done;   // device address of the mapped completion bytes, one per block
  u64 seq0;              // the last call posted before this launch
  u64 epoch0;            // epochs of the engine's region consumed by earlier launches
};

__device__ __forceinline__ u64 ldRelaxedSys(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void stRelaxedSysByte(unsigned char* p, u32 v) {
  asm volatile("st.relaxed.sys.global.u8 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Thread 0: wait for call `seq`'s four words, then acquire.
__device__ __forceinline__ void awaitCall(const EngineArgs& g, u64 seq, u64 field[4]) {
  const u64 tag = seq & 0xFFFFull;
  u64 w[4];
  for (;;) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = ldRelaxedSys(g.bell + i);  // four loads in flight together
    bool all = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) all = all && (w[i] >> HC_TAG_SHIFT) == tag;
    if (all) break;
  }
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
#pragma unroll
  for (int i = 0; i < 4; ++i) field[i] = w[i] & HC_FIELD_MASK;
}

template <int OP>
__device__ __forceinline__ bool engineAllreduce(const Args& a, u64 e, bool ok) {
  const u64 packs = packsOf(a.count);
  const Pack first = loadFirst(a, packs);
  return allreduceOneShotFrom<LL, OP>(a, packs, first, e, ok);
}

extern "C" __global__ void __launch_bounds__(HC_MAX_THREADS) hc_engine(const Args a0, const EngineArgs g) {
  __shared__ u64 field[4];
  Args a = a0;  // in, out, count change per call; iters is 1
  for (u64 seq = g.seq0 + 1;; ++seq) {
    if (threadIdx.x == 0) awaitCall(g, seq, field);
    __syncthreads();
    const u64 cmd = field[3];
    if (cmd == HC_ENGINE_STOP) return;
    a.in = (const void*)field[0];
    a.out = (void*)field[1];
    a.count = field[2];
    const u64 e = g.epoch0 + (seq - g.seq0 - 1);
    bool ok = !aborted(a);
    switch ((int)cmd) {
      case HC_SUM: ok = engineAllreduce<HC_SUM>(a, e, ok); break;
      case HC_PROD: ok = engineAllreduce<HC_PROD>(a, e, ok); break;
      case HC_MAX: ok = engineAllreduce<HC_MAX>(a, e, ok); break;
      default: ok = engineAllreduce<HC_MIN>(a, e, ok); break;
    }
    ok = __syncthreads_and(ok);  // also: every thread of the block has stored its output and read `field`
    if (!ok) return;             // a poll timed out (or the communicator was aborted)
    if (threadIdx.x == 0) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      stRelaxedSysByte(g.done + blockIdx.x, (u32)(seq & 0xFF));
    }
  }
}
