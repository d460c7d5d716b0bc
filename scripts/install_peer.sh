#!/usr/bin/env bash
# Install TorchRec as a peer to compare against (the `peer` tests and benchmarks/vs_torchrec.py).
# The three binaries are pinned and installed --no-deps: a plain `pip install torchrec` would pull
# a CUDA build of torch, and fbgemm-gpu-cpu 1.9.0 does not import beside torch 2.13 (ABI mismatch).
set -euo pipefail
cd "$(dirname "$0")/.."
pip install torch==2.13.0
pip install --no-deps fbgemm-gpu-cpu==1.8.0 torchrec==1.9.2
pip install -e ".[peer]"
python -c "import torchrec, fbgemm_gpu; print('TorchRec', torchrec.__version__, 'ready')"
