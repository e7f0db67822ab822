/*
 * test_sim_net — the simulator's fluid network: completion times on one
 * and on shared links, max-min fairness checked against its definition on
 * random flow sets, conservation of bytes, and the DRAM contention model
 * (stressors slow DMA streams, more stressors never help, traffic stays
 * within the memory's sustainable rate); the transfer engine's lanes (one
 * flow at a time, FIFO per priority, a higher priority takes the lane).
 */
#include "harness.h"
#include "sim/net.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>

static int near(double a, double b, double rel)
{
	return fabs(a - b) <= rel * fabs(b) + 1e-12;
}

struct seen {
	int n;
	double t[16];
	uint64_t tag[16];
};

static void on_done(void *arg, struct net_flow *f, double now)
{
	struct seen *s = arg;

	if (s->n < 16) {
		s->t[s->n] = now;
		s->tag[s->n] = f->tag;
	}
	s->n++;
}

static int g_lane = -1, g_prio; /* flow(): the lane of the next flows */

static struct net_flow *flow(struct net *n, double bytes, double cap,
			     int socket, struct seen *s, uint64_t tag,
			     int nres, ...)
{
	struct net_flow *f = kvti_net_flow_new(n);
	va_list ap;

	f->lane = g_lane;
	f->prio = g_prio;
	f->total = bytes;
	f->cap = cap;
	f->socket = socket;
	f->done = on_done;
	f->arg = s;
	f->tag = tag;
	va_start(ap, nres);
	for (int i = 0; i < nres; i++)
		f->res[f->nres++] = (uint32_t)va_arg(ap, int);
	va_end(ap);
	CHECK_OK(kvti_net_flow_start(n, f));
	return f;
}

/* Run the net until idle; returns the time. */
static double drain(struct net *n)
{
	double t;

	while (isfinite(t = kvti_net_next(n)))
		kvti_net_complete(n, t);
	return n->now;
}

static void test_links(void)
{
	struct net n;
	struct seen s = { 0 };
	int a, b;

	kvti_net_init(&n, 1.0, 10e9);
	a = kvti_net_add_res(&n, "a", 10e9);
	b = kvti_net_add_res(&n, "b", 4e9);
	/* one flow alone: bytes / capacity */
	flow(&n, 20e9, 0, -1, &s, 1, 1, a);
	kvti_net_solve(&n);
	CHECK(near(drain(&n), 2.0, 1e-9));
	CHECK_EQ(s.n, 1);
	/* two flows share a: 5 GB/s each until the small one ends, then the
	 * big one takes all: both done at (10 + 30) / 10 = 4 s more */
	flow(&n, 10e9, 0, -1, &s, 2, 1, a);
	flow(&n, 30e9, 0, -1, &s, 3, 1, a);
	kvti_net_solve(&n);
	drain(&n);
	CHECK_EQ(s.n, 3);
	CHECK(near(s.t[1], 2.0 + 2.0, 1e-9));
	CHECK(near(s.t[2], 2.0 + 4.0, 1e-9));
	CHECK_EQ(s.tag[1], 2);
	/* max-min: a flow through a and b is held to 4 by b, the other one
	 * on a alone gets the remaining 6 */
	{
		struct net_flow *x = flow(&n, 1e9, 0, -1, &s, 4, 2, a, b);
		struct net_flow *y = flow(&n, 1e9, 0, -1, &s, 5, 1, a);

		kvti_net_solve(&n);
		CHECK(near(x->rate, 4e9, 1e-9));
		CHECK(near(y->rate, 6e9, 1e-9));
		drain(&n);
	}
	/* a flow's own cap holds and leaves the rest to the other */
	{
		struct net_flow *x = flow(&n, 1e9, 1e9, -1, &s, 6, 1, a);
		struct net_flow *y = flow(&n, 1e9, 0, -1, &s, 7, 1, a);

		kvti_net_solve(&n);
		CHECK(near(x->rate, 1e9, 1e-9));
		CHECK(near(y->rate, 9e9, 1e-9));
		drain(&n);
	}
	/* a zero-byte flow completes at once */
	flow(&n, 0, 0, -1, &s, 8, 1, a);
	kvti_net_solve(&n);
	CHECK_EQ(kvti_net_next(&n), n.now);
	kvti_net_complete(&n, n.now);
	CHECK_EQ(n.nact, 0);
	/* conservation: every resource let out what it took in */
	for (uint32_t r = 0; r < n.nres; r++)
		CHECK(near(n.res[r].bytes_in, n.res[r].bytes_out, 1e-12));
	CHECK(near(n.res[a].bytes_in, 20e9 + 40e9 + 2e9 + 2e9, 1e-12));
	CHECK(n.res[a].busy_s <= n.now + 1e-9);
	kvti_net_fini(&n);
}

/* Max-min fairness by its definition: every flow is at its cap or crosses
 * a full resource on which no flow has a higher rate. */
