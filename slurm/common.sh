# common.sh - sourced by every job in slurm/: checks the job's environment (inside Slurm, the
# virtual environment, hpccoll on PATH, GPUs bound per node not per task), picks srun's MPI
# plugin from the MPI library mpi4py uses, and defines `die`, SRUN, NGPUS, TASK_GPUS and
# write_job_txt (what ran where, into $OUT/job.txt).  Not a job itself.
# shellcheck shell=bash
die() { echo "${SLURM_JOB_NAME:-hpccoll}: error: $*" >&2; exit 2; }
[[ -n "${SLURM_JOB_ID:-}" ]] || die "not inside a Slurm job: submit with sbatch"
if [[ -n "${HPCCOLL_VENV:-}" ]]; then
    [[ -f "$HPCCOLL_VENV/bin/activate" ]] || die "HPCCOLL_VENV=$HPCCOLL_VENV has no bin/activate"
    # shellcheck disable=SC1091  # the venv is the user's
    source "$HPCCOLL_VENV/bin/activate"
fi
PYTHON=$(command -v python || command -v python3) || die "no python on PATH: set HPCCOLL_VENV"
command -v hpccoll >/dev/null || die "hpccoll is not on PATH: set HPCCOLL_VENV=/path/to/venv or activate it before sbatch"
if (( ${SLURM_JOB_NUM_NODES:-1} > 1 )); then
    echo "hpccoll: ${SLURM_JOB_NUM_NODES} nodes: collectives run hierarchically (inside each node over CUDA IPC, between nodes over MPI or NCCL); give every node the same number of tasks" >&2
fi
# Every task of a node must see all of the node's GPUs: per-task GPU binding breaks CUDA IPC.
if [[ -n "${SLURM_GPUS_PER_TASK:-}" || -n "${SLURM_GPU_BIND:-}" ]]; then
    die "--gpus-per-task / --gpu-bind bind GPUs per task, which breaks CUDA IPC between ranks: request --gpus-per-node=G (or --gres=gpu:G) and no --gpu-bind; hpccoll picks each rank's GPU by node-local rank"
fi
# The MPI library mpi4py uses decides srun's PMI plugin: MPICH speaks PMI-2, Open MPI PMIx.
# (Querying the version does not initialize MPI.)
MPI_LIBRARY=$("$PYTHON" -c 'import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI; print(" ".join(MPI.Get_library_version().splitlines()[0].split()))') \
    || die "mpi4py does not import with $PYTHON"
if [[ -n "${HPCCOLL_MPI_PLUGIN:-}" ]]; then
    MPI_PLUGIN=$HPCCOLL_MPI_PLUGIN
else
    case "$MPI_LIBRARY" in
        *"Open MPI"*) MPI_PLUGIN=pmix ;;
        *) MPI_PLUGIN=pmi2 ;;  # MPICH and its derivatives (Intel MPI, MVAPICH)
    esac
fi
MPI_PLUGINS=$(srun --mpi=list 2>&1 || true)
grep -qw -- "$MPI_PLUGIN" <<<"$MPI_PLUGINS" \
    || die "this Slurm has no MPI plugin '$MPI_PLUGIN' (srun --mpi=list); set HPCCOLL_MPI_PLUGIN"
# GPUs of this job on this node (Slurm's count, else what nvidia-smi sees); 0 on a CPU node.
NGPUS=${SLURM_GPUS_ON_NODE:-$( { nvidia-smi -L 2>/dev/null || true; } | grep -c '^GPU' || true)}
if [[ -z "${SLURM_GPUS_ON_NODE:-}" ]] && (( NGPUS > 0 )); then
    echo "${SLURM_JOB_NAME:-hpccoll}: warning: $NGPUS GPUs visible but none allocated to the job; request them with --gpus-per-node=G" >&2
