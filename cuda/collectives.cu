// collectives.cu - the collective kernels, written on LLBuffer (ll_buffer.cuh).
//
// One thread handles packs p = tid, tid + T, ... (T = threads in the grid).  The launch
// configuration is a function of (collective, algorithm, size, nranks) only, so the same
// thread handles pack p on every rank.  `iters` > 1 runs that many collectives back to back
// inside one launch (the benchmark's in-kernel mode, from the HC_LOOP_FENCE module: see
// loopFence); the host path always passes 1.
#include "hc_common.cuh"
#include "ll_buffer.cuh"
#include "proto_ll.cuh"
#include "proto_ll128.cuh"
#include "proto_sentinel.cuh"

__device__ __forceinline__ u64 tid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
// The blocks a collective runs on: the grid's, or, in the eager engine (persistent.cu), the
// blocks the current call needs (a shared variable set per call).
#ifndef HC_CALL_BLOCKS
#define HC_CALL_BLOCKS gridDim.x
#endif
__device__ __forceinline__ u64 nthreads() { return (u64)(HC_CALL_BLOCKS) * blockDim.x; }
__device__ __forceinline__ u64 packsOf(u64 count) { return (count + HC_EPP - 1) / HC_EPP; }

// Between the collectives of an in-kernel loop (`iters` > 1: the benchmark's in-kernel mode
// only).  A re-arm (a plain local store) must be visible before the next collective's sends,
// which are the peer's credit to write that slot again.  Between launches the kernel boundary
// orders them; inside one launch nothing does, and with tens of thousands of threads re-arming
// at once a late re-arm can erase the peer's next data (both ranks then time out on the same
// slot).  So the in-kernel loops run from a second module compiled with HC_LOOP_FENCE=1,
// where this is a gpu-scope fence (the re-arm is performed at our L2, where the peer's next
// write lands, before the next send leaves).  In the library's module it is empty: its kernels
// always run one collective per launch and stay barrier-free (tests/test_device_code.py).
__device__ __forceinline__ void loopFence() {
#if HC_LOOP_FENCE
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
}

// One-shot's loops need the fence only where slots are re-armed.  LL slots never are (flags
// are epochs), and in the one-shot the thread that reads slot p at epoch e is the one that
// sends pack p of e+1, which the peer's thread for p receives before it writes p at e+2: the
// slot's reuse is ordered by that chain of dependencies alone, as in allgatherLL.  (Not so in
// two-shot: there the reader of a slot and the sender of the next phase are other threads.)
template <class Proto>
__device__ __forceinline__ void oneShotLoopFence() {
  if (!Proto::kRearms) return;
  loopFence();
}

// Pack p of a user buffer of `count` elements (the partial last pack padded with zeros).
__device__ __forceinline__ Pack loadPack(const void* base, u64 count, u64 p) {
  const T* x = (const T*)base + p * HC_EPP;
  return (p + 1) * HC_EPP <= count ? ldPack(x) : ldPartial(x, (int)(count - p * HC_EPP), (T)0);
}
__device__ __forceinline__ void storePack(void* base, u64 count, u64 p, Pack v) {
  T* y = (T*)base + p * HC_EPP;
  if ((p + 1) * HC_EPP <= count) stPack(y, v); else stPartial(y, v, (int)(count - p * HC_EPP));
}

// Where a one-shot's packs come from and go (its `io`).  Flat: one call's buffers, in Args.
// Segments: the calls of a group (Communicator.group, hc_common.cuh's Group) laid end to end,
// each from a pack boundary, so that one launch, one epoch and one pass over the slots carry
// them all: pack p of the launch is pack p - start[j] of call j.
struct Flat {
  const Args& a;
  __device__ u64 packs() const { return packsOf(a.count); }
  __device__ Pack load(u64 p) const { return loadPack(a.in, a.count, p); }
  __device__ void store(u64 p, Pack v) const { storePack(a.out, a.count, p, v); }
};

