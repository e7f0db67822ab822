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

#endif
