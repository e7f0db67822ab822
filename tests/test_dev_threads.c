/*
 * test_dev_threads — every operation of the device interface (src/dev/
 * dev.h) on every device this machine has — the emulated device always,
 * each CUDA GPU when there is one — compared with the plain CPU result
 * (the ggml test-backend-ops idea):
 *   - copies host -> device -> device -> host, batched copies, the gather
 *     kernel over chunks of many sizes and alignments (16-byte and byte
 *     paths), as the reference memcpy would place them;
 *   - the checksum kernel against libxxhash over items of 1..8 segments of
 *     lengths around every XXH3 size class and block boundary;
 *   - events order work: a copy on stream B waiting on an event recorded
 *     after a slow copy on stream A reads what A wrote; query/sync;
 *   - a stream wait on a 32-bit host word (the job slot's stream word):
 *     nothing after it runs until the word reaches the value, the cyclic
 *     comparison included;
 *   - emulated device only: the access check (a copy into memory the
 *     device does not know fails its event with -EFAULT and writes
 *     nothing; an operation queued behind a release faults instead of
 *     writing), the wait limit (a wait that cannot end fails its stream's
 *     next event with -ETIMEDOUT), host functions as "kernels".
 */
#include "harness.h"
#include "dev/dev.h"

#include <pthread.h>
#include <unistd.h>
#include <xxhash.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void fill(void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		((uint8_t *)p)[i] = (uint8_t)next();
}

#define OPS(d) ((d)->ops)

/* Copy @n bytes of device memory into a fresh host buffer. */
static uint8_t *readback(kvti_dev *d, const void *dev, size_t n)
{
	uint8_t *h = malloc(n ? n : 1);
	int err;

	if (!h)
		return NULL;
	if ((err = kvti_dev_copy_sync(d, h, dev, n))) {
		fprintf(stderr, "readback: %s\n", kvt_errdetail());
		free(h);
		return NULL;
	}
	return h;
}

static void test_copies(kvti_dev *d)
{
	const size_t n = 3u << 20;
	uint8_t *h, *back;
	void *a = NULL, *b = NULL, *reg;
	kvti_dev_stream *s;

	h = malloc(n);
	reg = malloc(n);
	CHECK_OK(OPS(d)->alloc(d, n, &a));
	CHECK_OK(OPS(d)->alloc(d, n, &b));
	CHECK_OK(OPS(d)->host_register(d, reg, n, KVTI_DEV_HOST_PORTABLE));
	CHECK_ERR(OPS(d)->host_register(d, reg, n, KVTI_DEV_HOST_PORTABLE),
		  -EEXIST);
	CHECK_OK(OPS(d)->stream_create(d, 1, &s));
	fill(h, n);
	memcpy(reg, h, n);
	CHECK_OK(OPS(d)->copy(s, a, reg, n));
	CHECK_OK(OPS(d)->copy(s, b, a, n));
	CHECK_OK(OPS(d)->stream_sync(s));
	back = readback(d, b, n);
	CHECK(back && !memcmp(back, h, n));
	free(back);
	/* batched: 100 pieces scattered back into registered memory */
	{
		void *dst[100];
		const void *src[100];
		size_t len[100], off = 0;

		memset(reg, 0, n);
		for (int i = 0; i < 100; i++) {
			len[i] = 1 + next() % 20000;
			src[i] = (uint8_t *)b + off;
			dst[i] = (uint8_t *)reg + off;
			off += len[i] + 17;
		}
		CHECK_OK(kvti_dev_copy_batch(d, s, dst, src, len, 100));
		CHECK_OK(OPS(d)->stream_sync(s));
		off = 0;
		for (int i = 0; i < 100; i++) {
			CHECK(!memcmp((uint8_t *)reg + off, h + off, len[i]));
			off += len[i] + 17;
		}
	}
	OPS(d)->stream_destroy(s);
	OPS(d)->host_unregister(d, reg);
	OPS(d)->free(d, a);
	OPS(d)->free(d, b);
	free(h);
	free(reg);
}

/* The gather: chunks scattered from registered host memory into device
 * memory and gathered back, against memcpy. */
