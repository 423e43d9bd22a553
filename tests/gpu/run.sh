#!/usr/bin/env bash
# The GPU test suite on a GPU machine: one MPI job per test file (a failure aborts only its own
# job), at each rank count given; several ranks share one GPU through MPS when there are more
# ranks than GPUs.  Logs go to $OUT (default /tmp/hpccoll-gpu).  From the repository root:
#
#   tests/gpu/run.sh 2 3            # every tests/gpu/test_*.py at 2 ranks, then at 3
#   FILES="tests/gpu/test_ext_gpu.py" tests/gpu/run.sh 4
#   HPCCOLL_TEST_NCCL_LOOPBACK=1 tests/gpu/run.sh 2   # NCCL's tests too on ranks sharing a GPU
#
# Open MPI needs --allow-run-as-root where it runs as root; MPIEXEC overrides the launcher.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/hpccoll-gpu}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HPCCOLL_TIMEOUT=${HPCCOLL_TIMEOUT:-10}
# CuPy's CUB-accelerated reductions fail to compile on the GPU machines of this project (NVRTC:
# "unrecognized token" on an empty program); the tests do not need them.
export CUPY_ACCELERATORS=${CUPY_ACCELERATORS-}
read -r -a MPIEXEC <<< "${MPIEXEC:-mpiexec --allow-run-as-root --oversubscribe --bind-to none}"
gpus=$(nvidia-smi -L | wc -l)
# Host BLAS threads: each rank takes its share of the CPUs the unbound ranks share
# (tests/conftest.py's host_blas_threads; OMP_NUM_THREADS and the like, if set, win).
python3 tests/gpu/precompile.py --ranks "$(IFS=,; echo "$*")" 2>&1 | tail -1
rm -f "$OUT/failed.txt"
for n in "$@"; do
  mps=0
  if (( n > gpus )); then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p /tmp/mps-pipe /tmp/mps-log && nvidia-cuda-mps-control -d && mps=1 && echo "MPS on ($n ranks, $gpus GPU)"
  fi
  for f in ${FILES:-tests/gpu/test_*.py}; do
    if grep -q "^STARTS_ITS_OWN_JOBS = True" "$f"; then  # its own MPI jobs: plain pytest, once
      [[ $n == "$1" ]] || continue
      echo "=== $f (starts its own jobs)"
      MPIEXEC="${MPIEXEC[*]}" timeout "${FILE_LIMIT:-600}" python3 -m pytest -q -rs --color=no -p no:cacheprovider \
        -W ignore::DeprecationWarning ${PYTEST_ARGS:-} "$f" 2>&1 | tail -${TAIL:-25}
      [[ ${PIPESTATUS[0]} == 0 ]] || { echo "$f" >> "$OUT/failed.txt"; echo "=== FAILED: $f"; }
      continue
    fi
    echo "=== $f at $n ranks"
    timeout "${FILE_LIMIT:-600}" "${MPIEXEC[@]}" -n "$n" python3 -m pytest -q -rs --color=no --with-mpi \
      -p no:cacheprovider -W ignore::DeprecationWarning ${PYTEST_ARGS:-} "$f" 2>&1 \
      | grep -a -v "^\(MPI\|MPICH\|rank:\|size:\|mpi4py\|=* MPI Information\)" | tail -${TAIL:-25}
    [[ ${PIPESTATUS[0]} == 0 ]] || { echo "$f at $n ranks" >> "$OUT/failed.txt"; echo "=== FAILED: $f at $n ranks"; }
  done 2>&1 | tee "$OUT/gpu-tests-${n}ranks.txt"
  (( mps )) && { echo quit | nvidia-cuda-mps-control; echo "MPS off"; }
done
[[ -s $OUT/failed.txt ]] && { echo "=== FAILED:"; cat "$OUT/failed.txt"; exit 1; }
echo "=== every file passed at $* ranks"
