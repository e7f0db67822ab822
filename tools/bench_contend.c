/*
 * bench_contend.c — kvtier bench contend: one tenant's lookup latency
 * while another tenant's stores force synchronous evictions.
 *
 * Setup (untimed): a cache over a dram and an ssd tier, no background
 * demotion (every store that finds no room evicts in its own call).
 * Tenant A stores one prompt of --lookup-pages pages into dram; tenant B
 * gets quotas that leave A's pages alone: its dram quota is the rest of
 * dram, its ssd quota the ssd tier. Then each repeat, in alternating order:
 *
 *   idle       one thread looks up A's prompt (kvt_cache_lookup, every
 *              key, no touch) back to back for --seconds, timing each call
 *   contended  the same, while --writers threads store fresh prompts of
 *              --store-pages pages for B, each store waited for: once B is
 *              at its dram quota every store demotes as many of B's pages
 *              to ssd in the store's job (and, at its ssd quota, drops
 *              B's oldest ssd pages), copying real bytes
 *
 * Reported: per phase the lookup p50 and p99 (medians over repeats, with
 * the spread), contended_p99_vs_idle = the per-repeat ratio of the two
 * p99s (median, min, max), the stores and demoted pages per second and
 * the stores' own waits for room; the machine's load average before and
 * after. Goal (issue 24): contended p99 within 2x the idle p99.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_REP 32
#define MAX_WRITERS 8
#define MAX_SAMPLES (1u << 20)
#define TENANT_A 1
#define TENANT_B 2

struct topt {
	const char *model, *dir;
	uint64_t page_tokens, lookup_pages, store_pages, dram_pages;
	uint64_t ssd_pages, repeats, writers, threads;
	double seconds;
	int json;
};

/* One phase of one repeat. */
struct phase {
	double p50, p99, max;
	uint64_t lookups;
	uint64_t stores, moved;
	double store_wait_s, secs;
};

struct run {
	int idle_first;
	struct phase idle, busy;
};

struct bench {
	struct topt o;
	kvt_geom g;
	uint64_t page;
	kvt_cache *c;
	kvt_tier *engine;
	kvt_page_key *akeys;
	double *lat;                /* samples of the running phase */
	atomic_int stop;
	atomic_uint_fast64_t seq;   /* B's prompts, for fresh keys */
	atomic_uint_fast64_t stores;
	atomic_int werr;
	pthread_mutex_t wmu;
	double wait_s;              /* wmu: the stores' own waits */
	struct run runs[MAX_REP];
	int nruns;
	double load0[3], load1[3];
	char tiers[512];
};

static double secs(uint64_t t0)
{
	return (kvt_now_ns() - t0) / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(const double *v, uint64_t n, double p)
{
	if (!n)
		return 0;
	return v[(uint64_t)(p * (double)(n - 1) + 0.5)];
}

static void loadavg(double l[3])
{
	FILE *f = fopen("/proc/loadavg", "r");

	l[0] = l[1] = l[2] = -1;
	if (f) {
		if (fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3)
			l[0] = l[1] = l[2] = -1;
		fclose(f);
	}
}

/* ---- setup ---------------------------------------------------------- */

static int open_all(struct bench *b)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	uint64_t w = b->o.store_pages * b->o.writers;
	uint64_t eblocks = b->o.lookup_pages > w ? b->o.lookup_pages : w;
	kvt_tier_spec spec[1];
	const kvt_layout *l;
	char text[128];
	size_t n;
	int err;

	snprintf(text, sizeof(text), "hostdev:%llu,populate",
		 (unsigned long long)(eblocks * b->page));
	if ((err = kvt_tier_spec_parse(text, spec, 1, &n)) ||
	    (err = kvt_tier_open(&b->engine, spec, &b->g)))
		return err;
	l = kvt_tier_layout(b->engine);
	for (uint32_t i = 0; i < l->nbufs; i++)
		memset(kvt_tier_bufs(b->engine)[i], 0x21 + (int)i, l->buf_bytes);
	snprintf(b->tiers, sizeof(b->tiers), "dram:%llu,populate,ssd:%s,%llu",
		 (unsigned long long)(b->o.dram_pages * b->page), b->o.dir,
		 (unsigned long long)(b->o.ssd_pages * b->page));
	cfg.tiers = b->tiers;
	cfg.geom = &b->g;
	cfg.flags = KVT_CACHE_NO_BACKGROUND;
	cfg.xfer_threads = (uint32_t)b->o.threads;
	if ((err = kvt_cache_open(&b->c, &cfg)))
		return err;
	if ((err = kvt_cache_register(b->c, kvt_tier_bufs(b->engine),
				      b->g.layers, l->slots, l->chunk_bytes,
				      l->slots * l->chunk_bytes,
				      (uint64_t)b->g.kv_heads * b->g.head_dim *
					      b->g.dtype_bytes, -1)))
		return err;
	if ((err = kvt_cache_tenant_add(b->c, TENANT_A, 0xa11ce)) ||
	    (err = kvt_cache_tenant_add(b->c, TENANT_B, 0xb0b)))
		return err;
	/* B's pages never push A's out: B evicts its own */
	if ((err = kvt_cache_tenant_quota(b->c, TENANT_B, KVT_TIER_DRAM,
					  b->o.dram_pages -
					  b->o.lookup_pages)) ||
	    (err = kvt_cache_tenant_quota(b->c, TENANT_B, KVT_TIER_SSD,
					  b->o.ssd_pages)))
		return err;
	return 0;
}

