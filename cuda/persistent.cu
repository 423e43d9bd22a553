// persistent.cu - the eager engine: one resident kernel per (communicator, dtype) that runs the
// host's blocking Allreduce calls without a kernel launch or a stream synchronize per call.
//
// Why: a blocking call made of a launch and a stream synchronize costs several times the
// collective itself before any work is done (docs/performance.md).  Here the kernel is already
// running.  The host posts a call by ringing the doorbells of the
// blocks it needs; each block's thread 0 polls its own, the blocks run a one-shot Allreduce (on
// sentinel slots for floating types, LL for integers; with two ranks a thread's packs kept in
// registers, else collectives.cu's loop), and each writes its completion into mapped host memory,
// where the host spins.
//
// Mapped host memory of one engine (written by the host, except `done`), one line per part:
//   bell b [64 b, 64 b + 8), b < 8:  seq32 << 32 | ver32    block b's doorbell: call seq is
//                                    posted to block b (ver: the version of desc, counted by the
//                                    host)
//   desc   [512, 544):  { in, out, count, cmd }  the call, rewritten only when it differs from
//                                                the last one
//   done   [576, 640):  u64 per block            the last call the block finished
// One poller per polled line: while GPU threads keep reading a line the host is writing, the
// host's stores wait for the line (a round trip grew several-fold with four pollers of one line).  The host writes desc before the bells (x86 stores
// are seen in order) and a poller's acquire load of its bell orders its desc loads after it.
//
// Which blocks a call needs: ceil(packs / (HC_ENGINE_PPT * blockDim)) of them (at least block
// 0), and the call's packs are spread over those blocks' threads only (hcCallBlocks); a call of
// <= 16 KiB is block 0's alone.  Past every block's HC_ENGINE_PPT packs, a call takes more packs
// per thread, up to HC_ENGINE_KEEP (start_persistent keeps max_bytes within that: 32 KiB a block).
// The host rings the bells of those blocks only and waits for their completions only (it
// computes the same count).  A bell is rung only for calls its block takes part in, and the host
// posts call s+1 only after every block of call s has finished it, so no desc or bell is
// rewritten while a block of the call still reads it.  A block whose poll timed out writes
// nothing more and leaves (the host sees the mapped error word); the host's stop rings every
// bell, so the blocks still waiting leave too.
// A block knows its last call (64 bits) and reads 32 bits of the next one's seq and of desc's
// version: exact while it is rung at least once every 2^32 calls.  So the host rings every block
// once every 2^30 calls (HC_ENGINE_FULL_RING); the blocks a call does not need do
// nothing but read its fields and finish it.
// Blocks that skip calls stay correct: the epoch comes from the call's seq, and the slot reuse
// argument (LL's epoch flags, the sentinel's re-arms) holds across skipped calls (block 0 takes
// part in every call, so the host cannot post call s+2 before every block of call s has
// finished it, on both ranks).
//
// Memory ordering.  All data stays in device memory; the host only signals.
// - Before posting, the host waits until the caller's stream has completed (its kernels wrote
//   the input), or the caller did (order "caller").  The bell's acquire load invalidates the
//   SM's L1 (no stale input lines from an earlier call), and the block barrier orders every
//   thread's loads after it.
// - After the Allreduce, the block barrier and a release fence by thread 0 make the block's
//   output stores performed in device memory before its completion word leaves; later work
//   that reads the output (kernels, copies) reads device memory.
// - Between calls the LL slots need no fence: their flags are epochs, and one thread owns a slot
//   across calls (collectives.cu, oneShotLoopFence), as in the in-kernel loop.  Sentinel
//   re-arms are ordered by the host's round trip (EngineProto below).
#define HC_NO_ENTRY_POINTS 1
// The blocks of the current call (blocksFor): the collective's threads are theirs alone, so
// that a call of up to HC_ENGINE_PPT packs per thread runs on fewer blocks.  Slot ownership may
// change from call to call: the host posts call s+1 only after every block of call s has
// finished it, so no read of call s is left when call s+1's sends leave (on either rank).
__shared__ unsigned hcCallBlocks;
#define HC_CALL_BLOCKS hcCallBlocks
#include "collectives.cu"

// The engine's constants and EngineArgs live in hc_abi.h (HC_ENGINE_*): the host reads them there.
#define HC_DESC HC_ENGINE_DESC
#define HC_DONE HC_ENGINE_DONE

// The blocks a call needs (the host's Engine.blocks_for computes the same).
__device__ __forceinline__ u64 blocksFor(u64 count, u64 cmd) {
  if (cmd == HC_ENGINE_STOP) return gridDim.x;
  const u64 per = (u64)HC_ENGINE_PPT * blockDim.x;
  const u64 need = (packsOf(count) + per - 1) / per;
  return need < 1 ? 1 : (need > gridDim.x ? gridDim.x : need);
}

// Thread 0: the next call this block takes part in, into field[0..4] = { in, out, count, cmd,
// seq }.  `cur`: the block's copy of the last desc it read, cur[4] that desc's ver32; `last`:
// the last call this block ran.  A new seq32 in its bell is a call for this block; desc is
// re-read when the bell's ver32 differs from the copy's.  The acquire orders the desc loads
// after the bell's.
__device__ __forceinline__ void awaitCall(const EngineArgs& g, u64 last, u64 cur[5], u64 field[5]) {
  u64 w;
  do w = ldAcquireSys(g.host + 8 * blockIdx.x); while ((u32)(w >> 32) == (u32)last);
  if ((u32)w != (u32)cur[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) cur[i] = ldRelaxedSys(g.host + HC_DESC + i);  // in flight together
    cur[4] = (u32)w;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) field[i] = cur[i];
  field[4] = last + (u32)((u32)(w >> 32) - (u32)last);  // the 64-bit seq after `last` with these low bits
}

