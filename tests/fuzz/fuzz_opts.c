/* fuzz_opts — the options file (`--config FILE`, KVT_CONFIG): "name =
 * value" lines into the options table. Whatever is accepted reads back. */
#include "fuzz.h"
#include "core/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *n, *v, *h, *src;
	kvt_opts *o;
	char *text;

	if (size > 65536)
		return 0;
	if (kvt_opts_create(&o))
		return 0;
	text = fuzz_str(data, size);
	if (kvti_opts_parse(o, text, "fuzz") == 0)
		for (int i = 0; kvt_opts_describe(o, i, &n, &v, &h, &src) == 0;
		     i++) {
			FUZZ_ASSERT(kvt_opts_get(o, n) == v);
			(void)kvt_opts_get_int(o, n);
		}
	free(text);
	kvt_opts_destroy(o);
	return 0;
}
