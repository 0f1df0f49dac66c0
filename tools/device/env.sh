# Source this on the GPU machine, from the repository root, before running anything built here:
#   source tools/device/env.sh
# (A copy of the shared device recipe's env.sh: ../shared does not travel to the GPU machine.)
# It points the loader at the libraries that `pack` put in .devlib/, and at the cuDNN that ships inside
# that machine's PyTorch environment; it keeps NVLink multicast off, which that machine requires.
export LD_LIBRARY_PATH="$PWD/.devlib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
