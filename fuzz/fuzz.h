/* fuzz.h: the libFuzzer entry points each harness defines, so that a harness builds both with
 * clang -fsanitize=fuzzer (libFuzzer's main) and with fuzz/replay.c (a plain main() that feeds
 * it files, for the regression replay in `make test`). */
#ifndef CORRAL_FUZZ_H
#define CORRAL_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* One input; returns 0. A violated invariant calls abort() (or a sanitizer reports it). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Optional one-time setup (the Lua harness defines it). */
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Stop at a violated invariant with a message that says which. */
#define FUZZ_CHECK(cond, ...)                                                     \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__,  \
				__LINE__, #cond);                                 \
			fprintf(stderr, __VA_ARGS__);                             \
			fputc('\n', stderr);                                      \
			abort();                                                  \
		}                                                                 \
	} while (0)

#endif
