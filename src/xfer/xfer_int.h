/*
 * xfer_int.h — what the library's other parts (the cache) may ask of the
 * transfer engine beyond include/kvtier/xfer.h. Not installed, not API.
 */
#ifndef KVT_XFER_INT_H
#define KVT_XFER_INT_H

#include <kvtier/xfer.h>

/* kvt_xfer_create(), with every thread the engine starts (cpu workers, the
 * io lane, the device lanes) at nice value @nice (0..19; 0: as created):
 * kvt_cache_config.thread_nice. kvt_xfer_config itself has no size field
 * to grow by, so the knob is not in it. */
int kvti_xfer_create_nice(kvt_xfer **out, const kvt_xfer_config *cfg,
			  int nice);

/* Count a transfer the engine did not run as one job into its measured
 * rate from @src to @dst (kvt_xfer_rate_get()): @bytes moved between
 * @t_start and @t_end (kvt_now_ns()). The cache's staged ssd loads and
 * stores (ssd -> bounce -> engine memory, two jobs) note their whole run
 * here, so the rate between the ssd and the engine's memory is measured
 * on the path that takes the bounce, as on every path that does not. */
void kvti_xfer_rate_add(kvt_xfer *x, kvt_tier_kind src, kvt_tier_kind dst,
			uint64_t bytes, uint64_t t_start, uint64_t t_end);

#endif
