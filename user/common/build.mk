# Internal helpers shared by libkcoll, kcolld and the tools (not installed).
COMMON_SRCS := $(sort $(wildcard user/common/*.c))
COMMON_OBJS := $(COMMON_SRCS:%.c=$(OBJ)/%.o)
COMMON_LIB := $(OBJ)/libkcoll_common.a

$(COMMON_LIB): $(COMMON_OBJS)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^
