#!/usr/bin/env bash
# Run a command on the CPUs and memory of the NUMA node next to this rank's GPU (the GPU hpccoll
# picks: node-local rank modulo the GPU count).  The eager paths cross PCIe on every call (a
# launch, a stream query, the eager engine's doorbell and completion words in mapped host
# memory), so a rank on the far socket pays the inter-socket hop each time.  Unbound, or where
# the node is unknown (-1), the command runs as is.
#   mpiexec -n 2 bench/numa_bind.sh hpccoll bench allreduce ...
set -u
r=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}}
n=$(nvidia-smi -L 2>/dev/null | wc -l)
node=-1
if (( n > 0 )); then
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i $((r % n)) | tr 'A-F' 'a-f')
  node=$(cat "/sys/bus/pci/devices/${bus:4}/numa_node" 2>/dev/null || echo -1)
fi
if [[ $node == -1 || -z $node ]]; then
  exec "$@"
fi
if command -v numactl >/dev/null; then
  exec numactl --cpunodebind="$node" --membind="$node" "$@"
fi
exec taskset -c "$(cat /sys/devices/system/node/node$node/cpulist)" "$@"
