// sytrd_abi.h - the constants sytrd_step.cu and its launcher (sytrd_device.py) share.  The one
// source: sytrd_step.cu includes this file and sytrd_device.py reads its #define lines at
// import, so Python never repeats one of these numbers.  Keep each value an integer literal or
// an expression of earlier names with + - * / and parentheses.
#pragma once

#define TPB 256            // threads per block: a tile of 32 rows x NW warps
#define NW (TPB / 32)      // warps per block

// sytrd_symv's work units (sytrd_step.cu describes them)
#define SY_R 256           // rows per tile (a thread per row: TPB)
#define SY_U (SY_R / 32)   // rows per lane
#define SY_C 64            // trailing local columns per chunk (2 SY_C, 4 SY_C wide early on)
#define SY_G 3             // columns per warp in flight (4 spilled registers at 2 blocks per SM)
#define SY_MAXCH 2048      // chunks per column at most in the persistent work list (local columns / SY_C)
#define SY_MINB 2          // resident blocks per SM the registers must allow
#define SY_WIDE 2048       // chunks 2 SY_C wide while at least this many trailing local columns remain
#define SY_WIDER 7168      // and 4 SY_C wide while at least this many remain
#define SY_SUMW 16         // loads in flight in the last units' sums of partials
