// hc_common.cuh - types, element traits, reduction ops, PTX access helpers, bounded polling.
//
// Compiled by NVRTC (no standard headers): everything needed is defined here.
// One module is compiled per element type: HC_DTYPE selects it (codes below), and
// every kernel of cuda/collectives.cu is instantiated for that type.
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define HC_MAX_RANKS 8       // ranks per node the kernels support
#define HC_MAX_BLOCKS 256    // epoch counters kept per communicator
#define HC_PACK 16           // bytes moved per thread per step

// ---- workspace control region (at offset 0 of every rank's symmetric buffer) ----
// [0, 2048)      u64 epochs[HC_MAX_BLOCKS]   per-block collective counters (see ll_buffer.cuh)
// [2048, 2056)   int abortFlag                set by the first poll that times out
// [2112, 2176)   ErrRec                       what that poll waited for
// [4096, 4096+64) u64 barrier[HC_MAX_RANKS]   barrier arrivals, written by peers
// [4608], [5120] u64                          sol.cu scratch: ping-pong word, floor store
// [16384, 32768) u64 arrive[blocks][ranks]    Bcast: "block b of rank r has finished epoch e-1"
#define HC_OFF_EPOCHS 0
#define HC_OFF_ABORT 2048
#define HC_OFF_ERR 2112
#define HC_OFF_BARRIER 4096
#define HC_OFF_ARRIVE 16384  // u64 arrive[HC_MAX_BLOCKS][HC_MAX_RANKS]: value e+1, written by the peers
#define HC_CTRL_BYTES 65536

struct ErrRec {
  int code;        // 1 = timeout
  int collective;  // HC_COLL_* below
  int peer;        // rank waited for
  int pad;
  u64 slot;        // slot (pack index) waited on
  u64 waitedNs;
};

#define HC_COLL_ALLREDUCE 1
#define HC_COLL_BCAST 2
#define HC_COLL_ALLGATHER 3
#define HC_COLL_REDUCE_SCATTER 4
#define HC_COLL_BARRIER 5

// Kernel arguments, passed by value (constant bank: no loads on the critical path).
struct Args {
  char* peers[HC_MAX_RANKS];  // symmetric workspace base of each rank; peers[rank] is our own
  const void* in;             // user input (16-byte aligned; the host stages unaligned buffers)
  void* out;                  // user output (16-byte aligned)
  u64 count;                  // elements in this launch
  u64 region;                 // byte offset of the collective's region in every workspace
  u64 region2;                // second region (phase 2 of two-shot)
  u64 sub;                    // bytes of one (parity, source) sub-buffer of `region`
  u64 sub2;                   // bytes of one (parity, source) sub-buffer of `region2`
  u64 timeoutNs;              // bound of every poll
  volatile int* hostErr;      // mapped host word: non-zero once any poll timed out
  int rank, nranks, root, iters;
};

// The rank count.  HC_NRANKS makes it a compile-time constant, so that a module built for one
// rank count keeps none of the other counts' code (the library builds every module so:
// backends/cuda.py rank_defines).
__device__ __forceinline__ int nranksOf(const Args& a) {
#ifdef HC_NRANKS
  return HC_NRANKS;
#else
  return a.nranks;
#endif
}

// The calls of a group (Communicator.group): one one-shot launch carries up to HC_GROUP_MAX
// Allreduce calls of one dtype and op, laid end to end from pack boundaries.  The second kernel
// parameter of the hc_allreduce_oneshot_*_group kernels, by value (1 KiB).
#define HC_GROUP_MAX 32
struct Group {
  u64 start[HC_GROUP_MAX + 1];  // first pack of call j in the launch; start[n]: the launch's packs
  const void* in[HC_GROUP_MAX];
  void* out[HC_GROUP_MAX];
  u64 count[HC_GROUP_MAX];      // elements of call j
  int n;
};
static_assert(sizeof(Group) == 1040, "hpccoll/_driver.py mirrors Group: change both");

