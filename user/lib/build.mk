# libkcoll: the public library (static and shared, symbol-versioned).
LIBKCOLL_SRCS := $(sort $(wildcard user/lib/*.c))
LIBKCOLL_OBJS := $(LIBKCOLL_SRCS:%.c=$(OBJ)/%.o)
# The internal helpers it needs come from user/common.
LIBKCOLL_DEPS := $(OBJ)/user/common/proto.o $(OBJ)/user/common/config.o $(OBJ)/user/common/log.o \
		 $(OBJ)/user/common/kdev.o $(OBJ)/user/common/reduce.o $(OBJ)/user/common/reduce_ref.o \
		 $(OBJ)/user/common/dtype.o
# Device buffers: the GPU loader (dlopens the CUDA driver only where one is used).
LIBKCOLL_DEPS += $(OBJ)/gpu/gpu.o
$(OBJ)/user/lib/mem.o: CPPFLAGS += -Igpu

$(LIB)/libkcoll.a: $(LIBKCOLL_OBJS) $(LIBKCOLL_DEPS)
	$(call msg,AR,$@)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(LIB)/libkcoll.so.1: $(LIBKCOLL_OBJS) $(LIBKCOLL_DEPS) user/lib/libkcoll.map
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) -shared -Wl,-soname,libkcoll.so.1 -Wl,--version-script=user/lib/libkcoll.map \
		-Wl,--no-undefined -o $@ $(LIBKCOLL_OBJS) $(LIBKCOLL_DEPS) $(LDFLAGS)

$(LIB)/libkcoll.so: $(LIB)/libkcoll.so.1
	$(Q)ln -sf libkcoll.so.1 $@

ALL_TARGETS += $(LIB)/libkcoll.a $(LIB)/libkcoll.so
