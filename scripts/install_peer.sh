#!/usr/bin/env bash
# Install the peers swpipe compares against: TorchRec (the `peer` tests and benchmarks/vs_torchrec.py)
# and torchgpipe (tests/test_gpipe_peer.py and benchmarks/gpipe.py).
# The three TorchRec binaries are pinned and installed --no-deps: a plain `pip install torchrec` would pull
# a CUDA build of torch, and fbgemm-gpu-cpu 1.9.0 does not import beside torch 2.13 (ABI mismatch).
# torchgpipe 0.0.7 (the last release, archived) is pure Python; --no-deps keeps the installed torch.
set -euo pipefail
cd "$(dirname "$0")/.."
pip install torch==2.13.0
pip install --no-deps fbgemm-gpu-cpu==1.8.0 torchrec==1.9.2
pip install --no-deps torchgpipe==0.0.7
pip install -e ".[peer]"
python -c "import torchrec, fbgemm_gpu; print('TorchRec', torchrec.__version__, 'ready')"
python -c "import torchgpipe; print('torchgpipe', torchgpipe.__version__, 'ready')"
