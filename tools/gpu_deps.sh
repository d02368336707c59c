#!/usr/bin/env bash
# Copies the shared libraries tulip links that the GPU machine lacks (libmicrohttpd and its TLS
# stack, libutf8proc, libjansson, libpcre2) into .deps/lib (git-ignored), so a build made here runs
# there: name .deps in the device tool's carry and set LD_LIBRARY_PATH=.deps/lib.
# Also haproxy, for bench/replicas.sh, into .deps/haproxy (below).
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
# bench/replicas.sh needs haproxy, which the GPU machine lacks: the binary and the libraries it
# needs go to .deps/haproxy (apart from .deps/lib, whose LD_LIBRARY_PATH the GPU scripts give
# torch too; libstdc++ and libgcc_s stay the machine's own, which are newer).
if hp=$(command -v haproxy || ls /usr/sbin/haproxy 2>/dev/null); then
    mkdir -p .deps/haproxy/lib
    cp -L "$hp" .deps/haproxy/haproxy
    ldd "$hp" | awk '$3 ~ /^\// {print $3}' | while read -r d; do
        case "$(basename "$d")" in libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;; *) cp -L "$d" .deps/haproxy/lib/ ;; esac
    done
    LD_LIBRARY_PATH=.deps/haproxy/lib .deps/haproxy/haproxy -v | head -1
    du -sh .deps/haproxy
else
    echo "gpu_deps: haproxy not installed here (apt-get install haproxy): bench/replicas.sh will not run there"
fi
