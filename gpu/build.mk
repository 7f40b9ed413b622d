# The GPU room (docs/gpu.md).
#   GPU_OBJS     loader + doctor, built with $(CC) everywhere; link them with
#                $(GPU_LDLIBS) and compile their users with $(GPU_CPPFLAGS)
#   libkcoll_gpu.so  the kernels, built by nvcc only where nvcc exists
#                (make NVCC=/path/to/nvcc GPU_ARCHS="sm_80 sm_90 compute_90")
#   kcoll-gpu-doctor, and test_gpu with its fake CUDA driver fixture
NVCC ?= /usr/local/cuda/bin/nvcc
CUDA_HOME ?= /usr/local/cuda
# sm_XY: machine code for X.Y (runs on X.Y..X.9); compute_XY: PTX the driver
# compiles for any later device.
GPU_ARCHS ?= sm_80 sm_90 compute_90

GPU_CPPFLAGS := -Igpu
GPU_LDLIBS := -ldl
GPU_SRCS := gpu/gpu.c gpu/doctor.c
GPU_OBJS := $(GPU_SRCS:%.c=$(OBJ)/%.o)
GPU_DOCTOR := $(BIN)/kcoll-gpu-doctor
GPU_FAKE_CUDA := $(TBIN)/fixtures/libcuda-fake.so

$(GPU_DOCTOR): $(OBJ)/gpu/doctor_main.o $(GPU_OBJS) $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(GPU_LDLIBS)

ALL_TARGETS += $(GPU_OBJS) $(GPU_DOCTOR)

# A stand-in libcuda.so.1 for the tests (gpu/fake_cuda.h); never installed.
$(GPU_FAKE_CUDA): $(OBJ)/gpu/fake_cuda.o
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -shared -o $@ $^ $(LDFLAGS)

# test_gpu needs the loader, not libkcoll: this rule replaces tests/build.mk's
# pattern rule for it.
$(OBJ)/tests/test_gpu.o: CPPFLAGS += $(GPU_CPPFLAGS)
$(TBIN)/test_gpu: $(OBJ)/tests/test_gpu.o $(GPU_OBJS) $(COMMON_LIB) | $(GPU_FAKE_CUDA)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $(OBJ)/tests/test_gpu.o $(GPU_OBJS) $(COMMON_LIB) $(LDFLAGS) \
		$(GPU_LDLIBS) -lm

CHECK_TARGETS += $(GPU_FAKE_CUDA)

# Proof that gpu/cuda_abi.h matches the CUDA headers, where they exist.
ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
$(OBJ)/gpu/cuda_abi_check.o: CPPFLAGS += -I$(CUDA_HOME)/include
ALL_TARGETS += $(OBJ)/gpu/cuda_abi_check.o
endif

# WITH_CUDA=0 builds no kernels, WITH_CUDA=1 insists on nvcc.
WITH_CUDA ?= auto
NVCC_FOUND := $(shell command -v $(NVCC) 2>/dev/null)
NVCC_HAVE := $(if $(filter 0,$(WITH_CUDA)),,$(NVCC_FOUND))
ifeq ($(WITH_CUDA)$(NVCC_FOUND),1)
$(error WITH_CUDA=1, but $(NVCC) is missing: install the CUDA toolkit or set NVCC=)
endif
KCOLL_CONFIG += CUDA_NVCC=$(if $(NVCC_HAVE),y,n) CUDA_HEADERS=$(if $(wildcard $(CUDA_HOME)/include/cuda.h),y,n)
ifneq ($(NVCC_HAVE),)
GPU_LIB := $(LIB)/libkcoll_gpu.so
# Host flags stay nvcc's own: no sanitizers (SAN=1) and the host compiler nvcc
# supports whatever $(CC) is. -fmad=false: no FMA contraction, like the CPU.
GPU_NVCCFLAGS := -std=c++17 -O3 -fmad=false -lineinfo -Werror all-warnings \
	-Xcompiler -fPIC,-fvisibility=hidden,-Wall \
	-Iinclude/uapi -Igpu -DKCOLL_GPU_ARCHS='"$(GPU_ARCHS)"' \
	$(foreach a,$(GPU_ARCHS),-gencode arch=compute_$(subst sm_,,$(subst compute_,,$(a))),code=$(a)) \
	$(NVCCFLAGS)

# Rebuild when the command line changes (another GPU_ARCHS, another nvcc).
$(OBJ)/gpu/nvcc.flags: FORCE_GPU_CMD
	@mkdir -p $(dir $@)
	@echo '$(NVCC) $(GPU_NVCCFLAGS)' | cmp -s - $@ || echo '$(NVCC) $(GPU_NVCCFLAGS)' > $@