static void test_maxmin_random(void)
{
	uint64_t seed = 99;

	for (int round = 0; round < 300; round++) {
		struct net n;
		struct seen s = { 0 };
		struct net_flow *f[12];
		int res[6], nf = 1 + (int)(test_rand(&seed) % 12), bad = 0;

		kvti_net_init(&n, 1.0, 10e9);
		for (int r = 0; r < 6; r++)
			res[r] = kvti_net_add_res(&n, "r",
				(1 + test_rand(&seed) % 100) * 1e9);
		for (int i = 0; i < nf; i++) {
			double cap = test_rand(&seed) % 3 ?
				0 : (1 + test_rand(&seed) % 50) * 1e9;
			int k = 1 + (int)(test_rand(&seed) % 3);

			f[i] = kvti_net_flow_new(&n);
			f[i]->total = 1e9;
			f[i]->cap = cap;
			f[i]->done = on_done;
			f[i]->arg = &s;
			for (int j = 0; j < k; j++) {
				int r = res[test_rand(&seed) % 6];
				int dup = 0;

				for (uint32_t q = 0; q < f[i]->nres; q++)
					dup |= (int)f[i]->res[q] == r;
				if (!dup)
					f[i]->res[f[i]->nres++] = (uint32_t)r;
			}
			CHECK_OK(kvti_net_flow_start(&n, f[i]));
		}
		kvti_net_solve(&n);
		for (uint32_t r = 0; r < n.nres; r++) {
			double sum = 0;

			for (int i = 0; i < nf; i++)
				for (uint32_t q = 0; q < f[i]->nres; q++)
					if (f[i]->res[q] == r)
						sum += f[i]->rate;
			bad |= sum > n.res[r].cap * (1 + 1e-9);
		}
		for (int i = 0; i < nf; i++) {
			int ok = f[i]->cap > 0 &&
				 f[i]->rate >= f[i]->cap * (1 - 1e-9);

			for (uint32_t q = 0; q < f[i]->nres && !ok; q++) {
				uint32_t r = f[i]->res[q];
				double sum = 0, top = 0;

				for (int j = 0; j < nf; j++)
					for (uint32_t w = 0; w < f[j]->nres; w++)
						if (f[j]->res[w] == r) {
							sum += f[j]->rate;
							top = KVT_MAX(top, f[j]->rate);
						}
				ok = sum >= n.res[r].cap * (1 - 1e-9) &&
				     f[i]->rate >= top * (1 - 1e-9);
			}
			bad |= !ok;
		}
		CHECK(!bad);
		drain(&n);
		CHECK_EQ(s.n, nf);
		kvti_net_fini(&n);
		if (bad)
			break;
	}
}

/* DMA rate of one 54 GB/s stream from DRAM with @stress stressors. */
static double dma_rate(uint32_t stress, double *stress_rate, double *traffic)
{
	struct net n;
	struct seen s = { 0 };
	struct net_flow *f;
	int link, sock;
	double r;

	kvti_net_init(&n, 1.0, 10e9);
	sock = kvti_net_add_socket(&n, "dram0", 160e9, 110e-9);
	link = kvti_net_add_port(&n, "gpu0.h2d", 54e9, sock, 700e-9);
	kvti_net_set_stress(&n, (uint32_t)sock, stress);
	f = flow(&n, 1e9, 54e9, sock, &s, 1, 1, link);
	kvti_net_solve(&n);
	r = f->rate;
	*stress_rate = n.sock[sock].stress_rate;
	*traffic = r + stress * 2 * n.sock[sock].stress_rate;
	drain(&n);
	CHECK(n.stress_bytes > 0 || stress == 0);
	kvti_net_fini(&n);
	return r;
}

static void test_dram(void)
{
	double prev = INFINITY, prev_s = INFINITY, sr, traffic, r;

	/* alone, the stream runs near the link rate (a little queueing) */
	r = dma_rate(0, &sr, &traffic);
	CHECK(r > 0.9 * 54e9 && r <= 54e9);
	for (uint32_t k = 0; k <= 64; k += 4) {
		r = dma_rate(k, &sr, &traffic);
		CHECK(r <= prev * (1 + 1e-9));     /* more stress never helps */
		CHECK(sr <= prev_s * (1 + 1e-9));
		CHECK(traffic <= 160e9 * (1 + 1e-6)); /* within capacity */
		prev = r;
		prev_s = sr;
	}
	/* 32 stressors want 640 GB/s of a 160 GB/s memory: the stream loses
	 * a good share of its rate, the stressors most of theirs */
	r = dma_rate(32, &sr, &traffic);
	CHECK(r < 0.8 * 54e9 && r > 0.1 * 54e9);
	CHECK(sr < 0.3 * 10e9);
	CHECK(traffic > 0.9 * 160e9);
}

