#!/usr/bin/env bash
# The one GPU-session script (docs/developing.md): run on the lent GPU machine, in the repository
# root, with the binaries built here (`make cuda` + the GPU test binaries) and .deps carried
# (tools/gpu_deps.sh). Logs go under $OUT; a short summary goes to stdout. Steps, each optional:
#   tests     bash tests/run.sh --gpu, then compute-sanitizer memcheck on test_gpu_e2e --quick, then
#             the tests of the defaults' A/B alternatives (TL_SAMPLE_VEC=0, TL_Q4W_WIDE=0,
#             TL_GEMM_SPLITK_CLUSTER=0, TL_MOE_COMBINE_NORM=0, TL_ATTN_WG=1, 2,
#             TL_MOE_SHARED_GROUPED=256, TL_CUDA_TC_PDL=1, TL_CUDA_PF_PDL=2,
#             TL_ROUTER_WG=2, TL_GEMM_CONV=0, TL_ROUTER_SPLIT_MAX=256)
#   hf        tools/hf_fullwidth.py (transformers on the GPU machine; bf16 and 4-bit) on the
#             seeds $HF_SEEDS (default 1; issue 13's yardstick: 1,2,3,5,7,11,13,21 with HF_S=600)
#   bench     tulip bench $BENCH (default: --random-weights --bits 4 --repeats 3: sampled with
#             the server's defaults; add --greedy for argmax); with BASELINE=path/to/tulip the
#             same bench of that binary first, in the same call, with $BASELINE_BENCH if set (a
#             binary from before the engine-path bench always ran greedy and has no --greedy)
#   load      load time of a full-size random 4-bit checkpoint (tools/make_random_mlx4.py),
#             warm and cold page cache
#   levers    the batch-1 kernel levers (docs/architecture.md §5.2): their kernel tests first
#             (test_slice_kernels, test_sample_count_bits; memcheck of the first), then
#             bench/env_ab.sh at 4K over $VARIANTS (default: all off (the default since
#             session 8), all on, each on alone, two slice blocks an SM, the GDN step cut by
#             columns), the same with --speculative-tokens 3, and the per-kernel table of one
#             decode step (--prof) with the levers off and on
#   prefill   the wgr kernel (k_gemm_wgr.cu, TL_MOE_WGR, TL_DENSE_WGR, the default since session
#             8) and the wgmma attention (k_attn_prefill.cu, TL_ATTN_WG; warp-specialised by
#             default since session 22): the prefill MoE, GEMM and attention tests (every tile, 6
#             and 7 included; the three attention kernels),
#             the e2e tests with tile 7 forced, memchecks, then bench/env_ab.sh METRIC=prefill at
#             1K, 4K and 16K with each on (default) and off, 2048- and 4096-token chunks
#             (TL_CUDA_MAX_TOK; default 8192) and all of the old settings; then decode batches
#             of 64 and 256 with the wgr tiles forced on every 4-bit GEMM
#   kbench    dev/kernels/prefill_bench (build/cuda/dev/prefill_bench, built beforehand): every
#             prefill kernel at production shapes, each GEMM tile forced in turn (wgr included)
#   ab        the staged binaries against each other (tools/stage_gpu.sh; BINS="base new ..." names
#             .gpu/NAME/tulip, default "base new"): decode batches of $AB_BATCHES (default 64 256;
#             empty: none) at context 1K, the binaries alternated for $AB_ROUNDS rounds (default
#             2), ms a step;
#             then prefill of $AB_PREFILL_BINS (default: $BINS; empty: none) at $AB_LENGTHS
#             (default 1024,4096,16384; one repeat), tok/s. One line per binary and
#             measurement (a failed run: "failed: " and its error), all in $OUT/ab.txt
#   chain     session 32's levers, written without a GPU (all off by default): the chained drafts
#             (TL_CUDA_SPEC_CHAIN=1|2) against the step-by-step drafts (test_mtp_chain_*,
#             test_draft_pick), route + plan in one launch (test_moe_route_plan), the trained tiny
#             model's ids with each chain mode (sampled and greedy; greedy also against no
#             speculation), then their cost: --speculative-tokens 3 at 4K for each lever
#             (alternated twice) and bench/env_ab.sh at --batch 8 (TL_MOE_ROUTE_PLAN=1,
#             TL_CUDA_GEMV_DENSE_MAX=16)
# Usage: bash tests/gpu/session_run.sh [tests] [hf] [bench] [load] [levers] [prefill] [kbench] [ab] [chain]
#   (no argument: tests hf bench load)
set -u
export LD_LIBRARY_PATH=$PWD/.deps/lib:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/tulip-out}
mkdir -p "$O"
steps=${*:-tests hf bench load}  # levers, prefill and kbench only when asked
has() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null | cut -c1-100

