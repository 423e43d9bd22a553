// hc_common.cuh - types, element traits, reduction ops, PTX access helpers, bounded polling.
//
// Compiled by NVRTC (no standard headers): everything needed is defined here.
// One module is compiled per element type: HC_DTYPE selects it (codes below), and
// every kernel of cuda/collectives.cu is instantiated for that type.
#pragma once

#include "hc_abi.h"

// The rank count.  HC_NRANKS makes it a compile-time constant, so that a module built for one
// rank count keeps none of the other counts' code (the library builds every module so).
__device__ __forceinline__ int nranksOf(const Args& a) {
#ifdef HC_NRANKS
  return HC_NRANKS;
#else
  return a.nranks;
#endif
}

// ---- element types ----
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

// ---- reduction ops: the semantics of hpccoll.ops.reduce_in_rank_order, bit for bit ----
// SUM / PROD: IEEE arithmetic in rank order, 16-bit types rounded back after every step.
// MAX / MIN: the larger / smaller value, +0 above -0; commutative and associative in bits, so the
// order of the operands never shows.  Any NaN (an operand of MAX/MIN, or a SUM/PROD result) is
// the dtype's canonical NaN (HC_CANON_NAN_*): NaN payloads differ between GPUs' arithmetic and
// between inputs, and every rank must hold the same bits.
#if HC_DTYPE == HC_F64
__device__ __forceinline__ T canonNaN() { return __longlong_as_double((long long)HC_CANON_NAN_F64); }
__device__ __forceinline__ bool signOf(T a) { return __double_as_longlong(a) < 0; }
#elif HC_DTYPE == HC_F32
__device__ __forceinline__ T canonNaN() { return __uint_as_float(HC_CANON_NAN_F32); }
__device__ __forceinline__ bool signOf(T a) { return __float_as_uint(a) >> 31; }
#elif HC_DTYPE == HC_F16 || HC_DTYPE == HC_BF16
__device__ __forceinline__ T canonNaN() { return HC_DTYPE == HC_F16 ? (u16)HC_CANON_NAN_F16 : (u16)HC_CANON_NAN_BF16; }
__device__ __forceinline__ bool signOf(T a) { return a >> 15; }
#endif

template <int OP>
__device__ __forceinline__ T combine(T a, T b) {
  Acc x = toAcc(a), y = toAcc(b);
#if HC_IS_FLOAT
  if (OP == HC_SUM || OP == HC_PROD) {
    const Acc r = OP == HC_SUM ? x + y : x * y;
    return r != r ? canonNaN() : fromAcc(r);  // (rounding a non-NaN never makes one)
  }
  if (x != x || y != y) return canonNaN();
  // Equal values have equal bits but for +-0 (16-bit types convert to fp32 exactly)
  const bool keep = (OP == HC_MAX) ? (x > y || (x == y && !signOf(a))) : (x < y || (x == y && signOf(a)));
  return keep ? a : b;
#else
  if (OP == HC_SUM) return x + y;
  if (OP == HC_PROD) return x * y;
  return ((OP == HC_MAX) ? (x >= y) : (x <= y)) ? a : b;
#endif
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