static int store_wait(kvt_cache *c, uint32_t tenant, const kvt_page_key *k,
		      size_t n, const uint32_t *blocks, double *wait_s)
{
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	int err = kvt_cache_store(c, tenant, k, n, 0, blocks, &j);

	if (err)
		return err;
	err = kvt_cache_job_wait(j, -1);
	kvt_cache_job_stat_get(j, &st);
	kvt_cache_job_free(j);
	if (wait_s)
		*wait_s = st.wait_s;
	return err;
}

static void fill_keys(kvt_page_key *k, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		k[i].lo = z ^ (z >> 31);
		k[i].hi = seed;
	}
}

static int store_a(struct bench *b)
{
	uint32_t *blk = malloc(b->o.lookup_pages * sizeof(*blk));
	kvt_cache_lookup_result r;
	int err = -ENOMEM;

	if (!blk)
		return err;
	for (uint64_t i = 0; i < b->o.lookup_pages; i++)
		blk[i] = (uint32_t)i;
	fill_keys(b->akeys, b->o.lookup_pages, 1);
	err = store_wait(b->c, TENANT_A, b->akeys, b->o.lookup_pages, blk,
			 NULL);
	free(blk);
	if (!err)
		err = kvt_cache_lookup(b->c, TENANT_A, b->akeys,
				       b->o.lookup_pages, 0, &r);
	if (!err && r.tier_pages[KVT_TIER_DRAM] != b->o.lookup_pages) {
		fprintf(stderr, "kvtier bench contend: %llu of A's %llu pages "
			"in dram after its store\n",
			(unsigned long long)r.tier_pages[KVT_TIER_DRAM],
			(unsigned long long)b->o.lookup_pages);
		err = KVT_EFULL;
	}
	return err;
}

/* ---- the two threads ------------------------------------------------- */

struct writer {
	struct bench *b;
	int id;
	pthread_t th;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	struct bench *b = w->b;
	size_t n = b->o.store_pages;
	kvt_page_key *k = malloc(n * sizeof(*k));
	uint32_t *blk = malloc(n * sizeof(*blk));

