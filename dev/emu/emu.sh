#!/usr/bin/env bash
# Builds and runs one host-emulation program of dev/emu against copies of the CUDA sources it
# includes: `bash dev/emu/emu.sh PROGRAM "SOURCES" [args...]`, PROGRAM a dev/emu/*.cpp, SOURCES
# the src/cuda files it includes (directly or not). The copies have their `__shared__` arrays
# made static (shared by the emulated threads of a block), `extern __shared__` ones plain
# externs (the program's globals) and k_q4m.cuh's one inline PTX instruction (lop3) written in
# C; headers the emulator replaces (dev/emu/cuda/: cuda_common.cuh, k_wgmma.cuh) are found
# first on the include path. EMU_OPT (default -O2) and EMU_RUN (e.g. 'gdb -batch -ex run -ex
# bt') for debugging; EMU_OBJS: more build/cpu objects the program links (q4_emu.sh: the host
# sampler). Run from the repository root; used by q4_emu.sh and gemm_emu.sh.
set -eu
prog=$1 srcs=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cuda"
for f in $srcs; do
    sed -e 's/extern __shared__/extern/g' -e 's/__shared__/static/g' \
        -e 's/asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(r) : "r"(a), "r"(e));/r = (a \& 0x000F000Fu) | e;/' \
        "src/cuda/$f" >"$tmp/cuda/$f"
done
objs="build/cpu/src/common/util.o build/cpu/src/common/buf.o build/cpu/src/common/status.o ${EMU_OBJS:-}"
make -s $objs >/dev/null
# shellcheck disable=SC2086
g++ ${EMU_OPT:--O2} -std=c++17 -w -Idev/emu -I"$tmp" -Iinclude -Isrc -Itests "$prog" \
    dev/emu/emu_rt.cpp $objs -lm -o "$tmp/emu"
${EMU_RUN:-} "$tmp/emu" "$@"
