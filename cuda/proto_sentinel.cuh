// proto_sentinel.cuh - the sentinel ("poison") protocol: payload only, validity from the data.
//
//   slot (16 B) = one pack of payload                      | receive buffer at rest
//   ---------------------------------------------------------+----------------------------
//   T0 T1 ... T(HC_EPP-1)                                   | every word = SENTINEL bits
//
// Assumption: each vector element of a 16-byte st.volatile (u32, or u64 for 8-byte types) is
// single-copy atomic, so a reader sees every element either old (sentinel) or new (data).
// It checks every element, so a torn 16-byte read is harmless.
// Sentinel = a negative quiet NaN pattern per element width, compared as BITS, never as values
// (-0.0 == +0.0 and NaN != NaN would break a value compare).  Senders rewrite any element whose
// bits equal the sentinel to the canonical quiet NaN (still a NaN: sums, products and max/min
// see a NaN either way), so data can never look unwritten.  16-bit types are checked per u32
// (two elements): after sanitizing, no data word can equal the doubled pattern.
// Integers have no spare bit pattern: they use the LL protocol.
#pragma once
#include "hc_common.cuh"

struct Sentinel {
  static constexpr bool kRearms = true;  // read slots are re-armed with the sentinel
  static constexpr int kBytesPerPack = 16;  // receive-buffer bytes per 16-byte pack
  __device__ static u64 at(u64 slot) { return slot * kBytesPerPack; }  // a pack's slot in a sub-buffer
#if HC_DTYPE == HC_F64 || HC_DTYPE == HC_I64
  static constexpr u64 kWord = HC_SENTINEL_U64;   // fill pattern of the receive buffer
  static constexpr u64 kCanon = HC_CANON_NAN_F64;  // what a sender writes for data equal to kWord
#else
  static constexpr u32 kWord = HC_SENTINEL_U32;
  static constexpr u32 kCanon = HC_CANON_NAN_F32;  // (16-bit types: per element, in sanitize)
#endif

  __device__ static Pack sanitize(Pack v) {
#if HC_DTYPE == HC_F64 || HC_DTYPE == HC_I64
#pragma unroll
    for (int i = 0; i < 2; ++i) v.q[i] = v.q[i] == kWord ? kCanon : v.q[i];
#elif HC_DTYPE == HC_F32 || HC_DTYPE == HC_I32
    u32* w = (u32*)&v.u;
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = w[i] == kWord ? kCanon : w[i];
#else
    const u16 canon = HC_DTYPE == HC_F16 ? HC_CANON_NAN_F16 : HC_CANON_NAN_BF16;
#pragma unroll
    for (int i = 0; i < HC_EPP; ++i) v.e[i] = v.e[i] == (u16)HC_SENTINEL_U16 ? canon : v.e[i];
#endif
    return v;
  }

  __device__ static bool valid(Pack v) {
#if HC_DTYPE == HC_F64 || HC_DTYPE == HC_I64
    return v.q[0] != kWord && v.q[1] != kWord;
#else
    return v.u.x != kWord && v.u.y != kWord && v.u.z != kWord && v.u.w != kWord;
#endif
  }

  __device__ static void write(char* slot, Pack v, u32 /*flag*/) { stVolatile(slot, sanitize(v)); }

  __device__ static bool readOnce(const char* slot, u32 /*flag*/, Pack& v) {
    v = ldVolatile(slot);
    return valid(v);
  }

  // Re-arm: a plain local store; it is ordered before any peer's next write to this slot by
  // the double buffering (see ll_buffer.cuh).
  __device__ static void clear(char* slot) {
    Pack s;
#if HC_DTYPE == HC_F64 || HC_DTYPE == HC_I64
    s.q[0] = s.q[1] = kWord;
#else
    s.u = make_uint4(kWord, kWord, kWord, kWord);
#endif
    stPack(slot, s);
  }
};
