# Benchmarks: kcoll-bench (against kcolld) and, where mpicc exists, the Open MPI
# anchor mpi-coll-bench printing the same table and JSON.
# bench_common: the options, check values, table and JSON every benchmark shares.
BENCH_COMMON_OBJ := $(OBJ)/user/tools/bench_common.o
BENCH_KCOLL := $(BIN)/kcoll-bench
BENCH_KCOLL_OBJ := $(OBJ)/user/tools/kcoll-bench.o $(BENCH_COMMON_OBJ)

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
KCOLLCTL_OBJ := $(OBJ)/user/tools/kcollctl.o

$(KCOLLCTL_OBJ): CPPFLAGS += $(GPU_CPPFLAGS)
$(BIN)/kcollctl: $(KCOLLCTL_OBJ) $(GPU_OBJS) $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $(KCOLLCTL_OBJ) $(GPU_OBJS) $(LIB)/libkcoll.a $(COMMON_LIB) \
		$(LDFLAGS) $(GPU_LDLIBS) -lm

ALL_TARGETS += $(BIN)/kcollctl