/* One lane: a second load submitted while the first runs waits for it
 * (done at the first's bytes + its own, not at the shared-rate time);
 * priorities take the lane; two lanes share their resources. */
static void test_lanes(void)
{
	struct net n;
	struct seen s = { 0 };
	struct net_flow *a, *b, *lo, *mid, *hi, *x, *y;
	int r, L, L2;

	kvti_net_init(&n, 1.0, 10e9);
	r = kvti_net_add_res(&n, "copy", 10e9);
	CHECK((L = kvti_net_add_lane(&n, "cpu")) >= 0);
	CHECK((L2 = kvti_net_add_lane(&n, "io")) >= 0);
	g_lane = L;
	g_prio = 0;
	a = flow(&n, 10e9, 0, -1, &s, 1, 1, r);
	kvti_net_solve(&n);
	CHECK(near(a->rate, 10e9, 1e-9));
	kvti_net_complete(&n, 0.5);
	b = flow(&n, 2e9, 0, -1, &s, 2, 1, r);
	kvti_net_solve(&n);
	CHECK(b->waiting && b->rate == 0);
	CHECK(near(a->rate, 10e9, 1e-9)); /* not shared: a runs alone */
	CHECK(near(kvti_net_eta(&n, a), 1.0, 1e-9));
	CHECK(near(kvti_net_eta(&n, b), 1.2, 1e-9)); /* behind a's 5 GB */
	CHECK_EQ(n.res[r].nactive, 1);
	drain(&n);
	CHECK_EQ(s.n, 2);
	CHECK_EQ(s.tag[0], 1);
	CHECK(near(s.t[0], 1.0, 1e-9)); /* fluid sharing: 1.2 */
	CHECK(near(s.t[1], 1.2, 1e-9)); /* fluid sharing: 0.9 */
	CHECK(near(n.lane[L].wait_s, 0.5, 1e-9));

	/* priorities: a demotion (2) runs, a store (1) and then a load (0)
	 * arrive together: the store takes the lane, the load takes it from
	 * the store; done in the order load, store, demotion */
	g_prio = 2;
	lo = flow(&n, 10e9, 0, -1, &s, 3, 1, r);
	kvti_net_solve(&n);
	kvti_net_complete(&n, n.now + 0.5);
	g_prio = 1;
	mid = flow(&n, 1e9, 0, -1, &s, 4, 1, r);
	g_prio = 0;
	hi = flow(&n, 2e9, 0, -1, &s, 5, 1, r);
	kvti_net_solve(&n);
	CHECK(lo->waiting && mid->waiting && !hi->waiting);
	CHECK(near(hi->rate, 10e9, 1e-9));
	CHECK(near(kvti_net_eta(&n, mid), 1.2 + 0.5 + 0.3, 1e-9));
	CHECK(near(kvti_net_eta(&n, lo), 1.2 + 0.5 + 0.8, 1e-9));
	CHECK_EQ(n.lane[L].preempted, 2);
	drain(&n);
	CHECK_EQ(s.n, 5);
	CHECK_EQ(s.tag[2], 5);
	CHECK_EQ(s.tag[3], 4);
	CHECK_EQ(s.tag[4], 3);
	CHECK(near(s.t[2], 1.2 + 0.7, 1e-9));
	CHECK(near(s.t[3], 1.2 + 0.8, 1e-9));
	CHECK(near(s.t[4], 1.2 + 1.3, 1e-9)); /* its 5 GB left after 0.3 s */

	/* two lanes run at once and share the copy resource; a flow of no
	 * lane shares it too */
	x = flow(&n, 1e9, 0, -1, &s, 6, 1, r);
	g_lane = L2;
	y = flow(&n, 1e9, 0, -1, &s, 7, 1, r);
	kvti_net_solve(&n);
	CHECK(near(x->rate, 5e9, 1e-9) && near(y->rate, 5e9, 1e-9));
	drain(&n);
	CHECK_EQ(s.n, 7);
	CHECK(near(n.res[r].bytes_in, n.res[r].bytes_out, 1e-12));
	CHECK_EQ(n.res[r].nactive, 0);
	CHECK(!n.lane[L].cur && !n.lane[L2].cur);

	/* a lane that does not exist, a priority out of range */
	g_lane = 7;
	{
		struct net_flow *f = kvti_net_flow_new(&n);

		f->lane = 7;
		f->total = 1;
		CHECK_EQ(kvti_net_flow_start(&n, f), -EINVAL);
		f = kvti_net_flow_new(&n);
		f->lane = L;
		f->prio = NET_NPRIO;
		f->total = 1;
		CHECK_EQ(kvti_net_flow_start(&n, f), -EINVAL);
	}
	g_lane = -1;
	g_prio = 0;
	kvti_net_fini(&n);
}

int main(void)
{
	test_links();
	test_maxmin_random();
	test_dram();
	test_lanes();
	TEST_DONE();
}
