// lab_latency.cu - stripped one-shot allreduces for bisecting the gap between hpccoll's
// in-kernel latency and the SoL model; driven by bench/latency_lab.py.  Not used by the library.
//
// 2 ranks, fp32 SUM, one block, one thread per 16-byte pack, `iters` allreduces in a row on
// hpccoll's one-shot region (a.region, sub-buffers of a.sub bytes per (parity, source)), parity
// = iteration & 1 (even `iters` keep successive launches consistent), every received slot
// re-armed to the sentinel right after it is read, so the region is left idle.  out[0] = ns of
// the loop (thread 0), out[1] = 1 if a poll gave up (2^27 spins).
#include "collectives.cu"  // hpccoll's kernels and primitives, for the variants built on them

template <int TIMER>
__device__ __forceinline__ void labOneShot(const Args& a, u64* out) {
  const int peer = a.rank ^ 1;
  const u64 p = threadIdx.x;
  const u64 packs = a.count / 4;
  const u64 t0 = globaltimer();
  if (p < packs) {
    const Pack x = ldPack((const float*)a.in + 4 * p);
    for (int it = 0; it < a.iters; ++it) {
      const u64 par = it & 1;
      char* theirs = a.peers[peer] + a.region + (par * 2 + a.rank) * a.sub + 16 * p;
      char* mine = a.peers[a.rank] + a.region + (par * 2 + peer) * a.sub + 16 * p;
      Sentinel::write(theirs, x, 0);
      Pack v;
      u32 n = 0;
      u64 tStart = 0;
      for (;;) {
        if (Sentinel::readOnce(mine, 0, v)) break;
        if (++n >= (1u << 27)) { out[1] = 1; break; }
        if (TIMER && (n & 255u) == 0) {  // hpccoll's bounded poll: timer + abort flag
          const u64 now = globaltimer();
          if (tStart == 0) tStart = now;
          if (now - tStart > a.timeoutNs || aborted(a)) {
            out[1] = 1;
            break;
          }
        }
      }
      Sentinel::clear(mine);
      const Pack y = a.rank == 0 ? combinePack<HC_SUM>(x, v) : combinePack<HC_SUM>(v, x);
      stPack((float*)a.out + 4 * p, y);
    }
  }
  if (threadIdx.x == 0) out[0] = globaltimer() - t0;
}

extern "C" __global__ void __launch_bounds__(512) hc_lab_oneshot_min(const Args a, u64* out) {
  labOneShot<0>(a, out);
}
extern "C" __global__ void __launch_bounds__(512) hc_lab_oneshot_timer(const Args a, u64* out) {
  labOneShot<1>(a, out);
}

// Bisection between `min` and hpccoll's kernel: the same loop on the LLBuffer
// primitives (`prims`: input loaded once; `prims_ld`: loaded from a.in twice per iteration, as
// allreduceOneShot does), and allreduceOneShot itself launched like the other lab kernels
// (`full`: epochs, abort check and all; differs from hpccoll_us only in the launch path).
template <bool LOAD>
__device__ __forceinline__ void labPrims(const Args& a, u64* out) {
  const u64 p = threadIdx.x, packs = a.count / 4;
  const u64 t0 = globaltimer();
  if (p < packs) {
    const Pack x0 = ldPack((const float*)a.in + 4 * p);
    for (int it = 0; it < a.iters; ++it) {
      LLBuffer<Sentinel> buf(a, a.region, a.sub, (u64)it, HC_COLL_ALLREDUCE);
      buf.bcast(p, LOAD ? loadPack(a.in, a.count, p) : x0);
      Pack y;
      if (!buf.template recvReduce<HC_SUM>(p, LOAD ? loadPack(a.in, a.count, p) : x0, y)) {
        out[1] = 1;
        break;
      }
      stPack((float*)a.out + 4 * p, y);
    }
  }
  if (threadIdx.x == 0) out[0] = globaltimer() - t0;
}

extern "C" __global__ void __launch_bounds__(512) hc_lab_oneshot_prims(const Args a, u64* out) {
  labPrims<false>(a, out);
}
extern "C" __global__ void __launch_bounds__(512) hc_lab_oneshot_prims_ld(const Args a, u64* out) {
  labPrims<true>(a, out);
}
extern "C" __global__ void __launch_bounds__(512) hc_lab_oneshot_full(const Args a, u64* out) {
  const u64 t0 = globaltimer();
  allreduceOneShot<Sentinel, HC_SUM>(a, Flat{a});
  if (threadIdx.x == 0) out[0] = globaltimer() - t0;
}

// LL variants: the library's one-shot LL loop sends collective i+1 right after collective i's
// pack arrived.  The same loop stripped: `ll_min` (poll without timer, early send), `ll_timer`
// (+ the bounded poll's timer and abort checks every 256 spins), `ll_late` (min, the next send
// after the reduction and the result's store).  On hpccoll's one-shot LL region; epochs from
// `base` (the host passes a fresh range per launch, far from the library's own epochs, so a
// stale slot never carries a flag of this launch).
template <int TIMER, int EARLY>
__device__ __forceinline__ void labLL(const Args& a, u64* out, u64 base) {
  const int peer = a.rank ^ 1;
  const u64 p = threadIdx.x;
  const u64 packs = a.count / 4;
  const u64 t0 = globaltimer();
  auto to = [&](u64 e) { return a.peers[peer] + a.region + ((e & 1) * 2 + a.rank) * a.sub + LL::at(p); };
  auto from = [&](u64 e) { return a.peers[a.rank] + a.region + ((e & 1) * 2 + peer) * a.sub + LL::at(p); };
  if (p < packs) {
    const Pack x = ldPack((const float*)a.in + 4 * p);
    LL::write(to(base), x, llFlag(base));
    for (int it = 0; it < a.iters; ++it) {
      const u64 e = base + it;
      char* next = to(e + 1);
      const u32 nf = llFlag(e + 1), f = llFlag(e);
      const char* mine = from(e);
      const bool more = it + 1 < a.iters;
      Pack v;
      u32 n = 0;
      u64 tStart = 0;
      for (;;) {
        if (LL::readOnce(mine, f, v)) break;
        if (++n >= (1u << 27)) { out[1] = 1; break; }
        if (TIMER && (n & 255u) == 0) {
          const u64 now = globaltimer();
          if (tStart == 0) tStart = now;
          if (now - tStart > a.timeoutNs || aborted(a)) {
            out[1] = 1;
            break;
          }
        }
      }
      if (EARLY && more) LL::write(next, x, nf);
      const Pack y = a.rank == 0 ? combinePack<HC_SUM>(x, v) : combinePack<HC_SUM>(v, x);
      stPack((float*)a.out + 4 * p, y);
      if (!EARLY && more) LL::write(next, x, nf);
    }
  }
  if (threadIdx.x == 0) out[0] = globaltimer() - t0;
}

extern "C" __global__ void __launch_bounds__(512) hc_lab_ll_min(const Args a, u64* out, u64 base) {
  labLL<0, 1>(a, out, base);
}
extern "C" __global__ void __launch_bounds__(512) hc_lab_ll_timer(const Args a, u64* out, u64 base) {
  labLL<1, 1>(a, out, base);
}
extern "C" __global__ void __launch_bounds__(512) hc_lab_ll_late(const Args a, u64* out, u64 base) {
  labLL<0, 0>(a, out, base);
}