static void test_gather(kvti_dev *d)
{
	static const size_t sizes[] = { 16, 64, 4096, 8192 + 16, 65536, 1000,
					17, 3 };
	const size_t n = 256, cap = 70000;
	uint8_t *host = NULL, *want = malloc(n * cap), *back;
	void **dst = NULL, **src = NULL, *dev = NULL, *hdev;
	kvti_dev_stream *s;
	kvti_dev_event *ev;

	CHECK_OK(OPS(d)->host_alloc(d, n * cap, (void **)&host));
	CHECK_OK(OPS(d)->host_alloc(d, n * sizeof(void *), (void **)&dst));
	CHECK_OK(OPS(d)->host_alloc(d, n * sizeof(void *), (void **)&src));
	CHECK_OK(OPS(d)->alloc(d, n * cap, &dev));
	CHECK_OK(OPS(d)->stream_create(d, 1, &s));
	CHECK_OK(OPS(d)->event_create(d, 0, &ev));
	if (!host || !dst || !src || !dev || !want)
		goto out;
	CHECK_OK(kvti_dev_host_devptr(d, host, &hdev));
	for (size_t si = 0; si < KVT_ARRAY_SIZE(sizes); si++) {
		size_t bytes = sizes[si];
		int odd = bytes % 16 != 0;

		fill(host, n * cap);
		memset(want, 0, n * cap);
		CHECK_OK(kvti_dev_copy_sync(d, dev, want, n * cap));
		/* chunk i of host goes to a shuffled place on the device */
		for (size_t i = 0; i < n; i++) {
			size_t to = (i * 37) % n;

			src[i] = (uint8_t *)hdev + i * cap + (odd ? i % 7 : 0);
			dst[i] = (uint8_t *)dev + to * cap;
			memcpy(want + to * cap, host + i * cap + (odd ? i % 7 : 0),
			       bytes);
		}
		kvti_dev_gather g = { .dst = dst, .src = (const void *const *)src,
				      .n = n, .bytes = bytes, .blocks = 2 };
		CHECK_OK(OPS(d)->gather(s, &g));
		CHECK_OK(OPS(d)->event_record(ev, s));
		CHECK_OK(OPS(d)->event_sync(ev, -1));
		back = readback(d, dev, n * cap);
		if (back && memcmp(back, want, n * cap)) {
			fprintf(stderr, "%s: gather of %zu-byte chunks differs\n",
				d->name, bytes);
			kvt_test_failures++;
		}
		free(back);
	}
out:
	OPS(d)->event_destroy(ev);
	OPS(d)->stream_destroy(s);
	OPS(d)->free(d, dev);
	OPS(d)->host_free(d, host);
	OPS(d)->host_free(d, dst);
	OPS(d)->host_free(d, src);
	free(want);
}

static void test_sum(kvti_dev *d)
{
	static const uint64_t lens[] = { 1, 8, 100, 120, 121, 240, 500, 1024,
					 4096, 32768, 65536 + 8 };
	const size_t items = 24;
	const uint64_t cap = 65536 + 64;
	uint8_t *host = malloc(items * 8 * cap), *cat = malloc(8 * cap);
	void *dev = NULL, **seg = NULL;
	uint64_t *out = NULL;
	kvti_dev_stream *s;

	CHECK_OK(OPS(d)->alloc(d, items * 8 * cap, &dev));
	CHECK_OK(OPS(d)->host_alloc(d, items * 8 * sizeof(void *), (void **)&seg));
	CHECK_OK(OPS(d)->host_alloc(d, items * sizeof(uint64_t), (void **)&out));
	CHECK_OK(OPS(d)->stream_create(d, 0, &s));
	if (!host || !cat || !dev || !seg || !out)
		goto out;
	fill(host, items * 8 * cap);
	CHECK_OK(kvti_dev_copy_sync(d, dev, host, items * 8 * cap));
	for (size_t li = 0; li < KVT_ARRAY_SIZE(lens); li++)
		for (uint32_t nseg = 1; nseg <= 8; nseg = nseg * 2 + (nseg == 2)) {
			uint64_t len = lens[li];

			/* item i: segments at scattered places */
			for (size_t i = 0; i < items; i++)
				for (uint32_t k = 0; k < nseg; k++)
					seg[i * nseg + k] = (uint8_t *)dev +
						((i * 8 + (k * 5 + i) % 8) * cap);
			kvti_dev_sum g = { .seg = (const void *const *)seg,
					   .nseg = nseg, .seg_len = len,
					   .nitems = items, .out = out };
			CHECK_OK(OPS(d)->sum(s, &g));
			CHECK_OK(OPS(d)->stream_sync(s));
			for (size_t i = 0; i < items; i++) {
				uint64_t want;

				for (uint32_t k = 0; k < nseg; k++)
					memcpy(cat + k * len, host +
					       ((uint8_t *)seg[i * nseg + k] -
						(uint8_t *)dev), len);
				want = XXH3_64bits(cat, nseg * len);
				if (out[i] != want) {
					fprintf(stderr, "%s: sum of %u x %llu "
						"bytes (item %zu) differs\n",
						d->name, nseg,
						(unsigned long long)len, i);
					kvt_test_failures++;
					break;
				}
			}
		}
out:
	OPS(d)->stream_destroy(s);
	OPS(d)->free(d, dev);
	OPS(d)->host_free(d, seg);
	OPS(d)->host_free(d, out);
	free(host);
	free(cat);
}

