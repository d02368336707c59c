#!/usr/bin/env bash
# Builds and runs dev/emu/q4_emu.cpp: the decode GEMV, MoE and sampler kernels (src/cuda/k_gemv.cu,
# k_moe.cu, k_sample.cu) emulated on the host (dev/emu/emu.sh: the device shim dev/emu/cuda/,
# the runtime dev/emu/emu_rt.cpp). Not part of the build or of CI: a check of the kernels'
# indexing and arithmetic without a GPU (~8 minutes). Usage, from the repository root:
#   bash dev/emu/q4_emu.sh   (T_ONLY=name runs the tests matching it)
EMU_OBJS="build/cpu/src/engine/sample.o" exec bash dev/emu/emu.sh dev/emu/q4_emu.cpp "k_q4m.cuh k_rms.cuh k_gemm.cuh k_gemv.cu k_moe.cu k_sample.cu" "$@"