	if (!k || !blk) {
		atomic_store(&b->werr, -ENOMEM);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		blk[i] = (uint32_t)(w->id * n + i);
	while (!atomic_load(&b->stop)) {
		double ws = 0;
		int err;

		fill_keys(k, n, 1000 + atomic_fetch_add(&b->seq, 1));
		if ((err = store_wait(b->c, TENANT_B, k, n, blk, &ws))) {
			atomic_store(&b->werr, err);
			break;
		}
		atomic_fetch_add(&b->stores, 1);
		pthread_mutex_lock(&b->wmu);
		b->wait_s += ws;
		pthread_mutex_unlock(&b->wmu);
	}
out:
	free(k);
	free(blk);
	return NULL;
}

/* Look A's prompt up for --seconds; fill @ph. */
static int lookups(struct bench *b, struct phase *ph)
{
	uint64_t t0 = kvt_now_ns(), end = t0 + (uint64_t)(b->o.seconds * 1e9);
	uint64_t n = 0;

	while (n < MAX_SAMPLES) {
		kvt_cache_lookup_result r;
		uint64_t s = kvt_now_ns();
		int err;

		if (s >= end)
			break;
		err = kvt_cache_lookup(b->c, TENANT_A, b->akeys,
				       b->o.lookup_pages, 0, &r);
		b->lat[n++] = (kvt_now_ns() - s) / 1e3;
		if (err)
			return err;
		if (r.pages != b->o.lookup_pages) {
			fprintf(stderr, "kvtier bench contend: a lookup found "
				"%llu of A's %llu pages\n",
				(unsigned long long)r.pages,
				(unsigned long long)b->o.lookup_pages);
			return KVT_ENOTFOUND;
		}
	}
	ph->secs = secs(t0);
	ph->lookups = n;
	qsort(b->lat, n, sizeof(*b->lat), cmp_d);
	ph->p50 = pct(b->lat, n, 0.50);
	ph->p99 = pct(b->lat, n, 0.99);
	ph->max = n ? b->lat[n - 1] : 0;
	return 0;
}

static int phase_run(struct bench *b, struct phase *ph, int busy)
{
	struct writer w[MAX_WRITERS];
	kvt_cache_stat s0, s1;
	int err, nw = 0;

	memset(ph, 0, sizeof(*ph));
	atomic_store(&b->stop, 0);
	atomic_store(&b->stores, 0);
	b->wait_s = 0;
	kvt_cache_stat_get(b->c, &s0);
	for (uint64_t i = 0; busy && i < b->o.writers; i++, nw++) {
		w[i].b = b;
		w[i].id = (int)i;
		if ((err = -pthread_create(&w[i].th, NULL, writer_main, &w[i])))
			break;
	}
	if (busy && nw == (int)b->o.writers)
		usleep(20000); /* the writers at work before timing starts */
	err = nw == (int)(busy ? b->o.writers : 0) ? lookups(b, ph) : -EAGAIN;
	atomic_store(&b->stop, 1);
	for (int i = 0; i < nw; i++)
		pthread_join(w[i].th, NULL);
	kvt_cache_stat_get(b->c, &s1);
	ph->stores = atomic_load(&b->stores);
	ph->moved = s1.move_pages - s0.move_pages;
	ph->store_wait_s = b->wait_s;
	if (!err && atomic_load(&b->werr))
		err = atomic_load(&b->werr);
	return err;
}

/* ---- output ------------------------------------------------------------ */

struct summary {
	double idle_p50, idle_p99, busy_p50, busy_p99, ratio, rmin, rmax;
	double stores_s, moved_s, wait_per_store;
};

static void summarize(const struct bench *b, struct summary *s)
{
	double v[7][MAX_REP] = { { 0 } };
	int n = b->nruns;

	s->rmin = 1e300;
	s->rmax = 0;
	for (int i = 0; i < n; i++) {
		const struct run *r = &b->runs[i];

		v[0][i] = r->idle.p50;
		v[1][i] = r->idle.p99;
		v[2][i] = r->busy.p50;
		v[3][i] = r->busy.p99;
		v[4][i] = r->idle.p99 > 0 ? r->busy.p99 / r->idle.p99 : 0;
		v[5][i] = r->busy.secs > 0 ? r->busy.stores / r->busy.secs : 0;
		v[6][i] = r->busy.secs > 0 ? r->busy.moved / r->busy.secs : 0;
		s->rmin = v[4][i] < s->rmin ? v[4][i] : s->rmin;
		s->rmax = v[4][i] > s->rmax ? v[4][i] : s->rmax;
	}
	s->idle_p50 = cli_median(v[0], n);
	s->idle_p99 = cli_median(v[1], n);
	s->busy_p50 = cli_median(v[2], n);
	s->busy_p99 = cli_median(v[3], n);
	s->ratio = cli_median(v[4], n);
	s->stores_s = cli_median(v[5], n);
	s->moved_s = cli_median(v[6], n);
	{
		double w = 0, st = 0;

		for (int i = 0; i < n; i++) {
			w += b->runs[i].busy.store_wait_s;
			st += (double)b->runs[i].busy.stores;
		}
		s->wait_per_store = st > 0 ? w / st : 0;
	}
}

static void phase_json(cJSON *o, const char *name, const struct phase *p)
{
	cJSON *e = cJSON_AddObjectToObject(o, name);

	cJSON_AddNumberToObject(e, "lookups", (double)p->lookups);
	cJSON_AddNumberToObject(e, "lookup_us_p50", p->p50);
	cJSON_AddNumberToObject(e, "lookup_us_p99", p->p99);
	cJSON_AddNumberToObject(e, "lookup_us_max", p->max);
	cJSON_AddNumberToObject(e, "stores", (double)p->stores);
	cJSON_AddNumberToObject(e, "moved_pages", (double)p->moved);
	cJSON_AddNumberToObject(e, "store_wait_s", p->store_wait_s);
	cJSON_AddNumberToObject(e, "seconds", p->secs);
}

static void load_json(cJSON *root, const char *name, const double l[3])
{
	cJSON *a = cJSON_AddArrayToObject(root, name);

	for (int i = 0; i < 3; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(l[i]));
}

static void print_json(const struct bench *b, const struct summary *s)
{
	cJSON *root = cJSON_CreateObject(), *o, *a;

	cJSON_AddNumberToObject(root, "version", 1);
	cJSON_AddStringToObject(root, "bench", "contend");
	cJSON_AddStringToObject(root, "model", b->g.name);
	cJSON_AddNumberToObject(root, "page_tokens", b->g.page_tokens);
	cJSON_AddNumberToObject(root, "page_bytes", (double)b->page);
	cJSON_AddStringToObject(root, "tiers", b->tiers);
	cJSON_AddNumberToObject(root, "lookup_pages", (double)b->o.lookup_pages);
	cJSON_AddNumberToObject(root, "store_pages", (double)b->o.store_pages);
	cJSON_AddNumberToObject(root, "writers", (double)b->o.writers);
	cJSON_AddNumberToObject(root, "seconds", b->o.seconds);
	cJSON_AddNumberToObject(root, "repeats", b->nruns);
	cJSON_AddNumberToObject(root, "cpus", sysconf(_SC_NPROCESSORS_ONLN));
	load_json(root, "loadavg_before", b->load0);
	load_json(root, "loadavg_after", b->load1);
	cJSON_AddNumberToObject(root, "idle_lookup_us_p50", s->idle_p50);
	cJSON_AddNumberToObject(root, "idle_lookup_us_p99", s->idle_p99);
	cJSON_AddNumberToObject(root, "contended_lookup_us_p50", s->busy_p50);
	cJSON_AddNumberToObject(root, "contended_lookup_us_p99", s->busy_p99);
	cJSON_AddNumberToObject(root, "contended_p99_vs_idle", s->ratio);
	cJSON_AddNumberToObject(root, "contended_p99_vs_idle_min", s->rmin);
	cJSON_AddNumberToObject(root, "contended_p99_vs_idle_max", s->rmax);
	cJSON_AddNumberToObject(root, "stores_per_s", s->stores_s);
	cJSON_AddNumberToObject(root, "demoted_pages_per_s", s->moved_s);
	cJSON_AddNumberToObject(root, "store_wait_s_mean", s->wait_per_store);
	o = cJSON_AddObjectToObject(root, "goals");
	cJSON_AddNumberToObject(o, "contended_p99_vs_idle", 2.0);
	cJSON_AddBoolToObject(o, "contended_p99_vs_idle_met", s->ratio <= 2.0);
	a = cJSON_AddArrayToObject(root, "runs");
	for (int i = 0; i < b->nruns; i++) {
		cJSON *e = cJSON_CreateObject();

		cJSON_AddStringToObject(e, "order", b->runs[i].idle_first ?
					"idle, contended" : "contended, idle");
		phase_json(e, "idle", &b->runs[i].idle);
		phase_json(e, "contended", &b->runs[i].busy);
		cJSON_AddItemToArray(a, e);
	}
	cli_json_print(root);
}

static void print_text(const struct bench *b, const struct summary *s)
{
	printf("%s, %u-token pages; tenant A looks up %llu pages while "
	       "tenant B stores %llu-page prompts from %llu thread%s\n(%s, "
	       "no background demotion); median of %d repeats of %.1f s, load "
	       "average %.2f -> %.2f on %ld cpus\n\n", b->g.name,
	       b->g.page_tokens, (unsigned long long)b->o.lookup_pages,
	       (unsigned long long)b->o.store_pages,
	       (unsigned long long)b->o.writers, b->o.writers == 1 ? "" : "s",
	       b->tiers, b->nruns,
	       b->o.seconds, b->load0[0], b->load1[0],
	       sysconf(_SC_NPROCESSORS_ONLN));
	printf("  lookup p50   idle %8.1f us   contended %8.1f us\n",
	       s->idle_p50, s->busy_p50);
	printf("  lookup p99   idle %8.1f us   contended %8.1f us\n",
	       s->idle_p99, s->busy_p99);
	printf("  B: %.1f stores/s, %.0f pages demoted/s, %.2f ms waited for "
	       "room per store\n", s->stores_s, s->moved_s,
	       s->wait_per_store * 1e3);
	printf("\n  contended_p99_vs_idle %.2f (%.2f-%.2f)  goal <= 2: %s\n",
	       s->ratio, s->rmin, s->rmax, s->ratio <= 2.0 ? "met" : "MISSED");
}

/* ---- the command --------------------------------------------------------- */

static void contend_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier bench contend [--model NAME|CONFIG] [--page-tokens P]\n"
"                            [--lookup-pages N] [--store-pages N]\n"
"                            [--dram-pages N] [--ssd-pages N] [--writers W]\n"
"                            [--seconds S] [--repeats R] [--threads T]\n"
"                            [--dir DIR] [--json]\n"
"\n"
"Times one tenant's lookups alone and while another tenant's stores evict\n"
"synchronously (dram -> ssd, real copies), alternating, in the same run.\n"
"\n"
"  --model M          preset or config.json (default llama-3.1-8b)\n"
"  --page-tokens P    tokens per page (default 1: 128 KiB pages)\n"
"  --lookup-pages N   A's prompt, looked up whole (default 2048)\n"
"  --store-pages N    B's prompts (default 64)\n"
"  --dram-pages N     the dram tier (default 4096)\n"
"  --ssd-pages N      the ssd tier (default 4096)\n"
"  --writers W        B's storing threads (default 1, at most %d)\n"
"  --seconds S        per phase (default 2)\n"
"  --repeats R        repeats of both phases (default 5)\n"
"  --threads T        transfer engine cpu threads (default: its own)\n"
"  --dir DIR          the ssd tier's directory (default $TMPDIR or /tmp)\n"
"  --json             one JSON object (see docs/PERFORMANCE.md)\n",
		MAX_WRITERS);
}

