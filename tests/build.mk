# Every tests/test_*.c is one test program printing TAP; tests/run.sh runs them.
# They link the static libkcoll and the internal helpers; daemon-side units
# they exercise are listed in TEST_DAEMON_OBJS (from user/daemon/build.mk).
TEST_SRCS := $(sort $(wildcard tests/test_*.c))
TEST_BINS := $(TEST_SRCS:tests/%.c=$(TBIN)/%)

$(TBIN)/%: $(OBJ)/tests/%.o $(LIB)/libkcoll.a $(COMMON_LIB) $(TEST_DAEMON_OBJS)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(TEST_DAEMON_OBJS) $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS) -lm

CHECK_TARGETS += $(TEST_BINS)

# The daemon's schedules over the step engine and the loopback transport; it
# records each call of the engine on its way in (kd_step_run, wrapped).
$(OBJ)/tests/test_sched.o: CPPFLAGS += -Iuser/daemon
$(TBIN)/test_sched: LDFLAGS += -Wl,--wrap=kd_step_run
# The step engine over the in-process loopback transport.
$(OBJ)/tests/test_step.o: CPPFLAGS += -Iuser/daemon

# exec.c's jobs on the worker pool.
$(OBJ)/tests/test_exec_job.o: CPPFLAGS += -Iuser/daemon
# kv_send.c's cutting of a batch into posts.
$(OBJ)/tests/test_kv_batch.o: CPPFLAGS += -Iuser/daemon -Irdma

# One rank of the multi-host tests (tests/t_multihost.sh starts one per rank in
# each host's namespace): not a test_* program, run.sh does not run it alone.
$(TBIN)/mh_rank: $(OBJ)/tests/mh_rank.o $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS) -lm

ALL_TARGETS += $(TBIN)/mh_rank
CHECK_TARGETS += $(TBIN)/mh_rank

# One rank of the C4 cluster tests (tests/t_c4.sh).
$(TBIN)/c4_rank: $(OBJ)/tests/c4_rank.o $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS) -lm

ALL_TARGETS += $(TBIN)/c4_rank
CHECK_TARGETS += $(TBIN)/c4_rank

# One side of the cross-host KV tests (tests/t_kv_cluster.sh).
$(TBIN)/kv_peer: $(OBJ)/tests/kv_peer.o $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS)

ALL_TARGETS += $(TBIN)/kv_peer
CHECK_TARGETS += $(TBIN)/kv_peer

# A peer that is not kcolld sending notification frames (tests/t_kv_cluster.sh).
$(OBJ)/tests/kv_badmsg.o: CPPFLAGS += -Iuser/daemon
$(TBIN)/kv_badmsg: $(OBJ)/tests/kv_badmsg.o $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS)

ALL_TARGETS += $(TBIN)/kv_badmsg
CHECK_TARGETS += $(TBIN)/kv_badmsg

# A hostile peer of the KV RDMA path (tests/vm/t_kv_rdma.sh runs it on
# Soft-RoCE): raw TCP and libibverbs, the owner side through libkcoll. It is
# a verbs tool by nature (its own QPs, no kcoll verbs layer, only the wire
# structs of kv_rdma.h), so it links libibverbs (KCOLL_IBV_LINKED: rdma/ibv_dl.h
# leaves the verbs names alone) and runs only where rdma-core is installed.
$(OBJ)/tests/kv_hostile.o: CPPFLAGS += -Iuser/daemon -Irdma -DKCOLL_IBV_LINKED
$(TBIN)/kv_hostile: $(OBJ)/tests/kv_hostile.o $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS) -libverbs

ALL_TARGETS += $(TBIN)/kv_hostile
CHECK_TARGETS += $(TBIN)/kv_hostile

# Sets the GSO/GRO maxima of the netns cluster's links through rtnetlink
# (scripts/netns-cluster.sh up --gso); libnl-3-dev (make deps) has its headers.
ifneq ($(wildcard /usr/include/libnl3/netlink/netlink.h),)
$(OBJ)/tests/link_gso.o: CPPFLAGS += -I/usr/include/libnl3
$(TBIN)/link_gso: $(OBJ)/tests/link_gso.o
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) -lnl-3

ALL_TARGETS += $(TBIN)/link_gso
CHECK_TARGETS += $(TBIN)/link_gso
endif
