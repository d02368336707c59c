/* tulip quantize --in HF_DIR --out DIR [--bits 4] [--group 64] [--shard-gb 5]: writes an MLX
 * affine-quantized checkpoint (MODEL.md §5.3) from an HF BF16/F32 one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "common/util.h"
#include "model/quant.h"

static void usage(void) {
    fprintf(stderr,
            "usage: tulip quantize --in HF_DIR --out DIR [--bits 4|8] [--group 64] [--shard-gb 5]\n"
            "  Writes the MLX affine format: every linear whose input width is a multiple of the\n"
            "  group at --bits, the MoE router and shared_expert_gate at 8 bits, norms offset\n"
            "  (+1), conv1d as [C, K, 1], config.json with \"quantization\".\n");
}

static void progress(const char *msg) {
    fprintf(stderr, "\rquantize: %-60s", msg);
    fflush(stderr);
}

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    int bits = 4, group = 64;
    double shard_gb = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!v) {
            fprintf(stderr, "tulip quantize: %s needs a value (or is unknown)\n", a);
            usage();
            return 2;
        }
        if (!strcmp(a, "--in"))
            in = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--bits"))
            bits = atoi(v);
        else if (!strcmp(a, "--group"))
            group = atoi(v);
        else if (!strcmp(a, "--shard-gb"))
            shard_gb = atof(v);
        else {
            fprintf(stderr, "tulip quantize: unknown option %s\n", a);
            usage();
            return 2;
        }
        i++;
    }
    if (!in || !out) {
        usage();
        return 2;
    }
    if (!(shard_gb > 0)) shard_gb = 5;
    char err[1024];
    double t0 = tl_time_s();
    int st = tl_quantize_checkpoint(in, out, bits, group, (size_t)(shard_gb * (1u << 30)), progress,
                                    err, sizeof err);
    fprintf(stderr, "\n");
    if (st) {
        fprintf(stderr, "tulip quantize: %s\n", err);
        return 1;
    }
    fprintf(stderr, "quantize: wrote %s (%d-bit, group %d) in %.1f s\n", out, bits, group,
            tl_time_s() - t0);
    return 0;
}