static int parse_args(int argc, char **argv, struct topt *o)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "lookup-pages", required_argument, 0, 'l' },
		{ "store-pages", required_argument, 0, 's' },
		{ "dram-pages", required_argument, 0, 'd' },
		{ "ssd-pages", required_argument, 0, 'S' },
		{ "writers", required_argument, 0, 'w' },
		{ "seconds", required_argument, 0, 't' },
		{ "repeats", required_argument, 0, 'R' },
		{ "threads", required_argument, 0, 'T' },
		{ "dir", required_argument, 0, 'D' },
		{ "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'p': if (cli_u64("--page-tokens", optarg, 1, 1u << 16, &o->page_tokens)) return -1; break;
		case 'l': if (cli_u64("--lookup-pages", optarg, 1, 1u << 20, &o->lookup_pages)) return -1; break;
		case 's': if (cli_u64("--store-pages", optarg, 1, 1u << 20, &o->store_pages)) return -1; break;
		case 'd': if (cli_u64("--dram-pages", optarg, 2, 1u << 24, &o->dram_pages)) return -1; break;
		case 'S': if (cli_u64("--ssd-pages", optarg, 1, 1u << 24, &o->ssd_pages)) return -1; break;
		case 'w': if (cli_u64("--writers", optarg, 1, MAX_WRITERS, &o->writers)) return -1; break;
		case 't': if (cli_double("--seconds", optarg, 0.05, 600, &o->seconds)) return -1; break;
		case 'R': if (cli_u64("--repeats", optarg, 1, MAX_REP, &o->repeats)) return -1; break;
		case 'T': if (cli_u64("--threads", optarg, 1, 256, &o->threads)) return -1; break;
		case 'D': o->dir = optarg; break;
		case 'j': o->json = 1; break;
		case 'h': contend_usage(stdout); return 1;
		default: cli_usage("bench contend", "bad option"); return -1;
		}
	}
	if (optind < argc) {
		cli_usage("bench contend", "unexpected argument '%s'",
			  argv[optind]);
		return -1;
	}
	if (o->lookup_pages + o->store_pages > o->dram_pages) {
		cli_usage("bench contend", "--lookup-pages + --store-pages "
			  "(%llu) must fit in --dram-pages (%llu)",
			  (unsigned long long)(o->lookup_pages + o->store_pages),
			  (unsigned long long)o->dram_pages);
		return -1;
	}
	if (o->store_pages * o->writers > o->ssd_pages) {
		cli_usage("bench contend", "--store-pages x --writers must fit "
			  "in --ssd-pages");
		return -1;
	}
	return 0;
}

