"""Backends execute validated calls.  `host` (numpy through MPI) is always available
and is the reference; `cuda` runs hpccoll's barrier-free kernels; `nccl` is the
baseline through NCCL."""
