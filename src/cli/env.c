/* The TL_* environment switches: the one list of them, for the subcommands' --help. Each is read
 * where noted (grep getenv src/); a switch added or renamed there gets its line here. They are
 * diagnostics and tuning knobs, not settings a deployment needs. */
#include <stdio.h>
#include "cli/opts.h"

/* Subcommands that open a model and run it on a backend: the CUDA switches act when that backend
 * is the CUDA one (--backend cuda, or auto on a machine with a GPU; bench always). */
#define ENGINE_CMDS (TL_CMD_RUN | TL_CMD_CHAT | TL_CMD_SERVE | TL_CMD_BENCH)
/* Subcommands that load a checkpoint directory (src/model/weights.c). */
#define LOAD_CMDS (ENGINE_CMDS | TL_CMD_INFO | TL_CMD_QUANTIZE)

typedef struct env_switch {
    const char *name; /* with its value syntax: "TL_CUDA_SYNC=1" */
    unsigned cmds;    /* TL_CMD_* bits of the subcommands it affects */
    const char *help; /* one line, for --help */
} env_switch;

static const env_switch env_switches[] = {
    {"TL_CUDA_SYNC=1", ENGINE_CMDS,
     "CUDA: sync and check after every kernel, errors name it (no graphs)"},
    {"TL_CUDA_NO_GRAPH=1", ENGINE_CMDS, "CUDA: decode steps run eagerly, without CUDA graphs"},
    {"TL_CUDA_NO_MIX=1", ENGINE_CMDS,
     "CUDA: prefill chunks run alone instead of sharing a micro-batch with the decode tokens"},
    {"TL_CUDA_NO_PDL=1", ENGINE_CMDS, "CUDA: decode kernels without programmatic dependent launch"},
    {"TL_CUDA_NO_PREFILL_GEMM", ENGINE_CMDS,
     "CUDA, if set: prefill through the decode kernels, not the GEMM path"},
    {"TL_CUDA_MAX_TOK=N", ENGINE_CMDS,
     "CUDA: tokens per micro-batch, >= 16 (default 8192; no GEMM: 512)"},
    {"TL_CUDA_TC_PDL=0|1|2", ENGINE_CMDS,
     "CUDA: the batched tensor-core path without programmatic dependent launch (0), with it (1), "
     "or with it and each kernel triggering its successor after its wait (2, default) (A/B)"},
    {"TL_CUDA_TC_MIN=N", ENGINE_CMDS,
     "CUDA: batches of >= N tokens decode on the tensor cores (default 3; 0: never)"},
    {"TL_CUDA_GEMV_DENSE_MAX=N", ENGINE_CMDS,
     "CUDA: tensor-core micro-batches of <= N tokens keep their dense products on the GEMV "
     "kernels, only the MoE on the tensor cores (default 0: off; A/B)"},
    {"TL_CUDA_ROUTER_GEMM_MIN=N", ENGINE_CMDS,
     "CUDA: batches of >= N tokens compute the router on the tensor cores (default 64; 0: never)"},
    {"TL_CUDA_STATE_BF16=1", ENGINE_CMDS,
     "CUDA: Gated DeltaNet state in bf16, as --state-dtype bf16 (for tools that run `tulip run`)"},
    {"TL_CUDA_SPEC_RECOMPUTE=1", ENGINE_CMDS,
     "CUDA, --speculative-tokens: roll back by restore + recompute, not state copies"},
    {"TL_CUDA_SPEC_CHAIN=0|1|2", ENGINE_CMDS,
     "CUDA, --speculative-tokens: one draft call a step, the host drawing between them (0, "
     "default), or the whole chain in one call drawn on the device (1), or that chain as a CUDA "
     "graph for a single drafting sequence (2) (A/B; the same drafts; not yet run on a GPU)"},
    {"TL_CUDA_ATTN_NO_TC=1", ENGINE_CMDS,
     "CUDA: CUDA-core split-KV decode attention instead of tensor-core"},
    {"TL_CUDA_ATTN_MIN_CHUNK=N", ENGINE_CMDS,
     "CUDA: at least N keys per split-KV attention chunk (default 32)"},
    {"TL_CUDA_VERBOSE", ENGINE_CMDS,
     "CUDA, if set: report the weight upload also for --random-weights"},
    {"TL_CUDA_GDN=tf32|3xtf32|fma", ENGINE_CMDS,
     "CUDA: chunked GDN prefill kernels (default tf32 tensor cores; fma: the old fp32 ones)"},
    {"TL_GEMM_SPLITK=0", ENGINE_CMDS,
     "CUDA: 4-bit GEMMs of decode batches (<= 256 tokens) without split-K (A/B; other rounding)"},
    {"TL_ROUTER_WG=0|2", ENGINE_CMDS,
     "CUDA: the router GEMM of prefill chunks of >= 3072 tokens on the mma.sync 64x64 tiles "
     "instead of wgmma (0), or every unsplit one on wgmma (2; A/B)"},
    {"TL_ROUTER_SPLIT_MAX=N", ENGINE_CMDS,
     "CUDA: router GEMMs of up to N tokens (default 1024) split in K 8 ways in a cluster, "
     "unsplit past N (A/B)"},
    {"TL_GEMM_CONV=0", ENGINE_CMDS,
     "CUDA: the conv1d of a prefill chunk's GDN layers in its own kernel instead of inside the "
     "in-projection's epilogue (the same bits; A/B)"},
    {"TL_GEMM_SPLITK_CLUSTER=0", ENGINE_CMDS,
     "CUDA: split-K dense products of decode batches sum their partials through a workspace and a "
     "reduce kernel instead of inside a thread-block cluster (A/B; up to 16 splits instead of 8)"},
    {"TL_MOE_COMBINE_NORM=0", ENGINE_CMDS,
     "CUDA: the next layer's input norm as its own launch instead of inside the MoE combine "
     "(A/B; same bits)"},
    {"TL_MOE_ROUTE_PLAN=1", ENGINE_CMDS,
     "CUDA: micro-batches of <= 32 tokens on the tensor cores route and plan their MoE in one "
     "launch instead of two (A/B; the same bits)"},
    {"TL_GEMM_Q4W=0", ENGINE_CMDS,
     "CUDA: a decode batch's 4-bit MoE GEMMs dequantize to bf16 (old kernel) instead of q4w (A/B)"},
    {"TL_Q4W_WIDE=0", ENGINE_CMDS,
     "CUDA: the q4w MoE GEMM on 8 warps of 16 weight rows (its first loop) instead of 4 warps of "
     "32 (A/B; same bits)"},
    {"TL_GEMV_SLICE=0|1|2", ENGINE_CMDS,
     "CUDA: 4-bit decode GEMVs of <= 8 tokens on the slice kernel with 1 or 2 blocks an SM; 0 "
     "(default): the persistent q4m kernel only (A/B; same bits)"},
    {"TL_GEMV_ROWS=1", ENGINE_CMDS,
     "CUDA: 4-bit decode GEMVs not taken by the slice kernel on the rows kernel instead of the "
     "persistent q4m kernel (A/B; same bits)"},
    {"TL_Q4V=0|1|2", ENGINE_CMDS,
     "CUDA: the q4v dot (one mma a weight word, x in registers) in the 4-bit decode GEMVs and "
     "moe_up of 1-2 tokens (1, default), and in moe_down too (2); 0: q4m_dot everywhere (A/B)"},
    {"TL_MOE_SLICE=1", ENGINE_CMDS,
     "CUDA: batch-1 MoE with the slice moe_up and the early-routing moe_down (A/B; same bits)"},
    {"TL_SAMPLE_VEC=0|2|4", ENGINE_CMDS,
     "CUDA: the sampler's part kernel reads its rows id by id (0), or as float4s, 2 or 4 in "
     "flight a thread (default: 4 for many rows, 2 for at most 8) (A/B; same survivors, logprobs "
     "within rounding)"},
    {"TL_MOE_SHARED_GROUPED=N", ENGINE_CMDS,
     "CUDA: the shared expert inside the grouped MoE GEMMs only in micro-batches of <= N tokens "
     "(default: all), longer ones as two dense GEMMs; 0: always dense (A/B)"},
    {"TL_GDN_COLS=1", ENGINE_CMDS,
     "CUDA: the decode kernels' GDN step as the column-cut kernel plus the f32 gated norm (A/B)"},
    {"TL_CUDA_PF_PDL=0|1|2", ENGINE_CMDS,
     "CUDA: a single sequence's prefill chunk without programmatic dependent launch (0), with it "
     "(1, default), or with the early triggers too (2) (A/B)"},
    {"TL_MOE_WGR=0|2|4", ENGINE_CMDS,
     "CUDA: 4-bit MoE GEMMs of >= 512 tokens on the wgr kernel with 2 (default) or 4 warpgroups, "
     "0: the mma.sync / wgmma tiles"},
    {"TL_DENSE_WGR=0|2|4", ENGINE_CMDS,
     "CUDA: dense 4-bit GEMMs of >= 512 tokens on the wgr kernel with 2 (default) or 4 "
     "warpgroups, 0: the mma.sync / wgmma tiles"},
    {"TL_DENSE_WGR_DEC=0", ENGINE_CMDS,
     "CUDA: dense 4-bit GEMMs of <= 256 tokens (decode batches) on the 16/64-token mma.sync tiles "
     "instead of the wgr kernel (A/B; other rounding)"},
    {"TL_ATTN_WG=0|1|2", ENGINE_CMDS,
     "CUDA: prefill attention on the mma.sync kernel (0), the one-warpgroup wgmma one (1) or the "
     "warp-specialised one with P through shared memory (2) instead of the warp-specialised one "
     "with P in registers (two query heads a block share each K/V tile; O = P V with V read "
     "N-major; A/B)"},
    {"TL_GEMM_TILE=0..7", ENGINE_CMDS,
     "CUDA: force a GEMM tile (mma 0:128x128 1:64x128 2:128x256 5:16x128, wgmma 3:128x256 "
     "4:64x256, wgr 6:2 7:4 warpgroups)"},
    {"TL_NORM_CHECK=0", LOAD_CMDS,
     "skip the load-time check of the RMSNorm weights' storage convention"},
    {"TL_TEST_LOAD_DELAY_MS=N", TL_CMD_SERVE,
     "tests: wait N ms before loading the model (observe /health 503)"},
    {"TL_TEST_ADMIT_DELAY_MS=N", TL_CMD_SERVE,
     "tests: pause N ms (at most 10000) after a request leaves the queue, before it runs"},
    {"TL_TEST_SWEEP_DELAY_MS=N", TL_CMD_SERVE,
     "tests: the scheduler pauses N ms (at most 10000) after each step's delivery, before it "
     "sweeps the finished streams"},
};

void tl_cli_print_env(FILE *f, unsigned cmds) {
    int n = 0;
    for (size_t i = 0; i < sizeof env_switches / sizeof env_switches[0]; i++) {
        const env_switch *s = &env_switches[i];
        if (!(s->cmds & cmds)) continue;
        fprintf(f, "  %-30s%s\n", s->name, s->help);
        n++;
    }
    if (!n) fprintf(f, "  (none: no TL_* switch affects this command)\n");
}
