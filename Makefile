# tulip — one Makefile for everything. `make help` lists the targets.
#
# Builds live under build/<variant>/: cpu (backend compiled out, -DTL_NO_CUDA), cuda (CPU + CUDA
# backends; needs nvcc), asan (cpu with AddressSanitizer + UBSan). build/tulip is the best build
# this machine can make: cuda when nvcc is found, cpu otherwise.

MAKEFLAGS += -r
CC        ?= cc
NVCC      ?= nvcc
CUDA_ARCH ?= sm_90a
CUDA_ARCH_NUM := $(subst sm_,,$(CUDA_ARCH))
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)
CUDA      ?= $(HAVE_NVCC)
CUDA_HOME ?= $(abspath $(dir $(shell command -v $(NVCC) 2>/dev/null))..)

PKGS     := libmicrohttpd jansson libpcre2-8 libutf8proc
PKG_CFL  := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lmicrohttpd -ljansson -lpcre2-8 -lutf8proc)

# What `tulip --version` and GET /version report: the release, the git commit this tree was built
# from ("unknown" outside git; "-dirty" with uncommitted changes) and, for the cuda build, the
# GPU architecture. Only src/cli/version.o sees them (recompiled every build: it is cheap); the
# server gets them from the CLI (tl_server_params), so library objects and tests never rebuild.
TL_VERSION := 0.1.0
TL_COMMIT  := $(shell c=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null && echo $$c || echo $$c-dirty; } || echo unknown)
VERSION_DEFS = -DTL_VERSION='"$(TL_VERSION)"' -DTL_COMMIT='"$(TL_COMMIT)"'

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter -Werror
CFLAGS  ?= -O2 -g
CFL     := -std=c11 $(CFLAGS) -D_GNU_SOURCE -Iinclude -Isrc -Itests -MMD -MP -pthread $(WARN) $(PKG_CFL) $(EXTRA_CFLAGS)
LDLIBS  := $(PKG_LIBS) -lm -pthread
NVFLAGS := -O3 -lineinfo -g -std=c++17 -gencode arch=compute_$(CUDA_ARCH_NUM),code=$(CUDA_ARCH) \
           -Iinclude -Isrc -Xcompiler -Wall,-Wno-unused-parameter,-Werror -Werror all-warnings -MMD -MP
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcudart_static -ldl -lrt -lstdc++