int bench_contend(int argc, char **argv)
{
	static struct bench b;
	struct summary s;
	int err, rc;

	memset(&b, 0, sizeof(b));
	b.o = (struct topt){ .model = "llama-3.1-8b", .page_tokens = 1,
			     .lookup_pages = 2048, .store_pages = 64,
			     .dram_pages = 4096, .ssd_pages = 4096,
			     .repeats = 5, .writers = 1, .seconds = 2 };
	b.o.dir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") :
		  "/tmp";
	if ((rc = parse_args(argc, argv, &b.o)))
		return rc > 0 ? 0 : CLI_EXIT_USAGE;
	if ((err = cli_geom(&b.g, b.o.model, (uint32_t)b.o.page_tokens, 1, 0)))
		return cli_fail("bench contend", err);
	b.page = kvt_geom_page_bytes(&b.g);
	pthread_mutex_init(&b.wmu, NULL);
	b.akeys = malloc(b.o.lookup_pages * sizeof(*b.akeys));
	b.lat = malloc(MAX_SAMPLES * sizeof(*b.lat));
	if (!b.akeys || !b.lat) {
		rc = cli_fail("bench contend", -ENOMEM);
		goto out;
	}
	if ((err = open_all(&b)) || (err = store_a(&b))) {
		rc = cli_fail("bench contend", err);
		goto out;
	}
	loadavg(b.load0);
	for (b.nruns = 0; b.nruns < (int)b.o.repeats; b.nruns++) {
		struct run *r = &b.runs[b.nruns];

		r->idle_first = b.nruns % 2 == 0;
		for (int k = 0; k < 2; k++) {
			int busy = (k == 0) != r->idle_first;

			if ((err = phase_run(&b, busy ? &r->busy : &r->idle,
					     busy))) {
				rc = cli_fail(busy ? "bench contend: contended "
					      "phase" : "bench contend: idle "
					      "phase", err);
				goto out;
			}
		}
	}
	loadavg(b.load1);
	summarize(&b, &s);
	if (b.o.json)
		print_json(&b, &s);
	else
		print_text(&b, &s);
	rc = 0;
out:
	kvt_cache_close(b.c);
	kvt_tier_close(b.engine);
	free(b.akeys);
	free(b.lat);
	pthread_mutex_destroy(&b.wmu);
	return rc;
}
