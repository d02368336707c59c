#!/usr/bin/env bash
# The SASS of one CUDA source file's kernels, here, without a GPU: compiles it to a cubin for
# sm_90a (the build's flags) and disassembles it with cuobjdump + nvdisasm, which this machine's
# CUDA install lacks; the first run fetches both from their PyPI wheels (nvidia-cuda-cuobjdump,
# nvidia-cuda-nvdisasm: NVIDIA's redistributable binaries) into .deps/sass (git-ignored).
#   bash tools/sass.sh src/cuda/k_gemm_wgr.cu > /tmp/wgr.sass
# Then count a loop's instructions between its barriers, or diff two versions' SASS. Session 18
# found the wgr GEMM's generic shared loads and per-step descriptor arithmetic this way (and in
# ncu's source view on the GPU machine: docs/developing.md §6).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: bash tools/sass.sh FILE.cu" >&2; exit 2; }
cd "$(dirname "$0")/.."
d=.deps/sass
if [ ! -x "$d/cuobjdump" ] || [ ! -x "$d/nvdisasm" ]; then
    mkdir -p "$d/whl"
    python3 -m pip download -q --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$d/whl" >&2
    python3 - "$d" <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
for w in glob.glob(os.path.join(d, "whl", "*.whl")):
    z = zipfile.ZipFile(w)
    for n in z.namelist():
        b = os.path.basename(n)
        if n.split("/")[-2:-1] == ["bin"] and b in ("cuobjdump", "nvdisasm"):
            open(os.path.join(d, b), "wb").write(z.read(n))
            os.chmod(os.path.join(d, b), 0o755)
PY
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc -cubin "$1" -o "$out/k.cubin"
NVDISASM_PATH=$PWD/$d "$d/cuobjdump" -sass "$out/k.cubin"
