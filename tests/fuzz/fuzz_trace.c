/* fuzz_trace — kvt_trace_parse(): Mooncake-format request traces (`kvtier
 * trace replay`, `kvtier sim --workload trace:FILE`). The bytes go in as
 * they are, with their length (the parser does not need a NUL). Every
 * accepted request's hash ids are readable and the counts agree. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvt_trace *t;
	uint64_t blocks = 0, sum = 0;
	char *copy;

	if (size > 1 << 20)
		return 0;
	/* an exact-size copy: ASan sees a read past the end */
	copy = malloc(size ? size : 1);
	if (!copy)
		abort();
	memcpy(copy, data, size);
	if (kvt_trace_parse(&t, copy, size, "fuzz") == 0) {
		size_t n = kvt_trace_count(t);

		FUZZ_ASSERT(n >= 1);
		for (size_t i = 0; i < n; i++) {
			const kvt_trace_req *r = kvt_trace_get(t, i);

			FUZZ_ASSERT(r && r->hash_ids);
			for (uint32_t k = 0; k < r->nhash; k++)
				sum += r->hash_ids[k];
			blocks += r->nhash;
		}
		FUZZ_ASSERT(kvt_trace_get(t, n) == NULL);
		FUZZ_ASSERT(blocks == kvt_trace_blocks(t));
		FUZZ_ASSERT(kvt_trace_unique_blocks(t) <= blocks);
		kvt_trace_close(t);
	}
	free(copy);
	(void)sum;
	return 0;
}
