// sy2sb_kernels.cu's launch sizes on the CPU (tests/unit/test_eigensolver_twostage.py): the
// shared memory of a block and the work array, which sy2sb_device.py computes in Python, from the
// kernel file's own functions (SY2SB_SIZES_ONLY: the file without its device code).
#define SY2SB_SIZES_ONLY
#include "sy2sb_kernels.cu"

extern "C" long long sy2sb_sizes_smem(int R, int b) { return sy2sb_panel_smem(R, b); }
extern "C" long long sy2sb_sizes_work(int G) { return sy2sb_panel_work(G); }
