# bpf/: the eBPF flow tracker (flows.bpf.c), its loader library (kcoll_bpf.c,
# libkcoll_bpf.a) and the kcoll-bpf tool. Built where clang, bpftool,
# libbpf-dev and libnl-route-3-dev exist (scripts/deps.sh installs them; the
# steering loader asks rtnetlink for addresses, MACs and neighbours through
# libnl); otherwise skipped and KCOLL_HAVE_BPF stays undefined (kcolld then
# runs without flow tracking).
# vmlinux.h comes from the build machine's /sys/kernel/btf/vmlinux (CO-RE:
# the object relocates itself on whatever kernel loads it).
BPF_CLANG ?= clang
BPFTOOL ?= $(shell command -v bpftool 2>/dev/null || echo /usr/sbin/bpftool)
# WITH_BPF=0 leaves it out, WITH_BPF=1 insists on it (see the Makefile's head).
WITH_BPF ?= auto
BPF_FOUND := $(and $(shell command -v $(BPF_CLANG) 2>/dev/null),$(wildcard $(BPFTOOL)),\
	$(wildcard /usr/include/bpf/libbpf.h),$(wildcard /sys/kernel/btf/vmlinux),\
	$(wildcard /usr/include/libnl3/netlink/route/neighbour.h))
BPF_HAVE := $(if $(filter 0,$(WITH_BPF)),,$(BPF_FOUND))
ifeq ($(WITH_BPF)$(BPF_FOUND),1)
$(error WITH_BPF=1, but clang, bpftool, libbpf-dev, libnl-route-3-dev or /sys/kernel/btf/vmlinux is missing: run make deps)
endif
KCOLL_CONFIG += BPF=$(if $(BPF_HAVE),y,n)
ifneq ($(BPF_HAVE),)
BPF_OUT := $(OBJ)/bpf
BPF_VMLINUX := $(BPF_OUT)/vmlinux.h
BPF_OBJ := $(BPF_OUT)/flows.bpf.o
BPF_SKEL := $(BPF_OUT)/flows.skel.h
KCOLL_BPF_LIB := $(LIB)/libkcoll_bpf.a
KCOLL_NL_CFLAGS := -I/usr/include/libnl3
KCOLL_BPF_LDLIBS := -lbpf -lelf -lz -lnl-route-3 -lnl-3
KCOLL_BPF_CPPFLAGS := -DKCOLL_HAVE_BPF -Ibpf
KCOLL_BPF_TOOL := $(BIN)/kcoll-bpf

$(BPF_VMLINUX):
	$(call msg,BTF,$@)
	@mkdir -p $(dir $@)
	$(Q)$(BPFTOOL) btf dump file /sys/kernel/btf/vmlinux format c > $@.tmp && mv $@.tmp $@

$(BPF_OBJ): bpf/flows.bpf.c bpf/flows.h bpf/bpf_common.h $(BPF_VMLINUX)
	$(call msg,BPF,$<)
	$(Q)$(BPF_CLANG) -g -O2 -target bpf -D__TARGET_ARCH_x86 -Wall -Werror \
		-I$(BPF_OUT) -Ibpf -c -o $@ $<

$(BPF_SKEL): $(BPF_OBJ)
	$(call msg,SKEL,$@)
	$(Q)$(BPFTOOL) gen skeleton $< name flows_bpf > $@.tmp && mv $@.tmp $@

$(OBJ)/bpf/kcoll_bpf.o: CPPFLAGS += -I$(BPF_OUT) -Ibpf
$(OBJ)/bpf/kcoll_bpf.o: $(BPF_SKEL)

# Flow steering (steer.bpf.c, loader steer.c): in the same library.
BPF_STEER_OBJ := $(BPF_OUT)/steer.bpf.o
BPF_STEER_SKEL := $(BPF_OUT)/steer.skel.h
$(BPF_STEER_OBJ): bpf/steer.bpf.c bpf/steer.h bpf/bpf_common.h $(BPF_VMLINUX)
	$(call msg,BPF,$<)
	$(Q)$(BPF_CLANG) -g -O2 -target bpf -D__TARGET_ARCH_x86 -Wall -Werror \
		-I$(BPF_OUT) -Ibpf -c -o $@ $<

$(BPF_STEER_SKEL): $(BPF_STEER_OBJ)
	$(call msg,SKEL,$@)
	$(Q)$(BPFTOOL) gen skeleton $< name steer_bpf > $@.tmp && mv $@.tmp $@

$(OBJ)/bpf/steer.o: CPPFLAGS += -I$(BPF_OUT) -Ibpf $(KCOLL_NL_CFLAGS)
$(OBJ)/bpf/steer.o: $(BPF_STEER_SKEL)

$(KCOLL_BPF_LIB): $(OBJ)/bpf/kcoll_bpf.o $(OBJ)/bpf/steer.o
	$(call msg,AR,$@)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(OBJ)/bpf/kcoll-bpf.o: CPPFLAGS += -Ibpf
$(KCOLL_BPF_TOOL): $(OBJ)/bpf/kcoll-bpf.o $(KCOLL_BPF_LIB) $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(KCOLL_BPF_LDLIBS) -lm

ALL_TARGETS += $(KCOLL_BPF_LIB) $(KCOLL_BPF_TOOL)
endif

# A packet-dropping classifier tests/t_bpf.sh puts on a path to cause retransmissions.
ifneq ($(BPF_HAVE),)
BPF_TEST_LOSSY := $(TBIN)/bpf_lossy.bpf.o
$(BPF_TEST_LOSSY): tests/bpf_lossy.bpf.c
	$(call msg,BPF,$<)
	@mkdir -p $(dir $@)
	$(Q)$(BPF_CLANG) -g -O2 -target bpf -Wall -Werror -c -o $@ $<
CHECK_TARGETS += $(BPF_TEST_LOSSY)
endif

# kcolld's flow tracking (KCOLL_BPF=1): the daemon adapter
# user/daemon/kcolld_bpf.c, linked into kcolld only (tests link the daemon's
# other units without libbpf).
ifneq ($(BPF_HAVE),)
KCOLLD_BPF_OBJ := $(OBJ)/user/daemon/kcolld_bpf.o
KCOLLD_EXTRA_OBJS += $(KCOLLD_BPF_OBJ) $(KCOLL_BPF_LIB)
KCOLLD_EXTRA_LDLIBS += $(KCOLL_BPF_LDLIBS)
$(KCOLLD_BPF_OBJ): CPPFLAGS += -Ibpf
$(OBJ)/user/daemon/main.o: CPPFLAGS += $(KCOLL_BPF_CPPFLAGS)
$(BIN)/kcolld: $(KCOLLD_BPF_OBJ) $(KCOLL_BPF_LIB)
endif

# The loader library's unit test (TAP; tests/run.sh runs build/tests/test_*).
ifneq ($(BPF_HAVE),)
$(OBJ)/tests/bpf/test_bpf_api.o: CPPFLAGS += -Ibpf
$(TBIN)/test_bpf_api: $(OBJ)/tests/bpf/test_bpf_api.o $(KCOLL_BPF_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(KCOLL_BPF_LDLIBS)
CHECK_TARGETS += $(TBIN)/test_bpf_api
endif