if has chain; then
    echo "== chain: tests"
    T_ONLY=mtp_chain timeout 120 build/cuda/tests/test_gpu_e2e >"$O/chain-e2e.txt" 2>&1
    echo "test_mtp_chain_* rc=$?"
    for t in test_draft_pick test_moe_route_plan; do
        T_ONLY=$t timeout 60 build/cuda/tests/test_kernels >"$O/$t.txt" 2>&1
        echo "$t rc=$?"
    done
    grep -hE '^(PASS|FAIL)|^# (chain|moe_route)' "$O/chain-e2e.txt" "$O"/test_*.txt | head -24
    echo "== chain: the trained tiny model's ids (modes 1, 2 against 0)"
    run=(build/cuda/tulip run --model tests/data/tiny-trained --allow-test-shape --backend cuda
        --prompt-ids "10,20,30,40,50,60" -n 300 --seed 3 --print-ids --presence-penalty 1.5)
    for t in 0 1; do
        for ch in 0 1 2; do
            TL_CUDA_SPEC_CHAIN=$ch timeout 60 "${run[@]}" --temperature $t \
                --speculative-tokens 3 >"$O/chain-run-c$ch-t$t.txt" 2>"$O/chain-run-c$ch-t$t.err"
        done
        timeout 60 "${run[@]}" --temperature $t >"$O/chain-run-plain-t$t.txt" 2>/dev/null
        for ch in 1 2; do
            cmp -s "$O/chain-run-c0-t$t.txt" "$O/chain-run-c$ch-t$t.txt" &&
                echo "t=$t: mode $ch == loop" || echo "t=$t: mode $ch DIFFERS from the loop"
        done
        tail -n 1 "$O/chain-run-c1-t$t.err"
    done
    cmp -s "$O/chain-run-plain-t0.txt" "$O/chain-run-c1-t0.txt" && echo "greedy: chain == plain" ||
        echo "greedy: chain DIFFERS from plain"
    echo "== chain: cost (--speculative-tokens 3 at 4K)"
    for r in 1 2; do
        for v in TL_CUDA_SPEC_CHAIN=0 TL_CUDA_SPEC_CHAIN=1 TL_CUDA_SPEC_CHAIN=2 \
            TL_CUDA_GEMV_DENSE_MAX=8 TL_MOE_ROUTE_PLAN=1; do
            line=$(env "$v" timeout 60 build/cuda/tulip bench --random-weights --bits 4 \
                --lengths 4096 --gen 64 --repeats 1 --speculative-tokens 3 2>&1 |
                grep 'per speculating' | head -1 | sed 's/.*sequence-step: //')
            echo "round $r $v: ${line:-failed}"
        done
    done
    VARIANTS="-; TL_MOE_ROUTE_PLAN=1; TL_CUDA_GEMV_DENSE_MAX=16" LEN=1024 GEN=48 ROUNDS=2 \
        ARGS="--random-weights --bits 4 --batch 8" timeout 200 bash bench/env_ab.sh
fi

if has levers; then
    echo "== lever tests"
    for t in test_slice_kernels test_sample_count_bits; do
        T_ONLY=$t timeout 180 build/cuda/tests/test_kernels >"$O/$t.txt" 2>&1
        echo "$t rc=$?"
        grep -E '^(PASS|FAIL)|DIFFER|failed' "$O/$t.txt" | head -8
    done
    T_ONLY=test_slice_kernels timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
        build/cuda/tests/test_kernels >"$O/memcheck-levers.txt" 2>&1
    echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$O/memcheck-levers.txt")"
    on="TL_GEMV_SLICE=1 TL_GEMV_ROWS=1 TL_MOE_SLICE=1"
    v=${VARIANTS:-"-; $on; TL_GEMV_SLICE=1; TL_GEMV_ROWS=1; TL_MOE_SLICE=1; TL_GEMV_SLICE=2; TL_GDN_COLS=1"}
    echo "== levers, decode at 4K"
    VARIANTS=$v timeout 300 bash bench/env_ab.sh 2>&1 | tee "$O/levers.txt"
    echo "== levers, --speculative-tokens 3"
    VARIANTS="-; $on" ARGS="--random-weights --bits 4 --speculative-tokens 3" GEN=64 \
        timeout 200 bash bench/env_ab.sh 2>&1 | tee "$O/levers-spec.txt"
    for mode in off on; do
        envs=()
        [ $mode = on ] && read -r -a envs <<<"$on"
        env ${envs[@]+"${envs[@]}"} timeout 120 build/cuda/tulip bench --random-weights --bits 4 \
            --lengths 4096 --gen 16 --repeats 1 --prof >"$O/prof-$mode.txt" 2>&1
        echo "prof $mode rc=$? (tables in $O/prof-$mode.txt)"
    done
