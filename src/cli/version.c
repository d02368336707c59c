/* tulip --version: the release, the git commit the binary was built from and the GPU architecture
 * of the CUDA build, all baked in at compile time by the Makefile (TL_VERSION, TL_COMMIT,
 * TL_CUDA_ARCH). The server reports the same through tl_server_params (GET /version). */
#include <stdio.h>
#include "cli/cli.h"

#ifndef TL_VERSION
#define TL_VERSION "0.1.0"
#endif
#ifndef TL_COMMIT
#define TL_COMMIT "unknown"
#endif
#ifdef TL_NO_CUDA
#define TL_ARCH_TEXT "cpu only"
#elif defined(TL_CUDA_ARCH)
#define TL_ARCH_TEXT "cuda " TL_CUDA_ARCH
#else
#define TL_ARCH_TEXT "cuda (architecture unknown)"
#endif

const char *tl_cli_version(void) { return TL_VERSION; }
const char *tl_cli_commit(void) { return TL_COMMIT; }
const char *tl_cli_arch(void) { return TL_ARCH_TEXT; }

int cmd_version(int argc, char **argv) {
    printf("tulip %s (commit %s, %s)\n", TL_VERSION, TL_COMMIT, TL_ARCH_TEXT);
    return 0;
}
