/*
 * kvtier/trace.h — request traces in the Mooncake format. Included by
 * <kvtier.h>.
 *
 * One JSON object per line (blank lines are skipped):
 *
 *   {"timestamp": 27482, "input_length": 6955, "output_length": 52,
 *    "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}
 *
 *   field          type                     meaning
 *   timestamp      number >= 0              ms since the trace's start
 *                                           (fractions kept, to the ns)
 *   input_length   integer >= 0             prompt tokens
 *   output_length  integer >= 0             generated tokens
 *   hash_ids       array of integers >= 0   one id per prefix block of the
 *                  (< 2^53)                 prompt; two requests sharing
 *                                           the first k ids share their
 *                                           first k blocks
 *
 * Other fields are ignored. The block size is the trace's (512 tokens for
 * the published Mooncake traces); the reader does not assume one. Requests
 * are kept in file order; timestamps need not be sorted.
 *
 * Errors name the file and line: "trace.jsonl:17: 'hash_ids' holds -3, not
 * an id", "trace.jsonl:4: not JSON (at column 12)". A trace is read whole
 * or not at all.
 */
#ifndef KVTIER_TRACE_H
#define KVTIER_TRACE_H

#include <kvtier.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_trace kvt_trace;

/** One request. Pointers are valid until kvt_trace_close(). */
typedef struct kvt_trace_req {
	uint64_t time_ns;        /* timestamp, in ns */
	uint32_t input_length;
	uint32_t output_length;
	uint32_t nhash;
	const uint64_t *hash_ids;
	uint32_t line;           /* 1-based line in the file */
} kvt_trace_req;

/**
 * kvt_trace_open() - read a whole trace file.
 * Returns 0 and *@out, -errno if the file cannot be read (detail: the
 * path), KVT_ECONFIG for a malformed line (detail: file, line and what is
 * wrong), KVT_ECONFIG for a file with no request, -ENOMEM. Files up to
 * 1 GiB. Free with kvt_trace_close().
 */
KVT_API int kvt_trace_open(kvt_trace **out, const char *path);
/** The same from text in memory (@len bytes); @name labels messages. */
KVT_API int kvt_trace_parse(kvt_trace **out, const char *text, size_t len,
			    const char *name);
KVT_API void kvt_trace_close(kvt_trace *t);

/** Requests in the trace. */
KVT_API size_t kvt_trace_count(const kvt_trace *t);
/** Request @i (0-based, file order); NULL past the end. */
KVT_API const kvt_trace_req *kvt_trace_get(const kvt_trace *t, size_t i);
/** Sum of nhash over all requests. */
KVT_API uint64_t kvt_trace_blocks(const kvt_trace *t);
/** Distinct hash ids in the trace. */
KVT_API uint64_t kvt_trace_unique_blocks(const kvt_trace *t);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_TRACE_H */