fi
if has prefill; then
    for t in test_moe_grouped test_gemm test_attn_prefill; do
        echo "== $t (wgr tiles 6, 7; TL_ATTN_WG)"
        T_ONLY=$t timeout 120 build/cuda/tests/test_prefill_kernels >"$O/pf-$t.txt" 2>&1
        echo "$t rc=$?"
        grep -E '^(PASS|FAIL)|tile=[67]|wgmma|CHECK' "$O/pf-$t.txt" | head -16
    done
    T_ONLY=test_norms_bf16 timeout 60 build/cuda/tests/test_kernels >"$O/norms.txt" 2>&1
    echo "test_norms_bf16 (vectorised bf16 norms) rc=$?"
    grep -E '^(PASS|FAIL)|^# (rms|gated)|CHECK' "$O/norms.txt" | head -6
    # the whole binary: its tests draw their prompts from one generator, so a test run alone
    # (T_ONLY) sees another prompt than its tolerance was set on (session 8)
    echo "== the e2e tests with the 4-warpgroup wgr tile forced"
    TL_GEMM_TILE=7 timeout 200 build/cuda/tests/test_gpu_e2e >"$O/e2e-pf-new.txt" 2>&1
    echo "test_gpu_e2e (TL_GEMM_TILE=7) rc=$?"
    grep -E '^FAIL|CHECK|passed' "$O/e2e-pf-new.txt" | head -6
    for t in test_moe_grouped test_attn_prefill; do
        T_ONLY=$t timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
            build/cuda/tests/test_prefill_kernels >"$O/memcheck-$t.txt" 2>&1
        echo "memcheck $t rc=$? $(grep 'ERROR SUMMARY' "$O/memcheck-$t.txt")"
    done
    echo "== TL_MOE_WGR / TL_DENSE_WGR / TL_ATTN_WG / TL_CUDA_MAX_TOK, prefill at 1K, 4K, 16K"
    METRIC=prefill LEN=1024,4096,16384 GEN=4 \
        VARIANTS="-; TL_MOE_SHARED_GROUPED=256; TL_CUDA_PF_PDL=0; TL_MOE_WGR=0; TL_MOE_WGR=4; TL_DENSE_WGR=0; TL_DENSE_WGR=4; TL_ATTN_WG=0; \
TL_CUDA_MAX_TOK=2048; TL_CUDA_MAX_TOK=4096; TL_CUDA_MAX_TOK=2048 TL_MOE_WGR=0 TL_DENSE_WGR=0 TL_ATTN_WG=0" \
        timeout 400 bash bench/env_ab.sh 2>&1 | tee "$O/wgr.txt"
    echo "== the wgr tiles forced on decode batches (B = 64, 256 at context 256)"
    for b in 64 256; do
        ARGS="--random-weights --bits 4 --batch $b" LEN=256 GEN=32 \
            VARIANTS="-; TL_GEMM_TILE=6; TL_GEMM_TILE=7" timeout 200 bash bench/env_ab.sh 2>&1 |
            tee "$O/wgr-batch$b.txt"
    done
fi
if has kbench; then
    echo "== prefill kernels (dev/kernels/prefill_bench)"
    timeout "${KBENCH_S:-300}" build/cuda/dev/prefill_bench 2>&1 | tee "$O/prefill_bench.txt"
    echo "prefill_bench rc=${PIPESTATUS[0]}"
fi
if has ab; then
    echo "== A/B of the staged binaries: ${BINS:-base new}" | tee "$O/ab.txt"
    # binary $1, bench arguments $3..: its rows' field $2 (ms a step, or prefill tok/s at each
    # length) from one `bench --json` run, or "failed: " and its last line on stderr
    ab_run() {
        local bin=$1 key=$2
        shift 2
        if timeout 120 ".gpu/$bin/tulip" bench --random-weights --bits 4 "$@" --json \
            >/tmp/ab.json 2>/tmp/ab.err; then
            python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); k = sys.argv[2]
print(" ".join(f"{r[k]:.3f}" if k == "gen_ms_per_step" else f"{r[k]:.0f}" for r in d["rows"]))' \
                /tmp/ab.json "$key"
        else
            echo "failed: $(tail -1 /tmp/ab.err)"
        fi
    }
    for b in ${AB_BATCHES-64 256}; do
        for round in $(seq 1 "${AB_ROUNDS:-2}"); do
            for n in ${BINS:-base new}; do
                v=$(ab_run "$n" gen_ms_per_step --batch "$b" --lengths 1024 --gen 32 --repeats 1)
                echo "batch $b round $round $n: ms/step $v" | tee -a "$O/ab.txt"
            done
        done
    done
    for n in ${AB_PREFILL_BINS-${BINS:-base new}}; do
        v=$(ab_run "$n" prefill_tps --lengths ${AB_LENGTHS:-1024,4096,16384} --gen 4 --repeats 1)
        echo "prefill ${AB_LENGTHS:-1024,4096,16384} $n: tok/s $v" | tee -a "$O/ab.txt"
    done