// A chain (hpccoll/_fuse.py): Allreduce calls captured back to back on one stream into a CUDA
// graph, run one after the other by one kernel node.  Every call has the same element count, so
// pack p of every call is handled by the same thread; buffers of different calls are the same or
// disjoint.  src[j]: where call j's input pack comes from in the kept path (a pack per thread).
#define HC_CHAIN_MAX 32
#define HC_SRC_LOAD 0  // its input buffer
#define HC_SRC_KEEP 1  // call j-1's input, still in the register (call j-1 did not write it)
#define HC_SRC_FWD 2   // call j-1's result, still in the register (call j's input is its output)
struct Chain {
  const void* in[HC_CHAIN_MAX];
  void* out[HC_CHAIN_MAX];
  int src[HC_CHAIN_MAX];
  u64 count;  // elements of every call
  int n;
};
static_assert(sizeof(Chain) == 656, "hpccoll/_driver.py mirrors Chain: change both");

// ---- element types ----
#define HC_F64 0
#define HC_F32 1
#define HC_F16 2
#define HC_BF16 3
#define HC_I32 4
#define HC_I64 5

#ifndef HC_DTYPE
#define HC_DTYPE HC_F32
#endif

// T: storage type; Acc: type the op is computed in (16-bit floats compute in fp32 and round
// back to nearest-even after every step, exactly as numpy / ml_dtypes do).
#if HC_DTYPE == HC_F64
typedef double T; typedef double Acc;
#define HC_IS_FLOAT 1
#elif HC_DTYPE == HC_F32
typedef float T; typedef float Acc;
#define HC_IS_FLOAT 1
#elif HC_DTYPE == HC_F16 || HC_DTYPE == HC_BF16
typedef u16 T; typedef float Acc;
#define HC_IS_FLOAT 1
#elif HC_DTYPE == HC_I32
typedef int T; typedef int Acc;
#define HC_IS_FLOAT 0
#elif HC_DTYPE == HC_I64
typedef long long T; typedef long long Acc;
#define HC_IS_FLOAT 0
#endif

#define HC_EPP (HC_PACK / (int)sizeof(T))  // elements per 16-byte pack

__device__ __forceinline__ Acc toAcc(T x) {
#if HC_DTYPE == HC_F16
  float f; asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(x)); return f;
#elif HC_DTYPE == HC_BF16
  return __uint_as_float(((u32)x) << 16);
#else
  return x;
#endif
}

__device__ __forceinline__ T fromAcc(Acc a) {
#if HC_DTYPE == HC_F16
  u16 h; asm("{ .reg .b16 r; cvt.rn.f16.f32 r, %1; mov.b16 %0, r; }" : "=h"(h) : "f"(a)); return h;
#elif HC_DTYPE == HC_BF16
  u16 h; asm("{ .reg .b16 r; cvt.rn.bf16.f32 r, %1; mov.b16 %0, r; }" : "=h"(h) : "f"(a)); return h;
#else
  return a;
#endif
}

// ---- reduction ops: fixed semantics shared with hpccoll.ops.reduce_in_rank_order ----
#define HC_SUM 0
#define HC_PROD 1
#define HC_MAX 2
#define HC_MIN 3

template <int OP>
__device__ __forceinline__ T combine(T a, T b) {
  Acc x = toAcc(a), y = toAcc(b);
  if (OP == HC_SUM) return fromAcc(x + y);
  if (OP == HC_PROD) return fromAcc(x * y);
  // MAX/MIN: numpy's scalar rule, selecting the original bits: a if (a >= b or isnan(a)) else b
  bool keep = (OP == HC_MAX) ? (x >= y) : (x <= y);
  keep = keep || (x != x);
  return keep ? a : b;
}

// A 16-byte pack viewed as elements.
union Pack {
  uint4 u;
  u64 q[2];
  T e[HC_EPP];
};

template <int OP>
__device__ __forceinline__ Pack combinePack(Pack a, Pack b) {
  Pack r;
#pragma unroll
  for (int i = 0; i < HC_EPP; ++i) r.e[i] = combine<OP>(a.e[i], b.e[i]);
  return r;
}

