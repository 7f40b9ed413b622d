# Benchmarks: kcoll-bench (against kcolld) and, where mpicc exists, the Open MPI
# anchor mpi-coll-bench printing the same table and JSON.
# bench_common: the options, check values, table and JSON every benchmark shares.
BENCH_COMMON_OBJ := $(OBJ)/user/tools/bench_common.o
# launch: the process launcher of kcoll-bench and kcoll-kvbench.
LAUNCH_OBJ := $(OBJ)/user/tools/launch.o
BENCH_KCOLL := $(BIN)/kcoll-bench
# kcoll-bench.c: main and options; bench_jobs.c: the modes; bench_rank.c: one
# rank; bench_report.c: the table and JSON.
BENCH_KCOLL_OBJ := $(addprefix $(OBJ)/user/tools/,kcoll-bench.o bench_jobs.o bench_rank.o \
	bench_report.o) $(BENCH_COMMON_OBJ) $(LAUNCH_OBJ)

$(BENCH_KCOLL): $(BENCH_KCOLL_OBJ) $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $(BENCH_KCOLL_OBJ) $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS) -lm

ALL_TARGETS += $(BENCH_KCOLL)

# mpicc wraps $(CC) with Open MPI's flags; the anchor needs nothing of kcoll's.
BENCH_MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(BENCH_MPICC),)
BENCH_MPI := $(BIN)/mpi-coll-bench

$(BENCH_MPI): user/tools/mpi-allreduce-bench.c user/tools/bench_common.h $(BENCH_COMMON_OBJ)
	$(call msg,MPICC,$@)
	@mkdir -p $(dir $@)
	$(Q)OMPI_CC=$(CC) $(BENCH_MPICC) $(filter-out -Iinclude -Iinclude/uapi -Iuser/common,$(CPPFLAGS)) \
		$(CFLAGS) -o $@ $< $(BENCH_COMMON_OBJ) $(LDFLAGS)

ALL_TARGETS += $(BENCH_MPI)
endif

# kcollctl: the control tool.
KCOLLCTL_OBJ := $(OBJ)/user/tools/kcollctl.o $(OBJ)/user/tools/kcollctl_top.o

$(KCOLLCTL_OBJ): CPPFLAGS += $(GPU_CPPFLAGS)
$(BIN)/kcollctl: $(KCOLLCTL_OBJ) $(GPU_OBJS) $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $(KCOLLCTL_OBJ) $(GPU_OBJS) $(LIB)/libkcoll.a $(COMMON_LIB) \
		$(LDFLAGS) $(GPU_LDLIBS) -lm

ALL_TARGETS += $(BIN)/kcollctl

# ---- kcoll-tcpcap: raw TCP capacity of a (netns) cluster, ring-neighbour streams.
# Standalone: needs nothing of kcoll's libraries.
TCPCAP_BIN := $(BIN)/kcoll-tcpcap
TCPCAP_OBJ := $(OBJ)/user/tools/kcoll-tcpcap.o

$(TCPCAP_BIN): $(TCPCAP_OBJ) $(BENCH_COMMON_OBJ)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $(TCPCAP_OBJ) $(BENCH_COMMON_OBJ) $(LDFLAGS)

ALL_TARGETS += $(TCPCAP_BIN)

# ---- gloo-allreduce-bench: the Gloo anchor (gloo::allreduce, ring, over Gloo's
# TCP device). C++, built with g++ only where Debian's libgloo-dev is installed
# (headers in /usr/include/gloo, shared libgloo.so in /usr/lib); otherwise
# skipped. bench_common is compiled again by gcc so that the C and C++ halves
# share one toolchain and one sanitizer runtime whatever CC is (clang, SAN=1).
GLOO_CXX ?= g++
GLOO_CC ?= gcc
GLOO_HEADER := $(wildcard /usr/include/gloo/allreduce.h)
GLOO_HAVE_CXX := $(shell command -v $(GLOO_CXX) 2>/dev/null)
WITH_GLOO ?= auto
GLOO_FOUND := $(and $(GLOO_HEADER),$(GLOO_HAVE_CXX))
GLOO_HAVE := $(if $(filter 0,$(WITH_GLOO)),,$(GLOO_FOUND))
ifeq ($(WITH_GLOO)$(GLOO_FOUND),1)
$(error WITH_GLOO=1, but libgloo-dev or $(GLOO_CXX) is missing: run scripts/deps.sh --bench)
endif
KCOLL_CONFIG += GLOO=$(if $(GLOO_HAVE),y,n) MPICC=$(if $(BENCH_MPICC),y,n)
ifneq ($(GLOO_HAVE),)
GLOO_BENCH := $(BIN)/gloo-allreduce-bench
GLOO_OBJ := $(OBJ)/user/tools/gloo/gloo-allreduce-bench.o
GLOO_COMMON_OBJ := $(OBJ)/user/tools/gloo/bench_common.o
GLOO_SANFLAGS := $(filter -fsanitize=% -fno-omit-frame-pointer -fno-sanitize-recover=%,$(CFLAGS))
GLOO_CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -pthread \
	$(GLOO_SANFLAGS)
GLOO_LDLIBS := -lgloo

$(GLOO_COMMON_OBJ): user/tools/bench_common.c
	$(call msg,CC,$< (for gloo))
	@mkdir -p $(dir $@)
	$(Q)$(GLOO_CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

$(GLOO_OBJ): user/tools/gloo-allreduce-bench.cc
	$(call msg,CXX,$<)
	@mkdir -p $(dir $@)
	$(Q)$(GLOO_CXX) -D_GNU_SOURCE $(GLOO_CXXFLAGS) -MMD -MP -c -o $@ $<

$(GLOO_BENCH): $(GLOO_OBJ) $(GLOO_COMMON_OBJ)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(GLOO_CXX) $(GLOO_CXXFLAGS) -o $@ $(GLOO_OBJ) $(GLOO_COMMON_OBJ) $(LDFLAGS) $(GLOO_LDLIBS)

ALL_TARGETS += $(GLOO_BENCH)
endif

# kcoll-kvbench: KV-cache transfers (docs/kv.md).
# kcoll-kvbench.c: main, options, target, initiator; kvbench_tcp.c: the raw
# TCP anchor; kvbench_batch.c: the options' defaults and the batches.
KVBENCH_OBJ := $(addprefix $(OBJ)/user/tools/,kcoll-kvbench.o kvbench_tcp.o kvbench_batch.o) \
	$(BENCH_COMMON_OBJ) $(LAUNCH_OBJ)
$(BIN)/kcoll-kvbench: $(KVBENCH_OBJ) $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $(KVBENCH_OBJ) $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS) -lm

ALL_TARGETS += $(BIN)/kcoll-kvbench

# kcoll-gpu-bench: the GPU benchmarks of scripts/gpu-check.sh, through kcoll's
# loader (no CUDA at build time; exit 77 at run time without a usable GPU).
GPU_BENCH := $(BIN)/kcoll-gpu-bench
$(OBJ)/user/tools/kcoll-gpu-bench.o: CPPFLAGS += $(GPU_CPPFLAGS)
$(GPU_BENCH): $(OBJ)/user/tools/kcoll-gpu-bench.o $(GPU_OBJS) $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $(OBJ)/user/tools/kcoll-gpu-bench.o $(GPU_OBJS) $(LIB)/libkcoll.a \
		$(COMMON_LIB) $(LDFLAGS) $(GPU_LDLIBS) -lm

ALL_TARGETS += $(GPU_BENCH)
