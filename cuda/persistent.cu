// persistent.cu - the eager engine: one resident kernel per (communicator, dtype) that runs the
// host's blocking Allreduce calls without a kernel launch or a stream synchronize per call.
//
// Why: on the 2xH200 machine a blocking call made of a launch and a stream synchronize costs
// 13-14 us before any work is done (bench/NOTES.md), where the collective itself takes ~1.3 us.
// Here the kernel is already running.  The host posts a call (the doorbell); thread 0 of block 0
// polls it, relays it to the other blocks the call needs, the blocks run a one-shot Allreduce
// (on sentinel slots for floating types, LL for integers; with two ranks a thread's packs kept
// in registers, else collectives.cu's loop), and each writes its completion into mapped host
// memory, where the host spins.
//
// Mapped host memory of one engine (written by the host, except `done`), one line per part:
//   bell  [0, 8):     seq * 2 + changed        the doorbell ("host" doorbell): call seq is posted
//   (bells [64 b, 64 b + 8), b < 8:            HC_ENGINE_BELLS, a lab variant: a doorbell per
//                     seq32 << 32 | dseq32     block, rung for the blocks the call needs; dseq:
//                                              the call at which desc was last rewritten)
//   desc  [512, 544): { in, out, count, cmd }  the call, rewritten only when it differs from the
//                                              last one (then changed = 1)
//   done  [576, 640): u64 per block            the last call the block finished
// ("stream" doorbell: the bell word is in device memory, written by the caller's stream.)
// One poller and one polled word: bench/engine_lab.py measured a host-to-GPU-to-host round trip
// of 2.5 us with one thread polling one word, 8.5 us with one thread polling four words of a
// line the host was writing, and 27-42 us with four blocks doing so (the host's stores wait for
// the line while the GPU's reads keep taking it).  The host writes desc before bell (x86 stores
// are seen in order) and the poller's acquire load of bell orders its desc loads after it.
//
// Which blocks a call needs: ceil(packs / (HC_ENGINE_PPT * blockDim)) of them (at least block
// 0), and the call's packs are spread over those blocks' threads only (hcCallBlocks); a call of
// <= 16 KiB is block 0's alone.  Past every block's HC_ENGINE_PPT packs, a call takes more packs
// per thread, up to HC_ENGINE_KEEP (start_persistent keeps max_bytes within that: 32 KiB a block).
// Block 0 relays a call to each block b it needs through b's own relay slot in device memory:
// six LL words (seq32 << 32 | 32 bits of a field: in, out, count (< 2^32: max_bytes <= 256 KiB),
// cmd), so that each word says which call its half-field belongs to and the words need no order
// among themselves.
// Thread b of block 0 writes them after a fence (the release), block b polls all six until they
// carry one new seq, then fences (the acquire).  A slot is written only for
// calls its block takes part in, and the host posts call s+1 only after every block of call s
// has finished it, so a slot is never rewritten while its block reads it.  The host waits for
// the blocks the call needs only (it computes the same count).  Block 0 leaving on a timeout
// releases HC_RELAY_DEAD into word 5 of every slot, so that the other blocks (and the host's
// stop) do not wait for it forever; a block whose poll timed out writes nothing more and leaves:
// the host sees the mapped error word instead.
// Blocks that skip calls stay correct: the epoch comes from the call's seq, and the slot reuse
// argument (LL's epoch flags, the sentinel's re-arms) holds across skipped calls (block 0 takes
// part in every call, so the host cannot post call s+2 before every block of call s has
// finished it, on both ranks).
//
// Memory ordering.  All data stays in device memory; the host only signals.
// - Before posting, the host waits until the caller's stream has completed (its kernels wrote
//   the input).  The doorbell's acquire load and the relay's acquire fence invalidate the SM's
//   L1 (no stale input lines from an earlier call), and the block barrier orders every thread's
//   loads after them.
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

#define HC_ENGINE_STOP 0xFF  // cmd: leave the loop; otherwise cmd = the reduction (HC_SUM..HC_MIN)
#define HC_RELAY_DEAD (~0ull)

// HC_ENGINE_RELAY_FENCE=0 (bench/engine_lab.py variant "nofence"; 1 in the library): the relay
// without the release fence before its stores (formally unordered; the lab's measure of the fence).
#ifndef HC_ENGINE_RELAY_FENCE
#define HC_ENGINE_RELAY_FENCE 1
#endif

