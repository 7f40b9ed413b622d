# libkcoll_mpi.so, the LD_PRELOAD (PMPI) shim for MPI programs, and the MPI
# test program tests/t_shim.sh runs with and without it.
#
# The shim (kcoll_mpi.c) is built once per MPI ABI, with that MPI's mpicc:
# libkcoll_mpi_ompi.so (Open MPI), libkcoll_mpi_mpich.so (MPICH), each where
# its mpicc exists. libkcoll_mpi.so (kcoll_mpi_select.c, x86-64) loads the one
# that matches the MPI of the process at its first MPI call; elsewhere
# libkcoll_mpi.so is a copy of the Open MPI shim. libkcoll is linked in
# statically and hidden: every library exports only the MPI_* functions it
# interposes (kcoll_mpi.map).
SHIM_OMPI_CC := $(or $(shell command -v mpicc.openmpi 2>/dev/null),$(shell command -v mpicc 2>/dev/null))
SHIM_MPICH_CC := $(shell command -v mpicc.mpich 2>/dev/null)
SHIM_MPIS := $(if $(SHIM_OMPI_CC),ompi) $(if $(SHIM_MPICH_CC),mpich)
KCOLL_CONFIG += SHIM_OMPI=$(if $(SHIM_OMPI_CC),y,n) SHIM_MPICH=$(if $(SHIM_MPICH_CC),y,n)
SHIM_CC_ompi := $(SHIM_OMPI_CC)
SHIM_CC_mpich := $(SHIM_MPICH_CC)
# Both wrappers wrap $(CC): Open MPI's reads OMPI_CC, MPICH's MPICH_CC.
SHIM_MPICC = OMPI_CC=$(CC) MPICH_CC=$(CC) $(SHIM_CC_$(1))

# $(1): ompi or mpich
define SHIM_VARIANT
$(OBJ)/user/shim/kcoll_mpi_$(1).o: user/shim/kcoll_mpi.c
	$$(call msg,MPICC,$$@)
	@mkdir -p $$(dir $$@)
	$$(Q)$$(call SHIM_MPICC,$(1)) $$(CPPFLAGS) $$(CFLAGS) -fvisibility=hidden -fno-plt -MMD -MP -c -o $$@ $$<

$(LIB)/libkcoll_mpi_$(1).so: $(OBJ)/user/shim/kcoll_mpi_$(1).o $(LIB)/libkcoll.a user/shim/kcoll_mpi.map
	$$(call msg,LD,$$@)
	@mkdir -p $$(dir $$@)
	$$(Q)$$(call SHIM_MPICC,$(1)) -shared -Wl,-soname,libkcoll_mpi_$(1).so \
		-Wl,--version-script=user/shim/kcoll_mpi.map -Wl,--no-undefined \
		-o $$@ $$< $(LIB)/libkcoll.a $$(LDFLAGS)

# The test program is a plain MPI program: nothing of kcoll's.
$(OBJ)/tests/shim/shim_check_$(1).o: tests/shim/shim_check.c
	$$(call msg,MPICC,$$@)
	@mkdir -p $$(dir $$@)
	$$(Q)$$(call SHIM_MPICC,$(1)) $$(CFLAGS) -MMD -MP -c -o $$@ $$<

$(TBIN)/shim_check_$(1): $(OBJ)/tests/shim/shim_check_$(1).o
	$$(call msg,LD,$$@)
	@mkdir -p $$(dir $$@)
	$$(Q)$$(call SHIM_MPICC,$(1)) $$(CFLAGS) -o $$@ $$< $$(LDFLAGS) -lm

ALL_TARGETS += $(LIB)/libkcoll_mpi_$(1).so
CHECK_TARGETS += $(TBIN)/shim_check_$(1)
endef
$(foreach m,$(SHIM_MPIS),$(eval $(call SHIM_VARIANT,$(m))))

ifneq ($(SHIM_OMPI_CC),)
SHIM_SO := $(LIB)/libkcoll_mpi.so
ifneq ($(filter x86_64-%,$(shell $(CC) -dumpmachine)),)
$(OBJ)/user/shim/kcoll_mpi_select.o: user/shim/kcoll_mpi_select.c
	$(call msg,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -fvisibility=hidden -MMD -MP -c -o $@ $<

$(SHIM_SO): $(OBJ)/user/shim/kcoll_mpi_select.o user/shim/kcoll_mpi.map \
		$(foreach m,$(SHIM_MPIS),$(LIB)/libkcoll_mpi_$(m).so)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) -shared -Wl,-soname,libkcoll_mpi.so -Wl,--version-script=user/shim/kcoll_mpi.map \
		-Wl,--no-undefined -o $@ $< $(LDFLAGS) -ldl
else
$(SHIM_SO): $(LIB)/libkcoll_mpi_ompi.so
	$(call msg,CP,$@)
	$(Q)cp $< $@
endif
ALL_TARGETS += $(SHIM_SO)
endif

# The MPI anchor benchmark built against MPICH (user/shim/bench-small.sh
# MPI=mpich): the same source as Open MPI's mpi-coll-bench.
ifneq ($(SHIM_MPICH_CC),)
$(BIN)/mpi-coll-bench-mpich: user/tools/mpi-allreduce-bench.c user/tools/bench_common.h $(OBJ)/user/tools/bench_common.o
	$(call msg,MPICC,$@)
	@mkdir -p $(dir $@)
	$(Q)$(call SHIM_MPICC,mpich) $(filter-out -Iinclude -Iinclude/uapi -Iuser/common,$(CPPFLAGS)) \
		$(CFLAGS) -o $@ $< $(OBJ)/user/tools/bench_common.o $(LDFLAGS)

ALL_TARGETS += $(BIN)/mpi-coll-bench-mpich
endif
