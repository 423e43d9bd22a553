// The order in which a kernel emulation runs a phase's thread indices (tests/unit/*_emulation.cpp):
// perm[0 .. nt - 1] ascending (order 0), descending (1), or a shuffle seeded by the order (>= 2).
#pragma once

static inline void thread_order(int* perm, int nt, int order) {
  for (int i = 0; i < nt; ++i) perm[i] = order == 1 ? nt - 1 - i : i;
  if (order < 2) return;
  unsigned long long r = 0x9E3779B97F4A7C15ull * (unsigned long long)order;
  for (int i = nt - 1; i > 0; --i) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    const int k = (int)((r >> 33) % (unsigned long long)(i + 1));
    const int t = perm[i]; perm[i] = perm[k]; perm[k] = t;
  }
}
