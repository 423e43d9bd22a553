// ll_buffer.cuh - LLBuffer<Proto>: the device API every collective is written on.
//
// A region of the symmetric workspace, identical in layout on every rank:
//
//   region + ((epoch & 1) * nranks + src) * sub  ->  slots written by rank `src` into the
//                                                   region's owner, for epochs of that parity
//
// Primitives (slot = index of a 16-byte pack inside a (parity, src) sub-buffer):
//   send(peer, slot, v)        store v into peer's sub-buffer for src = me
//   bcast(slot, v)             send to every peer with unicast stores (there is deliberately
//                              no NVLink-multicast path: multicast is forbidden on our machines)
//   recv(src, slot, v[, then]) poll my sub-buffer of src until valid, then re-arm it
//   recvReduce<OP>(slot, own, acc[, then])
//                              receive from every peer and reduce in FIXED RANK ORDER
//                              (own contribution taken at position `rank`): every rank computes
//                              the same expression tree, so every rank gets the same bits;
//                              `then()` runs once the data is in and re-armed, before the
//                              reduction (where a loop sends its next collective early)
//   reset(src, slot) / resetRange(src, start, count, stride)
//                              re-arm slots (the protocol's clear)
//   epoch / advance: see epochBegin / epochEnd
//
// Epochs and the double buffering ("the data is the credit"):
// - Each block reads its counter epochs[blockIdx.x] (our own control region, device memory)
//   at start and writes epoch+used at the end (used = iters, or iters x chunks for Allgather); block 0 also writes that value into the
//   counters of blocks beyond gridDim.x, so all HC_MAX_BLOCKS counters always hold the number
//   of collectives issued on this communicator - whatever grid each launch used, and under
//   CUDA-graph replay too (no epoch is ever a host argument).
// - Parity (epoch & 1) picks the sub-buffer.  A peer can run at most one collective ahead of
//   us: its collective e+1 needs our data of e+1, which we send only after finishing e.  So a
//   peer writing epoch e+2 into the parity we read at e proves we are done with e; our re-arm
//   stores of e completed at kernel end, before our e+1 sends (stream order).  No barrier.
//   This needs every collective to make a rank that finishes e hear (directly or through a
//   rank that waited for us) from every peer at e: true of Allreduce, Allgather, Reduce-
//   scatter and Barrier; Bcast gets it from arrival words (bcastLL in collectives.cu).
// - Every poll is bounded: after timeoutNs it records (collective, peer, slot) in the error
//   record, raises the abort flag (every other poll then gives up within 256 spins), and
//   writes the mapped host word so the host can raise CollectiveTimeout.
#pragma once
#include "hc_common.cuh"

__device__ __forceinline__ u64* ctrlEpochs(const Args& a) { return (u64*)(a.peers[a.rank] + HC_OFF_EPOCHS); }
__device__ __forceinline__ int* ctrlAbort(const Args& a) { return (int*)(a.peers[a.rank] + HC_OFF_ABORT); }

__device__ __forceinline__ u64 epochBegin(const Args& a) {
  return *(volatile u64*)(ctrlEpochs(a) + blockIdx.x);
}

// `used`: the epochs this launch consumed (iters collectives; Allgather: iters x its chunks).
__device__ __forceinline__ void epochEnd(const Args& a, u64 epoch, u64 used) {
  __syncthreads();  // every thread of the block has read its epoch
  u64* ep = ctrlEpochs(a);
  const u64 next = epoch + used;
  if (threadIdx.x == 0) ep[blockIdx.x] = next;
  if (blockIdx.x == 0)
    for (int j = gridDim.x + threadIdx.x; j < HC_MAX_BLOCKS; j += blockDim.x) ep[j] = next;
}

__device__ __forceinline__ bool aborted(const Args& a) { return ldVolatileInt(ctrlAbort(a)) != 0; }

// Record a timeout (first one wins) and tell everyone to give up.  Takes the control region
// and the host word by value, never `const Args&`: the address of a kernel parameter in a
// non-inlined call would make every kernel copy its Args into a local-memory stack frame.
__device__ __noinline__ void failTimeoutAt(char* ctrl, volatile int* hostErr, int coll, int peer, u64 slot,
                                           u64 waited) {
  ErrRec* e = (ErrRec*)(ctrl + HC_OFF_ERR);
  if (atomicCAS(&e->code, 0, 1) == 0) {
    e->collective = coll;
    e->peer = peer;
    e->slot = slot;
    e->waitedNs = waited;
    // No fence: the host reads this record only after synchronizing with the kernel, and
    // kernel completion makes it visible.  The host word only says "look".
    *hostErr = coll;
  }
  *(volatile int*)(ctrl + HC_OFF_ABORT) = 1;
}

__device__ __forceinline__ void failTimeout(const Args& a, int coll, int peer, u64 slot, u64 waited) {
  failTimeoutAt(a.peers[a.rank], a.hostErr, coll, peer, slot, waited);
}

// Poll `ready()` until true; false when timed out or aborted.  The timer and the abort flag
// are read every 256 spins only, so the fast path is the bare poll.
// The clock starts at the first 256-spin check, not at the first miss: a data word that
// arrives within ~256 polls (the common case) never pays for a %globaltimer read.
template <class Ready, class Peer>
__device__ __forceinline__ bool boundedPoll(const Args& a, int coll, Peer peer, u64 slot, Ready ready) {
  u64 t0 = 0;
  for (u32 n = 1;; ++n) {
    if (ready()) return true;
    if ((n & 255u) == 0) {
      if (aborted(a)) return false;
      const u64 now = globaltimer();
      if (t0 == 0) t0 = now;
      const u64 dt = now - t0;
      if (dt > a.timeoutNs) {
        failTimeout(a, coll, peer(), slot, dt);
        return false;
      }
    }
  }
}