/* Stream B waits on an event recorded after A's copy: B's copy of A's
 * destination sees A's bytes. */
static void test_events(kvti_dev *d)
{
	const size_t n = 8u << 20;
	uint8_t *h = malloc(n), *back;
	void *a = NULL, *b = NULL, *c = NULL;
	kvti_dev_stream *sa, *sb;
	kvti_dev_event *ev;

	CHECK_OK(OPS(d)->alloc(d, n, &a));
	CHECK_OK(OPS(d)->alloc(d, n, &b));
	CHECK_OK(OPS(d)->alloc(d, n, &c));
	CHECK_OK(OPS(d)->stream_create(d, 0, &sa));
	CHECK_OK(OPS(d)->stream_create(d, 1, &sb));
	CHECK_OK(OPS(d)->event_create(d, 0, &ev));
	CHECK_EQ(OPS(d)->event_query(ev), 1); /* never recorded: complete */
	fill(h, n);
	CHECK_OK(kvti_dev_copy_sync(d, a, h, n));
	if (d->caps & KVTI_DEV_CAP_EMULATED)
		kvti_dev_emu_set_delay(d, 20u * 1000 * 1000); /* 20 ms/MiB */
	for (int k = 0; k < 4; k++) /* a long chain on A */
		CHECK_OK(OPS(d)->copy(sa, b, a, n));
	CHECK_OK(OPS(d)->event_record(ev, sa));
	CHECK_OK(OPS(d)->stream_wait_event(sb, ev));
	CHECK_OK(OPS(d)->copy(sb, c, b, n));
	if (d->caps & KVTI_DEV_CAP_EMULATED)
		CHECK_EQ(OPS(d)->event_query(ev), 0); /* still copying */
	CHECK_OK(OPS(d)->stream_sync(sb));
	kvti_dev_emu_set_delay(d, 0);
	CHECK_EQ(OPS(d)->event_query(ev), 1);
	back = readback(d, c, n);
	CHECK(back && !memcmp(back, h, n));
	free(back);
	OPS(d)->event_destroy(ev);
	OPS(d)->stream_destroy(sa);
	OPS(d)->stream_destroy(sb);
	OPS(d)->free(d, a);
	OPS(d)->free(d, b);
	OPS(d)->free(d, c);
	free(h);
}

struct setter {
	uint32_t *word;
	uint32_t v;
	int ms;
};

static void *set_later(void *arg)
{
	struct setter *s = arg;

	usleep((useconds_t)s->ms * 1000);
	__atomic_store_n(s->word, s->v, __ATOMIC_RELEASE);
	return NULL;
}

/* A copy behind a stream wait on a host word runs only once the word has
 * reached the value (cyclic GEQ). */
static void test_wait_value(kvti_dev *d)
{
	const size_t n = 1u << 20;
	uint32_t *word = NULL;
	uint8_t *h = malloc(n), *back;
	void *a = NULL, *b = NULL;
	kvti_dev_stream *s;
	kvti_dev_event *ev;
	struct setter st;
	pthread_t th;

	if (!(d->caps & KVTI_DEV_CAP_WAIT_VALUE)) {
		fprintf(stderr, "%s: no stream value waits: skipped\n", d->name);
		free(h);
		return;
	}
	CHECK_OK(OPS(d)->host_alloc(d, 64, (void **)&word));
	CHECK_OK(OPS(d)->alloc(d, n, &a));
	CHECK_OK(OPS(d)->alloc(d, n, &b));
	CHECK_OK(OPS(d)->stream_create(d, 1, &s));
	CHECK_OK(OPS(d)->event_create(d, 0, &ev));
	if (!word || !a || !b)
		return;
	fill(h, n);
	CHECK_OK(kvti_dev_copy_sync(d, a, h, n));
	/* the stream word of a job: gen << 20 | layers; wait for layer 3 of
	 * generation 5, starting at generation 4's end */
	*word = (4u << 20) | 0xfffff;
	CHECK_OK(kvti_dev_stream_wait_value(d, s, word, (5u << 20) | 3));
	CHECK_OK(OPS(d)->copy(s, b, a, n));
	CHECK_OK(OPS(d)->event_record(ev, s));
	usleep(50 * 1000);
	CHECK_EQ(OPS(d)->event_query(ev), 0);
	__atomic_store_n(word, (5u << 20) | 2, __ATOMIC_RELEASE);
	usleep(30 * 1000);
	CHECK_EQ(OPS(d)->event_query(ev), 0);
	st = (struct setter){ word, (5u << 20) | 3, 20 };
	pthread_create(&th, NULL, set_later, &st);
	CHECK_OK(OPS(d)->event_sync(ev, 5ll * 1000 * 1000 * 1000));
	pthread_join(th, NULL);
	back = readback(d, b, n);
	CHECK(back && !memcmp(back, h, n));
	free(back);
	/* a later generation satisfies an old wait at once (wraps too) */
	*word = 0x00000003u;
	CHECK_OK(kvti_dev_stream_wait_value(d, s, word, 0xfff00005u));
	CHECK_OK(OPS(d)->event_record(ev, s));
	CHECK_OK(OPS(d)->event_sync(ev, 5ll * 1000 * 1000 * 1000));
	OPS(d)->event_destroy(ev);
	OPS(d)->stream_destroy(s);
	OPS(d)->free(d, a);
	OPS(d)->free(d, b);
	OPS(d)->host_free(d, word);
	free(h);
}

