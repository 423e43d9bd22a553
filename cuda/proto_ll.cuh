// proto_ll.cuh - the LL protocol: 8 bytes of data + 8 bytes of flag per 16-byte slot.
//
//   slot (16 B), written with ONE st.volatile.v2.u64:
//     u64 word 0 = flag << 32 | data[31:0]
//     u64 word 1 = flag << 32 | data[63:32]
//   receive buffer at rest: zero (flag 0 is never used)
//
// Assumption, and why this layout: PTX guarantees single-copy atomicity per vector ELEMENT,
// not per 16-byte vector.  No torn 16-byte read was ever seen over NVLink on H200 - evidence,
// not proof - so each 8-byte word carries its own
// copy of the flag and is atomic by itself: a reader that sees the flag in both words has both
// data halves of this epoch (NCCL's LL makes the same choice).  Cost: 50% payload efficiency.
// Flags are epoch-derived (1..2^32-1, never 0), so LL slots are never re-armed: a slot is
// fresh when its flags equal this epoch's flag.  A slot left unwritten for exactly
// k*(2^32-1) collectives of its parity could pass as fresh (>= 71 min at 1 us per op).
// LL moves raw bits (no sanitizing): it carries integers, Bcast and Allgather.
//
// Where a pack's two slots lie (`at`, `kHalf`): packs in groups of 32, a group's first halves
// in 512 contiguous bytes and its second halves in the next 512, so that a warp's store (and
// poll) instruction covers 512 contiguous bytes (sub-buffers are multiples of 1 KiB).  Side by
// side (p * 32) a warp's instruction would write every other 16 bytes of a 1 KiB span, which
// was measurably slower from 128 KiB up.
#pragma once
#include "hc_common.cuh"

struct LL {
  static constexpr bool kRearms = false;  // flags are epochs: slots are never re-armed
  static constexpr int kBytesPerPack = 32;  // a 16-byte pack takes two 16-byte slots
  static constexpr int kHalf = 512;  // from a pack's first slot to its second

  // Byte offset of pack `slot`'s first 16-byte slot in a sub-buffer.
  __device__ static u64 at(u64 slot) {
    return (slot >> 5) * 1024 + (slot & 31) * 16;
  }

  __device__ static void write(char* slot, Pack v, u32 flag) {
    const u64 f = (u64)flag << 32;
    const u32* w = (const u32*)&v.u;
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(f | w[0]), "l"(f | w[1]) : "memory");
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(slot + kHalf), "l"(f | w[2]), "l"(f | w[3]) : "memory");
  }

  __device__ static bool readOnce(const char* slot, u32 flag, Pack& v) {
    u64 a, b, c, d;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(slot) : "memory");
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(c), "=l"(d) : "l"(slot + kHalf) : "memory");
    v.u = make_uint4((u32)a, (u32)b, (u32)c, (u32)d);
    return (u32)(a >> 32) == flag && (u32)(b >> 32) == flag && (u32)(c >> 32) == flag && (u32)(d >> 32) == flag;
  }

  __device__ static void clear(char*) {}  // flags are epochs: nothing to re-arm
};
