/* SPDX-License-Identifier: MIT */
/*
 * libkcoll_mpi.so: picks the shim built for the MPI the process runs.
 *
 * Open MPI and MPICH differ in ABI (Open MPI's handles are pointers to
 * library globals, MPICH's are ints), so the shim (kcoll_mpi.c) is built
 * once per MPI: libkcoll_mpi_ompi.so and libkcoll_mpi_mpich.so, next to this
 * file's library. This library exports the same MPI_* names as trampolines:
 * an indirect jump through a pointer, filled on the first call of any of
 * them (MPI_Init or MPI_Init_thread in a correct program), when the MPI
 * library is certainly loaded, even where it was dlopen'ed locally (mpi4py).
 * It then loads the matching shim with RTLD_LOCAL and takes its functions;
 * if that fails, or the MPI is neither, it takes the MPI's own PMPI_*
 * functions, so the program runs on plain MPI (one log line).
 *
 * The jump keeps every argument where the caller put it, whatever the types
 * (which differ by MPI), so one trampoline serves both ABIs; it is written
 * for x86-64 (build.mk installs the Open MPI shim as libkcoll_mpi.so on
 * other machines).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef __x86_64__
#error "kcoll_mpi_select.c: trampolines are written for x86-64 only"
#endif

/* Every name kcoll_mpi.map exports. */
#define KCOLL_MPI_SELECT_CALLS(X)                                                                 \
	X(MPI_Init) X(MPI_Init_thread) X(MPI_Finalize) X(MPI_Allreduce)                           \
	X(MPI_Reduce_scatter_block) X(MPI_Allgather) X(MPI_Bcast) X(MPI_Barrier)                  \
	X(MPI_Iallreduce) X(MPI_Ireduce_scatter_block) X(MPI_Iallgather) X(MPI_Ibcast)            \
	X(MPI_Ibarrier) X(MPI_Comm_dup) X(MPI_Comm_split) X(MPI_Comm_create) X(MPI_Comm_free)     \
	X(MPI_Alloc_mem) X(MPI_Free_mem)

void kcoll_mpi_select_resolve(void) __attribute__((visibility("hidden")));

/* One pointer per name; NULL until resolved. */
#define KCOLL_MPI_SELECT_PTR(name)                                                                \
	__attribute__((visibility("hidden"))) void *kcoll_mpi_select_##name;
KCOLL_MPI_SELECT_CALLS(KCOLL_MPI_SELECT_PTR)

/*
 * The trampoline: jump through the pointer; the first time, save the six
 * argument registers (MPI calls pass no floating-point arguments; a seventh
 * or eighth argument is on the stack, untouched), resolve, restore, jump.
 * Six pushes plus 8 bytes keep the stack 16-byte aligned for the call.
 */
