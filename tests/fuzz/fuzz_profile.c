/* fuzz_profile — kvt_hw_parse(): hardware profile files (`kvtier sim
 * --hardware FILE`). An accepted profile must give a cost model whose
 * numbers are finite for a small model (kvt_hw_cost may still refuse it,
 * e.g. a TP degree the node cannot hold). */
#include "fuzz.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvt_hw hw;
	kvt_geom g;
	kvt_cost c;
	char *text;

	if (size > 65536)
		return 0;
	text = fuzz_str(data, size);
	if (kvt_hw_parse(&hw, text, "fuzz") == 0 &&
	    kvt_geom_preset(&g, "llama-3.1-8b", 16, 1, 0) == 0 &&
	    kvt_hw_cost(&hw, &g, &c) == 0) {
		double s = kvt_cost_step_s(&c, NULL, 0, 4, 4096);

		FUZZ_ASSERT(isfinite(s) && s >= 0);
		for (int m = 0; m < KVT_COPY_COUNT; m++) {
			double r = kvt_cost_copy_gbps(&c, (kvt_copy_method)m,
						      65536);
			FUZZ_ASSERT(!(r < 0) && !isnan(r));
		}
	}
	free(text);
	return 0;
}