// Packs per thread before a call takes another block (hpccoll/_engine.py PACKS_PER_THREAD), and
// the most a thread keeps (PACKS_KEPT).  2xH200, bench/engine_lab.py at 69d8881 (the kept path,
// LL slots per warp, the LL-word relay; Engine.call, order "caller"), 4-block engine: 4 KiB
// 4.9-5.1 us, 16 KiB 5.9-6.1 (one block), 32 KiB 7.0-7.1 (two), 64 KiB 7.5-7.6 (four); 2 packs
// per thread before another block beat 4 at 64 KiB (8.1 on two blocks) and tied at 32 KiB.
// The loop before (pack after pack, about 1.1 us per pack per thread on one block; 32-byte
// strided LL slots; a released seq word) took 5.4, 6.2-6.3, 7.5 and 8.5 us in the same run.
#ifndef HC_ENGINE_PPT
#define HC_ENGINE_PPT 2
#endif
// HC_ENGINE_BELLS=1 (bench/engine_lab.py variant "bells"; 0 in the library): every block polls a
// doorbell of its own (its own line of mapped host memory, one poller per line), which the host
// rings for the blocks a call needs: no relay through device memory.  Host doorbell only.
#ifndef HC_ENGINE_BELLS
#define HC_ENGINE_BELLS 0
#endif
// HC_ENGINE_BELL_SLEEP=ns (lab): blocks other than 0 sleep that long between polls of their bell
// (fewer PCIe reads in flight from blocks a call may not need).
#ifndef HC_ENGINE_BELL_SLEEP
#define HC_ENGINE_BELL_SLEEP 0
#endif
#define HC_DESC 64  // u64 offsets into the engine's host memory (the layout above)
#define HC_DONE 72
#define HC_ENGINE_KEEP 4

struct EngineArgs {
  const u64* host;       // device address of the engine's mapped host memory (bell, desc, done)
  const u64* bell;       // the doorbell block 0 polls: host + 0 (mapped host memory, written by
                         // the host), or a word of device memory written by the caller's stream
                         // (cuStreamWriteValue64: hpccoll/_engine.py, doorbell "stream")
  u64* relay;            // device memory: 8 u64 per block, six LL words of the call
                         // (block 0's unused, but for the "stream" doorbell's word at [6])
  u64 seq0;              // the last call posted before this launch
  u64 epoch0;            // epochs of the engine's region consumed by earlier launches
};

// The blocks a call needs (the host's Engine.blocks_for computes the same).
__device__ __forceinline__ u64 blocksFor(u64 count, u64 cmd) {
  if (cmd == HC_ENGINE_STOP) return gridDim.x;
  const u64 per = (u64)HC_ENGINE_PPT * blockDim.x;
  const u64 need = (packsOf(count) + per - 1) / per;
  return need < 1 ? 1 : (need > gridDim.x ? gridDim.x : need);
}

// Thread 0: the next call this block takes part in, into field[0..4] = { in, out, count, cmd,
// seq }.  `cur`: the block's copy of the last desc it read (block 0's, or with HC_ENGINE_BELLS
// every block's, cur[4]: that desc's dseq32); `last`: the last call this block ran.
__device__ __forceinline__ void awaitCall(const EngineArgs& g, u64 last, u64 cur[5], u64 field[5]) {
  if (HC_ENGINE_BELLS) {
    // Its own bell: a new seq32 is a call for this block (the host rings only the blocks a call
    // needs, and posts the next call after they all finished); desc is re-read when its dseq32
    // differs from the copy's.  The acquire orders the desc loads after the bell's.
    u64 w;
    for (;;) {
      w = ldAcquireSys(g.bell + 8 * blockIdx.x);
      if ((u32)(w >> 32) != (u32)last) break;
      if (HC_ENGINE_BELL_SLEEP && blockIdx.x) __nanosleep(HC_ENGINE_BELL_SLEEP);
    }
    if ((u32)w != (u32)cur[4]) {
#pragma unroll
      for (int i = 0; i < 4; ++i) cur[i] = ldRelaxedSys(g.host + HC_DESC + i);
      cur[4] = (u32)w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) field[i] = cur[i];
    field[4] = last + (u32)((u32)(w >> 32) - (u32)last);
    return;
  }
  if (blockIdx.x == 0) {
    const u64 seq = last + 1;  // block 0 takes part in every call
    u64 w;
    do w = ldAcquireSys(g.bell); while ((w >> 1) != seq);
    if (w & 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) cur[i] = ldRelaxedSys(g.host + HC_DESC + i);  // in flight together
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) field[i] = cur[i];
    field[4] = seq;
    return;
  }
  const u64* slot = g.relay + 8 * blockIdx.x;
  // Six words (seq32 << 32 | 32 bits of a field), each single-copy atomic: polled until all
  // carry one seq that is not `last`'s; the fence after the relaxed loads is the acquire.
  u64 w[6];
  for (;;) {
#pragma unroll
    for (int i = 0; i < 6; i += 2)
      asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[i]), "=l"(w[i + 1]) : "l"(slot + i) : "memory");
    if (w[5] == HC_RELAY_DEAD) {
      field[3] = HC_ENGINE_STOP;
      return;
    }
    const u32 s = (u32)(w[5] >> 32);
    bool same = s != (u32)last;
