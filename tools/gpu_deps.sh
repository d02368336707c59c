#!/usr/bin/env bash
# Copies the shared libraries tulip links that the GPU machine lacks (libmicrohttpd and its TLS
# stack, libutf8proc, libjansson, libpcre2) into .deps/lib (git-ignored), so a build made here runs
# there: name .deps in the device tool's carry and set LD_LIBRARY_PATH=.deps/lib.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/lib
libs="libmicrohttpd.so.12 libutf8proc.so.2 libjansson.so.4 libpcre2-8.so.0"
for l in $libs; do
    p=$(ldconfig -p | awk -v l="$l" '$1 == l && /x86-64/ {print $NF}' | head -n 1)
    [ -n "$p" ] || { echo "gpu_deps: $l not found (apt-get install the -dev packages first)"; exit 1; }
    cp -L "$p" .deps/lib/
    ldd "$p" | awk '$3 ~ /^\// {print $3}' | while read -r d; do
        case "$(basename "$d")" in libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;; *) cp -L "$d" .deps/lib/ ;; esac
    done
done
du -sh .deps/lib
