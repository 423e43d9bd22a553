#!/usr/bin/env bash
# The eigensolver on the GPU machine (called from bench/device_run.sh, cwd = repo root, after
# the install).  Every step runs under `timeout`, appends to one log and the script goes on
# after a failure; steps that would not fit in EIG_BUDGET seconds are skipped (and logged).
# What comes back: $OUT/eig_device.log and $OUT/eigensolver.tar.gz (report.md/json, plots and
# run JSONs of every folder; no eigenvector .npy).
#
# Order = importance per second: smoke (n=512) -> 4096 and 8192 against cuSOLVERMp and the
# single-GPU anchor (the targets) -> 2048 all paths, repeat 10 -> 4 ranks on 2 GPUs under MPS.
# Estimates (s, incl. ~10 s start-up per launch; the first 8192 launch also builds the problem,
# cached in $HPCCOLL_EIG_PROBLEM_CACHE afterwards) are the numbers passed to `step`.
set -uo pipefail
OUT=${OUT:-/tmp/hpccoll-out}
mkdir -p "$OUT"
LOG=$OUT/eig_device.log
WORK=${EIG_WORK:-/tmp/eig}
BUDGET=${EIG_BUDGET:-420}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
# CuPy reductions without CUB: its CCCL header compile failed on the 2026-11-30 machines
export CUPY_ACCELERATORS=${CUPY_ACCELERATORS-}
export HPCCOLL_EIG_PROBLEM_CACHE=${HPCCOLL_EIG_PROBLEM_CACHE:-/tmp/eig-problems}
export HPCCOLL_CACHE_DIR=${HPCCOLL_CACHE_DIR:-/tmp/hpccoll-kcache}
[[ -d /tmp/site && -z ${PYTHONPATH:-} ]] && export PYTHONPATH=/tmp/site
PY=${PYTHON:-python3}
MPIEXEC=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
EIG=("$PY" -m hpccoll_eigensolver.cli)
mkdir -p "$WORK"
T0=$SECONDS

log() { echo "[eig $((SECONDS - T0))s] $*" | tee -a "$LOG"; }
# EIG_STEPS: the steps to run (default all but n16384): smoke n4096 n8192 n16384 n8192-dense n2048 p4
want() { [[ " ${EIG_STEPS:-smoke n4096 n8192 n8192-dense n2048 p4} " == *" $1 "* ]]; }

# step NAME ESTIMATE_S TIMEOUT_S CMD...: run CMD unless it would not fit the budget.
step() {
    local name=$1 est=$2 limit=$3; shift 3
    local left=$((BUDGET - (SECONDS - T0)))
    if ((est > left)); then log "SKIP $name (estimate ${est}s > ${left}s left)"; return 0; fi
    ((limit > left + 30)) && limit=$((left + 30))
    log "START $name (estimate ${est}s, timeout ${limit}s): $*"
    local t=$SECONDS
    timeout --kill-after=15 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    log "END $name rc=$rc in $((SECONDS - t))s"
    return $rc
}

check_smoke() {  # accuracy of the smoke runs: exit 0 when every JSON in $1 is accurate
    "$PY" - "$1" <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, sys
bad = 0
files = glob.glob(sys.argv[1] + "/*.json")
for f in files:
    r = json.load(open(f))
    if r.get("schema", "").endswith("failure/1"):
        print("SMOKE failure record", f); bad += 1; continue
    ok = r["residual"] < 10 and r["b_orthogonality"] < 100 and (r["eigenvalue_error"] or 0) < 1e-9 \
        and r["ranks_agree_on_eigenvalues"]
    print("SMOKE", "PASS" if ok else "FAIL", r["comm"], "res", r["residual"], "borth", r["b_orthogonality"],
          "eigerr", r["eigenvalue_error"], "solve", r["solve_seconds"], r["phases"])
    bad += not ok
sys.exit(1 if bad or not files else 0)
EOF
}

compare() {  # compare NAME EST LIMIT OUTDIR ARGS...
    local name=$1 est=$2 limit=$3 dir=$4; shift 4
    step "$name" "$est" "$limit" "${EIG[@]}" compare --out "$WORK/$dir" "$@"
}

mps_on() { export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
           mkdir -p /tmp/mps-pipe /tmp/mps-log; nvidia-cuda-mps-control -d && log "MPS on"; }
mps_off() { echo quit | nvidia-cuda-mps-control 2>/dev/null; log "MPS off"; }

log "eigensolver on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); budget ${BUDGET}s"
"$PY" -c "import cupy, numpy, scipy; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'scipy', scipy.__version__)" >>"$LOG" 2>&1

# 1. smoke: 2 ranks, n=512, sentinel; accuracy checked. If the fused CuPy kernels fail, retry
#    with them off (HPCCOLL_EIG_FUSED=0) and keep that for the rest.
smoke() { step "smoke$1" 60 120 "${MPIEXEC[@]}" -n 2 "${EIG[@]}" solve --n 512 --comm sentinel --repeat 2 \
          --no-sync-collectives --out "$WORK/smoke$1" && check_smoke "$WORK/smoke$1"; }
