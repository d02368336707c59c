#!/usr/bin/env bash
# Builds and runs dev/emu/gemm_emu.cpp: the prefill GEMMs (src/cuda/k_gemm.cu, with k_moe.cu's
# MoE plan) and the prefill attention (k_attn_prefill.cu) emulated on the host (dev/emu/emu.sh),
# the wgmma instructions included (dev/emu/cuda/k_wgmma.cuh stands in for the src/cuda header).
# Not part of the build or of CI: a check of the kernels' indexing and arithmetic without a GPU.
# Usage, from the repository root:  bash dev/emu/gemm_emu.sh   (~3 minutes; T_ONLY=name: the
# matching tests; EMU_OPT='-O0 -g' EMU_RUN='gdb -batch -ex run -ex bt' to debug)
exec bash dev/emu/emu.sh dev/emu/gemm_emu.cpp \
    "k_q4m.cuh k_rms.cuh k_gemm.cuh k_gemm_common.cuh k_wgdesc.cuh k_gemm.cu k_gemm_wgr.cu k_conv1d.cu k_gemv.cu k_moe.cu \
    k_attn_prefill.cu k_norm.cu k_gdn_decode.cu k_router.cu k_rope.cu" "$@"