struct Segments {
  const Group& g;
  __device__ u64 packs() const { return g.start[g.n]; }
  __device__ int callOf(u64 p) const {  // the last j with start[j] <= p (binary search: n <= 32)
    int lo = 0, hi = g.n - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (g.start[mid] <= p) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  __device__ Pack load(u64 p) const {
    const int j = callOf(p);
    return loadPack(g.in[j], g.count[j], p - g.start[j]);
  }
  __device__ void store(u64 p, Pack v) const {
    const int j = callOf(p);
    storePack(g.out[j], g.count[j], p - g.start[j], v);
  }
};

// Call j of a chain (hc_common.cuh's Chain).
struct Chained {
  const Chain& c;
  int j;
  __device__ u64 packs() const { return packsOf(c.count); }
  __device__ Pack load(u64 p) const { return loadPack(c.in[j], c.count, p); }
  __device__ void store(u64 p, Pack v) const { storePack(c.out[j], c.count, p, v); }
};

// This thread's first input pack (zeros past the end), loaded at kernel start before the
// epoch and abort words: the three loads are then in flight together.  Loaded inside the
// collective's loop instead, it would leave only after both words came back (the loop runs
// under `ok`, so the compiler cannot hoist it): one more L2 round trip per launch.
template <class IO>
__device__ __forceinline__ Pack loadFirst(const IO& io, u64 packs) {
  Pack x;
  x.u = make_uint4(0, 0, 0, 0);
  if (tid() < packs) x = io.load(tid());
  return x;
}

// Push every pack of the input to every peer (`first`: loadFirst's pack; the input does not
// change within a launch).  Four packs per thread are loaded before the first of their stores
// is issued, so four loads are in flight at once (the stores' "memory" clobbers would
// otherwise serialize load, store, load, store).
template <class Proto, class IO>
__device__ __forceinline__ void sendAll(const LLBuffer<Proto>& buf, const IO& io, u64 packs, Pack first) {
  const u64 T = nthreads();
  u64 p = tid();
  if (p < packs) buf.bcast(p, first);
  p += T;
  for (; p + 3 * T < packs; p += 4 * T) {
    Pack x[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = io.load(p + k * T);
#pragma unroll
    for (int k = 0; k < 4; ++k) buf.bcast(p + k * T, x[k]);
  }
  for (; p < packs; p += T) buf.bcast(p, io.load(p));
}

// The packs of a two-shot allreduce that other ranks own: all of [0, packs) but our own
// [lo, hi), numbered q = 0 .. count-1, so every thread of the send and the all-gather loops
// gets useful work (a loop over all packs that skips our own would idle 1/nranks of them).
struct OthersPacks {
  u64 lo, hi, count;
  __device__ OthersPacks(u64 packs, u64 lo_, u64 hi_) : lo(lo_), hi(hi_), count(packs - (hi_ - lo_)) {}
  __device__ __forceinline__ u64 operator()(u64 q) const { return q < lo ? q : q + (hi - lo); }
};

// Reduce-scatter's sends: each pack other ranks own to its owner, load then store, pack after
// pack.  (Batching several loads before their stores made the two-shot slower over NVLink: stores
// issued in bursts from the whole grid drain more slowly than stores paced by the loads.)
template <class Proto>
__device__ __forceinline__ void scatterToOwners(const LLBuffer<Proto>& rs, const Args& a, u64 chunk,
                                                const OthersPacks& others) {
  for (u64 q = tid(); q < others.count; q += nthreads()) {
    const u64 p = others(q);
    const int owner = (int)(p / chunk);
    rs.send(owner, p - owner * chunk, loadPack(a.in, a.count, p));
  }
}

// ---------------------------------------------------------------------------------------
// Allreduce, one-shot: every rank pushes its whole input to every peer, then reduces locally.
//
// When the grid has a thread per pack, the thread's pack stays in a register: loaded once, sent,
// and reused as the own contribution of the reduction (the loop below re-reads the input after
// its sends).
//
// In an in-kernel loop (`iters` > 1) on LL, the pack of collective it+1 leaves as soon as the
// same pack of collective it has arrived from every peer (recvReduce's `then`), before the
// reduction and the result's store: the loop's critical path from one collective to the next
// is then the poll and two stores.  The credit holds as in oneShotLoopFence: the thread that
// received p at e sends p at e+1.  Sentinel slots are re-armed, and the re-arm must be fenced
// before the next send, so sentinel sends at the top of each iteration, after the fence.
template <class Proto, int OP, class IO>
__device__ __forceinline__ bool allreduceOneShotKept(const Args& a, const IO& io, u64 packs, Pack x, u64 e0,
                                                     bool ok) {
  constexpr bool kEarly = !Proto::kRearms;
  const u64 p = tid();
  if (p >= packs) return ok;
  for (int it = 0; ok && it < a.iters; ++it, oneShotLoopFence<Proto>()) {
    const LLBuffer<Proto> buf(a, a.region, a.sub, e0 + it, HC_COLL_ALLREDUCE);
    if (!(kEarly && it > 0)) buf.bcast(p, x);  // (LL: sent early by the previous iteration)
    const LLBuffer<Proto> next(a, a.region, a.sub, e0 + it + 1, HC_COLL_ALLREDUCE);  // (set up during the poll)
    const bool more = kEarly && it + 1 < a.iters;
    Pack y;
    ok = buf.template recvReduce<OP>(p, x, y, [&] {
      if (more) next.bcast(p, x);
    });
    if (ok) io.store(p, y);
  }
  return ok;
}

// The one-shot's `iters` collectives from epoch e0 on the grid-stride loop (`first`: loadFirst's
// pack); false once a poll timed out or the communicator was aborted.
template <class Proto, int OP, class IO>
__device__ __forceinline__ bool allreduceOneShotLoop(const Args& a, const IO& io, u64 packs, Pack first, u64 e0,
                                                     bool ok) {
  for (int it = 0; ok && it < a.iters; ++it, oneShotLoopFence<Proto>()) {
    LLBuffer<Proto> buf(a, a.region, a.sub, e0 + it, HC_COLL_ALLREDUCE);
    sendAll(buf, io, packs, first);
    for (u64 p = tid(); ok && p < packs; p += nthreads()) {
      Pack y;
      ok = buf.template recvReduce<OP>(p, io.load(p), y);
      if (ok) io.store(p, y);
    }
  }
  return ok;
}

// The same, choosing the kept-pack path where it applies: the launched one-shot's body, and the
// eager engine's entry (persistent.cu), which keeps its own epochs.
template <class Proto, int OP, class IO>
__device__ __forceinline__ bool allreduceOneShotFrom(const Args& a, const IO& io, u64 packs, Pack first, u64 e0,
                                                     bool ok) {
  if (packs <= nthreads())  // grid-uniform
    return allreduceOneShotKept<Proto, OP>(a, io, packs, first, e0, ok);
  return allreduceOneShotLoop<Proto, OP>(a, io, packs, first, e0, ok);
}

template <class Proto, int OP, class IO>
__device__ void allreduceOneShot(const Args& a, const IO& io) {
  const u64 packs = io.packs();
  const Pack first = loadFirst(io, packs);
  const u64 e0 = epochBegin(a);
  bool ok = !aborted(a);
  allreduceOneShotFrom<Proto, OP>(a, io, packs, first, e0, ok);
  epochEnd(a, e0, a.iters);
}

// A chain (hc_common.cuh's Chain): its calls one after the other, each its own epoch, as the
// in-kernel loop runs its iterations.  Only in the HC_LOOP_FENCE module, for its fence between
// calls (sentinel re-arms, oneShotLoopFence).  The host sets iters = 1.  Between calls the
// slots' reuse is ordered as in the loop: all calls have the same count, so the thread that
// receives pack p of call j sends pack p of call j+1; and a call's input that an earlier call
// wrote was written by this same thread (same pack, same thread), so program order suffices.
template <class Proto, int OP>
__device__ __forceinline__ void chainKept(const Args& a, const Chain& c, u64 packs, Pack x, u64 e0, bool ok) {
  constexpr bool kEarly = !Proto::kRearms;  // LL: call j+1's pack may leave inside call j's poll
  const u64 p = tid();
  if (p >= packs) return;
  bool sent = false;  // (this call's pack left early, in the previous call)
  for (int j = 0; ok && j < c.n; ++j) {
    const LLBuffer<Proto> buf(a, a.region, a.sub, e0 + j, HC_COLL_ALLREDUCE);
    if (!sent) buf.bcast(p, x);
    const LLBuffer<Proto> next(a, a.region, a.sub, e0 + j + 1, HC_COLL_ALLREDUCE);
    const int src = j + 1 < c.n ? c.src[j + 1] : HC_SRC_LOAD;
    Pack y;
    ok = buf.template recvReduce<OP>(p, x, y, [&] {
      if (kEarly && src == HC_SRC_KEEP) next.bcast(p, x);
    });
    if (!ok) break;
    sent = kEarly && src != HC_SRC_LOAD && j + 1 < c.n;
    if (kEarly && src == HC_SRC_FWD && j + 1 < c.n) next.bcast(p, y);
    storePack(c.out[j], c.count, p, y);
    if (j + 1 == c.n) break;
    if (src == HC_SRC_FWD) x = y;
    else if (src == HC_SRC_LOAD) x = loadPack(c.in[j + 1], c.count, p);
    oneShotLoopFence<Proto>();
  }
}

template <class Proto, int OP>
__device__ void allreduceChain(const Args& a, const Chain& c) {
  const u64 packs = packsOf(c.count);
  const Pack first = loadFirst(Chained{c, 0}, packs);
  const u64 e0 = epochBegin(a);
  bool ok = !aborted(a);
  if (packs <= nthreads()) {  // grid-uniform
    chainKept<Proto, OP>(a, c, packs, first, e0, ok);
  } else {
    for (int j = 0; ok && j < c.n; ++j) {  // (the loop fences after each call: iters = 1)
      const Chained io{c, j};
      ok = allreduceOneShotLoop<Proto, OP>(a, io, packs, j == 0 ? first : loadFirst(io, packs), e0 + j, ok);
    }
  }
  epochEnd(a, e0, c.n);
}

// Allreduce, two-shot: reduce-scatter to chunk owners (region), then all-gather (region2).
template <class Proto, int OP>
__device__ void allreduceTwoShot(const Args& a) {
  const u64 e0 = epochBegin(a), packs = packsOf(a.count);
  const u64 chunk = (packs + nranksOf(a) - 1) / nranksOf(a);  // packs per owner
  bool ok = !aborted(a);
  for (int it = 0; ok && it < a.iters; ++it, loopFence()) {
    LLBuffer<Proto> rs(a, a.region, a.sub, e0 + it, HC_COLL_ALLREDUCE);
    LLBuffer<Proto> ag(a, a.region2, a.sub2, e0 + it, HC_COLL_ALLREDUCE);
    const u64 lo = min(packs, a.rank * chunk), hi = min(packs, lo + chunk);  // empty for late owners of few packs
    const OthersPacks others(packs, lo, hi);
    scatterToOwners(rs, a, chunk, others);
    for (u64 p = lo + tid(); ok && p < hi; p += nthreads()) {
      Pack y;
      ok = rs.template recvReduce<OP>(p - lo, loadPack(a.in, a.count, p), y);
      if (ok) {
        ag.bcast(p - lo, y);
        storePack(a.out, a.count, p, y);
      }
    }
    for (u64 q = tid(); ok && q < others.count; q += nthreads()) {
      const u64 p = others(q);
      const int owner = (int)(p / chunk);
      Pack y;
      ok = ag.recv(owner, p - owner * chunk, y);
      if (ok) storePack(a.out, a.count, p, y);
    }
  }
  epochEnd(a, e0, a.iters);
}

#if HC_IS_FLOAT
// Allreduce, two-shot LL128 atomic (SUM): reductions into owner lines, then a sentinel
// all-gather of the owners' lines (region2, line-structured: slot = line * 8 + lane).
// Warp-structured: each 8-lane group handles one line per step; the owner's poll is a
// warp-uniform loop (shuffles with the full mask, timeout decided with __any_sync).
__device__ void allreduceTwoShotLL128(const Args& a) {
  const u64 e0 = epochBegin(a);
  const int lane = threadIdx.x & 31, sub = lane & 7;
  const bool counterLane = sub == 7;
  const u64 lines = (a.count + LL128::kEPL - 1) / LL128::kEPL;
  const u64 perOwner = (lines + nranksOf(a) - 1) / nranksOf(a);
  const u64 gwarp = tid() >> 5, nwarps = nthreads() >> 5;
  const int myElems = counterLane ? HC_EPP - 1 : HC_EPP;
  bool ok = !aborted(a);
  for (int it = 0; ok && it < a.iters; ++it, loopFence()) {
    const u64 e = e0 + it;
    LLBuffer<Sentinel> ag(a, a.region2, a.sub2, e, HC_COLL_ALLREDUCE);
    auto lineAt = [&](int owner, u64 l) { return a.peers[owner] + a.region + (e & 1) * a.sub + l * 128 + sub * 16; };
    auto elem0 = [&](u64 line) { return line * LL128::kEPL + (u64)sub * HC_EPP; };
    auto nElems = [&](u64 line) {
      const u64 first = elem0(line);
      return first >= a.count ? 0 : (int)min((u64)myElems, a.count - first);
    };
    // phase 1: every rank adds its contribution into the other owners' lines.  The owner adds
    // its own in registers in phase 1b, in the thread that also re-arms the line, so no
    // contribution of a later epoch can race with that re-arm inside an in-kernel loop.
    for (u64 l = gwarp * 4 + (lane >> 3); l < lines; l += nwarps * 4) {
      const int owner = (int)(l / perOwner);
      if (owner == a.rank) continue;
      Pack x = ldPartial((const T*)a.in + elem0(l), nElems(l), (T)0);
      LL128::contribute(lineAt(owner, l - owner * perOwner), x, counterLane);
    }
    // phase 1b: the owner waits for nranks contributions per line, then shares the sums
    const u64 lo = a.rank * perOwner, hi = min(lines, lo + perOwner);
    const u64 steps = (hi > lo) ? (hi - lo + nwarps * 4 - 1) / (nwarps * 4) : 0;
    for (u64 s = 0; ok && s < steps; ++s) {  // warp-uniform trip count
      const u64 l = lo + s * nwarps * 4 + gwarp * 4 + (lane >> 3);
      const bool mine = l < hi;
      char* line = mine ? lineAt(a.rank, l - lo) : nullptr;
      Pack v, own;
      v.u = own.u = make_uint4(0, 0, 0, 0);
      if (mine) own = ldPartial((const T*)a.in + elem0(l), nElems(l), (T)0);
      const u64 t0 = globaltimer();
      for (u32 n = 0;; ++n) {
        if (mine) v = ldVolatile(line);
        const int full = toAcc(v.e[HC_EPP - 1]) == (Acc)(nranksOf(a) - 1);  // peers only; lane 7 holds it
        const int groupFull = __shfl_sync(0xffffffffu, full, (lane & ~7) | 7);  // every lane shuffles
        const bool have = !mine || groupFull;
        if (__all_sync(0xffffffffu, have)) break;
        if ((n & 255u) == 255u) {
          const bool late = aborted(a) || globaltimer() - t0 > a.timeoutNs;
          if (__any_sync(0xffffffffu, late)) {
            if (lane == 0 && !aborted(a)) failTimeout(a, HC_COLL_ALLREDUCE, -1, lo, globaltimer() - t0);
            ok = false;
            break;
          }
        }
      }
      if (!ok || !mine) continue;
      LL128::clear(line);
#pragma unroll
      for (int i = 0; i < HC_EPP; ++i) v.e[i] = combine<HC_SUM>(v.e[i], own.e[i]);
      if (counterLane) v.e[HC_EPP - 1] = (T)0;
      ag.bcast((l - lo) * 8 + sub, v);
      stPartial((T*)a.out + elem0(l), v, nElems(l));
    }
    // phase 2: receive every other owner's sums
    for (u64 l = gwarp * 4 + (lane >> 3); ok && l < lines; l += nwarps * 4) {
      const int owner = (int)(l / perOwner);
      if (owner == a.rank) continue;
      Pack y;
      ok = ag.recv(owner, (l - owner * perOwner) * 8 + sub, y);
      if (ok) stPartial((T*)a.out + elem0(l), y, nElems(l));
    }
    ok = __all_sync(0xffffffffu, ok);  // keep `ok` warp-uniform: the next poll shuffles
  }
  epochEnd(a, e0, a.iters);
}
#endif

// ---------------------------------------------------------------------------------------
// Arrival words (Bcast, Barrier): in every rank's control region at `off`, a row of
// HC_MAX_RANKS words per block; word [b][r] holds epoch+1 of the last collective at which block
// b of rank r arrived (= had finished the one before).  Monotonic, so never re-armed.
__device__ __forceinline__ void arrive(const Args& a, u64 off, int peer, u64 mark) {
  u64* theirs = (u64*)(a.peers[peer] + off) + blockIdx.x * HC_MAX_RANKS + a.rank;
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(theirs), "l"(mark) : "memory");
}

// Wait until `peer`'s block has arrived at `mark`; false on timeout or abort.
__device__ __forceinline__ bool awaitArrival(const Args& a, u64 off, int peer, u64 mark, int coll, u64 slot) {
  const volatile u64* mine = (const volatile u64*)(a.peers[a.rank] + off) + blockIdx.x * HC_MAX_RANKS + peer;
  return boundedPoll(a, coll, [&] { return peer; }, slot, [&] { return *mine >= mark; });
}

// Bcast (LL: exact bits): root pushes, everyone else receives.
// Bcast is the one collective in which a rank can finish without hearing from every peer: a
// receiver only needs the root's data.  The double buffering's credit ("a peer can run at most
// one collective ahead", ll_buffer.cuh) needs every rank that finishes collective e to know
// that every peer has finished e-1.  Without that, at >= 3 ranks a receiver S of Bcast e
// could start Allreduce e+1 and overwrite its slot in a slow peer D that was still reading
// Allreduce e-1 in the same parity (a Bcast/Allreduce sequence at 4 ranks hangs so).  So every block of every rank
// announces its arrival at e (= it has finished e-1) to the same block of every peer at
// start (arrive word = e+1, monotonic, never re-armed), and waits for every peer's arrival
// before it finishes.  The arrivals travel while the data does: a receiver's wait is the
// longer of two one-way trips, the root's is one (acks would make it a round trip).
__device__ void bcastLL(const Args& a) {
  const u64 e0 = epochBegin(a), packs = packsOf(a.count);
  const u64 per = a.sub / LL::kBytesPerPack;  // packs of one chunk (one sub-buffer)
  const u64 chunks = packs > per ? (packs + per - 1) / per : 1;
  bool ok = !aborted(a);
  const int r = threadIdx.x;
  const bool signals = r < nranksOf(a) && r != a.rank;  // thread r talks to rank r
  for (int it = 0; ok && it < a.iters; ++it, loopFence()) {
    // every chunk is an epoch of its own, in this one launch (no host round trip per chunk)
    for (u64 c = 0; ok && c < chunks; ++c) {
      const u64 e = e0 + it * chunks + c;
      __syncthreads();  // the block has finished e-1 before it says so
      if (signals) arrive(a, HC_OFF_ARRIVE, r, e + 1);
      LLBuffer<LL> buf(a, a.region, a.sub, e, HC_COLL_BCAST);
      const u64 p0 = c * per, np = min(per, packs - p0);
      for (u64 p = tid(); ok && p < np; p += nthreads()) {
        if (a.rank == a.root) {
          buf.bcast(p, loadPack(a.out, a.count, p0 + p));
        } else {
          Pack y;
          ok = buf.recv(a.root, p, y);
          if (ok) storePack(a.out, a.count, p0 + p, y);
        }
      }
      if (ok && signals) ok = awaitArrival(a, HC_OFF_ARRIVE, r, e + 1, HC_COLL_BCAST, p0);
      ok = __syncthreads_and(ok);
    }
  }
  epochEnd(a, e0, (u64)a.iters * chunks);
}

// Allgather (LL): `count` elements per rank, a multiple of HC_EPP (the host pads otherwise),
// in chunks of one sub-buffer, each chunk its own epoch, all in this one launch (no host round
// trip per chunk).  No fence between chunks: LL
// slots are never re-armed (flags are epochs), and the double buffering holds inside the
// launch as between launches - thread t writes chunk c+2 into a peer's slot p only after
// receiving the peer's chunk c+1 slot p, which the peer's thread t sent after its poll of our
// chunk c slot p had returned (a control dependency: no store runs ahead of it).
__device__ void allgatherLL(const Args& a) {
  const u64 e0 = epochBegin(a), packs = a.count / HC_EPP;
  const u64 per = a.sub / LL::kBytesPerPack;  // packs of one chunk
  const u64 chunks = packs > per ? (packs + per - 1) / per : 1;
  bool ok = !aborted(a);
  for (int it = 0; ok && it < a.iters; ++it, loopFence()) {
    for (u64 c = 0; ok && c < chunks; ++c) {
      LLBuffer<LL> buf(a, a.region, a.sub, e0 + it * chunks + c, HC_COLL_ALLGATHER);
      const u64 p0 = c * per, np = min(per, packs - p0);
      for (u64 p = tid(); p < np; p += nthreads()) {
        Pack x = ldPack((const T*)a.in + (p0 + p) * HC_EPP);
        buf.bcast(p, x);
        stPack((T*)a.out + (a.rank * a.count) + (p0 + p) * HC_EPP, x);
      }
      for (int k = 1; ok && k < nranksOf(a); ++k) {
        const int src = (a.rank + k) % nranksOf(a);
        for (u64 p = tid(); ok && p < np; p += nthreads()) {
          Pack y;
          ok = buf.recv(src, p, y);
          if (ok) stPack((T*)a.out + src * a.count + (p0 + p) * HC_EPP, y);
        }
      }
    }
  }
  epochEnd(a, e0, (u64)a.iters * chunks);
}

// Alltoall (LL: exact bits): block j of the input (`count` elements, a multiple of HC_EPP: the
// host pads otherwise) goes to rank j, which stores it as block `rank` of its output; chunks of
// one sub-buffer, each its own epoch, as allgatherLL.  The credit holds as there: thread t sends
// chunk c+1 slot p to a peer only after receiving that peer's chunk c slot p, which the peer's
// thread t sent after it had read every rank's chunk c-1 slot p.
__device__ void alltoallLL(const Args& a) {
  const u64 e0 = epochBegin(a), packs = a.count / HC_EPP;
  const u64 per = a.sub / LL::kBytesPerPack;  // packs of one chunk
  const u64 chunks = packs > per ? (packs + per - 1) / per : 1;
  bool ok = !aborted(a);
  for (int it = 0; ok && it < a.iters; ++it, loopFence()) {
    for (u64 c = 0; ok && c < chunks; ++c) {
      LLBuffer<LL> buf(a, a.region, a.sub, e0 + it * chunks + c, HC_COLL_ALLTOALL);
      const u64 p0 = c * per, np = min(per, packs - p0);
      for (int k = 1; k < nranksOf(a); ++k) {
        const int dst = (a.rank + k) % nranksOf(a);  // staggered: ranks do not all hit rank 0 first
        for (u64 p = tid(); p < np; p += nthreads())
          buf.send(dst, p, ldPack((const T*)a.in + dst * a.count + (p0 + p) * HC_EPP));
      }
      for (u64 p = tid(); p < np; p += nthreads()) {
        const u64 off = a.rank * a.count + (p0 + p) * HC_EPP;
        stPack((T*)a.out + off, ldPack((const T*)a.in + off));
      }
      for (int k = 1; ok && k < nranksOf(a); ++k) {
        const int src = (a.rank + nranksOf(a) - k) % nranksOf(a);
        for (u64 p = tid(); ok && p < np; p += nthreads()) {
          Pack y;
          ok = buf.recv(src, p, y);
          if (ok) stPack((T*)a.out + src * a.count + (p0 + p) * HC_EPP, y);
        }
      }
    }
  }
  epochEnd(a, e0, (u64)a.iters * chunks);
}

// Reduce_scatter_block: block j of the input goes to rank j, which reduces in rank order.
// `count` = elements per block, a multiple of HC_EPP (the host pads otherwise).
template <class Proto, int OP>
__device__ void reduceScatter(const Args& a) {
  const u64 e0 = epochBegin(a), packs = a.count / HC_EPP;
  bool ok = !aborted(a);
  for (int it = 0; ok && it < a.iters; ++it, loopFence()) {
    LLBuffer<Proto> buf(a, a.region, a.sub, e0 + it, HC_COLL_REDUCE_SCATTER);
    for (int k = 1; k < nranksOf(a); ++k) {
      const int dst = (a.rank + k) % nranksOf(a);
      for (u64 p = tid(); p < packs; p += nthreads())
        buf.send(dst, p, ldPack((const T*)a.in + dst * a.count + p * HC_EPP));
    }
    for (u64 p = tid(); ok && p < packs; p += nthreads()) {
      Pack y;
      ok = buf.template recvReduce<OP>(p, ldPack((const T*)a.in + a.rank * a.count + p * HC_EPP), y);
      if (ok) stPack((T*)a.out + p * HC_EPP, y);
    }
  }
  epochEnd(a, e0, a.iters);
}

// Barrier: thread r < nranks signals rank r and waits for rank r's signal.  Arrival words
// hold the barrier's epoch+1 (monotonic: never re-armed).  One block.
__device__ void barrier(const Args& a) {
  const u64 e0 = epochBegin(a);
  bool ok = !aborted(a);
  const int r = threadIdx.x;
  for (int it = 0; ok && it < a.iters; ++it, loopFence()) {
    const u64 mark = e0 + it + 1;
    if (r < nranksOf(a) && r != a.rank) {  // one block: its row of arrival words is row 0
      arrive(a, HC_OFF_BARRIER, r, mark);
      ok = awaitArrival(a, HC_OFF_BARRIER, r, mark, HC_COLL_BARRIER, 0);
    }
    __syncthreads();
  }
  epochEnd(a, e0, a.iters);
}

// ---------------------------------------------------------------------------------------
// Entry points: hc_<collective>_<algorithm>_<op>, instantiated for this module's HC_DTYPE
// (not in persistent.cu's module, which includes this file for its device functions).
#ifndef HC_NO_ENTRY_POINTS
// 512 threads per block at most (the host's grid rule), so up to 128 registers per thread:
// the fixed-rank-order receive keeps up to HC_MAX_RANKS packs in registers.
#define HC_KERNEL(name, body) \
  extern "C" __global__ void __launch_bounds__(HC_MAX_THREADS) name(const Args a) { streamOrderBegin(); body; }
// A group's one-shot (Communicator.group): its calls in the second parameter, by value too.
#define HC_GROUP_KERNEL(name, body)                                                                 \
  extern "C" __global__ void __launch_bounds__(HC_MAX_THREADS) name(const Args a, const Group g) { \
    streamOrderBegin();                                                                             \
    body;                                                                                           \
  }

// A chain (hpccoll/backends/cuda/fusion.py): only in the in-kernel loop module, whose fence it needs.
#define HC_CHAIN_KERNEL(name, body)                                                                 \
  extern "C" __global__ void __launch_bounds__(HC_MAX_THREADS) name(const Args a, const Chain c) { \
    streamOrderBegin();                                                                             \
    body;                                                                                           \
  }
#if HC_LOOP_FENCE
#define HC_CHAINS(OPNAME, OP, PROTO, pname) \
  HC_CHAIN_KERNEL(hc_allreduce_oneshot_##pname##_##OPNAME##_chain, (allreduceChain<PROTO, OP>(a, c)))
#else
#define HC_CHAINS(OPNAME, OP, PROTO, pname)
#endif

#define HC_REDUCING(OPNAME, OP)                                                               \
  HC_KERNEL(hc_allreduce_oneshot_ll_##OPNAME, (allreduceOneShot<LL, OP>(a, Flat{a})))         \
  HC_GROUP_KERNEL(hc_allreduce_oneshot_ll_##OPNAME##_group, (allreduceOneShot<LL, OP>(a, Segments{g}))) \
  HC_KERNEL(hc_allreduce_twoshot_ll_##OPNAME, (allreduceTwoShot<LL, OP>(a)))                  \
  HC_KERNEL(hc_reduce_scatter_ll_##OPNAME, (reduceScatter<LL, OP>(a)))                        \
  HC_CHAINS(OPNAME, OP, LL, ll)                                                                 \
  HC_SENTINEL_KERNELS(OPNAME, OP)

#if HC_IS_FLOAT
#define HC_SENTINEL_KERNELS(OPNAME, OP)                                                       \
  HC_KERNEL(hc_allreduce_oneshot_sentinel_##OPNAME, (allreduceOneShot<Sentinel, OP>(a, Flat{a}))) \
  HC_GROUP_KERNEL(hc_allreduce_oneshot_sentinel_##OPNAME##_group,                             \
                  (allreduceOneShot<Sentinel, OP>(a, Segments{g})))                           \
  HC_KERNEL(hc_allreduce_twoshot_sentinel_##OPNAME, (allreduceTwoShot<Sentinel, OP>(a)))      \
  HC_KERNEL(hc_reduce_scatter_sentinel_##OPNAME, (reduceScatter<Sentinel, OP>(a)))        \
  HC_CHAINS(OPNAME, OP, Sentinel, sentinel)
HC_KERNEL(hc_allreduce_twoshot_ll128_sum, allreduceTwoShotLL128(a))
#else
#define HC_SENTINEL_KERNELS(OPNAME, OP)
#endif

HC_REDUCING(sum, HC_SUM)
HC_REDUCING(prod, HC_PROD)
HC_REDUCING(max, HC_MAX)
HC_REDUCING(min, HC_MIN)
HC_KERNEL(hc_bcast_ll, bcastLL(a))
HC_KERNEL(hc_allgather_ll, allgatherLL(a))
HC_KERNEL(hc_alltoall_ll, alltoallLL(a))
HC_KERNEL(hc_barrier, barrier(a))
#endif  // HC_NO_ENTRY_POINTS
