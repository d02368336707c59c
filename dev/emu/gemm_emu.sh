#!/usr/bin/env bash
# Builds and runs dev/emu/gemm_emu.cpp: the prefill GEMM kernels (src/cuda/k_gemm.cu, with
# k_moe.cu's MoE plan) emulated on the host (dev/emu/cuda/, dev/emu/emu_rt.cpp), the wgmma
# instructions included (dev/emu/cuda/k_wgmma.cuh stands in for src/cuda/k_wgmma.cuh). The
# sources are copied with their `__shared__` arrays made static, `extern __shared__` ones plain
# externs and k_q4m.cuh's one inline PTX instruction written in C (as dev/emu/q4_emu.sh). Not
# part of the build or of CI: a check of the kernels' indexing and arithmetic without a GPU.
# Usage, from the repository root:  bash dev/emu/gemm_emu.sh   (~2 minutes; T_ONLY=name: the
# matching tests; EMU_OPT='-O0 -g' EMU_RUN='gdb -batch -ex run -ex bt' to debug)
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cuda"
for f in k_q4m.cuh k_gemm.cuh k_wgdesc.cuh k_gemm.cu k_gemv.cu k_moe.cu k_attn_prefill.cu; do
    sed -e 's/extern __shared__/extern/g' -e 's/__shared__/static/g' \
        -e 's/asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(r) : "r"(a), "r"(e));/r = (a \& 0x000F000Fu) | e;/' \
        "src/cuda/$f" >"$tmp/cuda/$f"
done
objs="build/cpu/src/common/util.o build/cpu/src/common/buf.o build/cpu/src/common/status.o"
make -s $objs >/dev/null
g++ ${EMU_OPT:--O2} -std=c++17 -w -Idev/emu -I"$tmp" -Iinclude -Isrc -Itests dev/emu/gemm_emu.cpp \
    dev/emu/emu_rt.cpp $objs -lm -o "$tmp/gemm_emu"
${EMU_RUN:-} "$tmp/gemm_emu" "$@"