template <class Proto>
struct LLBuffer {
  const Args& a;
  u64 sub;
  u32 flag;
  int coll;
  // Computed once per buffer, outside every loop and poll: my sub-buffers of this parity
  // (src 0's slot 0) and the offset of my sub-buffer in every peer.  My slot of src =
  // mine + src * sub + at(slot); peer's slot of mine = peers[peer] + sendOff + at(slot).
  // Why: peers[] indexed with a run-time rank inside every poll sweep (an 8-way predicated
  // sweep even for 2 ranks) doubles the in-kernel time of a small collective.
  // `pair`: with two ranks, the peer's sub-buffer for me, so that a send is an add and its
  // stores (the peer's base is a constant-bank load indexed by our rank, itself a load).
  char* mine;
  u64 sendOff;
  char* pair;

  __device__ LLBuffer(const Args& args, u64 regionOff, u64 subBytes, u64 ep, int collective)
      : a(args), sub(subBytes), flag(llFlag(ep)), coll(collective) {
    const u64 par = (ep & 1) * (u64)nranksOf(args);
    mine = args.peers[args.rank] + regionOff + par * subBytes;
    sendOff = regionOff + (par + (u64)args.rank) * subBytes;
    pair = args.peers[args.rank ^ 1] + sendOff;  // (used only when nranks == 2)
    asm volatile("" : "+l"(pair));  // computed here: the compiler would redo both loads at each send
  }

  __device__ __forceinline__ char* mySlot(int src, u64 slot) const {
    return mine + (u64)src * sub + Proto::at(slot);
  }

  __device__ __forceinline__ void send(int peer, u64 slot, Pack v) const {
    Proto::write(a.peers[peer] + sendOff + Proto::at(slot), v, flag);
  }

  __device__ __forceinline__ void bcast(u64 slot, Pack v) const {
    if (nranksOf(a) == 2) {  // the common case: one peer, no loop
      Proto::write(pair + Proto::at(slot), v, flag);
      return;
    }
#pragma unroll
    for (int k = 1; k < HC_MAX_RANKS; ++k) {
      if (k >= nranksOf(a)) break;
      int peer = a.rank + k;
      peer -= peer >= nranksOf(a) ? nranksOf(a) : 0;  // stagger targets so ranks don't all hit rank 0 first
      send(peer, slot, v);
    }
  }

  __device__ __forceinline__ void reset(int src, u64 slot) const { Proto::clear(mySlot(src, slot)); }

  // A slot just read, back to its idle state (the receive side's one place for it).
  __device__ __forceinline__ static void rearm(const char* slot) {
    Proto::clear((char*)slot);
  }

  __device__ __forceinline__ void resetRange(int src, u64 start, u64 count, u64 stride) const {
    for (u64 i = 0; i < count; ++i) reset(src, start + i * stride);
  }

  // Poll my sub-buffer of `src` until valid; re-arm it; then run `then()` (see recvReduce).
  // False on timeout/abort.
  template <class Then>
  __device__ __forceinline__ bool recv(int src, u64 slot, Pack& v, Then then) const {
    const char* p = mySlot(src, slot);
    const u32 f = flag;
    if (!boundedPoll(a, coll, [&] { return src; }, slot, [&] { return Proto::readOnce(p, f, v); })) return false;
    rearm(p);
    then();
    return true;
  }
  __device__ __forceinline__ bool recv(int src, u64 slot, Pack& v) const { return recv(src, slot, v, [] {}); }

  // Receive slot `slot` from every peer, reduce in rank order 0..nranks-1 with `own` at
  // position rank.  Two ranks: one direct poll.  More: all peers polled in one sweep so their
  // latencies overlap.  `then()` runs once every peer's data is in and re-armed, before the
  // reduction: where the next collective's sends may leave (allreduceOneShotKept), they leave
  // there, off the reduction's and the result store's path.
  template <int OP, class Then>
  __device__ __forceinline__ bool recvReduce(u64 slot, Pack own, Pack& acc, Then then) const {
    const u32 f = flag;
    if (nranksOf(a) == 2) {
      const int peer = a.rank ^ 1;
      Pack v;
      if (!recv(peer, slot, v, then)) return false;
      acc = a.rank == 0 ? combinePack<OP>(own, v) : combinePack<OP>(v, own);
      return true;
    }
    Pack v[HC_MAX_RANKS];
    u32 pending = 0;
#pragma unroll
    for (int r = 0; r < HC_MAX_RANKS; ++r)
      if (r < nranksOf(a) && r != a.rank) pending |= 1u << r;
    const char* base = mySlot(0, slot);
    auto sweep = [&] {
#pragma unroll
      for (int r = 0; r < HC_MAX_RANKS; ++r)
        if (pending & (1u << r))
          if (Proto::readOnce(base + (u64)r * sub, f, v[r])) pending &= ~(1u << r);
      return pending == 0;
    };
    if (!boundedPoll(a, coll, [&] { return __ffs(pending) - 1; }, slot, sweep)) return false;
#pragma unroll
    for (int r = 0; r < HC_MAX_RANKS; ++r)
      if (r < nranksOf(a) && r != a.rank) rearm(base + (u64)r * sub);
    then();
    acc = a.rank == 0 ? own : v[0];  // constant indices only: v stays in registers
#pragma unroll
    for (int r = 1; r < HC_MAX_RANKS; ++r)
      if (r < nranksOf(a)) acc = combinePack<OP>(acc, r == a.rank ? own : v[r]);
    return true;
  }
  template <int OP>
  __device__ __forceinline__ bool recvReduce(u64 slot, Pack own, Pack& acc) const {
    return recvReduce<OP>(slot, own, acc, [] {});
  }
};
