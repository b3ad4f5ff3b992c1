# Short commands. `make` builds everything into build/ (CLI: build/mole).
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE_FLAGS ?=
DEMO ?= eval-model/mole-eval-moe-q8_0.gguf

.PHONY: all deps build test test-release test-asan test-arm64 fuzz run bench bench-avx2 bench-compress bench-kv bench-disagg clean eval-model

all: build

deps:
	@bash scripts/deps.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(if $(CI),-DMOLE_WERROR=ON) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

# The whole suite: release build, then ASan+UBSan build, then the fuzzers (GGUF, compressed experts, whole models).
test: deps
	@$(MAKE) --no-print-directory build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory fuzz
	@$(MAKE) --no-print-directory test-arm64

test-asan:
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMOLE_SANITIZE=ON -DMOLE_WERROR=ON >/dev/null
	@cmake --build build-asan -j $(JOBS) -- --no-print-directory
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 MOLE_ASAN=1 ctest --output-on-failure -j $(JOBS)

fuzz:
	@bash scripts/fuzz.sh

# ARM64: cross-compiled with Debian's aarch64 gcc (NEON + dotprod kernels), the
# unit tests and the conformance suite run under qemu-aarch64. One process only
# (no arm64 Open MPI beside the host's); the CLI scripts need a native mole.
test-arm64:
	@bash scripts/deps-arm64.sh
	@cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DMOLE_MPI=OFF \
	  -DCMAKE_BUILD_TYPE=Release $(if $(CI),-DMOLE_WERROR=ON) >/dev/null
	@cmake --build build-arm64 -j $(JOBS) -- --no-print-directory
	cd build-arm64 && ctest --output-on-failure -j $(JOBS)

run: deps
	@$(MAKE) --no-print-directory build
	@bash scripts/demo.sh $(DEMO)

bench: deps
	@$(MAKE) --no-print-directory build
	@bash bench/run.sh
	@bash bench/offload.sh

# mole's AVX2 kernels (MOLE_ISA=avx2) against llama.cpp built for AVX2 only
# (LLAMA_CPP_AVX2_DIR: -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF)
bench-avx2: deps
	@$(MAKE) --no-print-directory build
	@MOLE_ISA=avx2 LLAMA_CPP_DIR=$(LLAMA_CPP_AVX2_DIR) bash bench/run.sh

# QMoE compression (issue 10): needs the F16 evaluation model and its corpus (make eval-model)
bench-compress: deps
	@$(MAKE) --no-print-directory build
	@bash bench/compress.sh

# Bounded KV caches (issue 11): long prompts on a synthetic model, and the eviction policies' quality
# on the evaluation model (retaining heads trained by mole train-retain), and mole serve's slots with
# long prompts, full against bounded
bench-kv: deps
	@$(MAKE) --no-print-directory build
	@bash bench/kv.sh
	@bash bench/kv_quality.sh
	@bash bench/serve_kv.sh

bench-disagg: deps
	@$(MAKE) --no-print-directory build
	@bash bench/disagg.sh

# The trained evaluation model (eval-model/): corpus, BPE, about an hour of training, GGUF export,
# figures. Needs PyTorch from Debian (installed here, not by deps); COMMIT=1 refreshes eval-model/.
eval-model:
	@bash scripts/train/deps.sh
	@bash scripts/train/run.sh

clean:
	rm -rf build build-asan build-fuzz build-arm64
