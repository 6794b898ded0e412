# Reel -- top-level build.  `make` builds everything; see README.md.
#
#   make            libraries, reelctl, tests (CUDA too when nvcc exists)
#   make test       install missing deps, build, run every test (plus asan, tsan)
#   make demo       install missing deps, build, run the main job
#   make asan       unit suites under AddressSanitizer + UBSan (CUDA=0), with
#                   the capture cache's invariants checked after every call
#   make tsan       unit suites under ThreadSanitizer (CUDA=0), invariants too
#   make fuzz       libFuzzer harnesses, FUZZ_SECONDS (60) each; make test runs 3 s each
#   make test-hosts broker and workers in 3 network namespaces over veth (make test runs it too)
#   make bench      benchmarks (separate from tests)
#   make CUDA=0     build without CUDA even where nvcc exists

BUILD   ?= build
# Parallel compiles for the builds that make test, demo and the sanitizer
# targets start (CI runs a plain `make test`); `make JOBS=1 test` for one.
JOBS    ?= $(shell getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
CC      ?= cc
CSTD     = -std=c17
WARN     = -Wall -Wextra -Werror -Wno-psabi
OPT     ?= -O2 -g
SAN     ?=
PKGS     = libzmq msgpack jansson sqlite3 libsodium libcrypto
# Live /metrics and health (net/http.c) use libmicrohttpd; the GPU bundle
# (deploy/gpu-bundle.sh) builds without it: the device check needs no HTTP.
# Prompts and videos (media/: libsentencepiece, FFmpeg's libavformat and
# libavcodec) are left out of it too: it checks the DiT's step.
ifeq ($(REEL_GPU_BUNDLE),1)
HTTP_PKG   =
HTTP_FLAGS = -DREEL_NO_HTTP -DREEL_NO_MEDIA
MEDIA_PKG  =
else
HTTP_PKG   = libmicrohttpd
HTTP_FLAGS =
MEDIA_PKG  = sentencepiece libavformat libavcodec libswscale libavutil
endif
PKGS    += $(HTTP_PKG) $(MEDIA_PKG)
CFLAGS_ALL = $(CSTD) $(WARN) $(OPT) $(SAN) $(HTTP_FLAGS) -D_GNU_SOURCE -pthread -MMD -MP \
             -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread \
             $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# No binary links FFmpeg: media/av_lazy.c opens it (dlopen) the first time
# a video is written or read, since its ~130 libraries cost every process
# 75 ms at start. sentencepiece is linked --as-needed.
PKGS_CORE  = $(filter-out $(MEDIA_PKG),$(PKGS))
ifneq ($(MEDIA_PKG),)
MEDIA_LDLIBS = -Wl,--as-needed $(shell pkg-config --libs sentencepiece 2>/dev/null) -lstdc++ -Wl,--no-as-needed -ldl
endif
LDLIBS_ALL = $(shell pkg-config --libs $(PKGS_CORE) 2>/dev/null) $(MEDIA_LDLIBS) -lopenblas -lm -pthread
CXX      ?= c++
# The one C++ file: media/spm_shim.cc, a C face over libsentencepiece's C++ API.
CXXFLAGS_ALL = -std=c++17 -Wall -Wextra -Werror $(OPT) $(SAN) -D_GNU_SOURCE -pthread -MMD -MP -I. \
             $(shell pkg-config --cflags sentencepiece 2>/dev/null)
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null)

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(wildcard $(NVCC)),1,0)
endif
CUDA_ARCHS = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCCFLAGS  = -std=c++17 -O2 -g $(CUDA_ARCHS) -I. -DHAVE_CUDA -MMD -MP -Xcompiler -Wall,-Wextra,-fPIC

