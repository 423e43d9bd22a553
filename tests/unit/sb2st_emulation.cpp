// sb2st_kernels.cu's step on the CPU (tests/unit/test_sb2st_emulation.py): the kernel's own
// chase_step, compiled as C++ (SB2ST_HOST), every phase run over all SB_TPB thread indices in
// turn, in an order chosen per call (ascending, descending, or shuffled: a phase whose threads
// race on a slot gives different results under different orders).  Each sweep has its own shared
// memory, kept from step to step as the block that runs the sweep keeps it; before every step all
// of it is set to NaN except, after the sweep's first step, what the previous step leaves for it:
// the pivot block L, the reflector v and tau v, and whether it deferred a row (a slot read
// before a phase wrote it shows up in the results).
#define SB2ST_HOST
#include "sb2st_kernels.cu"

#include <string.h>

#include "emulation_order.h"

#include <vector>

struct HostExec {
  int perm[SB_TPB];  // the order in which a phase runs the thread indices
  template <class F>
  void each(F f) const { for (int i = 0; i < SB_TPB; ++i) f(perm[i]); }
  template <class F>
  void warp(F f) const { for (int i = 0; i < SB_TPB; ++i) if (perm[i] < 32) f(perm[i]); }
  void sync() const {}
};

static void order_threads(HostExec& x, int order) { thread_order(x.perm, SB_TPB, order); }

extern "C" int sb2st_emu_step(double* A, double* flat, const long long* goff, int n, int b, int g,
                              int j, int k, int order) {
  static std::vector<Smem> per_sweep;  // sweep j's shared memory
  if ((int)per_sweep.size() <= j) per_sweep.resize(j + 1);
  Smem& sm = per_sweep[j];
  if (k == 0) {
    memset(&sm, 0xff, sizeof sm);      // every double a NaN
  } else {
    static Smem kept;
    memcpy(&kept, &sm, sizeof sm);
    memset(&sm, 0xff, sizeof sm);
    memcpy(sm.L, kept.L, sizeof sm.L);
    memcpy(sm.v, kept.v, sizeof sm.v);
    memcpy(sm.tv, kept.tv, sizeof sm.tv);
    sm.deferred = kept.deferred;
  }
  HostExec x;
  order_threads(x, order);
  chase_step(x, sm, A, flat, goff, n, b, g, j, k);
  return 0;
}

extern "C" int sb2st_emu_steps_needed(int n, int b, int j, int k) { return steps_needed(n, b, j, k); }
extern "C" int sb2st_emu_sweep_steps(int n, int b, int j) { return sweep_steps(n, b, j); }
extern "C" int sb2st_emu_const(int which) { return which == 0 ? SB_TPB : which == 1 ? SB_BMAX : SB_LAG; }
