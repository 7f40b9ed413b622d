# kcoll top-level Makefile. Each room adds itself through a build.mk fragment.
#   make            build everything this machine can build into $(BUILD)/
#   make V=1        show commands
#   make CC=clang   build with clang
#   make SAN=1      ASan+UBSan build (into build-asan/ unless BUILD is given)
#   make WITH_BPF=0 leave a probed part out (WITH_BPF, WITH_CUDA, WITH_GLOO:
#                   auto (default) = build it where its tools exist, 0 = never,
#                   1 = required: stop with an error naming what is missing)
#   make config     what the probes found and the flags, as $(BUILD)/config.mk
#   make deps       install missing Debian packages (idempotent; needs root)
#   make check      deps + build + host-tier tests (+ the same tests under ASan/UBSan)
#   make demo       deps + build + start kcolld + 4-rank all-reduce sweep
#   make vmtest     deps + the VM tier (kernel module, Soft-RoCE, BPF tracing) under QEMU
#   make fuzz       libFuzzer run over the ring consumer (FUZZ_SECONDS=60)
#   make install    install the build (PREFIX=/usr/local, DESTDIR=; uninstall undoes it)

# demo, check and vmtest install packages first and only then read the rest
# of this file in a second make: every probe below (clang, bpftool, nvcc,
# libgloo, mpicc) must see what deps.sh installed, not the machine before it.
DEPS_GOALS := demo check vmtest
ifneq ($(filter $(DEPS_GOALS),$(MAKECMDGOALS)),)
ifneq ($(KCOLL_DEPS_DONE),1)
KCOLL_STAGE1 := 1
endif
endif

# The second make builds with one job per CPU unless -j was given (make
# sees -j only in a recipe's MAKEFLAGS); the goals run one after another, so
# `make demo check` never runs the demo and the tests at once.
ifeq ($(KCOLL_STAGE1),1)
stage1_first := $(firstword $(MAKECMDGOALS))
.PHONY: $(MAKECMDGOALS)
$(stage1_first):
	@scripts/deps.sh $(if $(filter vmtest,$(MAKECMDGOALS)),--vm)
	@case " $$MAKEFLAGS " in *" -j"*) j= ;; *) j=-j$$(nproc) ;; esac; \
	for g in $(MAKECMDGOALS); do \
		$(MAKE) --no-print-directory $$j KCOLL_DEPS_DONE=1 $$g || exit; \
	done
$(filter-out $(stage1_first),$(MAKECMDGOALS)): $(stage1_first)
	@:
else
SAN ?= 0
ifeq ($(SAN),1)
BUILD ?= build-asan
else
BUILD ?= build
endif
CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif
AR ?= ar
V ?= 0
Q := $(if $(filter 1,$(V)),,@)
msg = $(if $(filter 1,$(V)),,@printf '  %-7s %s\n' '$(1)' '$(2)';)

KCOLL_VERSION := 1.0.0

CPPFLAGS += -D_GNU_SOURCE -Iinclude -Iinclude/uapi -Iuser/common -DKCOLL_VERSION='"$(KCOLL_VERSION)"'
# -ffp-contract=off: no FMA contraction, so vector and scalar reductions agree bit for bit.
CFLAGS += -std=gnu11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -fPIC -pthread \
	  -ffp-contract=off -fno-strict-aliasing
LDFLAGS += -pthread
ifeq ($(SAN),1)
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

OBJ := $(BUILD)/obj
BIN := $(BUILD)/bin
LIB := $(BUILD)/lib
TBIN := $(BUILD)/tests

# Fragments append to these. KCOLL_CONFIG: NAME=value words, one per probe
# result, written to $(BUILD)/config.mk.
ALL_TARGETS :=
CHECK_TARGETS :=
KCOLL_CONFIG :=

# ---- Commands that remember themselves (Kbuild's if_changed, in short).
# A rule whose recipe is $(call if_changed,NAME) runs cmd_NAME when the target
# is missing, a prerequisite is newer, or cmd_NAME expands to another command
# line than the one that made the target (a probe result, CC, CFLAGS, a
# target-specific flag): it saves the line in $@.cmd, which the next make
# reads back. So exactly the objects whose command changed are rebuilt, and
# what links them relinks because they are newer. Such rules list $(force).
# MTIME_ONLY=1 drops it, for `make -q` (tests/run.sh asks whether a test
# program is older than its inputs: FORCE would make every target look
# stale, since make -q cannot run the check).
empty :=
space := $(empty) $(empty)
squote := '
escsq = $(subst $(squote),'\$(squote)',$(1))
cmd_line = $(strip $(cmd_$(1)))
# Empty when the two lines are equal (each one would vanish from the other).
cmd_changed = $(subst $(savedcmd_$@),,$(call cmd_line,$(1)))$(subst $(call cmd_line,$(1)),,$(savedcmd_$@))
if_changed = $(if $(filter-out FORCE,$?)$(call cmd_changed,$(1)),$(call run_cmd,$(1)),@:)
run_cmd = $(call msg,$(quiet_$(1)),$(or $(msg_$(1)),$<)) mkdir -p $(dir $@) && $(cmd_$(1)) && \
	printf '%s\n' 'savedcmd_$@ := $(call escsq,$(subst $$,$$$$,$(call cmd_line,$(1))))' > $@.cmd
