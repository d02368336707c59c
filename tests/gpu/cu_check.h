/* CU(call): a CUDA runtime call that must succeed, for the standalone GPU programs (the prefill
 * kernel tests, dev/kernels benchmarks): on an error it prints file:line, the call and the CUDA
 * message, and exits with status 2. The backend itself returns errors instead (cuda_common.cuh
 * CUDA_TRY). */
#ifndef TL_CU_CHECK_H
#define TL_CU_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#define CU(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#endif
