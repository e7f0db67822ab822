/* fuzz_profile — kvt_hw_parse(): hardware profile files (`kvtier sim
 * --hardware FILE`). An accepted profile gives sane costs. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvt_hw hw;
	char *text;

	if (size > 65536)
		return 0;
	text = fuzz_str(data, size);
	if (kvt_hw_parse(&hw, text, "fuzz") == 0)
		fuzz_check_costs(&hw);
	free(text);
	return 0;
}