static void sleep_400ms(void *arg)
{
	(void)arg;
	usleep(400 * 1000);
}

static void bump(void *arg)
{
	atomic_fetch_add((_Atomic int *)arg, 1);
}

/* The emulated device's own behaviour. */
static void test_emu_only(kvti_dev *d)
{
	const size_t n = 1u << 20;
	uint8_t *stray = calloc(1, n), zero[64] = { 0 };
	void *a = NULL;
	kvti_dev_stream *s;
	kvti_dev_event *ev;
	kvti_dev_stat st0, st1;
	kvti_dev_handle h;
	uint64_t off;
	_Atomic int calls = 0;
	void *imp = NULL;
	int fd = -1;

	CHECK_OK(OPS(d)->alloc(d, n, &a));
	CHECK_OK(OPS(d)->stream_create(d, 0, &s));
	CHECK_OK(OPS(d)->event_create(d, 0, &ev));
	kvti_dev_stat_get(d, &st0);
	/* a write into memory the device does not know: refused */
	CHECK_OK(OPS(d)->copy(s, stray, a, n));
	CHECK_OK(OPS(d)->event_record(ev, s));
	CHECK_ERR(OPS(d)->event_sync(ev, -1), -EFAULT);
	CHECK(strstr(kvt_errdetail(), "not device memory") != NULL);
	CHECK(!memcmp(stray, zero, sizeof(zero)));
	kvti_dev_stat_get(d, &st1);
	CHECK_EQ(st1.faults, st0.faults + 1);
	/* the next record is clean again */
	CHECK_OK(OPS(d)->event_record(ev, s));
	CHECK_OK(OPS(d)->event_sync(ev, -1));
	/* import our own allocation (a second mapping), queue two slow
	 * copies into it, release while the first is in its DMA time: both
	 * fault, neither writes into the unmapped range */
	CHECK_OK(kvti_dev_export_mem(d, (uint8_t *)a + 100, &h, &off));
	CHECK_EQ(off, 100);
	fd = dup(h.fd);
	h.fd = fd;
	CHECK_OK(kvti_dev_import(d, &h, &imp));
	CHECK_OK(kvti_dev_import(d, &h, &imp)); /* counted, one mapping */
	kvti_dev_unimport(d, imp);
	/* 1 s per MiB: the first copy is still in its DMA time when the
	 * release comes even if this thread is descheduled for most of a
	 * second (at 200 ms a loaded machine let it land first: one fault) */
	kvti_dev_emu_set_delay(d, 1000u * 1000 * 1000);
	CHECK_OK(OPS(d)->copy(s, imp, a, n));
	CHECK_OK(OPS(d)->copy(s, imp, a, n));
	CHECK_OK(OPS(d)->event_record(ev, s));
	usleep(50 * 1000);
	kvti_dev_unimport(d, imp); /* waits for the running copy */
	kvti_dev_emu_set_delay(d, 0);
	CHECK_ERR(OPS(d)->event_sync(ev, -1), -EFAULT);
	kvti_dev_stat_get(d, &st0);
	CHECK_EQ(st0.faults, st1.faults + 2);
	CHECK_EQ(st0.live_imports, 0);
	close(fd);
	/* host functions run in stream order */
	for (int i = 0; i < 10; i++)
		CHECK_OK(kvti_dev_host_fn(d, s, bump, (void *)&calls));
	CHECK_OK(OPS(d)->stream_sync(s));
	CHECK_EQ(atomic_load(&calls), 10);
	/* waits give up at the wait limit: a value that never comes fails
	 * the stream's next event; a stream waiting on an event that stays
	 * incomplete (a long "kernel" on another stream) fails its own */
	{
		kvti_dev_event *never, *slow;
		kvti_dev_stream *s2, *s3;
		uint32_t *w;

		CHECK_OK(OPS(d)->event_create(d, 0, &never));
		CHECK_OK(OPS(d)->event_create(d, 0, &slow));
		CHECK_OK(OPS(d)->stream_create(d, 0, &s2));
		CHECK_OK(OPS(d)->stream_create(d, 0, &s3));
		CHECK_OK(OPS(d)->host_alloc(d, 64, (void **)&w));
		*w = 0;
		kvti_dev_emu_set_wait_limit(d, 150u * 1000 * 1000);
		CHECK_OK(kvti_dev_stream_wait_value(d, s2, w, 1));
		CHECK_OK(OPS(d)->event_record(never, s2));
		CHECK_ERR(OPS(d)->event_sync(never, -1), -ETIMEDOUT);
		CHECK_OK(kvti_dev_host_fn(d, s3, sleep_400ms, NULL));
		CHECK_OK(OPS(d)->event_record(slow, s3));
		CHECK_OK(OPS(d)->stream_wait_event(s, slow));
		CHECK_OK(OPS(d)->event_record(ev, s));
		CHECK_ERR(OPS(d)->event_sync(ev, -1), -ETIMEDOUT);
		CHECK_OK(OPS(d)->event_sync(slow, -1));
		kvti_dev_emu_set_wait_limit(d, 60ull * 1000 * 1000 * 1000);
		OPS(d)->stream_destroy(s2);
		OPS(d)->stream_destroy(s3);
		OPS(d)->event_destroy(never);
		OPS(d)->event_destroy(slow);
		OPS(d)->host_free(d, w);
	}
	OPS(d)->event_destroy(ev);
	OPS(d)->stream_destroy(s);
	OPS(d)->free(d, a);
	free(stray);
}