#define KCOLL_MPI_SELECT_TRAMPOLINE(name)                                                         \
	__asm__(".text\n"                                                                         \
		".globl " #name "\n"                                                              \
		".type " #name ", @function\n"                                                    \
		".p2align 4\n" #name ":\n"                                                        \
		"	movq kcoll_mpi_select_" #name "(%rip), %rax\n"                            \
		"	testq %rax, %rax\n"                                                       \
		"	jz 1f\n"                                                                  \
		"	jmp *%rax\n"                                                              \
		"1:	pushq %rdi\n"                                                             \
		"	pushq %rsi\n"                                                             \
		"	pushq %rdx\n"                                                             \
		"	pushq %rcx\n"                                                             \
		"	pushq %r8\n"                                                              \
		"	pushq %r9\n"                                                              \
		"	subq $8, %rsp\n"                                                          \
		"	call kcoll_mpi_select_resolve\n"                                          \
		"	addq $8, %rsp\n"                                                          \
		"	popq %r9\n"                                                               \
		"	popq %r8\n"                                                               \
		"	popq %rcx\n"                                                              \
		"	popq %rdx\n"                                                              \
		"	popq %rsi\n"                                                              \
		"	popq %rdi\n"                                                              \
		"	jmp *kcoll_mpi_select_" #name "(%rip)\n"                                  \
		".size " #name ", .-" #name "\n");
KCOLL_MPI_SELECT_CALLS(KCOLL_MPI_SELECT_TRAMPOLINE)

#define KCOLL_MPI_SELECT_ENTRY(name) { #name, &kcoll_mpi_select_##name },
static const struct {
	const char *name;
	void **fn;
} kcoll_mpi_select_table[] = { KCOLL_MPI_SELECT_CALLS(KCOLL_MPI_SELECT_ENTRY) };
#define KCOLL_MPI_SELECT_N (sizeof(kcoll_mpi_select_table) / sizeof(kcoll_mpi_select_table[0]))

/* The MPIs we have a shim for, by the soname of their C library. */
static const struct {
	const char *soname;
	const char *shim;
} kcoll_mpi_select_mpis[] = {
	{ "libmpi.so.40", "libkcoll_mpi_ompi.so" },	/* Open MPI 3 to 5 */
	{ "libmpich.so.12", "libkcoll_mpi_mpich.so" },	/* MPICH 3.1+ (Debian's name) */
	{ "libmpi.so.12", "libkcoll_mpi_mpich.so" },	/* MPICH 3.1+ (upstream's name) */
};

/* Fill every pointer from 'lib' (the shim, or with prefix "P" the MPI). */
static int kcoll_mpi_select_take(void *lib, const char *prefix)
{
	void *fn[KCOLL_MPI_SELECT_N];
	char sym[64];

	for (size_t i = 0; i < KCOLL_MPI_SELECT_N; i++) {
		snprintf(sym, sizeof(sym), "%s%s", prefix, kcoll_mpi_select_table[i].name);
		fn[i] = dlsym(lib, sym);
		if (!fn[i])
			return -1;
	}
	for (size_t i = 0; i < KCOLL_MPI_SELECT_N; i++)
		__atomic_store_n(kcoll_mpi_select_table[i].fn, fn[i], __ATOMIC_RELEASE);
	return 0;
}

static void kcoll_mpi_select_once(void)
{
	void *mpi = NULL, *shim = NULL;
	const char *shim_name = NULL;
	char path[4096], *slash;
	Dl_info self;

	for (size_t i = 0; !mpi && i < sizeof(kcoll_mpi_select_mpis) / sizeof(kcoll_mpi_select_mpis[0]); i++) {
		mpi = dlopen(kcoll_mpi_select_mpis[i].soname, RTLD_NOW | RTLD_NOLOAD);
		shim_name = kcoll_mpi_select_mpis[i].shim;
	}
	if (!mpi) {
		/* Not an MPI we know: its PMPI_* must then be global. */
		if (kcoll_mpi_select_take(RTLD_DEFAULT, "P") == 0) {
			fprintf(stderr, "kcoll_mpi: this MPI is neither Open MPI (libmpi.so.40) nor "
					"MPICH (libmpich.so.12); every collective goes to MPI\n");
			return;
		}
		fprintf(stderr, "kcoll_mpi: no MPI library found in this process; remove "
				"libkcoll_mpi.so from LD_PRELOAD\n");
		abort();
	}
	if (!dladdr((void *)kcoll_mpi_select_once, &self) || !self.dli_fname ||
	    strlen(self.dli_fname) >= sizeof(path)) {
		snprintf(path, sizeof(path), "%s", shim_name);
	} else {
		size_t dir;

		snprintf(path, sizeof(path), "%s", self.dli_fname);
		slash = strrchr(path, '/');
		dir = slash ? (size_t)(slash + 1 - path) : 0;
		snprintf(path + dir, sizeof(path) - dir, "%s", shim_name);
	}
	shim = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (shim && kcoll_mpi_select_take(shim, "") == 0)
		return;
	fprintf(stderr, "kcoll_mpi: cannot load %s (%s); every collective goes to MPI\n", path,
		shim ? "it lacks an MPI function" : dlerror());
	if (kcoll_mpi_select_take(mpi, "P") == 0)
		return;
	fprintf(stderr, "kcoll_mpi: the MPI library lacks a PMPI function the shim needs; remove "
			"libkcoll_mpi.so from LD_PRELOAD\n");
	abort();
}

void kcoll_mpi_select_resolve(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, kcoll_mpi_select_once);
}
