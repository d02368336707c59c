#!/usr/bin/env bash
# Builds the CUDA binaries of one or more git refs here (where nvcc is) and packs them for the
# lent GPU machine, whose commands get the working tree plus what `carry` names (64 MiB in all):
#   bash tools/stage_gpu.sh NAME=REF [NAME=REF ...]     e.g.  new=next-gpu base=main
# Each REF is checked out into its own worktree under $STAGE_WT (default /tmp/tulip-stage-wt),
# built with `make cuda` plus the GPU tests and the dev/kernels programs named in $DEV (e.g.
# DEV=prefill_bench), and its binaries (debug info stripped) land in .gpu/NAME/: tulip,
# tests/test_*, dev/*. Names listed in $TULIP_ONLY (e.g. TULIP_ONLY=base, a baseline to bench
# against) get only tulip. Everything is packed into .gpu/bin.tgz (the directories themselves
# are removed: the carry limit counts all of .gpu; each binary is ~13 MB, ~4 MB packed).
# On the GPU machine, from the repository root (carry [".gpu", ".deps/lib"]):
#   tar xzf .gpu/bin.tgz -C .gpu && mkdir -p build/cuda/tests build/cuda/dev &&
#   cp .gpu/new/tulip build/cuda/ && cp -r .gpu/new/tests/. build/cuda/tests/ &&
#   cp -r .gpu/new/dev/. build/cuda/dev/
# (then .gpu/base/tulip is the baseline binary for BASELINE=). Run from the repository root.
set -eu
if [ $# -eq 0 ]; then
    echo "usage: bash tools/stage_gpu.sh NAME=REF [NAME=REF ...]" >&2
    exit 2
fi
root=$(pwd)
wt=${STAGE_WT:-/tmp/tulip-stage-wt}
mkdir -p "$wt" .gpu
names=()
for spec in "$@"; do
    name=${spec%%=*} ref=${spec#*=}
    case "$name" in '' | *[!A-Za-z0-9_-]*)
        echo "stage_gpu: bad name in '$spec'" >&2
        exit 2
        ;;
    esac
    # resolved here: inside the worktree, a symbolic ref such as HEAD names the worktree's own
    hash=$(git rev-parse --verify -q "$ref^{commit}") || {
        echo "stage_gpu: '$ref' is not a commit" >&2
        exit 2
    }
    dir=$wt/$name
    if [ -d "$dir" ]; then
        git -C "$dir" checkout -q --detach "$hash"
    else
        git worktree add -q --detach "$dir" "$hash"
    fi
    echo "== $name = $ref ($(git -C "$dir" log -1 --format='%h %s' | cut -c1-70))"
    tests=$(cd "$dir" && ls tests/gpu/test_*.c | sed 's|tests/gpu/\(.*\)\.c|build/cuda/tests/\1|')
    devs=""
    for d in ${DEV:-}; do devs="$devs build/cuda/dev/$d"; done
    case " ${TULIP_ONLY:-} " in *" $name "*) tests="" devs="" ;; esac
    make -C "$dir" -s -j"${JOBS:-6}" cuda $tests $devs >/dev/null
    out=$root/.gpu/$name
    rm -rf "$out"
    mkdir -p "$out/tests" "$out/dev"
    cp "$dir/build/cuda/tulip" "$out/"
    for t in $tests; do cp "$dir/$t" "$out/tests/"; done
    for d in $devs; do cp "$dir/$d" "$out/dev/"; done
    find "$out" -type f -exec objcopy --strip-debug {} \;
    names+=("$name")
done
tar czf .gpu/bin.tgz -C .gpu "${names[@]}"
for n in "${names[@]}"; do rm -rf ".gpu/$n"; done
echo "== .gpu/bin.tgz $(du -h .gpu/bin.tgz | cut -f1) (${names[*]}); .gpu in all: $(du -sh .gpu | cut -f1)"
