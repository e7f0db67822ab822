/*
 * harness.h — the tiny test harness. One program per feature; exit 0 pass,
 * 1 fail, 77 skip (ctest maps 77 to "skipped"). Checks print the file,
 * line and expression, then keep going; the program fails at the end if
 * any check failed, so one run shows every broken expectation.
 *
 *   CHECK(cond)              a condition
 *   TCHECK(cond)             a condition, checked on any thread
 *   CHECK_EQ(a, b)           two integers (printed when they differ)
 *   CHECK_OK(call)           a kvtier call returns 0 (prints kvt_errdetail)
 *   CHECK_ERR(call, code)    a kvtier call fails with @code
 *   SKIP(why)                exit 77 now
 *   TEST_DONE()              return from main with the verdict
 */
#ifndef KVT_TEST_HARNESS_H
#define KVT_TEST_HARNESS_H

#include <kvtier.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int kvt_test_failures;
/* TCHECK's failures, from any thread; TEST_DONE() counts them */
static atomic_int kvt_test_tfailures __attribute__((unused));

#define CHECK(c)                                                            \
	do {                                                                \
		if (!(c)) {                                                 \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, \
				__LINE__, #c);                              \
			kvt_test_failures++;                                \
		}                                                           \
	} while (0)

#define TCHECK(c)                                                           \
	do {                                                                \
		if (!(c)) {                                                 \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, \
				__LINE__, #c);                              \
			atomic_fetch_add(&kvt_test_tfailures, 1);           \
		}                                                           \
	} while (0)

#define CHECK_EQ(a, b)                                                      \
	do {                                                                \
		long long _a = (long long)(a), _b = (long long)(b);         \
		if (_a != _b) {                                             \
			fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", \
				__FILE__, __LINE__, #a, #b, _a, _b);        \
			kvt_test_failures++;                                \
		}                                                           \
	} while (0)

#define CHECK_OK(call)                                                      \
	do {                                                                \
		int _e = (call);                                            \
		if (_e) {                                                   \
			fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, \
				__LINE__, #call, kvt_strerror(_e),          \
				kvt_errdetail());                           \
			kvt_test_failures++;                                \
		}                                                           \
	} while (0)

#define CHECK_ERR(call, code)                                               \
	do {                                                                \
		int _e = (call);                                            \
		if (_e != (code)) {                                         \
			fprintf(stderr, "%s:%d: %s returned %d (%s), want %s\n", \
				__FILE__, __LINE__, #call, _e,              \
				kvt_strerror(_e), #code);                   \
			kvt_test_failures++;                                \
		}                                                           \
	} while (0)

#define SKIP(why)                                                           \
	do {                                                                \
		fprintf(stderr, "skip: %s\n", why);                         \
		exit(77);                                                   \
	} while (0)

#define TEST_DONE()                                                         \
	do {                                                                \
		kvt_test_failures += atomic_exchange(&kvt_test_tfailures, 0); \
		if (kvt_test_failures)                                      \
			fprintf(stderr, "%d check(s) failed\n",             \
				kvt_test_failures);                         \
		return kvt_test_failures ? 1 : 0;                           \
	} while (0)

/* A small deterministic PRNG for tests (xorshift64*). */
static inline uint64_t test_rand(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 2685821657736338717ull;
}

/* A scratch directory for this test under the build tree, emptied first. */
static inline const char *test_dir(const char *name)
{
	static char path[512];
	char cmd[1100];

	snprintf(path, sizeof(path), "%s/test-scratch/%s",
		 getenv("KVT_TEST_TMP") ? getenv("KVT_TEST_TMP") : "/tmp",
		 name);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s'", path, path);
	if (system(cmd) != 0) {
		fprintf(stderr, "cannot make %s\n", path);
		exit(1);
	}
	return path;
}

/* Entries of @dir other than dot files (-1 if it cannot be opened): files
 * left behind, /proc/self/fd for descriptors, /proc/self/task for threads. */
static inline int test_count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Lines of a file (-1 if it cannot be read): /proc/self/maps for mappings. */
static inline int test_count_lines(const char *path)
{
	FILE *f = fopen(path, "r");
	int n = 0, c;

	if (!f)
		return -1;
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

#endif
