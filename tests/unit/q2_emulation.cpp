// q2_kernels.cu's group path on the CPU (tests/unit/test_q2_emulation.py): q2_group_T's and
// q2_group_apply's blocks, compiled as C++ (Q2_HOST), every phase run over all Q2_THREADS thread
// indices in turn, in an order chosen per call (ascending, descending, or shuffled: a phase whose
// threads race on a slot gives different results under different orders), each mma as the sum
// over k of the lane's outputs, and a phase run only when the barrier after it is reached (see
// HostExec).  Shared memory and each thread's kept state start as NaN in every block (a slot read
// before a phase wrote it shows up in the results).
#define Q2_HOST
#include "q2_kernels.cu"

#include <string.h>

#include "emulation_order.h"

#include <functional>
#include <vector>

// each() only queues its phase; sync() runs the queued phases thread by thread (thread perm[0]
// through all of them, then perm[1], ...): two phases with no barrier between them then see each
// other's writes as unsynchronized threads could, and give other results in another order
struct HostExec {
  int perm[Q2_THREADS];  // the order in which a phase runs the thread indices
  int nt;                // how many: the launch's threads
  mutable std::vector<std::function<void(int)>> queued;
  template <class F>
  void each(F f) const { queued.emplace_back(f); }
  void sync() const {
    for (int i = 0; i < nt; ++i)
      for (auto& f : queued) f(perm[i]);
    queued.clear();
  }
};

static void order_threads(HostExec& x, int nt, int order) {
  x.nt = nt;
  thread_order(x.perm, nt, order);
}

extern "C" int q2_emu_group_T(const double* flat, const long long* offsets, int q, int K, int b, int g,
                              double* T, int order) {
  std::vector<double> S((size_t)(g * g + g));
  HostExec x;
  order_threads(x, Q2_THREADS, order);
  for (int k = 0; k < K; ++k) {
    memset(S.data(), 0xff, S.size() * sizeof(double));
    q2_group_T_block(x, Q2_THREADS, flat, offsets, q, b, g, T, k, S.data());
  }
  return 0;
}

extern "C" int q2_emu_group_apply(const double* flat, const long long* offsets, const double* T, int q, int K,
                                  int n, int b, int g, double* Z, long long ldz, int ncols, int order) {
  static Q2Smem s;
  static Q2Thread th[Q2_THREADS];
  HostExec x;
  order_threads(x, Q2_THREADS, order);
  for (int blk = 0; blk * Q2_COLS < ncols; ++blk) {
    memset(&s, 0xff, sizeof s);
    memset(th, 0xff, sizeof th);
    q2_group_apply_block(x, [](int t) -> Q2Thread& { return th[t]; }, s, flat, offsets, T, q, K, n, b, g, Z, ldz,
                         ncols, blk);
  }
  return 0;
}