// Two ranks: a thread's up to HC_ENGINE_KEEP packs stay in registers, loaded together, sent
// back to back, and polled in one sweep over all of them, so that their load and poll latencies
// overlap (collectives.cu's loop loads, sends and polls pack after pack: fine for a launch of a
// pack or two per thread, a round trip per pack for the engine's few blocks).  Each arrival is reduced at
// once, in rank order.
// The engine's slots: sentinel slots for floating types (payload only, 16 B a pack where LL
// takes 32; re-armed after reading), LL for integers.  The host fills an engine's region for
// its dtype before every start.  A re-arm is ordered before the peer's next write of its slot
// (two calls later, the same parity) by the host's round trip: the block's barrier and release
// before its completion word, the host's next post, and that call's sends, which the peer must
// receive before it writes the slot again.
#if HC_IS_FLOAT
using EngineProto = Sentinel;
#else
using EngineProto = LL;
#endif

template <int OP>
__device__ __forceinline__ bool engineKept(const Args& a, const Flat& io, u64 packs, Pack first, u64 e) {
  using P = EngineProto;
  constexpr int K = HC_ENGINE_KEEP;
  const u64 T = nthreads(), p0 = tid();
  const LLBuffer<P> buf(a, a.region, a.sub, e, HC_COLL_ALLREDUCE);
  Pack x[K];  // the own packs, then their results
  x[0] = first;
#pragma unroll
  for (int k = 1; k < K; ++k)
    if (p0 + k * T < packs) x[k] = io.load(p0 + k * T);
  u32 pending = 0;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (p0 + k * T < packs) {
      buf.bcast(p0 + k * T, x[k]);
      pending |= 1u << k;
    }
  const int peer = a.rank ^ 1;
  const char* slot = buf.mySlot(peer, p0);  // pack p0 + k * T at slot + at(k * T): T is a multiple of 32
  const u32 f = buf.flag;
  auto sweep = [&] {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (pending & (1u << k)) {
        Pack y;
        const char* s = slot + P::at(k * T);
        if (P::readOnce(s, f, y)) {  // reduced at once, in rank order
          LLBuffer<P>::rearm(s);
          x[k] = a.rank == 0 ? combinePack<OP>(x[k], y) : combinePack<OP>(y, x[k]);
          pending &= ~(1u << k);
        }
      }
    return pending == 0;
  };
  if (!boundedPoll(a, HC_COLL_ALLREDUCE, [&] { return peer; }, p0, sweep)) return false;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (p0 + k * T < packs) io.store(p0 + k * T, x[k]);
  return true;
}

template <int OP>
__device__ __forceinline__ bool engineAllreduce(const Args& a, u64 e, bool ok) {
  const Flat io{a};
  const u64 packs = io.packs();
  const Pack first = loadFirst(io, packs);
  // (start_persistent keeps a call within HC_ENGINE_KEEP packs per thread of the whole grid)
  if (nranksOf(a) == 2) return engineKept<OP>(a, io, packs, first, e);
  return allreduceOneShotFrom<EngineProto, OP>(a, io, packs, first, e, ok);
}

extern "C" __global__ void __launch_bounds__(HC_MAX_THREADS) hc_engine(const Args a0, const EngineArgs g) {
  __shared__ u64 field[5];
  // The call's Args in shared memory: in, out, count change per call, and the collective reads
  // peers[] with a run-time index.  A copy in registers would go to local memory (that index),
  // which lives in L1, and every call begins with an acquire that invalidates L1: each of those
  // reads would be an L2 trip on the critical path.  Shared memory is not invalidated.
  __shared__ Args a;
  u64 cur[5] = {0, 0, 0, 0, 0};  // thread 0: the last desc read from the host, its ver32
  u64 last = g.seq0;             // the last call this block ran
  u64* done = (u64*)(g.host + HC_DONE);
  if (threadIdx.x == 0) a = a0;  // iters is 1
  for (;;) {
    if (threadIdx.x == 0) {
      awaitCall(g, last, cur, field);
      a.in = (const void*)field[0];
      a.out = (void*)field[1];
      a.count = field[2];
      hcCallBlocks = (unsigned)blocksFor(field[2], field[3]);
    }
    __syncthreads();
    const u64 cmd = field[3], seq = field[4];
    if (cmd == HC_ENGINE_STOP) return;
    last = seq;
    const u64 e = g.epoch0 + (seq - g.seq0 - 1);
    // No abort check up front (an L2 trip per call): a running engine's polls see the flag
    // within 256 spins, and a block that timed out has left.
    bool ok = true;
    if (blockIdx.x < hcCallBlocks) {  // (a block past them: rung by the host's periodic full ring)
      switch ((int)cmd) {
        case HC_SUM: ok = engineAllreduce<HC_SUM>(a, e, ok); break;
        case HC_PROD: ok = engineAllreduce<HC_PROD>(a, e, ok); break;
        case HC_MAX: ok = engineAllreduce<HC_MAX>(a, e, ok); break;
        default: ok = engineAllreduce<HC_MIN>(a, e, ok); break;
      }
    }
    ok = __syncthreads_and(ok);  // also: every thread of the block has stored its output and read `field`
    if (!ok) return;             // a poll timed out (or the communicator was aborted)
    if (threadIdx.x == 0) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      stRelaxedSys(done + blockIdx.x, seq);
    }
  }
}
