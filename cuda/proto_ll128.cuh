// proto_ll128.cuh - LL128 atomic: hardware reductions into 128-byte lines with an in-line
// completion counter.  Sum of floating-point types only; NOT deterministic (the order in which
// contributions land decides the rounding once three or more meet in one sum).
//
//   line (128 B) = 8 lanes x 16-byte packs, owned by one rank, zero at rest:
//     lane 0..6 : HC_EPP data elements each
//     lane 7    : HC_EPP-1 data elements + the counter (last element)
//   data elements per line: EPL = 128/sizeof(T) - 1  (f64 15, f32 31, f16/bf16 63)
//
// Every peer adds its contribution with ONE warp-wide vector reduction per line -
// red.global.v4.f32.add, .v4.f16x2/.v4.bf16x2.add.noftz, f64: two red.add.f64 per lane - with
// 1.0 in the counter.  The owner polls the line until the counter reads nranks-1, takes the
// sums from that same load, adds its own contribution in registers, and re-arms the line with
// zeros (double buffered by epoch parity).
//
// Assumption (NCCL's LL128 assumption, extended to reductions): the reductions of the 8 lanes
// of one warp instruction to one 128-byte-aligned line travel and are applied as one unit, so
// the counter never lands before the data beside it.  The PTX memory model does not promise
// this; it needs native peer atomics over NVLink (checked on the host before LL128 is offered)
// and the GPU tests check every sum.
#pragma once
#include "hc_common.cuh"

#if HC_IS_FLOAT
struct LL128 {
  static constexpr bool kRearms = true;  // lines are re-armed (zeroed) after use
  static constexpr int kLineBytes = 128;
  static constexpr int kEPL = 128 / (int)sizeof(T) - 1;

  // Add pack v (counter lane: last element replaced by 1.0) into `dst`.
  __device__ static void contribute(char* dst, Pack v, bool counterLane) {
    if (counterLane) v.e[HC_EPP - 1] = fromAcc((Acc)1);
#if HC_DTYPE == HC_F32
    asm volatile("red.global.v4.f32.add [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v.e[0]), "f"(v.e[1]),
                 "f"(v.e[2]), "f"(v.e[3]) : "memory");
#elif HC_DTYPE == HC_F16
    asm volatile("red.global.v4.f16x2.add.noftz [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.u.x), "r"(v.u.y),
                 "r"(v.u.z), "r"(v.u.w) : "memory");
#elif HC_DTYPE == HC_BF16
    asm volatile("red.global.v4.bf16x2.add.noftz [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.u.x), "r"(v.u.y),
                 "r"(v.u.z), "r"(v.u.w) : "memory");
#elif HC_DTYPE == HC_F64
    asm volatile("red.global.add.f64 [%0], %1;" ::"l"(dst), "d"(v.e[0]) : "memory");
    asm volatile("red.global.add.f64 [%0], %1;" ::"l"(dst + 8), "d"(v.e[1]) : "memory");
#endif
  }

  __device__ static void clear(char* p) { stPack(p, Pack{make_uint4(0, 0, 0, 0)}); }
};
#endif
