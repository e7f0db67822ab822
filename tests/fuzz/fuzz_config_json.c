/* fuzz_config_json — kvt_geom_from_json(): a model's config.json (`--model
 * PATH`). An accepted geometry is within kvt_geom_finish()'s bounds and
 * gives a page size. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvt_geom g;
	char *text;

	if (size > 65536)
		return 0;
	text = fuzz_str(data, size);
	for (uint32_t tp = 1; tp <= 8; tp *= 8)
		if (kvt_geom_from_json(&g, text, "fuzz", 16, tp, 0) == 0) {
			FUZZ_ASSERT(g.layers >= 1 && g.layers <= 1024);
			FUZZ_ASSERT(g.kv_heads >= 1 && g.head_dim >= 1);
			FUZZ_ASSERT(g.params >= g.active_params ||
				    g.params == 0);
			FUZZ_ASSERT(kvt_geom_page_bytes(&g) > 0);
		}
	free(text);
	return 0;
}