.DEFAULT_GOAL := all
# Keep intermediate objects (examples link through a chain of pattern rules).
.SECONDARY:
force := $(if $(filter 1,$(MTIME_ONLY)),,FORCE)
.PHONY: FORCE
FORCE:

.PHONY: all config deps check check-host check-san demo vmtest fuzz install uninstall clean help
all:

# Order matters where a fragment names another's variables in prerequisites:
# common helpers first, then the GPU loader (kcollctl links it), then the rest.
include user/common/build.mk $(wildcard gpu/build.mk)
include $(sort $(filter-out user/common/build.mk,$(wildcard user/*/build.mk)))
include $(wildcard rdma/build.mk bpf/build.mk examples/build.mk) tests/build.mk

# The ABI proofs: compile-only, native and 32-bit (needs gcc-multilib).
ABI_CHECKS := $(sort $(wildcard include/kcoll/abi_check*.c))
quiet_abi := ABI
cmd_abi = $(CC) $(CPPFLAGS) -std=gnu11 -Wall -Werror -c -o $@ $<
quiet_abi32 := ABI-m32
cmd_abi32 = $(CC) $(CPPFLAGS) -m32 -std=gnu11 -Wall -Werror -c -o $@ $<
$(OBJ)/abi/%.o: include/kcoll/%.c include/uapi/linux/kcoll.h $(force)
	$(Q)$(call if_changed,abi)
$(OBJ)/abi/%.m32.o: include/kcoll/%.c include/uapi/linux/kcoll.h $(force)
	$(Q)$(call if_changed,abi32)
ALL_TARGETS += $(ABI_CHECKS:include/kcoll/%.c=$(OBJ)/abi/%.o) $(ABI_CHECKS:include/kcoll/%.c=$(OBJ)/abi/%.m32.o)

all: $(ALL_TARGETS)

quiet_cc := CC
cmd_cc = $(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<
$(OBJ)/%.o: %.c $(force)
	$(Q)$(call if_changed,cc)

-include $(shell find $(OBJ) -name '*.d' -o -name '*.cmd' 2>/dev/null)

# ---- The build's configuration: every probe result and the flags, rewritten
# only when it changes (make config prints it; tests read it).
KCOLL_CONFIG += CC=$(CC) SAN=$(SAN)
define newline


endef
config_text = $(subst $(space),$(newline),$(strip $(KCOLL_CONFIG)))
$(shell mkdir -p $(BUILD))
ifneq ($(file <$(BUILD)/config.mk),$(config_text))
$(file >$(BUILD)/config.mk,$(config_text))
endif
config:
	@cat $(BUILD)/config.mk

deps:
	$(Q)scripts/deps.sh

# The host tier: plain build, then the same tests under ASan+UBSan, then a
# clang -Werror build, then 10 s of libFuzzer on the SQE validator (clang's
# libFuzzer runtime: libclang-rt-dev). Prints TAP and a final "N passed,
# N failed" line per pass.
check:
	$(Q)$(MAKE) --no-print-directory check-host
	$(Q)$(MAKE) --no-print-directory SAN=1 check-san
	$(Q)$(MAKE) --no-print-directory CC=clang BUILD=build-clang all
	$(Q)mkdir -p build-fuzz && $(MAKE) --no-print-directory fuzz FUZZ_SECONDS=10 >build-fuzz/check.log 2>&1 || \
		{ tail -n 30 build-fuzz/check.log; echo "make fuzz failed: build-fuzz/check.log"; exit 1; }
	$(Q)grep -h '^Done [0-9]* runs' build-fuzz/check.log | sed 's/^/fuzz (tests\/test_fuzz_sqe.c, libFuzzer): /'

check-host: all $(CHECK_TARGETS)
	$(Q)tests/run.sh $(BUILD)

check-san: all $(CHECK_TARGETS)
	$(Q)KCOLL_TEST_SAN=1 tests/run.sh $(BUILD)

demo: all
	$(Q)scripts/demo.sh $(BUILD)

vmtest: all $(CHECK_TARGETS)
	$(Q)scripts/vmtest.sh --suite

# Coverage-guided fuzzing of the ring consumer front end (clang libFuzzer).
FUZZ_SECONDS ?= 60
fuzz:
	$(call msg,FUZZ,tests/test_fuzz_sqe.c for $(FUZZ_SECONDS) s)
	@mkdir -p build-fuzz/corpus
	$(Q)clang $(CPPFLAGS) -g -O1 -fsanitize=fuzzer,address,undefined -DKCOLL_LIBFUZZER \
		-o build-fuzz/fuzz_sqe tests/test_fuzz_sqe.c user/daemon/sqe.c user/common/dtype.c
	$(Q)build-fuzz/fuzz_sqe -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus

# PREFIX, DESTDIR, BINDIR, SBINDIR, LIBDIR, INCLUDEDIR, MANDIR, UNITDIR: see
# scripts/install.sh. Installs only what was built.
PREFIX ?= /usr/local
export PREFIX DESTDIR BINDIR SBINDIR LIBDIR INCLUDEDIR MANDIR UNITDIR
install: all
	$(Q)scripts/install.sh $(BUILD)

uninstall:
	$(Q)scripts/install.sh --uninstall $(BUILD)

clean:
	rm -rf build build-asan build-clang build-fuzz build-gpu

help:
	@sed -n '2,16p' Makefile | sed 's/^# \{0,1\}//'
endif # KCOLL_STAGE1
