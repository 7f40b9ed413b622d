# rdma/: the verbs layer, a library (linked into kcolld and into the tests
# that link the daemon's units). The daemon's RDMA transport on top of it is
# user/daemon/xport_rdma.c. Nothing here links libibverbs: ibv_dl.c dlopens
# it when kcoll_rdma_init() first runs (dlopen is in glibc's libc since 2.34;
# GPU_LDLIBS' -ldl below keeps older glibc linking).
RDMA_SRCS := $(sort $(wildcard rdma/*.c))
RDMA_OBJS := $(RDMA_SRCS:%.c=$(OBJ)/%.o)

$(RDMA_OBJS): CPPFLAGS += -Irdma
$(addprefix $(OBJ)/user/daemon/xport_rdma,.o _conn.o _path.o): CPPFLAGS += -Irdma
# main.c subscribes the registration cache to the daemon's unmap notices
# (kd_unmap_subscribe): mem.c and mh.c tell, and need not know who listens.
$(OBJ)/user/daemon/main.o: CPPFLAGS += -Irdma
KCOLLD_OBJS += $(RDMA_OBJS)
TEST_DAEMON_OBJS += $(RDMA_OBJS)
$(BIN)/kcolld: $(RDMA_OBJS)

# The verbs layer's public calls on a real device (tests/vm/t_rdma.sh runs it;
# not a test_* program: the host tier has no RDMA device). Through the loader
# like kcolld, so it proves the table on Soft-RoCE.
$(OBJ)/tests/rdma_onesided.o: CPPFLAGS += -Irdma
$(TBIN)/rdma_onesided: $(OBJ)/tests/rdma_onesided.o $(OBJ)/rdma/verbs.o $(OBJ)/rdma/ibv_dl.o $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(GPU_LDLIBS)

ALL_TARGETS += $(TBIN)/rdma_onesided
CHECK_TARGETS += $(TBIN)/rdma_onesided

# GPUDirect registration (rdma/gpudirect.c) asks the GPU loader: kcolld and
# the tests that link the daemon's units link it too; client.c names the
# loader's reason when it refuses a device-memory SQE.
$(RDMA_OBJS): CPPFLAGS += $(GPU_CPPFLAGS)
KCOLLD_OBJS += $(GPU_OBJS)
TEST_DAEMON_OBJS += $(GPU_OBJS)
$(BIN)/kcolld: $(GPU_OBJS)
$(OBJ)/user/daemon/client.o: CPPFLAGS += $(GPU_CPPFLAGS)
$(BIN)/kcolld: LDFLAGS += $(GPU_LDLIBS)
$(TBIN)/test_%: LDFLAGS += $(GPU_LDLIBS)
$(OBJ)/tests/test_gpudirect.o: CPPFLAGS += $(GPU_CPPFLAGS) -Irdma
$(TBIN)/test_gpudirect: | $(GPU_FAKE_CUDA)

# Host-tier checks of the path knobs and device-less calls (no RDMA needed).
$(OBJ)/tests/test_rdma_path.o: CPPFLAGS += -Irdma -Iuser/daemon

# The libibverbs loader against this machine's library and broken ones.
$(OBJ)/tests/test_ibv_dl.o: CPPFLAGS += -Irdma
