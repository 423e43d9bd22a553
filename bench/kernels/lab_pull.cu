// lab_pull.cu - push against pull for a one-shot LL allreduce, per op in a CUDA graph and
// in-kernel; driven by bench/pull_lab.py.  Not used by the library.
//
// Question (bench/NOTES.md, session 12): a kernel that stored to the peer cannot complete
// before that store is acknowledged, so each op of a graph pays the NVLink store's round trip
// at its end (floor_store - floor_empty, 0.4 us).  If every rank instead writes its packs into
// its OWN workspace (local stores) and reads the peer's packs there (remote loads, polled), no
// remote store is outstanding at the end: is an op in a graph then shorter?
//
// 2 ranks, fp32 SUM, counts a multiple of 4, any grid, one pack per thread per step (grid
// stride).  LL slots (16-byte data + flags in 32 bytes, ll flags = epochs: never re-armed) in
// the library's one-shot LL region; (parity, writer) sub-buffer = region + (par * 2 + writer) *
// sub.  push: rank r writes its sub-buffer in the PEER's workspace and polls its own.  pull:
// rank r writes its sub-buffer in its OWN workspace and polls the peer's.  The credit is the
// library's, thread by thread: the thread that reads pack p at epoch e writes pack p at e+1, so
// a writer reaches e+2 (the parity of e) only after its reader has read e.
// Epochs: per-block words at LAB_OFF_EPOCHS of the control region (free space), set by the
// host to the same base on both ranks, advanced by each launch (graph replays too).
#include "collectives.cu"

#define LAB_OFF_EPOCHS 40960  // u64[HC_MAX_BLOCKS], in [32768, 65536): unused by the library

template <bool PULL>
__device__ __forceinline__ void labOneShotLL(const Args& a) {
  u64* ep = (u64*)(a.peers[a.rank] + LAB_OFF_EPOCHS) + blockIdx.x;
  const u64 packs = a.count / 4, T = nthreads(), p0 = tid();
  const float* in = (const float*)a.in;
  float* out = (float*)a.out;
  Pack first;
  if (p0 < packs) first = ldPack(in + 4 * p0);  // in flight with the epoch's load
  const u64 e0 = *(volatile u64*)ep;
  const int peer = a.rank ^ 1;
  char* mineBase = a.peers[a.rank] + a.region;
  char* peerBase = a.peers[peer] + a.region;
  bool ok = true;
  for (int it = 0; ok && it < a.iters; ++it) {
    const u64 e = e0 + it, par = e & 1;
    const u32 f = llFlag(e);
    char* put = (PULL ? mineBase : peerBase) + (par * 2 + a.rank) * a.sub;
    const char* get = (PULL ? peerBase : mineBase) + (par * 2 + peer) * a.sub;
    for (u64 p = p0; p < packs; p += T) LL::write(put + LL::at(p), p == p0 ? first : ldPack(in + 4 * p), f);
    for (u64 p = p0; ok && p < packs; p += T) {
      Pack v;
      const char* s = get + LL::at(p);
      ok = boundedPoll(a, HC_COLL_ALLREDUCE, [&] { return peer; }, p, [&] { return LL::readOnce(s, f, v); });
      if (!ok) break;
      const Pack own = p == p0 ? first : ldPack(in + 4 * p);
      stPack(out + 4 * p, a.rank == 0 ? combinePack<HC_SUM>(own, v) : combinePack<HC_SUM>(v, own));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *ep = e0 + a.iters;
}

extern "C" __global__ void __launch_bounds__(512) hc_lab_push_ll(const Args a) {
  streamOrderBegin();
  labOneShotLL<false>(a);
}
extern "C" __global__ void __launch_bounds__(512) hc_lab_pull_ll(const Args a) {
  streamOrderBegin();
  labOneShotLL<true>(a);
}

// The kernel boundary with one remote LOAD (sol.cu has the empty kernel and the one with one
// remote store): thread 0 reads the peer's floor-store word and keeps it in its own scratch.
extern "C" __global__ void hc_lab_floor_load(const Args a) {
  streamOrderBegin();
  if (threadIdx.x == 0) {
    const u64 v = *(volatile u64*)(a.peers[a.rank ^ 1] + HC_OFF_BARRIER + 1024);
    *(volatile u64*)(a.peers[a.rank] + HC_OFF_BARRIER + 1536) = v;
  }
}
