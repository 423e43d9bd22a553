#!/usr/bin/env bash
# One call on the GPU machine: install, run the GPU tests (2 ranks; 4 ranks on 2 GPUs under
# MPS) and the benchmark.  Results and logs go to $OUT.  Usage (from the repo root):
#   bash bench/device_run.sh [tests|tests4|bench|eig|all]...
set -uo pipefail
OUT=${OUT:-/tmp/hpccoll-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HPCCOLL_CACHE_DIR=${HPCCOLL_CACHE_DIR:-/tmp/hpccoll-kcache}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1 \
  || { echo "install failed"; tail -20 "$OUT/install.log"; exit 1; }
MPIEXEC=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit" | tee "$OUT/meta.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/meta.txt"

mps_on() { export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log;
           mkdir -p /tmp/mps-pipe /tmp/mps-log; nvidia-cuda-mps-control -d && echo "MPS on"; }
mps_off() { echo quit | nvidia-cuda-mps-control 2>/dev/null; echo "MPS off"; }

for stage in "${@:-all}"; do
  case $stage in
    info) "${MPIEXEC[@]}" -n 2 hpccoll info 2>&1 | tee "$OUT/info.txt" ;;
    tests) HPCCOLL_TIMEOUT=10 timeout ${TEST_LIMIT:-420} "${MPIEXEC[@]}" -n 2 python3 -m pytest -q -x -rs --with-mpi \
             -p no:cacheprovider ${PYTEST_ARGS:-} tests/gpu 2>&1 | tee "$OUT/gpu-tests-2ranks.txt" ;;
    tests4) mps_on; HPCCOLL_TIMEOUT=10 timeout ${TEST_LIMIT:-420} "${MPIEXEC[@]}" -n 4 python3 -m pytest -q -x -rs --with-mpi \
             -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu-tests-4ranks.txt"; mps_off ;;
    bench) timeout 500 "${MPIEXEC[@]}" -n 2 hpccoll bench allreduce --sizes "${SIZES:-8:64M}" --dtype "${DTYPE:-float32}" \
             --algorithms all --baselines --json "$OUT/bench-allreduce.json" --plot "$OUT/bench-allreduce.png" \
             2>&1 | tee "$OUT/bench-allreduce.txt" ;;
    profile) timeout 120 "${MPIEXEC[@]}" -n 2 python3 bench/profile_eager.py 2>&1 | tee "$OUT/profile-eager.txt" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
