/* fuzz_tier_spec — kvt_tier_spec_parse(): `--tiers` and KVT_TIERS. An
 * accepted spec formats back to text that parses to the same spec. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvt_tier_spec s[8], r[8];
	char *text, buf[2 * KVT_PATH_MAX];
	size_t n = 0, m = 0;

	if (size > 4096)
		return 0;
	text = fuzz_str(data, size);
	if (kvt_tier_spec_parse(text, s, 8, &n) == 0) {
		FUZZ_ASSERT(n <= 8);
		for (size_t i = 0; i < n; i++) {
			kvt_tier_spec_format(&s[i], buf, sizeof(buf));
			FUZZ_ASSERT(kvt_tier_spec_parse(buf, r, 8, &m) == 0);
			FUZZ_ASSERT(m == 1);
			FUZZ_ASSERT(r[0].kind == s[i].kind);
			FUZZ_ASSERT(r[0].backing == s[i].backing);
			FUZZ_ASSERT(r[0].bytes == s[i].bytes);
			FUZZ_ASSERT(r[0].files == s[i].files);
			FUZZ_ASSERT(!strcmp(r[0].path, s[i].path));
		}
	}
	free(text);
	return 0;
}
