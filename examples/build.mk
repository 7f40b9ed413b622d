# Example programs against libkcoll (each examples/NAME.c -> $(BIN)/NAME).
EXAMPLE_SRCS := $(sort $(wildcard examples/*.c))
EXAMPLE_BINS := $(EXAMPLE_SRCS:examples/%.c=$(BIN)/%)

$(BIN)/%: $(OBJ)/examples/%.o $(LIB)/libkcoll.a $(COMMON_LIB)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LIB)/libkcoll.a $(COMMON_LIB) $(LDFLAGS)

ALL_TARGETS += $(EXAMPLE_BINS)
