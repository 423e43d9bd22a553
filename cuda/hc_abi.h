// hc_abi.h - everything the kernels and the host share: constants, codes, and the by-value
// kernel parameter structs.  The single source: hpccoll/_abi.py reads this file at import time
// (the #define lines of integer values and the struct definitions below), so Python never
// repeats one of these numbers or field layouts.  Plain C: NVRTC and the CPU tests' parser
// both read it.  Keep each #define value an integer literal or an expression of earlier names
// with + - * << and parentheses, and each struct field `type name;` or `type name[EXPR];`.
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// ---- limits ----
#define HC_MAX_RANKS 8       // ranks per node the kernels support
#define HC_MAX_BLOCKS 256    // epoch counters kept per communicator
#define HC_PACK 16           // bytes moved per thread per step
#define HC_MAX_THREADS 512   // threads per block at most (the host's grid rule, __launch_bounds__)

// ---- workspace control region (at offset 0 of every rank's symmetric buffer) ----
// [0, 2048)        u64 epochs[HC_MAX_BLOCKS]  per-block collective counters (ll_buffer.cuh)
// [2048, 2056)     int abortFlag              set by the first poll that times out
// [2112, 2144)     ErrRec                     what that poll waited for
// [4096, 4160)     u64 barrier[HC_MAX_RANKS]  barrier arrivals, written by peers
// [4608], [5120]   u64                        sol.cu scratch: ping-pong word, floor store
// [8192, 8256)     u64 probe[HC_MAX_RANKS]    the host's cross-process peer test
// [16384, 32768)   u64 arrive[blocks][ranks]  Bcast: "block b of rank r has finished epoch e-1"
#define HC_OFF_EPOCHS 0
#define HC_OFF_ABORT 2048
#define HC_OFF_ERR 2112
#define HC_OFF_BARRIER 4096
#define HC_OFF_PINGPONG (HC_OFF_BARRIER + 512)
#define HC_OFF_FLOOR (HC_OFF_BARRIER + 1024)
#define HC_OFF_PROBE 8192
#define HC_OFF_ARRIVE 16384
#define HC_CTRL_BYTES 65536

// ---- collectives named in the error record ----
#define HC_COLL_ALLREDUCE 1
#define HC_COLL_BCAST 2
#define HC_COLL_ALLGATHER 3
#define HC_COLL_REDUCE_SCATTER 4
#define HC_COLL_BARRIER 5
#define HC_COLL_ALLTOALL 6
#define HC_COLL_USER 7       // a kernel written on the extension API (hpccoll.ext)

// ---- element types (HC_DTYPE selects one per module) ----
#define HC_F64 0
#define HC_F32 1
#define HC_F16 2
#define HC_BF16 3
#define HC_I32 4
#define HC_I64 5

// ---- reduction ops ----
#define HC_SUM 0
#define HC_PROD 1
#define HC_MAX 2
#define HC_MIN 3

// ---- floating-point bit patterns ----
// The sentinel protocol's "not yet written" word: a negative quiet NaN in every width, the same
// bytes for every dtype (0xFA 0xFF repeated), so one fill serves every region.
#define HC_SENTINEL_U16 0xFFFA
#define HC_SENTINEL_U32 0xFFFAFFFA
#define HC_SENTINEL_U64 0xFFFAFFFAFFFAFFFA
// The one NaN every floating-point result carries (numpy's np.nan in each width): reductions
// turn any NaN they produce into it, so every rank holds the same bits whatever the payloads of
// the NaNs that went in (ops.py gives the host the same rule).
#define HC_CANON_NAN_F64 0x7FF8000000000000
#define HC_CANON_NAN_F32 0x7FC00000
#define HC_CANON_NAN_F16 0x7E00
#define HC_CANON_NAN_BF16 0x7FC0

// ---- groups and chains ----
#define HC_GROUP_MAX 32      // Allreduce calls one group launch carries
#define HC_CHAIN_MAX 32      // Allreduce calls one captured chain node carries
#define HC_SRC_LOAD 0        // a chained call's input pack: from its input buffer
#define HC_SRC_KEEP 1        // call j-1's input, still in the register (call j-1 did not write it)
#define HC_SRC_FWD 2         // call j-1's result, still in the register (call j's input is its output)

// ---- the eager engine (persistent.cu): mapped host memory of one engine ----
//   bell b [64 b, 64 b + 8), b < HC_ENGINE_MAX_BLOCKS: seq32 << 32 | ver32
//   desc   [512, 544): { in, out, count, cmd }
//   done   [576, 640): u64 per block, the last call the block finished
#define HC_ENGINE_MAX_BLOCKS 8
#define HC_ENGINE_HOST_BYTES 1024
#define HC_ENGINE_DESC_BYTE 512
#define HC_ENGINE_DONE_BYTE 576
#define HC_ENGINE_DESC (HC_ENGINE_DESC_BYTE / 8)   // as u64 indices
#define HC_ENGINE_DONE (HC_ENGINE_DONE_BYTE / 8)
#define HC_ENGINE_STOP 255   // cmd: leave the loop; otherwise cmd = the reduction (HC_SUM..HC_MIN)
#define HC_ENGINE_PPT 2      // packs per thread before a call takes another block
#define HC_ENGINE_KEEP 4     // the most packs a thread keeps: max_bytes <= blocks * KEEP * 512 * 16
#define HC_ENGINE_BLOCK 512  // threads per engine block
#define HC_ENGINE_FULL_RING ((1 << 30) - 1)  // every block takes part in one call of every 2^30

// ---- the by-value kernel parameters ----
// What one poll that timed out waited for (at HC_OFF_ERR of the control region).
struct ErrRec {
  int code;        // 1 = timeout
  int collective;  // HC_COLL_*
  int peer;        // rank waited for
  int pad;
  u64 slot;        // slot (pack index) waited on
  u64 waitedNs;
};

// Kernel arguments (constant bank: no loads on the critical path).
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
  int rank;
  int nranks;
  int root;
  int iters;
};

// The calls of a group launch: laid end to end from pack boundaries.
struct Group {
  u64 start[HC_GROUP_MAX + 1];  // first pack of call j in the launch; start[n]: the launch's packs
  const void* in[HC_GROUP_MAX];
  void* out[HC_GROUP_MAX];
  u64 count[HC_GROUP_MAX];      // elements of call j
  int n;
};

// The calls of a captured chain node: one element count, buffers the same or disjoint.
struct Chain {
  const void* in[HC_CHAIN_MAX];
  void* out[HC_CHAIN_MAX];
  int src[HC_CHAIN_MAX];        // HC_SRC_* of call j
  u64 count;                    // elements of every call
  int n;
};

// The eager engine's second parameter.
struct EngineArgs {
  const u64* host;   // device address of the engine's mapped host memory (bells, desc, done)
  u64 seq0;          // the last call posted before this launch
  u64 epoch0;        // epochs of the engine's region consumed by earlier launches
};
