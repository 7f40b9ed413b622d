# rdma/: the verbs layer and the daemon's RDMA transport (linked into kcolld
# and into the tests that link the daemon's units).
RDMA_SRCS := $(sort $(wildcard rdma/*.c))
RDMA_OBJS := $(RDMA_SRCS:%.c=$(OBJ)/%.o)

$(RDMA_OBJS): CPPFLAGS += -Iuser/daemon -Irdma
$(OBJ)/user/daemon/net.o: CPPFLAGS += -Irdma -Iuser/daemon
KCOLLD_OBJS += $(RDMA_OBJS)
TEST_DAEMON_OBJS += $(RDMA_OBJS)
$(BIN)/kcolld: $(RDMA_OBJS)
$(BIN)/kcolld: LDFLAGS += -libverbs
$(TBIN)/test_%: LDFLAGS += -libverbs
