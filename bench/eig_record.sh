#!/usr/bin/env bash
# The eigensolver's records on one GPU machine: per-rank peak memory of the distributed solver at
# P = 1, 2, 4 (ranks sharing the GPU through MPS when there are fewer GPUs) and its time at P = 1
# against the one-GPU anchor (CuPy's cuSOLVER path) on the same GPU and problems.
#
#   OUT=dir SIZES="8192 16384" RANKS="1 2 4" bash bench/eig_record.sh
#
# Writes $OUT/eig/ (one JSON per run, report.md) and $OUT/eig-record.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hpccoll-eig}
mkdir -p "$OUT/eig"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CUPY_ACCELERATORS=${CUPY_ACCELERATORS-} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
read -r -a MPIEXEC <<< "${MPIEXEC:-mpiexec --allow-run-as-root --oversubscribe --bind-to none}"
gpus=$(nvidia-smi -L | wc -l)
COMMON=(--problem "${PROBLEM:-known}" --repeat "${REPEAT:-1}" --no-reference --save-vectors no --out "$OUT/eig")
{
  for n in ${SIZES:-8192 16384}; do
    timeout "${LIMIT:-300}" "${MPIEXEC[@]}" -n 1 hpccoll-eigensolver anchor single-gpu --n "$n" "${COMMON[@]}" 2>&1 | grep -a "solve\|error" | tail -3
    for p in ${RANKS:-1 2 4}; do
      mps=0
      if (( p > gpus )); then
        export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
        mkdir -p /tmp/mps-pipe /tmp/mps-log && nvidia-cuda-mps-control -d && mps=1
      fi
      timeout "${LIMIT:-300}" "${MPIEXEC[@]}" -n "$p" hpccoll-eigensolver solve --n "$n" --comm "${COMM:-sentinel}" \
        "${COMMON[@]}" 2>&1 | grep -a "solve\|error\|memory" | tail -3
      (( mps )) && echo quit | nvidia-cuda-mps-control
    done
  done
  hpccoll-eigensolver report "$OUT/eig" 2>&1 | tail -3
} 2>&1 | tee "$OUT/eig-record.txt"
