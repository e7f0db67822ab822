/* fuzz_xfer_json — kvt_hw_apply_xfer(): `kvtier sim --xfer FILE`, the JSON
 * of `kvtier bench xfer --json` over a profile. Applied to testbed-b, an
 * accepted file still gives sane costs. */
#include "fuzz.h"

static kvt_hw base;
static int have_base = -1;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvt_hw hw;
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
	if (kvt_hw_apply_xfer(&hw, text, "fuzz") == 0)
		fuzz_check_costs(&hw);
	free(text);
	return 0;
}