fi
# A step inherits all of the job's GPUs, and without --gpu-bind every task gets all of them
# (CUDA_VISIBLE_DEVICES=0,1,...).  (--gpu-bind=none is no help: Slurm 22.05 then leaves
# CUDA_VISIBLE_DEVICES unset, and without device cgroups the tasks see GPUs not allocated.)
SRUN=(srun --mpi="$MPI_PLUGIN" --kill-on-bad-exit=1)
TASK_GPUS=none
if (( NGPUS > 0 )); then  # check it: the GPUs each task sees, identical across tasks
    # shellcheck disable=SC2016  # each task expands it
    TASK_GPUS=$("${SRUN[@]}" bash -c 'echo "${CUDA_VISIBLE_DEVICES:-all}"' | sort -u | paste -sd' ')
    [[ "$TASK_GPUS" != *" "* ]] \
        || die "the tasks see different GPUs ($TASK_GPUS): per-task GPU binding breaks CUDA IPC; request --gpus-per-node=G and no --gpu-bind"
fi
write_job_txt() {  # what ran where, for the record
    mkdir -p "$OUT"
    {
        echo "job_id=$SLURM_JOB_ID"
        echo "job_name=${SLURM_JOB_NAME:-}"
        echo "nodes=${SLURM_JOB_NODELIST:-$(hostname)}"
        echo "ranks=${SLURM_NTASKS:-1}"
        echo "gpus=$NGPUS"
        echo "task_gpus=$TASK_GPUS"
        echo "mpi_library=$MPI_LIBRARY"
        echo "mpi_plugin=$MPI_PLUGIN"
        echo "python=$PYTHON"
        echo "started=$(date -Is)"
        printf 'command='; printf '%q ' "$@"; echo
    } > "$OUT/job.txt"
    echo "${SLURM_JOB_NAME:-hpccoll}: $* (ranks ${SLURM_NTASKS:-1}, GPUs/node $NGPUS, srun --mpi=$MPI_PLUGIN, $MPI_LIBRARY)"
}
# Ranks sharing a GPU need NVIDIA's MPS: without it the GPU time-slices between their processes
# and every collective waits a slice (measured about 40x slower, docs/performance.md).  Where a
# node's tasks outnumber its GPUs and no MPS daemon answers (its `control` socket in
# CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps), start one for this job (its pipes under
# /tmp/hpccoll-mps-$SLURM_JOB_ID) and stop it when the job script exits; a daemon already
# running is left alone.  Several nodes: start MPS on each beforehand (a site prolog, or
# Slurm's MPS gres); the job refuses rather than run time-sliced.
mps_where_ranks_share_gpus() {
    local tasks
    tasks=${SLURM_NTASKS_PER_NODE:-$(tr ',' '\n' <<<"${SLURM_TASKS_PER_NODE:-${SLURM_NTASKS:-1}}" | sed 's/(.*//' | sort -n | tail -1)}
    (( NGPUS > 0 && tasks > NGPUS )) || return 0
    local why="$tasks tasks per node share $NGPUS GPU(s) and no MPS runs: each collective would wait for a GPU time slice (measured about 40x slower)"
    [[ -S "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ]] && { echo "${SLURM_JOB_NAME:-hpccoll}: MPS running (${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps})"; return 0; }
    command -v nvidia-cuda-mps-control >/dev/null \
        || die "$why, and nvidia-cuda-mps-control is not on PATH: start MPS before the job (nvidia-cuda-mps-control -d; after it: echo quit | nvidia-cuda-mps-control), or request a GPU per task"
    (( ${SLURM_JOB_NUM_NODES:-1} == 1 )) \
        || die "$why on some node: start MPS on every node before the job (nvidia-cuda-mps-control -d, e.g. in a prolog), or request a GPU per task"
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/hpccoll-mps-$SLURM_JOB_ID/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hpccoll-mps-$SLURM_JOB_ID/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || die "$why, and nvidia-cuda-mps-control -d failed: start MPS by hand, or request a GPU per task"
    trap 'echo quit | nvidia-cuda-mps-control; rm -rf "/tmp/hpccoll-mps-$SLURM_JOB_ID"' EXIT
    echo "${SLURM_JOB_NAME:-hpccoll}: MPS started for $tasks tasks on $NGPUS GPU(s) ($CUDA_MPS_PIPE_DIRECTORY); stopped when the job ends"
}