fi
if has tests; then
    echo "== GPU tests"
    bash tests/run.sh --gpu 2>&1 | tee "$O/tests.txt"
    grep -hE '^# ' build/test-logs/gpu*.log | cut -c1-160 >"$O/test-notes.txt"
    grep -E 'poisoned|prefill GEMM|gemm vs|kv pool' "$O/test-notes.txt" | head -12
    timeout "${MEMCHECK_S:-180}" compute-sanitizer --tool memcheck --error-exitcode 9 \
        build/cuda/tests/test_gpu_e2e --quick >"$O/memcheck.txt" 2>&1
    echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$O/memcheck.txt")"
    # the A/B alternatives of the defaults keep their tests: alt SWITCH T_ONLY BINARY SECONDS WHAT
    # runs build/cuda/tests/BINARY with SWITCH set, its output appended to $O/alt.txt
    : >"$O/alt.txt"
    alt() {
        env "$1" T_ONLY="$2" timeout "$4" "build/cuda/tests/$3" >>"$O/alt.txt" 2>&1
        echo "$1 $5 rc=$? $(tail -1 "$O/alt.txt")"
    }
    alt TL_SAMPLE_VEC=0 sample test_kernels 120 "sampler tests"
    alt TL_Q4W_WIDE=0 tc_decode_batched test_gpu_e2e 150 "batched == alone"
    alt TL_GEMM_SPLITK_CLUSTER=0 test_gemm_splitk test_prefill_kernels 120 "split-K products"
    alt TL_MOE_COMBINE_NORM=0 tc_decode_batched test_gpu_e2e 150 "batched == alone"
    alt TL_MOE_COMBINE_NORM=0 prefill test_gpu_e2e 150 "prefill e2e"
    alt TL_ATTN_WG=1 prefill test_gpu_e2e 150 "prefill e2e"
    alt TL_ATTN_WG=2 prefill test_gpu_e2e 150 "prefill e2e"
    alt TL_MOE_SHARED_GROUPED=256 prefill test_gpu_e2e 150 "prefill e2e"
    alt TL_CUDA_TC_PDL=1 tc_decode_batched test_gpu_e2e 150 "batched == alone"
    alt TL_CUDA_PF_PDL=2 prefill test_gpu_e2e 150 "prefill e2e"
    alt TL_ROUTER_WG=2 prefill test_gpu_e2e 150 "prefill e2e"
    alt TL_GEMM_CONV=0 prefill test_gpu_e2e 150 "prefill e2e"
    alt TL_ROUTER_SPLIT_MAX=256 prefill test_gpu_e2e 150 "prefill e2e"
fi
if has hf; then
    echo "== hf_fullwidth"
    PYTHONUNBUFFERED=1 timeout "${HF_S:-270}" python3 tools/hf_fullwidth.py --out /tmp/fw \
        --layers 4 --steps 32 --seeds "${HF_SEEDS:-1}" >"$O/hf.txt" 2>&1
    echo "hf rc=$?"
    grep -E '^\||^(PASS|FAIL)|Error' "$O/hf.txt" | cut -c1-240
    rm -rf /tmp/fw
fi
if has bench; then
    args=${BENCH:---random-weights --bits 4 --repeats 3}
    for bin in ${BASELINE:-} build/cuda/tulip; do
        a=$args
        [ "$bin" = "${BASELINE:-}" ] && a=${BASELINE_BENCH:-$args}
        echo "== $bin bench $a"
        timeout "${BENCH_S:-240}" "$bin" bench $a >"$O/bench-$(basename "$(dirname "$bin")").txt" \
            2>&1
        echo "bench rc=$?"
        grep -E '^\|' "$O/bench-$(basename "$(dirname "$bin")").txt"
    done
fi
if has load; then
    echo "== load time"
    (time timeout "${GEN_S:-120}" python3 tools/make_random_mlx4.py --out /tmp/ckpt) >"$O/gen.txt" 2>&1
    tail -4 "$O/gen.txt"
    for pass in warm cold; do
        if [ $pass = cold ]; then sync; echo 3 >/proc/sys/vm/drop_caches && echo "page cache dropped"; fi
        (time timeout "${LOAD_S:-90}" build/cuda/tulip run --backend cuda --model /tmp/ckpt \
            --prompt-ids 1,2,3 -n 8 --temperature 0 --print-ids) >"$O/load-$pass.txt" 2>&1
        echo "-- $pass:"; grep -vE '^\s*$|uploading' "$O/load-$pass.txt" | tail -6
    done
fi
