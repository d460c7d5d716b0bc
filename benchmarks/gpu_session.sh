#!/usr/bin/env bash
# What a session with a GPU runs first, in one go: every `cuda`-marked test (on the fake device and on the GPU)
# and every `gpu`-marked one (real GPU only: NCCL, torch's CUDA kernels), the six CUDA semantics FakeCuda models
# checked on the GPU beside the fake (benchmarks/fake_vs_real.py), then the GPU figures.
# Logs go to the folder given (default: $OUT if set, else ./gpu_logs); record the figures in docs/results.md.
#
#     bash benchmarks/gpu_session.sh [LOG_DIR]
#
# Runs from a checkout without installing it (PYTHONPATH); the demo's auto row needs OR-Tools and is
# skipped with a warning where it is not installed.
set -u
out=${1:-${OUT:-gpu_logs}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$py" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"
  nproc; uptime; } > "$out/machine.txt"
cat "$out/machine.txt"
"$py" -m pytest -m "cuda or gpu" -rfEs -o addopts="" -p no:cacheprovider --timeout 300 --continue-on-collection-errors \
    tests 2>&1 | tee "$out/cuda_tests.log" | tail -40
"$py" benchmarks/fake_vs_real.py 2>&1 | tee "$out/fake_vs_real.log"
"$py" benchmarks/gpu_overlap.py --device cuda 2>&1 | tee "$out/gpu_overlap.log"
"$py" -m swpipe.cli demo --plans base,sparse_dist,prefetch,prefetch+by_stream --trace "" 2>&1 \
    | grep -v "run/s\]" | tee "$out/demo_cuda.log"
