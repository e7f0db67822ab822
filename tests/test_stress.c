/*
 * test_stress — the memory stressor: threads copy and report their own
 * rates; a duration stops them by themselves; stop is prompt; bad counts,
 * sizes and durations are refused; more memory than the machine has is
 * refused up front (no thread started, nothing mapped).
 */
#include "harness.h"

#include <unistd.h>

int main(void)
{
	kvt_stress_stat st, fin;
	kvt_stress *s;
	uint64_t t0;
	int64_t live = kvt_alloc_live();

	CHECK_ERR(kvt_stress_start(&s, 0, 1 << 20, 0), -EINVAL);
	CHECK_ERR(kvt_stress_start(&s, KVT_STRESS_MAX_THREADS + 1, 1 << 20, 0),
		  -EINVAL);
	CHECK_ERR(kvt_stress_start(&s, 1, 4096, 0), -EINVAL);
	CHECK_ERR(kvt_stress_start(&s, 1, 1 << 20, -1), -EINVAL);
	CHECK_ERR(kvt_stress_start(&s, 2, 1ull << 45, 0), -ENOMEM);
	CHECK(strstr(kvt_errdetail(), "available") != NULL);

	/* runs until stopped; every thread copies */
	CHECK_OK(kvt_stress_start(&s, 2, 4 << 20, 0));
	usleep(200000);
	kvt_stress_sample(s, &st);
	CHECK_EQ(st.threads, 2);
	CHECK_EQ(st.running, 2);
	CHECK(st.seconds > 0.1);
	CHECK(st.thread_gbps[0] > 0 && st.thread_gbps[1] > 0);
	CHECK(st.gbps > 0.01);
	CHECK(st.bytes >= 2 * (4 << 20));
	t0 = kvt_now_ns();
	kvt_stress_stop(s, &fin);
	CHECK((kvt_now_ns() - t0) / 1e9 < 2.0); /* prompt, even under ASan */
	CHECK_EQ(fin.running, 0);
	CHECK(fin.bytes >= st.bytes);
	fprintf(stderr, "2 stressors: %.2f + %.2f GB/s\n", fin.thread_gbps[0],
		fin.thread_gbps[1]);

	/* a duration stops them by themselves */
	CHECK_OK(kvt_stress_start(&s, 1, 2 << 20, 0.2));
	t0 = kvt_now_ns();
	do {
		usleep(20000);
		kvt_stress_sample(s, &st);
	} while (st.running && (kvt_now_ns() - t0) / 1e9 < 10);
	CHECK_EQ(st.running, 0);
	CHECK(st.seconds < 5);
	kvt_stress_stop(s, NULL);
	kvt_stress_stop(NULL, NULL);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
