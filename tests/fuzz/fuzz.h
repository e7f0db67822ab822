/*
 * fuzz.h — what every libFuzzer harness in tests/fuzz/ shares.
 *
 * One harness per parser of untrusted input (docs/ARCHITECTURE.md, "Bad
 * input"); each is built with clang -fsanitize=fuzzer,address,undefined
 * (CMake -DKVT_FUZZ=ON) and run by scripts/fuzz, with a seed corpus in
 * corpus/<name>/ and a dictionary <name>.dict. A harness feeds the bytes
 * to the parser and, where the parser accepts them, checks what it
 * promises about its result (FUZZ_ASSERT aborts: libFuzzer saves the
 * input). Errors are expected and silent (KVT_LOG=error is set below).
 */
#ifndef KVT_FUZZ_H
#define KVT_FUZZ_H

#include <kvtier.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_ASSERT(c)                                                      \
	do {                                                                \
		if (!(c)) {                                                 \
			fprintf(stderr, "%s:%d: FUZZ_ASSERT failed: %s\n",  \
				__FILE__, __LINE__, #c);                    \
			abort();                                            \
		}                                                           \
	} while (0)

/* The input as a NUL-terminated string (parsers of text take one); free()
 * it. An input holding a NUL is cut there, as a C string would be. */
static inline char *fuzz_str(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	if (!s)
		abort();
	memcpy(s, data, size);
	s[size] = '\0';
	return s;
}

/* A profile that was accepted must give sane costs for a small model
 * (kvt_hw_cost may still refuse it, e.g. a TP degree the node cannot
 * hold): finite step times, copy rates neither negative nor NaN. */
static inline void fuzz_check_costs(const kvt_hw *hw)
{
	kvt_geom g;
	kvt_cost c;

	if (kvt_geom_preset(&g, "llama-3.1-8b", 16, 1, 0) ||
	    kvt_hw_cost(hw, &g, &c))
		return;
	FUZZ_ASSERT(isfinite(kvt_cost_step_s(&c, NULL, 0, 4, 4096)));
	for (int m = 0; m < KVT_COPY_COUNT; m++) {
		double r = kvt_cost_copy_gbps(&c, (kvt_copy_method)m, 65536);

		FUZZ_ASSERT(!(r < 0) && !isnan(r));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Quiet warnings the parsers print for odd but accepted input. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	setenv("KVT_LOG", "error", 1);
	return 0;
}

#endif