# --- sources -------------------------------------------------------------
LIB_SRC  = $(wildcard base/*.c schema/*.c net/*.c catalog/*.c kernels/*.c kernels/cpu/*.c capture_cache/*.c model/*.c media/*.c clients/c/*.c)
LIB_CC   = $(if $(MEDIA_PKG),$(wildcard media/*.cc))
CUDA_C   = $(wildcard kernels/cuda/*.c)
CUDA_CU  = $(wildcard kernels/cuda/*.cu)
ifeq ($(CUDA),1)
CFLAGS_ALL += -DHAVE_CUDA -I$(CUDA_HOME)/include
LDLIBS_ALL += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
LIB_SRC  += $(CUDA_C)
# cuDNN's fused attention (kernels/cuda/attention_cudnn.c) when cudnn.h sits
# beside the toolkit's headers; CUDNN=0 builds without it.
CUDNN ?= $(if $(wildcard $(CUDA_HOME)/include/cudnn.h),1,0)
ifeq ($(CUDNN),1)
CFLAGS_ALL += -DHAVE_CUDNN
# opened on first use (kernels/cuda/cudnn_lazy.c): a machine without cuDNN
# (or with an older one) still runs everything but the fused attention
LDLIBS_ALL += -ldl
endif
endif
LIB_OBJ  = $(LIB_SRC:%.c=$(BUILD)/%.o) $(LIB_CC:%.cc=$(BUILD)/%.cc.o)
ifeq ($(CUDA),1)
LIB_OBJ += $(CUDA_CU:%.cu=$(BUILD)/%.cu.o)
endif
LIB      = $(BUILD)/libreel.a

BROKER_SRC = $(wildcard broker/*.c)
BROKER_OBJ = $(BROKER_SRC:%.c=$(BUILD)/%.o)
BROKER     = $(BUILD)/reel-broker
WORKER_SRC = $(wildcard worker/*.c)
WORKER_OBJ = $(WORKER_SRC:%.c=$(BUILD)/%.o)
WORKER     = $(BUILD)/reel-worker
# The broker never links CUDA (nor BLAS): only the codec, catalog, keys and
# libcrypto's SHA-256 (it hashes the weights trainers upload).
BROKER_LDLIBS = $(shell pkg-config --libs libzmq msgpack sqlite3 jansson libcrypto $(HTTP_PKG) 2>/dev/null) -lm -pthread

CTL_SRC  = $(wildcard ctl/*.c)
CTL_OBJ  = $(CTL_SRC:%.c=$(BUILD)/%.o)
# reelctl's catalog reports (tables, JSON, Prometheus text): test_catalog
# and the catalog fuzzer link them too.
REPORT_SRC = ctl/report.c ctl/report_table.c ctl/report_why.c
REPORT_OBJ = $(REPORT_SRC:%.c=$(BUILD)/%.o)
REELCTL  = $(BUILD)/reelctl

TEST_SRC = $(wildcard tests/test_*.c)
TEST_BIN = $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# What the suites share (tests/support.h), linked into every one.
TEST_SUPPORT = $(BUILD)/tests/support.o
BENCH_SRC = $(wildcard bench/bench_*.c)
BENCH_BIN = $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all units deps test test-busy test-hosts test-isa demo demo-local asan asan-cli tsan fuzz fuzz-build bench soak-broker clean FORCE
all: units $(BENCH_BIN)
# What the test suites run (the sanitizer builds make only these: no bench).
units: $(LIB) $(REELCTL) $(if $(BROKER_SRC),$(BROKER)) $(if $(WORKER_SRC),$(WORKER)) $(TEST_BIN) artifacts

# Objects depend on the flags they were built with: switching CUDA=0/1 or
# sanitizers in the same build folder rebuilds instead of mixing objects.
FLAGS_STAMP = $(BUILD)/.flags
$(FLAGS_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(CC) $(CFLAGS_ALL) CUDA=$(CUDA) $(LDLIBS_ALL)' | cmp -s - $@ || \
	  echo '$(CC) $(CFLAGS_ALL) CUDA=$(CUDA) $(LDLIBS_ALL)' > $@

# deploy/install-deps.sh is idempotent and fast when nothing is missing.
deps:
	@deploy/install-deps.sh

# The CPU kernels' per-element loops vectorise with a scalar epilogue (GCC
# 12's -O2 "very cheap" model leaves such loops scalar). Nothing is
# reassociated (no -ffast-math, no contraction under -std=c17), so a lane
# computes the bits the scalar loop would.
# (GCC only: clang, which builds the fuzzers, has no such flag.)
$(BUILD)/kernels/cpu/%.o: CFLAGS_ALL += $(if $(findstring clang,$(CC)),,-fvect-cost-model=dynamic)

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/%.cc.o: %.cc $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_ALL) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BROKER): $(BROKER_OBJ) $(LIB) $(FLAGS_STAMP)
	$(CC) $(CFLAGS_ALL) -o $@ $(BROKER_OBJ) $(LIB) $(BROKER_LDLIBS)

# Every binary but the GPU check's own tools opens cuBLAS on first use
# (kernels/cuda/lazy/cublas_lazy.c): loading libcublasLt costs ~0.3 s of
# static initialisation at start, which every reelctl command, every CPU
# worker and every test binary paid before, though only the CUDA backend
# calls cuBLAS. (ifeq: the lazy object exists only in CUDA builds.)
ifeq ($(CUDA),1)
CUDA_LAZY_OBJ = $(BUILD)/kernels/cuda/lazy/cublas_lazy.o
BIN_LDLIBS    = $(filter-out -lcublasLt -lcublas,$(LDLIBS_ALL)) -ldl
else
CUDA_LAZY_OBJ =
BIN_LDLIBS    = $(LDLIBS_ALL)
endif

$(WORKER): $(WORKER_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(FLAGS_STAMP)
	$(CC) $(CFLAGS_ALL) -o $@ $(WORKER_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(BIN_LDLIBS)

$(REELCTL): $(CTL_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(FLAGS_STAMP)
	$(CC) $(CFLAGS_ALL) -o $@ $(CTL_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(BIN_LDLIBS)

# Unit tests of the daemons link the daemon's objects (all but main).
BROKER_UNIT_OBJ = $(filter-out $(BUILD)/broker/brk_main.o,$(BROKER_OBJ))
WORKER_UNIT_OBJ = $(filter-out $(BUILD)/worker/wrk_main.o,$(WORKER_OBJ))
$(BUILD)/tests/test_broker_unit: tests/test_broker_unit.c $(BROKER_UNIT_OBJ) $(TEST_SUPPORT) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(TEST_SUPPORT) $(BROKER_UNIT_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(CHECK_LIBS) $(BIN_LDLIBS)

$(BUILD)/tests/test_broker_invariants: tests/test_broker_invariants.c $(BROKER_UNIT_OBJ) $(TEST_SUPPORT) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(TEST_SUPPORT) $(BROKER_UNIT_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(CHECK_LIBS) $(BIN_LDLIBS)

$(BUILD)/tests/test_worker_invariants: tests/test_worker_invariants.c $(WORKER_UNIT_OBJ) $(TEST_SUPPORT) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(TEST_SUPPORT) $(WORKER_UNIT_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(CHECK_LIBS) $(BIN_LDLIBS)

$(BUILD)/tests/test_worker_unit: tests/test_worker_unit.c $(WORKER_UNIT_OBJ) $(TEST_SUPPORT) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(TEST_SUPPORT) $(WORKER_UNIT_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(CHECK_LIBS) $(BIN_LDLIBS)

$(BUILD)/tests/test_catalog: tests/test_catalog.c $(REPORT_OBJ) $(TEST_SUPPORT) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(TEST_SUPPORT) $(REPORT_OBJ) $(CUDA_LAZY_OBJ) $(LIB) $(CHECK_LIBS) $(BIN_LDLIBS)

# The capture cache's suites drive one synthetic step (tests/synth_step.h);
# the attack suites share one fixture too (tests/cache_fixture.h).
SYNTH_STEP_TESTS = $(BUILD)/tests/test_capture_cache $(BUILD)/tests/test_capture_adversarial $(BUILD)/tests/test_cache_attack
SYNTH_STEP = $(BUILD)/tests/synth_step.o $(BUILD)/tests/cache_fixture.o
$(SYNTH_STEP_TESTS): $(BUILD)/tests/%: tests/%.c $(SYNTH_STEP) $(TEST_SUPPORT) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(SYNTH_STEP) $(TEST_SUPPORT) $(CUDA_LAZY_OBJ) $(LIB) $(CHECK_LIBS) $(BIN_LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(TEST_SUPPORT) $(CUDA_LAZY_OBJ) $(LIB) $(CHECK_LIBS) $(BIN_LDLIBS)

# bench_routing measures the broker's own routing code.
$(BUILD)/bench/bench_routing: bench/bench_routing.c $(BUILD)/broker/brk_route.o $(CUDA_LAZY_OBJ) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/broker/brk_route.o $(CUDA_LAZY_OBJ) $(LIB) $(BIN_LDLIBS)

$(BUILD)/bench/%: bench/%.c $(CUDA_LAZY_OBJ) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(CUDA_LAZY_OBJ) $(LIB) $(BIN_LDLIBS)

# Every suite, then the unit suites again under ASan/UBSan and TSan.
test: deps
	$(MAKE) -j$(JOBS) all
	BUILD=$(BUILD) tests/run_all.sh
	$(MAKE) asan
	$(MAKE) tsan
	$(MAKE) fuzz FUZZ_SECONDS=3

# The whole of make test with two CPU hogs beside it (tests/busy.sh): every
# test waits for the event it checks, so a busy machine must not fail it.
test-busy: deps
	MAKE="$(MAKE)" sh tests/busy.sh

# The CPU path's bits at every x86 level (tests/isa_levels.sh): reelctl run
# from this build against builds for x86-64-v3 and baseline x86-64 with
# dispatch off (build-v3, build-v1; CPU only): every latent the same bytes.
test-isa: deps
	$(MAKE) -j$(JOBS) all
	$(MAKE) -j$(JOBS) BUILD=build-v3 CUDA=0 OPT="-O2 -g -march=x86-64-v3 -DREEL_NO_VEC_DISPATCH" build-v3/reelctl
	$(MAKE) -j$(JOBS) BUILD=build-v1 CUDA=0 OPT="-O2 -g -DREEL_NO_VEC_DISPATCH" build-v1/reelctl
	sh tests/isa_levels.sh $(BUILD) build-v3 build-v1

# Across hosts (issue 13): the broker and two workers in three network
# namespaces over veth pairs; and a standby pair of brokers on a bridge
# with two worker hosts (issue 30). make test runs both too (each skips
# with one line where ip netns is not permitted).
test-hosts: deps
	$(MAKE) -j$(JOBS) all
	sh tests/cli_hosts.sh $(BUILD)
	sh tests/cli_hosts_pair.sh $(BUILD)

demo: deps
	$(MAKE) -j$(JOBS) all
	BUILD=$(BUILD) deploy/demo.sh

# The single-process tour: reelctl run with and without graphs, SDE.
demo-local: deps
	$(MAKE) -j$(JOBS) all
	BUILD=$(BUILD) deploy/demo_local.sh

# Sanitizer builds have no runtime dispatch (its ifunc resolvers run before
# the sanitizer runtime), so the CPU kernels are built for one level: with
# FMA where this machine has it, else each fused multiply-add is a libm
# call per lane (the same bits, about 12x slower). These builds run here
# only.
SAN_ISA := $(shell grep -qw fma /proc/cpuinfo 2>/dev/null && echo -mfma)

# Unit suites under ASan + UBSan; CUDA off (its runtime and ASan disagree).
asan: deps
	$(MAKE) -j$(JOBS) BUILD=build-asan CUDA=0 OPT="-O1 -g -fno-omit-frame-pointer $(SAN_ISA)" \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -DREEL_INVARIANTS" units
	CK_FORK=no ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  BUILD=build-asan REEL_UNIT_ONLY=1 tests/run_all.sh

# The process-level scripts (tests/cli_*.sh) against ASan + UBSan builds of
# the daemons and reelctl: any sanitizer report fails it.
asan-cli: deps
	$(MAKE) -j$(JOBS) BUILD=build-asan CUDA=0 OPT="-O1 -g -fno-omit-frame-pointer $(SAN_ISA)" \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -DREEL_INVARIANTS" all
	BUILD=build-asan tests/run_asan_cli.sh

# Unit suites under ThreadSanitizer (the threaded capture_cache tests are
# the point); OpenBLAS is not instrumented, so it runs single-threaded.
tsan: deps
	$(MAKE) -j$(JOBS) BUILD=build-tsan CUDA=0 OPT="-O1 -g $(SAN_ISA)" SAN="-fsanitize=thread -DREEL_INVARIANTS" units
	CK_FORK=no OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  BUILD=build-tsan REEL_UNIT_ONLY=1 tests/run_all.sh

# libFuzzer harnesses (tests/fuzz/fuzz_*.c) with clang, ASan and UBSan:
# each runs FUZZ_SECONDS from its seed corpus in tests/fuzz/corpus/.
FUZZ_SECONDS ?= 60
FUZZ_SRC = $(wildcard tests/fuzz/fuzz_*.c)
fuzz-build: deps
	$(MAKE) -j$(JOBS) BUILD=build-fuzz CUDA=0 CC=clang CXX=clang++ OPT="-O1 -g" \
	  SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all" build-fuzz/libreel.a \
	  $(REPORT_SRC:%.c=build-fuzz/%.o)
	@mkdir -p build-fuzz/fuzz build-fuzz/fuzz-obj
	@for f in $(FUZZ_SRC); do \
	  echo "clang $$f"; \
	  clang $(CSTD) $(WARN) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	    -D_GNU_SOURCE -I. -c -o build-fuzz/fuzz-obj/$$(basename $$f .c).o $$f || exit 1; \
	  clang++ -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	    -o build-fuzz/fuzz/$$(basename $$f .c) build-fuzz/fuzz-obj/$$(basename $$f .c).o \
	    $(REPORT_SRC:%.c=build-fuzz/%.o) build-fuzz/libreel.a $(LDLIBS_ALL) || exit 1; \
	done

fuzz: fuzz-build
	tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

# The broker SIGKILLed at random moments under load, 20 times (issue 30;
# tests/cli_broker_kill.sh runs 3 rounds in make test). SOAK_SEED=N replays.
soak-broker: deps
	$(MAKE) -j$(JOBS) all
	SOAK_SEED=$(SOAK_SEED) sh tests/soak_broker_kill.sh $(BUILD) 20

bench: deps
	$(MAKE) -j$(JOBS) all
	BUILD=$(BUILD) bench/run_all.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz build-v3 build-v1

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# --- gpu-bundle: the device check, carried to a GPU machine that has none of
# Debian's libraries (issue 8, docs/GPU.md). `make gpu-bundle` builds here,
# with CUDA, in $(GPU_BUILD), what deploy/gpu-check.sh runs, and gathers it in
# $(GPU_BUNDLE)/ (git-ignored, under 64 MiB): Debian's libraries linked
# statically, the CUDA runtime static, libzmq and what it loads as .so files
# in lib/ (RPATH $ORIGIN/../lib), then proves with ldd, and with the Debian
# libraries hidden, that nothing else is needed but libc, libstdc++, libm and
# the CUDA libraries. `make gpu-tools` builds only the check's own tools.
GPU_BUNDLE ?= gpu-bundle
GPU_BUILD  ?= build-gpu
GPU_TOOLS   = $(patsubst deploy/%.c,$(BUILD)/deploy/%,$(wildcard deploy/gpu_*.c))
.PHONY: gpu-bundle gpu-tools
gpu-bundle:
	GPU_BUNDLE='$(GPU_BUNDLE)' GPU_BUILD='$(GPU_BUILD)' MAKE='$(MAKE)' deploy/gpu-bundle.sh

gpu-tools: $(GPU_TOOLS)

$(BUILD)/deploy/gpu_%: deploy/gpu_%.c $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIB) $(LDLIBS_ALL)

# Link lines of a bundle build (deploy/gpu-bundle.sh sets REEL_GPU_BUNDLE=1):
# $(BUILD)/static holds links to Debian's .a files, so -lmsgpackc and the
# rest resolve there first; -lzmq and -lopenblas, which have none there, stay
# .so files that the bundle carries (a static OpenBLAS is 26 MB per binary);
# only the libraries a binary uses are recorded.
ifeq ($(REEL_GPU_BUNDLE),1)
# The RPATH names the bundle's lib/ only (DT_RPATH, not RUNPATH: RUNPATH
# would not reach the libraries libzmq loads from there): the toolkit's
# folder of this machine is left out, so on the GPU machine the CUDA
# libraries are found where LD_LIBRARY_PATH and its loader cache say.
comma := ,
GPU_LDPRE     = -Wl,-rpath,\$$ORIGIN/../lib -Wl,--disable-new-dtags -Wl,--as-needed -L$(BUILD)/static
LDLIBS_ALL   := $(GPU_LDPRE) $(patsubst -lcudart,-lcudart_static -ldl -lrt,\
                 $(filter-out -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64,$(LDLIBS_ALL)))
BROKER_LDLIBS := $(GPU_LDPRE) $(BROKER_LDLIBS)
endif

# --- artifacts: kernel bundles (docs/ARTIFACTS.md). `make artifacts` builds
# each example of artifacts/ into $(BUILD)/artifacts/<name>/ (its shared
# object, then manifest.json with the sha256 of every file, by
# artifacts/bundle.sh), the CUDA ones when CUDA=1, and the test-only
# variants of artifacts/test_gemm_gelu into $(BUILD)/artifacts-test/, never
# beside the examples. `all` builds them: tests/test_artifacts.c and
# bench_artifacts load them from there. Objects get this build's flags
# (sanitizers included), so a sanitized process loads sanitized kernels.
ART_CFLAGS = $(CSTD) $(WARN) $(OPT) $(SAN) -D_GNU_SOURCE -pthread -fPIC -shared -I. \
             -I/usr/include/x86_64-linux-gnu/openblas-pthread
ART_DEPS   = artifacts/bundle.sh kernels/artifact_abi.h kernels/ops_args.h kernels/registry.h \
             kernels/cpu/cpu_vmath.h kernels/cpu/cpu_gemm_tiles.h kernels/cpu/cpu_attn.h \
             $(FLAGS_STAMP)
ART_CPU    = $(patsubst artifacts/%/kernel.c,%,$(wildcard artifacts/cpu_*/kernel.c))
ART_CUDA   = $(patsubst artifacts/%/kernel.cu,%,$(wildcard artifacts/cuda_*/kernel.cu))
ART_TEST   = $(patsubst artifacts/test_gemm_gelu/%.json,%,$(wildcard artifacts/test_gemm_gelu/*.json))
ART_OUT    = $(ART_CPU:%=$(BUILD)/artifacts/%/manifest.json) \
             $(ART_TEST:%=$(BUILD)/artifacts-test/%/manifest.json)
ifeq ($(CUDA),1)
ART_OUT   += $(ART_CUDA:%=$(BUILD)/artifacts/%/manifest.json)
endif
.PHONY: artifacts
artifacts: $(ART_OUT)

$(BUILD)/artifacts/%/manifest.json: artifacts/%/kernel.c artifacts/%/manifest.in.json $(ART_DEPS)
	@rm -rf $(dir $@) && mkdir -p $(dir $@)
	$(CC) $(ART_CFLAGS) -o $(dir $@)lib$*.so $< -lopenblas -lm
	artifacts/bundle.sh $(dir $@) artifacts/$*/manifest.in.json

$(BUILD)/artifacts/%/manifest.json: artifacts/%/kernel.cu artifacts/%/manifest.in.json $(ART_DEPS)
	@rm -rf $(dir $@) && mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -shared -o $(dir $@)lib$*.so $< -L$(CUDA_HOME)/lib64 -lcublas -lcudart
	artifacts/bundle.sh $(dir $@) artifacts/$*/manifest.in.json

$(BUILD)/artifacts-test/%/manifest.json: artifacts/test_gemm_gelu/kernel.c artifacts/test_gemm_gelu/%.json $(ART_DEPS)
	@rm -rf $(dir $@) && mkdir -p $(dir $@)
	$(CC) $(ART_CFLAGS) -DART_VARIANT_$* $(if $(filter abi2,$*),-DKERN_ART_OBJECT_ABI=1u) \
	  -o $(dir $@)libtest_$*.so $< -lopenblas -lm
	artifacts/bundle.sh $(dir $@) artifacts/test_gemm_gelu/$*.json
