/*
 * err.c — error codes, their names, and the per-thread detail buffer.
 *
 * Calls return -errno or a KVT_E* code; a failure site also writes one line
 * into a thread-local buffer saying what exactly was wrong, read back with
 * kvt_errdetail(). The buffer is the only per-thread state in the library.
 */
#include "core/core.h"

#include <stdio.h>
#include <string.h>

#define KVT_ERRDETAIL_MAX 512

static _Thread_local char errdetail[KVT_ERRDETAIL_MAX];

/* One table for the names of kvtier's own codes. */
static const struct {
	int code;
	const char *msg;
} kvt_errs[] = {
	{ KVT_EFULL, "no free slot (pool or tier full)" },
	{ KVT_ESPEC, "bad tier spec" },
	{ KVT_EPRESET, "unknown model preset" },
	{ KVT_ECONFIG, "bad configuration" },
	{ KVT_ENODEV, "device not present" },
	{ KVT_ECORRUPT, "data failed verification" },
	{ KVT_EGEOM, "geometry or layout mismatch" },
	{ KVT_ENOTBUILT, "feature not built into this kvtier" },
	{ KVT_ENOTFOUND, "not found" },
	{ KVT_EBUSY, "in use" },
	{ KVT_EPROTO, "protocol error" },
};

const char *kvt_strerror(int err)
{
	if (err == 0)
		return "success";
	if (err <= KVT_ERR_FIRST && err >= KVT_ERR_LAST) {
		for (size_t i = 0; i < KVT_ARRAY_SIZE(kvt_errs); i++)
			if (kvt_errs[i].code == err)
				return kvt_errs[i].msg;
	}
	if (err < 0 && err > -4096)
		err = -err;
	if (err > 0 && err < 4096)
		return strerror(err); /* glibc: static for known errnos */
	return "unknown error";
}

const char *kvt_errdetail(void)
{
	return errdetail;
}

void kvti_errclear(void)
{
	errdetail[0] = '\0';
}

/* Formats into a local buffer first: an argument may be kvt_errdetail()
 * itself (a caller adding context), and vsnprintf's source and destination
 * must not overlap. */
int kvti_fail(int err, const char *fmt, ...)
{
	char line[KVT_ERRDETAIL_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	memcpy(errdetail, line, sizeof(errdetail));
	return err;
}

void kvti_errctx(const char *fmt, ...)
{
	char old[KVT_ERRDETAIL_MAX], line[KVT_ERRDETAIL_MAX];
	va_list ap;

	memcpy(old, errdetail, sizeof(old));
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (old[0])
		snprintf(errdetail, sizeof(errdetail), "%s: %s", line, old);
	else
		memcpy(errdetail, line, sizeof(errdetail));
}

const char *kvt_version(void)
{
	return KVT_VERSION_STRING;
}