LIB_SRC  := $(wildcard src/common/*.c src/model/*.c src/tokenizer/*.c src/cpu/*.c src/engine/*.c src/server/*.c src/grammar/*.c)
CLI_SRC  := $(wildcard src/cli/*.c)
CU_SRC   := $(wildcard src/cuda/*.cu)
TEST_SRC := $(wildcard tests/cpu/test_*.c)
GTEST_SRC := $(wildcard tests/gpu/test_*.c)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)

objs = $(patsubst %.c,build/$(1)/%.o,$(2))

CPU_LIB  := $(call objs,cpu,$(LIB_SRC))
ASAN_LIB := $(call objs,asan,$(LIB_SRC))
CUDA_LIB := $(call objs,cuda,$(LIB_SRC)) $(patsubst %.cu,build/cuda/%.o,$(CU_SRC))

CPU_TESTS  := $(patsubst tests/cpu/%.c,build/cpu/tests/%,$(TEST_SRC))
ASAN_TESTS := $(patsubst tests/cpu/%.c,build/asan/tests/%,$(TEST_SRC))
GPU_TESTS  := $(patsubst tests/gpu/%.c,build/cuda/tests/%,$(GTEST_SRC))
FUZZERS    := $(patsubst tests/fuzz/%.c,build/fuzz/%,$(FUZZ_SRC))

ifeq ($(CUDA),1)
BEST := build/cuda/tulip
else
BEST := build/cpu/tulip
endif

.PHONY: all help deps cpu cuda asan tests test test-c test-py test-gpu fuzz format format-check clean demo
.DEFAULT_GOAL := all

all: build/tulip

help:
	@echo "make            build build/tulip (CUDA backend if nvcc is found, else CPU only)"
	@echo "make cpu        CPU-only build: build/cpu/tulip"
	@echo "make cuda       CPU + CUDA build: build/cuda/tulip (CUDA_ARCH=$(CUDA_ARCH))"
	@echo "make deps       install the Debian packages tulip builds against (apt-get; root or sudo)"
	@echo "make demo       build and run the bundled tiny demo model"
	@echo "make test       CPU tests (C, ASan+UBSan, fuzz smoke, Python references); ends with 'N passed, N failed'"
	@echo "make test-gpu   GPU tests (on a machine with an NVIDIA GPU)"
	@echo "make fuzz       libFuzzer targets (clang); FUZZ_TIME=seconds per target"
	@echo "make format / format-check"
	@echo "make clean"

build/tulip: $(BEST)
	@ln -sfn $(patsubst build/%/tulip,%,$(BEST))/tulip $@

cpu: build/cpu/tulip
cuda: build/cuda/tulip
asan: build/asan/tulip $(ASAN_TESTS)
tests: $(CPU_TESTS) $(ASAN_TESTS) build/cpu/tulip build/asan/tulip

# ---- compile rules per variant ----
build/cpu/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFL) -DTL_NO_CUDA -c $< -o $@
build/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFL) -DTL_NO_CUDA -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -c $< -o $@
build/cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFL) -c $< -o $@
build/cuda/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# The version object: rebuilt every time (the commit may have moved), with the version defines;
# the cuda variant also names the architecture it was compiled for.
.PHONY: FORCE
FORCE:
build/cpu/src/cli/version.o: src/cli/version.c FORCE
	@mkdir -p $(dir $@)
	$(CC) $(CFL) -DTL_NO_CUDA $(VERSION_DEFS) -c $< -o $@
build/asan/src/cli/version.o: src/cli/version.c FORCE
	@mkdir -p $(dir $@)
	$(CC) $(CFL) -DTL_NO_CUDA -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined $(VERSION_DEFS) -c $< -o $@
build/cuda/src/cli/version.o: src/cli/version.c FORCE
	@mkdir -p $(dir $@)
	$(CC) $(CFL) $(VERSION_DEFS) -DTL_CUDA_ARCH='"$(CUDA_ARCH)"' -c $< -o $@

# ---- binaries ----
build/cpu/tulip: $(CPU_LIB) $(call objs,cpu,$(CLI_SRC))
	$(CC) $(CFL) $^ -o $@ $(LDLIBS)
build/asan/tulip: $(ASAN_LIB) $(call objs,asan,$(CLI_SRC))
	$(CC) $(CFL) -fsanitize=address,undefined $^ -o $@ $(LDLIBS)
build/cuda/tulip: $(CUDA_LIB) $(call objs,cuda,$(CLI_SRC))
	$(CC) $(CFL) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)

build/cpu/tests/%: build/cpu/tests/cpu/%.o $(CPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFL) $^ -o $@ $(LDLIBS)
build/asan/tests/%: build/asan/tests/cpu/%.o $(ASAN_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFL) -fsanitize=address,undefined $^ -o $@ $(LDLIBS)
build/cuda/tests/%: build/cuda/tests/gpu/%.o $(CUDA_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFL) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)
# dev/kernels timing programs (GPU machine only; not part of any test run). prefill_bench
# compiles k_gdn_chunk.cu in (it times that file's kernels one by one).
build/cuda/dev/prefill_bench: build/cuda/dev/kernels/prefill_bench.o \
		$(filter-out %/k_gdn_chunk.o,$(CUDA_LIB))
	@mkdir -p $(dir $@)
	$(CC) $(CFL) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)
build/cuda/dev/%: build/cuda/dev/kernels/%.o $(CUDA_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFL) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)

# libFuzzer targets: clang, the library sources compiled once (build/fuzz/obj) with the fuzzer's
# instrumentation and sanitizers, linked into each target.
FUZZ_CFL := $(filter-out -MMD -MP,$(CFL)) -DTL_NO_CUDA -DTL_FUZZING -O1 -g -fsanitize=fuzzer,address,undefined
FUZZ_LIB := $(call objs,fuzz/obj,$(LIB_SRC))
.SECONDARY: $(FUZZ_LIB)
build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFL) -MMD -MP -c $< -o $@
build/fuzz/%: tests/fuzz/%.c $(FUZZ_LIB)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFL) $^ -o $@ $(LDLIBS)

# ---- tests ----
test: tests
	@bash tests/run.sh

test-gpu: $(GPU_TESTS) build/cuda/tulip
	@bash tests/run.sh --gpu

fuzz: $(FUZZERS)
	@for f in $(FUZZERS); do echo "== $$f"; $$f -max_total_time=$${FUZZ_TIME:-60} tests/fuzz/corpus/$$(basename $$f) || exit 1; done

APT_PKGS := build-essential pkg-config clang clang-format libclang-rt-14-dev python3 python3-venv \
            libmicrohttpd-dev libjansson-dev libpcre2-dev libutf8proc-dev libcmocka-dev \
            systemd haproxy
deps:
	$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq
	$(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PKGS) >/dev/null

# The demo model. tests/data/tiny-trained when it exists (tools/train_tiny_mtp.py: trained on the
# stdlib's docstrings, with an MTP head): greedy text from a raw prompt with speculative decoding
# (the acceptance per draft position on stderr), then a chat message through the template. Else
# tests/data/tiny-a (random weights made by transformers): greedy ids from prompt ids, then a chat
# message through the template, tokenizer and detokenizer.
DEMO_TRAINED := $(wildcard tests/data/tiny-trained/config.json)
demo: build/tulip
ifneq ($(DEMO_TRAINED),)
	./build/tulip run --model tests/data/tiny-trained --allow-test-shape --raw -p "Return a new list of" -n 48 --temperature 0 --speculative-tokens 2
	./build/tulip run --model tests/data/tiny-trained --allow-test-shape -p "What does the len function do?" -n 32 --seed 7 --no-thinking
else
	./build/tulip run --model tests/data/tiny-a --allow-test-shape --prompt-ids 1,2,3,4 -n 16 --temperature 0 --print-ids
	./build/tulip run --model tests/data/tiny-a --allow-test-shape -p "Hello, who are you?" -n 24 --seed 7
endif

format:
	clang-format -i $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh')
format-check:
	clang-format --dry-run --Werror $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)

# Python virtualenv for the reference tests (pinned in requirements-test.txt).
.PHONY: venv
venv: .venv/bin/python
.venv/bin/python: requirements-test.txt
	python3 -m venv .venv
	.venv/bin/pip install -q --disable-pip-version-check -r requirements-test.txt
	@touch $@
