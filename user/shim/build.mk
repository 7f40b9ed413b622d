# libkcoll_mpi.so: the LD_PRELOAD (PMPI) shim for MPI programs, and the MPI
# test program tests/t_shim.sh runs with and without it. Built where mpicc
# (Debian's Open MPI) exists; libkcoll is linked in statically and hidden: the
# shim exports only the MPI_* functions it interposes (kcoll_mpi.map).
SHIM_MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(SHIM_MPICC),)
SHIM_SO := $(LIB)/libkcoll_mpi.so
SHIM_OBJ := $(OBJ)/user/shim/kcoll_mpi.o
SHIM_TEST := $(TBIN)/shim_check
SHIM_TEST_OBJ := $(OBJ)/tests/shim/shim_check.o

$(SHIM_OBJ): user/shim/kcoll_mpi.c
	$(call msg,MPICC,$<)
	@mkdir -p $(dir $@)
	$(Q)OMPI_CC=$(CC) $(SHIM_MPICC) $(CPPFLAGS) $(CFLAGS) -fvisibility=hidden -MMD -MP -c -o $@ $<

$(SHIM_SO): $(SHIM_OBJ) $(LIB)/libkcoll.a user/shim/kcoll_mpi.map
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)OMPI_CC=$(CC) $(SHIM_MPICC) -shared -Wl,-soname,libkcoll_mpi.so \
		-Wl,--version-script=user/shim/kcoll_mpi.map -Wl,--no-undefined \
		-o $@ $(SHIM_OBJ) $(LIB)/libkcoll.a $(LDFLAGS)

# The test program is a plain MPI program: nothing of kcoll's.
$(SHIM_TEST_OBJ): tests/shim/shim_check.c
	$(call msg,MPICC,$<)
	@mkdir -p $(dir $@)
	$(Q)OMPI_CC=$(CC) $(SHIM_MPICC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(SHIM_TEST): $(SHIM_TEST_OBJ)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)OMPI_CC=$(CC) $(SHIM_MPICC) $(CFLAGS) -o $@ $< $(LDFLAGS)

ALL_TARGETS += $(SHIM_SO)
CHECK_TARGETS += $(SHIM_TEST)
endif
