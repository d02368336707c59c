/* tulip quantize --in HF_DIR --out DIR [--bits 4] [--group 64] [--shard-gb 5]: writes an MLX
 * affine-quantized checkpoint (docs/model.md §5.3) from an HF BF16/F32 one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "common/util.h"
#include "model/quant.h"

static void progress(const char *msg) {
    fprintf(stderr, "\rquantize: %-60s", msg);
    fflush(stderr);
}

static const tl_opt_choice quant_bits[] = {{"4", 4}, {"8", 8}, {NULL, 0}};

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    int bits = 4, group = 64;
    double shard_gb = 5;
    tl_opt opts[] = {
        TL_OPT_STR("in", 0, &in, "HF_DIR", "the HF BF16/F32 checkpoint directory"),
        TL_OPT_STR("out", 0, &out, "DIR", "where the quantized checkpoint goes (created)"),
        TL_OPT_CHOICE("bits", 0, &bits, "4|8", quant_bits, "bits per weight (default 4)"),
        TL_OPT_INT("group", 0, &group, "N", 32, 512,
                   "weights per scale and bias, a multiple of 32 (default 64)"),
        TL_OPT_DOUBLE("shard-gb", 0, &shard_gb, "GB", 0, 1e6,
                      "safetensors shard size in GiB (default 5; 0: the default)"),
    };
    tl_cli_cmd cmd = {
        .name = "quantize",
        .id = TL_CMD_QUANTIZE,
        .synopsis = "--in HF_DIR --out DIR [--bits 4|8] [--group 64] [--shard-gb 5]",
        .about =
            "Writes the MLX affine format: every linear whose input width is a multiple of the\n"
            "group at --bits, the MoE router and shared_expert_gate at 8 bits, norms offset\n"
            "(+1), conv1d as [C, K, 1], config.json with \"quantization\".\n",
        .opts = opts,
        .n_opts = TL_CLI_NOPTS(opts),
    };
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    if (!in || !out) return tl_cli_usage_error(&cmd, "--in and --out are required");
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
