/* fuzz_xfer_json — kvt_hw_apply_xfer(): `kvtier sim --xfer FILE`, the JSON
 * of `kvtier bench xfer --json` over a profile. Applied to testbed-b, an
 * accepted file must still give a cost model with finite copy times. */
#include "fuzz.h"

#include <math.h>

static kvt_hw base;
static int have_base = -1;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvt_hw hw;
	kvt_geom g;
	kvt_cost c;
	char *text;

	if (have_base < 0)
		have_base = kvt_hw_load(&base, "testbed-b") == 0;
	if (!have_base) {
		fprintf(stderr, "fuzz_xfer_json: profile testbed-b: %s\n",
			kvt_errdetail());
		abort();
	}
	if (size > 65536)
		return 0;
	text = fuzz_str(data, size);
	hw = base;
	if (kvt_hw_apply_xfer(&hw, text, "fuzz") == 0 &&
	    kvt_geom_preset(&g, "llama-3.1-8b", 16, 1, 0) == 0 &&
	    kvt_hw_cost(&hw, &g, &c) == 0) {
		for (int m = 0; m < KVT_COPY_COUNT; m++) {
			double r = kvt_cost_copy_gbps(&c, (kvt_copy_method)m,
						      65536);
			FUZZ_ASSERT(!(r < 0) && !isnan(r));
		}
	}
	free(text);
	return 0;
}