// ---- lab-only switches (bench/bw_lab.py's timing-only variants); all 0 in the library ----
// HC_LAB_NO_INPUT   "noin":   user input packs are made up instead of read (collectives.cu loadPack)
// HC_LAB_NO_OUTPUT  "noout":  results are not written (storePack)
// HC_LAB_NO_WAIT    "nowait": every poll reads once and goes on as if the data were there (boundedPoll)
// HC_LAB_NO_REARM   "nowait_norearm": read slots are not re-armed (LLBuffer::rearm); only
//                   meaningful with HC_LAB_NO_WAIT, else a poll would pass on stale data
// Their results are wrong by design: they measure what a part of a collective costs.
// HC_LAB_NO_ABORT   "noabort": the one-shot does not read the abort flag before its first send
//                   (its polls still do); correct unless a peer times out
#ifndef HC_LAB_NO_ABORT
#define HC_LAB_NO_ABORT 0
#endif
#ifndef HC_LAB_NO_INPUT
#define HC_LAB_NO_INPUT 0
#endif
#ifndef HC_LAB_NO_OUTPUT
#define HC_LAB_NO_OUTPUT 0
#endif
#ifndef HC_LAB_NO_WAIT
#define HC_LAB_NO_WAIT 0
#endif
#ifndef HC_LAB_NO_REARM
#define HC_LAB_NO_REARM 0
#endif

// ---- memory access helpers ----
// st/ld.volatile reach L2 (and over NVLink the peer's L2) without L1 caching; each vector
// element is single-copy atomic: u32 for <=4-byte types, u64 for 8-byte types (so an 8-byte
// element never tears).  No fence is issued anywhere on the send/poll paths.
__device__ __forceinline__ void stVolatile(void* p, Pack v) {
#if HC_DTYPE == HC_F64 || HC_DTYPE == HC_I64
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v.q[0]), "l"(v.q[1]) : "memory");
#else
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.u.x), "r"(v.u.y),
               "r"(v.u.z), "r"(v.u.w) : "memory");
#endif
}

__device__ __forceinline__ Pack ldVolatile(const void* p) {
  Pack v;
#if HC_DTYPE == HC_F64 || HC_DTYPE == HC_I64
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.q[0]), "=l"(v.q[1]) : "l"(p) : "memory");
#else
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.u.x), "=r"(v.u.y), "=r"(v.u.z), "=r"(v.u.w) : "l"(p) : "memory");
#endif
  return v;
}

// Plain 16-byte global load/store (user buffers, 16-byte aligned).
__device__ __forceinline__ Pack ldPack(const void* p) { Pack v; v.u = *(const uint4*)p; return v; }
__device__ __forceinline__ void stPack(void* p, Pack v) { *(uint4*)p = v.u; }

// Load `n` (< HC_EPP) elements of a partial last pack; `fill` elsewhere.
__device__ __forceinline__ Pack ldPartial(const T* p, int n, T fill) {
  Pack v;
#pragma unroll
  for (int i = 0; i < HC_EPP; ++i) v.e[i] = i < n ? p[i] : fill;
  return v;
}
__device__ __forceinline__ void stPartial(T* p, Pack v, int n) {
#pragma unroll
  for (int i = 0; i < HC_EPP; ++i) if (i < n) p[i] = v.e[i];
}

__device__ __forceinline__ u64 globaltimer() {
  u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}

__device__ __forceinline__ int ldVolatileInt(const int* p) { return *(const volatile int*)p; }

// Scoped loads and stores of one u64 (the eager engine, cuda/persistent.cu, and its lab): .sys
// for words the host shares through mapped memory, .gpu for words only this GPU's blocks share.
__device__ __forceinline__ u64 ldAcquireSys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
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
__device__ __forceinline__ void stRelaxedSys(u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// LL flag of an epoch: 1..2^32-1, never 0 (receive buffers start zeroed).
__device__ __forceinline__ u32 llFlag(u64 epoch) { return (u32)(epoch % 0xFFFFFFFFull) + 1u; }

// Programmatic dependent launch (Hopper+): the host may launch a collective with the
// programmatic-stream-serialization attribute, so it is scheduled while the previous kernel
// of the stream still runs.  `griddepcontrol.wait` first thing keeps the stream's order for
// every memory access (it returns once the previous grid has completed and its writes are
// visible; without the attribute it returns at once), and `launch_dependents` lets the next
// launch start early in turn.
__device__ __forceinline__ void streamOrderBegin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