#pragma unroll
    for (int i = 0; i < 5; ++i) same = same && (u32)(w[i] >> 32) == s;
    if (same) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      field[0] = (w[0] & 0xFFFFFFFFull) | (w[1] << 32);
      field[1] = (w[2] & 0xFFFFFFFFull) | (w[3] << 32);
      field[2] = w[4] & 0xFFFFFFFFull;
      field[3] = w[5] & 0xFFFFFFFFull;
      field[4] = last + (u32)(s - (u32)last);  // seq: the 64-bit value after `last` with these low bits
      return;
    }
  }
}

// Two ranks: a thread's up to HC_ENGINE_KEEP packs stay in registers, loaded together, sent
// back to back, and polled in one sweep over all of them, so that their load and poll latencies
// overlap (collectives.cu's loop loads, sends and polls pack after pack: fine for a launch of a
// pack or two per thread, about 1.1 us per pack per thread here).  Each arrival is reduced at
// once, in rank order.
// The engine's slots: sentinel slots for floating types (payload only, 16 B a pack where LL
// takes 32; re-armed after reading), LL for integers.  The host fills an engine's region for
// its dtype before every start (backends/cuda.py start_engine).  A re-arm is ordered before the
// peer's next write of its slot (two calls later, the same parity) by the host's round trip:
// the block's barrier and release before its completion word, the host's next post, and that
// call's sends, which the peer must receive before it writes the slot again.  2xH200, engine_lab
// at 595677b (4-block engine, Engine.call, pass 0 / 1): sentinel 16 KiB 5.96 / 6.20 us, 32 KiB
// 7.36 / 7.50, 64 KiB 7.61 / 8.18, 128 KiB 8.62 / 9.28; LL 6.42 / 7.03, 8.19 / 8.31, 8.55 / 8.53,
// 9.85 / 9.88.  HC_ENGINE_SENTINEL=0 (engine_lab variant "ll") builds the LL engine for floats.
#ifndef HC_ENGINE_SENTINEL
#define HC_ENGINE_SENTINEL 1
#endif
#if HC_ENGINE_SENTINEL && HC_IS_FLOAT
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
  u64 cur[5] = {0, 0, 0, 0, 0};  // thread 0: the last desc read from the host (block 0's)
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
    if (!HC_ENGINE_BELLS && blockIdx.x == 0 && threadIdx.x >= 1 && threadIdx.x < hcCallBlocks) {
      u64* slot = g.relay + 8 * threadIdx.x;  // thread b relays the call to block b
      const u64 hi = (u64)(u32)seq << 32;
      const u64 w[6] = {hi | (u32)field[0], hi | (u32)(field[0] >> 32), hi | (u32)field[1],
                        hi | (u32)(field[1] >> 32), hi | (u32)field[2], hi | (u32)field[3]};
      if (HC_ENGINE_RELAY_FENCE) asm volatile("fence.acq_rel.gpu;" ::: "memory");  // the release
#pragma unroll
      for (int i = 0; i < 6; i += 2)
        asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(slot + i), "l"(w[i]), "l"(w[i + 1]) : "memory");
    }
    if (cmd == HC_ENGINE_STOP) return;
    last = seq;
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
      if (!HC_ENGINE_BELLS && blockIdx.x == 0 && threadIdx.x >= 1 && threadIdx.x < gridDim.x)
        stReleaseGpu(g.relay + 8 * threadIdx.x + 5, HC_RELAY_DEAD);
      return;
    }
    if (threadIdx.x == 0) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      stRelaxedSys(done + blockIdx.x, seq);
    }
  }
}
