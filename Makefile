# kcoll top-level Makefile. Each room adds itself through a build.mk fragment.
#   make            build everything this machine can build into $(BUILD)/
#   make V=1        show commands
#   make CC=clang   build with clang
#   make SAN=1      ASan+UBSan build (into build-asan/ unless BUILD is given)
#   make deps       install missing Debian packages (idempotent; needs root)
#   make check      deps + build + host-tier tests (+ the same tests under ASan/UBSan)
#   make demo       deps + build + start kcolld + 4-rank all-reduce sweep
#   make vmtest     the VM tier (kernel module, Soft-RoCE, BPF tracing) under QEMU
#   make fuzz       libFuzzer run over the ring consumer (FUZZ_SECONDS=60)
#   make install    install the build (PREFIX=/usr/local, DESTDIR=; uninstall undoes it)

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

# Fragments append to these.
ALL_TARGETS :=
CHECK_TARGETS :=

.PHONY: all deps check check-host check-san demo vmtest fuzz install uninstall clean help
all:

# Order matters where a fragment names another's variables in prerequisites:
# common helpers first, then the GPU loader (kcollctl links it), then the rest.
include user/common/build.mk $(wildcard gpu/build.mk)
include $(sort $(filter-out user/common/build.mk,$(wildcard user/*/build.mk)))
include $(wildcard rdma/build.mk bpf/build.mk examples/build.mk) tests/build.mk

# The ABI proofs: compile-only, native and 32-bit (needs gcc-multilib).
ABI_CHECKS := $(sort $(wildcard include/kcoll/abi_check*.c))
$(OBJ)/abi/%.o: include/kcoll/%.c include/uapi/linux/kcoll.h
	$(call msg,ABI,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -std=gnu11 -Wall -Werror -c -o $@ $<
$(OBJ)/abi/%.m32.o: include/kcoll/%.c include/uapi/linux/kcoll.h
	$(call msg,ABI-m32,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -m32 -std=gnu11 -Wall -Werror -c -o $@ $<
ALL_TARGETS += $(ABI_CHECKS:include/kcoll/%.c=$(OBJ)/abi/%.o) $(ABI_CHECKS:include/kcoll/%.c=$(OBJ)/abi/%.m32.o)

all: $(ALL_TARGETS)

$(OBJ)/%.o: %.c
	$(call msg,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

-include $(shell find $(OBJ) -name '*.d' 2>/dev/null)

deps:
	$(Q)scripts/deps.sh

# The host tier: plain build, then the same tests under ASan+UBSan, then a
# clang -Werror build. Prints TAP and a final "N passed, N failed" line.
check: deps
	$(Q)$(MAKE) --no-print-directory check-host
	$(Q)$(MAKE) --no-print-directory SAN=1 check-san
	$(Q)$(MAKE) --no-print-directory CC=clang BUILD=build-clang all

check-host: all $(CHECK_TARGETS)
	$(Q)tests/run.sh $(BUILD)

check-san: all $(CHECK_TARGETS)
	$(Q)KCOLL_TEST_SAN=1 tests/run.sh $(BUILD)

demo: deps all
	$(Q)scripts/demo.sh $(BUILD)

vmtest: deps all $(CHECK_TARGETS)
	$(Q)scripts/vmtest.sh --suite

# Coverage-guided fuzzing of the ring consumer front end (clang libFuzzer).
FUZZ_SECONDS ?= 60
fuzz:
	$(call msg,FUZZ,tests/test_fuzz_sqe.c for $(FUZZ_SECONDS) s)
	@mkdir -p build-fuzz/corpus
	$(Q)clang $(CPPFLAGS) -g -O1 -fsanitize=fuzzer,address,undefined -DKCOLL_LIBFUZZER \
		-o build-fuzz/fuzz_sqe tests/test_fuzz_sqe.c user/daemon/sqe.c user/lib/util.c
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
	rm -rf build build-asan build-clang build-fuzz

help:
	@sed -n '2,12p' Makefile | sed 's/^# \{0,1\}//'
