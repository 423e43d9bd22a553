#!/usr/bin/env bash
# One call on the GPU machine: install, run the GPU tests (2 ranks; 4 ranks on 2 GPUs under
# MPS) and the benchmark.  Results and logs go to $OUT.  Usage (from the repo root):
#   bash bench/device_run.sh [info|tests|tests3|tests4|persist|persist3|elab|pbench|mpson|mpsoff|bench|dbench|nopdl|profile|hier|lab|bwlab|pushlab|eagerbind|eig|eig8k|gemm|dc|symvpick|symv|fused|dcpick|sytrd]...
set -uo pipefail
OUT=${OUT:-/tmp/hpccoll-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HPCCOLL_CACHE_DIR=${HPCCOLL_CACHE_DIR:-/tmp/hpccoll-kcache}
# Carried wheels: test tools on PYTHONPATH; the cuSOLVERMp anchor's wheels (nvmath-python,
# nvidia-cusolvermp-cu13) in a folder of their own, put on sys.path by that anchor only: their
# nvidia/cu13/{include,lib} folders must not shadow the image's CUDA headers for CuPy/torch.
if ls .whl/pytest_mpi*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/pytest_mpi*.whl \
    && export PYTHONPATH=/tmp/site
fi
if ls .whl/nvmath*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-anchor \
    .whl/nvmath*.whl .whl/nvidia_cusolvermp*.whl && export HPCCOLL_ANCHOR_SITE=/tmp/site-anchor
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1 \
  || { echo "install failed"; tail -20 "$OUT/install.log"; exit 1; }
MPIEXEC=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
commit=${HPCCOLL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "commit $commit" | tee "$OUT/meta.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/meta.txt"

mps_on() { export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log;
           mkdir -p /tmp/mps-pipe /tmp/mps-log; nvidia-cuda-mps-control -d && echo "MPS on"; }
mps_off() { echo quit | nvidia-cuda-mps-control 2>/dev/null; echo "MPS off"; }
gpu_tests() {  # gpu_tests NRANKS: one job per test file, so a failure aborts only its own job
  for f in ${TEST_FILES:-tests/gpu/test_*.py}; do
    CUPY_ACCELERATORS= HPCCOLL_TIMEOUT=10 timeout ${TEST_LIMIT:-420} "${MPIEXEC[@]}" ${MPI_ARGS:-} -n "$1" python3 -m pytest -q -rs --with-mpi \
      -p no:cacheprovider ${PYTEST_ARGS:-} "$f" 2>&1
  done
}

for stage in "${@:-all}"; do
  case $stage in
    info) "${MPIEXEC[@]}" -n 2 hpccoll info 2>&1 | tee "$OUT/info.txt" ;;
    tests) gpu_tests 2 | tee "$OUT/gpu-tests-2ranks.txt" ;;
    tests4) mps_on; gpu_tests 4 | tee "$OUT/gpu-tests-4ranks.txt"; mps_off ;;
    tests3) mps_on; gpu_tests 3 | tee "$OUT/gpu-tests-3ranks.txt"; mps_off ;;
    persist) TEST_FILES=tests/gpu/test_persistent_gpu.py gpu_tests 2 | tee "$OUT/gpu-tests-persist-2ranks.txt" ;;
    persist3) mps_on; TEST_FILES=tests/gpu/test_persistent_gpu.py gpu_tests 3 | tee "$OUT/gpu-tests-persist-3ranks.txt"; mps_off ;;
    elab) timeout ${ELAB_LIMIT:-240} "${MPIEXEC[@]}" -n 2 python3 bench/engine_lab.py --json "$OUT/engine-lab.json" \
            ${ELAB_PARTS:+--parts "$ELAB_PARTS"} 2>&1 | grep -v Warning | tail -250 | tee "$OUT/engine-lab.txt" ;;
    pbench) i=0; for order in ${ENGINE_ORDERS:-stream}; do  # e.g. ENGINE_ORDERS="stream caller caller stream"
              i=$((i + 1))
              timeout ${BENCH_LIMIT:-200} "${MPIEXEC[@]}" -n 2 hpccoll bench allreduce --sizes "${SIZES:-8:256K}" --dtype "${DTYPE:-float32}" \
               --algorithms "${ALGOS:-auto,oneshot_ll}" --persistent --engine-order $order ${BENCH_ITERS:+--iters $BENCH_ITERS} \
               --json "$OUT/bench-persistent-${DTYPE:-float32}-$i-$order.json" 2>&1 | tee -a "$OUT/bench-persistent-${DTYPE:-float32}.txt"
            done ;;
    mpson) mps_on ;;    # every later stage's ranks share the GPUs through MPS (e.g. 2 ranks on ONE GPU)
    mpsoff) mps_off ;;
    bench) timeout ${BENCH_LIMIT:-500} "${MPIEXEC[@]}" -n 2 hpccoll bench allreduce --sizes "${SIZES:-8:64M}" --dtype "${DTYPE:-float32}" \
             --algorithms all --baselines --persistent --engine-order "${ENGINE_ORDER:-stream}" --json "$OUT/bench-allreduce-${DTYPE:-float32}.json" --plot "$OUT/bench-allreduce-${DTYPE:-float32}.png" \
             2>&1 | tee "$OUT/bench-allreduce-${DTYPE:-float32}.txt" ;;
    dbench) timeout ${BENCH_LIMIT:-500} "${MPIEXEC[@]}" -n 2 hpccoll bench allreduce --sizes "${SIZES:-8:64M}" --dtype "${DTYPE:-float32}" \
             --algorithms all --baselines --persistent --engine-order "${ENGINE_ORDER:-stream}" --deterministic \
             --json "$OUT/bench-allreduce-${DTYPE:-float32}-det.json" --plot "$OUT/bench-allreduce-${DTYPE:-float32}-det.png" \
             2>&1 | tee "$OUT/bench-allreduce-${DTYPE:-float32}-det.txt" ;;   # the bench under deterministic=True
    profile) { echo "## HPCCOLL_PDL=1 (default)"; timeout 120 "${MPIEXEC[@]}" -n 2 python3 bench/profile_eager.py 2>&1;
               echo "## HPCCOLL_PDL=0"; HPCCOLL_PDL=0 timeout 120 "${MPIEXEC[@]}" -n 2 -x HPCCOLL_PDL python3 bench/profile_eager.py 2>&1;
             } | tee "$OUT/profile-eager.txt" ;;
    nopdl) HPCCOLL_PDL=0 timeout 300 "${MPIEXEC[@]}" -n 2 -x HPCCOLL_PDL hpccoll bench allreduce --sizes "${SIZES:-8:64M}" \
             --dtype "${DTYPE:-float32}" --algorithms oneshot_sentinel,oneshot_ll,twoshot_sentinel,twoshot_ll128 \
             --json "$OUT/bench-allreduce-nopdl.json" 2>&1 | tail -40 | tee "$OUT/bench-allreduce-nopdl.txt" ;;
    hier) { for ns in 2 1; do echo "## HPCCOLL_NODE_SIZE=$ns (2 = one node, flat; 1 = two simulated nodes)";
              HPCCOLL_NODE_SIZE=$ns timeout 200 "${MPIEXEC[@]}" -n 2 -x HPCCOLL_NODE_SIZE hpccoll bench allreduce \
                --sizes "${HIER_SIZES:-8,4K,64K,1M,4M}" --algorithms auto --json "$OUT/bench-hier-ns$ns.json" 2>&1 | tail -12;
              HPCCOLL_NODE_SIZE=$ns timeout 200 "${MPIEXEC[@]}" -n 2 -x HPCCOLL_NODE_SIZE hpccoll bench allreduce \
                --sizes "${HIER_SIZES:-8,4K,64K,1M,4M}" --algorithms auto --deterministic \
                --json "$OUT/bench-hier-ns$ns-det.json" 2>&1 | tail -12; done; } | tee "$OUT/bench-hier.txt" ;;
    lab) timeout 120 "${MPIEXEC[@]}" -n 2 python3 bench/latency_lab.py --json "$OUT/latency-lab.json" 2>&1 \
           | grep -v Warning | tail -20 | tee "$OUT/latency-lab.txt" ;;
    eig8k) HPCCOLL_EIG_PROBLEM_CACHE=/tmp/eig-problems CUPY_ACCELERATORS= timeout ${EIG_LIMIT:-300} python3 -m hpccoll_eigensolver.cli \
             compare --out /tmp/eig/n8192 --n 8192 --comm sentinel,nccl --cusolvermp --single-gpu --ranks 2 --repeat 3 \
             --no-sync-collectives --no-reference --save-vectors no 2>&1 | tail -40 | tee "$OUT/eig8k.txt"
           tar czf "$OUT/eig8k.tar.gz" --exclude='*.npy' -C /tmp/eig n8192 ;;
    eig) timeout ${EIG_LIMIT:-480} bash bench/eig_device.sh 2>&1 | tail -60 ;;
    symvpick)  # time sytrd_symv's variants alone, keep the fastest correct one for the later stages
      CUPY_ACCELERATORS= timeout 150 python3 bench/symv_bench.py --n 8192 --variants "${SYMV_VARIANTS:-default}" \
        --json "$OUT/symv-bench.json" 2>&1 | tee "$OUT/symv-bench.txt"
      pick=$(python3 - "$OUT/symv-bench.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
tot = {}
for r in rows:
    tot.setdefault(r["variant"], [0.0, True])
    tot[r["variant"]][0] += r["us"]
    tot[r["variant"]][1] &= r["max_rel_err"] < 1e-12
ok = {v: t for v, (t, good) in tot.items() if good}
print(min(ok, key=ok.get) if ok else "default")
PYEOF
)
      export HPCCOLL_EIG_SYMV=$pick; echo "HPCCOLL_EIG_SYMV=$pick (fastest correct over the columns timed)" | tee -a "$OUT/symv-bench.txt" ;;
    symv)  # sytrd_symv's variants alone, timing only (no pick)
      CUPY_ACCELERATORS= timeout 150 python3 bench/symv_bench.py --n "${SYTRD_N:-8192}" --variants "${SYMV_VARIANTS:-default}" \
        --json "$OUT/symv-bench.json" 2>&1 | tee "$OUT/symv-bench.txt" ;;
    fused)  # the fused sytrd (auto on sentinel) against the same kernels with collectives, NCCL, one GPU
      for N in ${FUSED_N:-8192}; do
        for mode in auto graph; do
          comms=sentinel; [[ $mode == auto ]] && comms=${FUSED_COMMS:-sentinel,nccl}
          extra=(); [[ $mode == auto ]] && extra=(${FUSED_ANCHORS:---single-gpu})
          HPCCOLL_EIG_SYTRD=$mode HPCCOLL_EIG_PROBLEM_CACHE=/tmp/eig-problems CUPY_ACCELERATORS= timeout ${EIG_LIMIT:-300} \
            python3 -m hpccoll_eigensolver.cli compare --out /tmp/eig/n$N-$mode --n $N --comm $comms "${extra[@]}" --ranks 2 \
            --repeat ${FUSED_REPEAT:-3} --no-sync-collectives --no-reference --save-vectors no 2>&1 | tail -25 | tee -a "$OUT/fused.txt"
        done
      done
      tar czf "$OUT/fused.tar.gz" --exclude='*.npy' -C /tmp/eig . ;;
    dcpick)  # the GPU divide and conquer's leaf size and leaf streams, timed alone; keep the fastest
      CUPY_ACCELERATORS= timeout 200 python3 bench/dc_profile.py --n 8192 --leaf "${DC_LEAVES:-128,256,512}" \
        --streams "${DC_STREAMS:-1,4}" --json "$OUT/dc-profile.json" 2>&1 | tee "$OUT/dc-profile.txt"
      pick=$(python3 - "$OUT/dc-profile.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
tot = {}
for r in rows:  # both matrices, accurate only
    k = (r["leaf"], r["streams"])
    t, ok = tot.get(k, (0.0, True))
    tot[k] = (t + r["dc_s"], ok and r["residual"] < 10 and r["orthogonality"] < 10)
good = {k: t for k, (t, ok) in tot.items() if ok}
leaf, streams = min(good, key=good.get) if good else (256, 1)
print(leaf, streams)
PYEOF
)
      read -r leaf streams <<<"$pick"
      export HPCCOLL_DC_LEAF=$leaf HPCCOLL_DC_STREAMS=$streams
      echo "HPCCOLL_DC_LEAF=$leaf HPCCOLL_DC_STREAMS=$streams (fastest accurate at n=8192)" | tee -a "$OUT/dc-profile.txt" ;;
    sytrd) CUPY_ACCELERATORS= timeout 240 "${MPIEXEC[@]}" -n 2 python3 bench/sytrd_profile.py --n "${SYTRD_N:-8192}" --gemv "${SYTRD_GEMV:-lower,full}" \
             --json "$OUT/sytrd-profile.json" 2>&1 | tail -20 | tee "$OUT/sytrd-profile.txt" ;;
    pushlab) CUPY_ACCELERATORS= timeout ${PUSHLAB_LIMIT:-200} "${MPIEXEC[@]}" -n 2 python3 bench/push_lab.py --sizes "${SIZES:-256K,1M,2M,4M}" \
             --json "$OUT/push-lab.json" 2>&1 | tee "$OUT/push-lab.txt" ;;
    eagerbind)  # the eager engine's blocking call, processes unbound and bound to a core each, twice
      { lscpu | grep -E "^(Thread|Core|Socket|CPU\(s\)|Model name)"; echo "cpu0 siblings $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list)";
        for b in none core none core; do echo "## mpiexec --bind-to $b"
          CUPY_ACCELERATORS= timeout 150 mpiexec --allow-run-as-root --oversubscribe --bind-to $b --report-bindings -n 2 hpccoll bench allreduce \
            --sizes 1K,4K --algorithms auto,oneshot_ll --persistent 2>&1 | grep -E "^ +(1K|4K) |bound|binding|Error"; done; } | tee "$OUT/eager-bind.txt" ;;
    bwlab) CUPY_ACCELERATORS= timeout ${BWLAB_LIMIT:-240} "${MPIEXEC[@]}" -n 2 python3 bench/bw_lab.py --sizes "${SIZES:-64K,256K,1M,2M,4M,8M}" \
             ${BWLAB_VARIANTS:+--variants "$BWLAB_VARIANTS"} ${BWLAB_ALGOS:+--algorithms "$BWLAB_ALGOS"} --json "$OUT/bw-lab.json" 2>&1 | tee "$OUT/bw-lab.txt" ;;
    dc) CUPY_ACCELERATORS= timeout 240 python3 bench/dc_profile.py --json "$OUT/dc-profile.json" 2>&1 | tee "$OUT/dc-profile.txt" ;;
    gemm) PYTHONPATH=${PYTHONPATH:-} CUPY_ACCELERATORS= timeout 150 python3 bench/gemm_nvmath_vs_cupy.py \
            --json "$OUT/gemm-nvmath-vs-cupy.json" 2>&1 | tee "$OUT/gemm-nvmath-vs-cupy.txt" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