static void run_device(int id)
{
	kvti_dev *d;
	char name[32];
	int err = kvti_dev_get(id, &d);

	if (err) {
		fprintf(stderr, "%s: %s: skipped\n",
			kvt_device_format(id, name, sizeof(name)), kvt_errdetail());
		return;
	}
	fprintf(stderr, "device %s\n", d->name);
	test_copies(d);
	test_gather(d);
	test_sum(d);
	test_events(d);
	test_wait_value(d);
	if (d->caps & KVTI_DEV_CAP_EMULATED)
		test_emu_only(d);
	/* a second reference is the same device */
	{
		kvti_dev *again;

		CHECK_OK(kvti_dev_get(id, &again));
		CHECK(again == d);
		kvti_dev_put(again);
	}
	kvti_dev_put(d);
}

int main(void)
{
	int id = -1;
	char buf[16];

	CHECK_OK(kvt_device_parse("emu", &id));
	CHECK_EQ(id, KVT_DEVICE_EMU);
	CHECK_OK(kvt_device_parse("emu:3", &id));
	CHECK_EQ(id, KVT_DEVICE_EMU + 3);
	CHECK_OK(kvt_device_parse("cuda:1", &id));
	CHECK_EQ(id, 1);
	CHECK_OK(kvt_device_parse("2", &id));
	CHECK_EQ(id, 2);
	CHECK_OK(kvt_device_parse("host", &id));
	CHECK_EQ(id, KVT_DEVICE_HOST);
	CHECK_ERR(kvt_device_parse("emu:99", &id), -EINVAL);
	CHECK_ERR(kvt_device_parse("gpu0", &id), -EINVAL);
	CHECK(!strcmp(kvt_device_format(KVT_DEVICE_EMU + 2, buf, sizeof(buf)),
		      "emu:2"));
	CHECK_ERR(kvti_dev_get(KVT_DEVICE_EMU + KVT_DEVICE_EMU_MAX, &(kvti_dev *){ 0 }),
		  -EINVAL);
	run_device(KVT_DEVICE_EMU);
	for (int g = 0; g < 16; g++) {
		kvti_dev *d;

		if (kvti_dev_get(g, &d))
			break;
		kvti_dev_put(d);
		run_device(g);
	}
	TEST_DONE();
}
