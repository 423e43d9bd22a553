#!/usr/bin/env bash
# The eigensolver against cuSOLVER on one GPU (bench/eig_vs_cusolver.py): P = 1 in one plain
# process (MPS off), then P = 2 and 4 under mpiexec with the ranks sharing the GPU through MPS,
# each process with its own time budget; every output lands in $OUT/eig-vs-cusolver as it is
# written (a run cut short keeps its rows), and is tarred at the end.
#
#   OUT=dir SIZES=8192,16384 MPI_SIZES=8192 RANKS="2 4" bash bench/eig_vs_cusolver.sh
#
# SIZES / MPI_SIZES: --n of P = 1 / of the ranks; WHAT / MPI_WHAT: their --what (empty: the
# script's defaults); PROBLEMS: --problems; BUDGET / MPI_BUDGET: --budget-s of P = 1 / of each P
# (default 300 / 90: with start-up, about 9 minutes in all); EXTRA: more arguments for every run;
# RANKS: the rank counts after P = 1 (default "2 4"; "" for none); GPU: the one GPU every rank
# uses (default 0).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hpccoll-eig-vs-cusolver}
RES="$OUT/eig-vs-cusolver"
mkdir -p "$RES"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CUPY_ACCELERATORS=${CUPY_ACCELERATORS-} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export CUDA_VISIBLE_DEVICES=${GPU:-0}    # one GPU, shared by every rank
read -r -a MPIEXEC <<< "${MPIEXEC:-mpiexec --allow-run-as-root --oversubscribe --bind-to none}"
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
SIZES=${SIZES:-8192,16384}
MPI_SIZES=${MPI_SIZES:-${SIZES%%,*}}
BUDGET=${BUDGET:-300}
MPI_BUDGET=${MPI_BUDGET:-90}
PY=${PYTHON:-python}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mps=0
stop_mps() { if (( mps )); then echo quit | nvidia-cuda-mps-control; mps=0; fi; }
{
  trap stop_mps EXIT                     # this block is a subshell (the pipe): MPS stops with it
  nvidia-smi -L
  timeout -k 10 $((BUDGET + 60)) "$PY" bench/eig_vs_cusolver.py --n "$SIZES" ${WHAT:+--what "$WHAT"} \
    ${PROBLEMS:+--problems "$PROBLEMS"} --budget-s "$BUDGET" --out "$RES" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
  echo "P = 1: exit $?"
  RANKS=${RANKS-2 4}                     # RANKS="": P = 1 only
  [[ -n ${RANKS// } ]] && mkdir -p /tmp/mps-pipe /tmp/mps-log && nvidia-cuda-mps-control -d && mps=1
  for p in $RANKS; do
    timeout -k 10 $((MPI_BUDGET + 60)) "${MPIEXEC[@]}" -n "$p" "$PY" bench/eig_vs_cusolver.py --mpi --n "$MPI_SIZES" \
      ${MPI_WHAT:+--what "$MPI_WHAT"} ${PROBLEMS:+--problems "$PROBLEMS"} --budget-s "$MPI_BUDGET" --out "$RES" \
      ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
    echo "P = $p: exit $?"
  done
  stop_mps
} 2>&1 | tee "$RES/record.txt"
tar -C "$OUT" -cJf "$OUT/eig-vs-cusolver.tar.xz" eig-vs-cusolver && echo "wrote $OUT/eig-vs-cusolver.tar.xz"