$(GPU_LIB): gpu/reduce.cu gpu/reduce_core.h gpu/kernels.h gpu/cuda_abi.h gpu/libkcoll_gpu.map \
	    include/uapi/linux/kcoll.h $(OBJ)/gpu/nvcc.flags
	$(call msg,NVCC,$@)
	@mkdir -p $(dir $@)
	$(Q)$(NVCC) $(GPU_NVCCFLAGS) -shared -Xlinker --version-script=gpu/libkcoll_gpu.map \
		-o $@ gpu/reduce.cu

ALL_TARGETS += $(GPU_LIB)
endif

.PHONY: FORCE_GPU_CMD

# Device buffers through kcolld, on the fake driver (and a real one if present).
$(OBJ)/tests/test_gpu_ring.o: CPPFLAGS += $(GPU_CPPFLAGS)
$(TBIN)/test_gpu_ring: | $(GPU_FAKE_CUDA) $(BIN)/kcolld
# Multi-host ops on device buffers: the local phases on the GPU.
$(OBJ)/tests/test_gpu_mh.o: CPPFLAGS += $(GPU_CPPFLAGS)
$(TBIN)/test_gpu_mh: | $(GPU_FAKE_CUDA) $(BIN)/kcolld
# KV segments in device memory, one host and across two kcollds.
$(OBJ)/tests/test_gpu_kv.o: CPPFLAGS += $(GPU_CPPFLAGS)
$(TBIN)/test_gpu_kv: | $(GPU_FAKE_CUDA) $(BIN)/kcolld

# ---- The slim build the device check carries (docs/gpu.md "Running the device
# check"): what scripts/gpu-check.sh runs, in build's layout (binaries find
# ../lib and ../bin as in build/), plus the shared libraries they need beyond
# glibc in syslib/ (the GPU machine cannot install any; the script uses them
# only where ldd finds one missing there).
GPU_CARRY ?= build-gpu
GPU_CARRY_BINS := $(BIN)/kcolld $(BIN)/kcollctl $(GPU_DOCTOR) $(BIN)/kcoll-gpu-bench \
	$(TBIN)/test_gpu $(TBIN)/test_gpu_ring $(TBIN)/test_gpu_mh $(TBIN)/test_gpu_kv \
	$(TBIN)/test_gpudirect
GPU_CARRY_SKIP_SO := linux-vdso libc.so libm.so libpthread.so libdl.so librt.so ld-linux
# Loaded at run time (rdma/ibv_dl.c), so ldd of the binaries does not name
# it: carried with its own dependencies for test_gpudirect.
GPU_CARRY_DLOPEN := $(shell /sbin/ldconfig -p 2>/dev/null | awk '$$1 == "libibverbs.so.1" { print $$NF; exit }')
.PHONY: gpu-carry
gpu-carry: $(GPU_CARRY_BINS) $(GPU_FAKE_CUDA) $(GPU_LIB) $(LIB)/libkcoll.so.1
	$(if $(GPU_LIB),,$(error gpu-carry: no nvcc ($(NVCC)), so no libkcoll_gpu.so to carry))
	$(call msg,CARRY,$(GPU_CARRY))
	$(Q)rm -rf $(GPU_CARRY) && mkdir -p $(GPU_CARRY)/bin $(GPU_CARRY)/lib \
		$(GPU_CARRY)/tests/fixtures $(GPU_CARRY)/syslib
	$(Q)cp -p $(filter $(BIN)/%,$(GPU_CARRY_BINS)) $(GPU_CARRY)/bin/
	$(Q)cp -p $(filter $(TBIN)/%,$(GPU_CARRY_BINS)) $(GPU_CARRY)/tests/
	$(Q)cp -p $(GPU_FAKE_CUDA) $(GPU_CARRY)/tests/fixtures/
	$(Q)cp -p $(GPU_LIB) $(GPU_CARRY)/lib/
	$(Q)cp -p $(LIB)/libkcoll.so.1 $(GPU_CARRY)/lib/
	$(Q){ ldd $(GPU_CARRY_BINS) $(GPU_LIB) $(GPU_CARRY_DLOPEN); echo "x => $(GPU_CARRY_DLOPEN) (0)"; } | \
		awk '$$2 == "=>" && $$3 ~ /^\// { print $$3 }' | \
		grep -v $(foreach s,$(GPU_CARRY_SKIP_SO),-e /$(s)) | sort -u | \
		xargs -r cp -L -t $(GPU_CARRY)/syslib/
	$(Q)cp -p $(BUILD)/config.mk $(GPU_CARRY)/
	$(Q)du -sh $(GPU_CARRY)
