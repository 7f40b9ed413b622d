# kcolld: the daemon.
# kcolld_bpf.c (flow tracking) is added by bpf/build.mk where BPF builds.
KCOLLD_SRCS := $(filter-out user/daemon/kcolld_bpf.c,$(sort $(wildcard user/daemon/*.c)))
KCOLLD_OBJS := $(KCOLLD_SRCS:%.c=$(OBJ)/%.o)
# KCOLLD_EXTRA_OBJS / _LDLIBS: added by other rooms (bpf/build.mk: flow tracking).
# Daemon units the tests link directly (everything but main).
TEST_DAEMON_OBJS := $(filter-out $(OBJ)/user/daemon/main.o,$(KCOLLD_OBJS))

$(BIN)/kcolld: $(KCOLLD_OBJS) $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $(KCOLLD_OBJS) $(KCOLLD_EXTRA_OBJS) $(LIB)/libkcoll.a $(COMMON_LIB) \
		$(LDFLAGS) -lm $(KCOLLD_EXTRA_LDLIBS)

ALL_TARGETS += $(BIN)/kcolld

# Device buffers (mem.c, exec.c, mh.c) use the GPU loader (gpu/kcoll_gpu.h).
$(OBJ)/user/daemon/mem.o $(OBJ)/user/daemon/exec.o $(OBJ)/user/daemon/mh.o: CPPFLAGS += $(GPU_CPPFLAGS)

# The KV engine's files share kv_int.h, which includes kv_rdma.h (rdma/rdma.h).
$(filter $(OBJ)/user/daemon/kv_%.o,$(KCOLLD_OBJS)): CPPFLAGS += -Irdma