if want smoke && ! smoke ""; then
    log "smoke failed: retrying with HPCCOLL_EIG_FUSED=0"
    export HPCCOLL_EIG_FUSED=0
    smoke "-unfused" || log "smoke failed again: continuing (failures are recorded per step)"
fi

# 2. the targets: 4096 and 8192 (repeat 3) against cuSOLVERMp and one GPU, in the same run;
#    timed without a device sync around each collective; stedc auto (= dc on GPUs from 4096).
FAST=(--ranks 2 --repeat 3 --no-sync-collectives --no-reference --save-vectors no)
# EIG_ANCHORS: the anchors beside them (default both; the cuSOLVERMp wheels are 29 MB of the
# 64 MiB a device call may carry, so a call without them passes EIG_ANCHORS=--single-gpu)
read -r -a ANCHORS <<< "${EIG_ANCHORS:---cusolvermp --single-gpu}"
want n4096 && compare "n4096 dc sentinel,nccl+anchors" 70 150 n4096 --n 4096 --comm sentinel,nccl "${ANCHORS[@]}" "${FAST[@]}"
want n8192 && compare "n8192 dc sentinel,nccl+anchors" 140 240 n8192 --n 8192 --comm sentinel,nccl "${ANCHORS[@]}" "${FAST[@]}"
# 2a. 16384 (are 2 GPUs faster than one there too?): the problem built on the GPU once (the
#     host's QRs would take minutes) for both steps that use it.  n16384: sentinel and NCCL
#     against the one-GPU path, repeat 2.  n16384-fused: the sentinel path's column step with
#     its fused transfers (HPCCOLL_EIG_SYTRD=fused) and with the collectives (graph), one job.
if want n16384 || want n16384-fused; then
    if step "n16384 problem" 40 120 "$PY" bench/make_problem_gpu.py --n 16384 --out "$WORK/p16k"; then
        P16=(--n 16384 --problem "file:$WORK/p16k/A.npy,$WORK/p16k/B.npy" --ranks 2 --repeat 2
             --no-sync-collectives --no-reference --save-vectors no)
        want n16384 && compare "n16384 dc sentinel,nccl+single-gpu" 150 300 n16384 --comm sentinel,nccl \
            --single-gpu "${P16[@]}"
        if want n16384-fused; then
            for mode in fused graph; do
                export HPCCOLL_EIG_SYTRD=$mode
                compare "n16384 sentinel sytrd=$mode" 70 150 n16384-sytrd-$mode --comm sentinel "${P16[@]}"
            done
            unset HPCCOLL_EIG_SYTRD
        fi
    fi
    rm -rf "$WORK/p16k"
fi
# 2b. the dense syevd of T on rank 0 (stedc=gpu), the previous default, beside dc
want n8192-dense && compare "n8192 sentinel stedc=gpu" 60 150 n8192-dense --n 8192 --comm sentinel --stedc gpu "${FAST[@]}"
# 3. n=2048, every path and both anchors, repeat 10, with the per-collective device sync
#    (time breakdown); then 4 ranks on the 2 GPUs under MPS (>= 3 ranks: atomics can show).
want n2048 && compare "n2048 all" 100 200 n2048 --n 2048 --ranks 2 --repeat 10 --comm sentinel,ll128,nccl,mpi \
    --cusolvermp --single-gpu
left=$((BUDGET - (SECONDS - T0)))
if ! want p4; then
    log "n2048 4 ranks MPS not asked for (EIG_STEPS)"
elif ((left > 60)); then
    mps_on
    compare "n2048 4 ranks MPS" 60 150 n2048-p4-mps --n 2048 --ranks 4 --repeat 10 --comm sentinel,ll128 \
        --no-sync-collectives
    mps_off
else
    log "SKIP n2048 4 ranks MPS (${left}s left)"
fi

# Pack: reports, plots and run JSONs of every folder (no .npy), plus the log beside it.
for d in "$WORK"/*/; do
    [[ -f $d/report.md ]] || "${EIG[@]}" report "$d" >>"$LOG" 2>&1
done
tar -czf "$OUT/eigensolver.tar.gz" -C "$WORK" --exclude='*.npy' . 2>>"$LOG"
size=$(stat -c %s "$OUT/eigensolver.tar.gz" 2>/dev/null || echo 0)
if ((size > 16 * 1024 * 1024)); then  # over the return limit: reports only
    log "archive ${size} B > 16 MiB: keeping report.md/report.json/png only"
    (cd "$WORK" && find . \( -name 'report.*' -o -name '*.png' -o -name 'failed_*.json' \) -print0 \
        | tar -czf "$OUT/eigensolver.tar.gz" --null -T -)
fi
log "done in $((SECONDS - T0))s; $(ls -l "$OUT/eigensolver.tar.gz" | awk '{print $5}') B archive"
for d in "$WORK"/*/; do
    [[ -f $d/report.md ]] && { echo "== $d"; sed -n '1,60p' "$d/report.md"; } >>"$LOG"
done
exit 0
