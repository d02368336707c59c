#!/usr/bin/env bash
# Builds and runs dev/emu/q4_emu.cpp: the decode GEMV, MoE and sampler kernels (src/cuda/k_gemv.cu,
# k_moe.cu, k_sample.cu) emulated on the host (dev/emu/cuda/cuda_common.cuh, dev/emu/emu_rt.cpp). The sources
# are copied with their `__shared__` arrays made static (shared by the emulated threads of a
# block), `extern __shared__` ones plain externs (the program's globals) and the one inline PTX
# instruction (q4m_nib's lop3) written in C. Not part of the build
# or of CI: a check of the kernels' indexing and arithmetic without a GPU (~8 minutes). Usage,
# from the repository root:  bash dev/emu/q4_emu.sh   (T_ONLY=name runs the tests matching it)
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cuda"
for f in k_q4m.cuh k_gemm.cuh k_gemv.cu k_moe.cu k_sample.cu; do
    sed -e 's/extern __shared__/extern/g' -e 's/__shared__/static/g' \
        -e 's/asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(r) : "r"(a), "r"(e));/r = (a \& 0x000F000Fu) | e;/' \
        "src/cuda/$f" >"$tmp/cuda/$f"
done
objs="build/cpu/src/common/util.o build/cpu/src/common/buf.o build/cpu/src/common/status.o"
make -s $objs >/dev/null
g++ -O2 -std=c++17 -w -Idev/emu -I"$tmp" -Iinclude -Isrc -Itests dev/emu/q4_emu.cpp \
    dev/emu/emu_rt.cpp $objs -lm -o "$tmp/q4_emu"
"$tmp/q4_emu" "$@"
