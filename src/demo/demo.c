/*
 * demo.c — the main job (include/kvtier/demo.h): configuration and sizing,
 * the policies, the passes in order (each policy at each rate, the order
 * alternating; the ablation), the statistics of each pass, throughput at
 * equal TTFT along the measured curves, and the simulator's configuration
 * of the same workload (kvtier sim predicts a pass: docs/SIMULATOR.md).
 *
 * One pass (serve.c) opens its own tiers, runs the whole workload through
 * the engine, verifies every copy and closes them again, so passes never
 * share the machine's memory or disk and each starts cold.
 */
#include "demo/demo_impl.h"
#include "sim/sim_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define HEADROOM (256ull << 20) /* free disk the ssd tier leaves */

/* ---- policies ------------------------------------------------------------ */

static const struct kvti_demo_policy policies[] = {
	{ KVT_DEMO_LMCACHE, "lmcache", KVT_POLICY_LMCACHE, 0, 0, 1, 0, 256,
	  "LMCache: whole 256-token chunks retrieved before the step "
	  "computes (blocking), saves waited for in the step, FCFS" },
	{ KVT_DEMO_LMCACHE_LW, "lmcache-layerwise", KVT_POLICY_LMCACHE,
	  KVT_SCHED_OVERLAP, 0, 0, 0, 256,
	  "LMCache use_layerwise: the same, layer l retrieved while layer "
	  "l-1 computes; saves overlapped (not waited for)" },
	{ KVT_DEMO_VLLM, "vllm", KVT_POLICY_VLLM, 0, 0, 0, 1, 0,
	  "vLLM offloading connector: asynchronous loads, a request joins a "
	  "step once its loads are home, asynchronous saves, FCFS" },
	{ KVT_DEMO_KVTIER, "kvtier", KVT_POLICY_KVTIER, 0, 0, 0, 0, 0,
	  "kvtier: layer-wise overlap, prefetch, delay-hit, balance, "
	  "stall-hide, starve, load-or-recompute by measured cost" },
};

const struct kvti_demo_policy *kvti_demo_policy_of(unsigned bit)
{
	for (size_t i = 0; i < KVT_ARRAY_SIZE(policies); i++)
		if (policies[i].bit == bit)
			return &policies[i];
	return NULL;
}

const char *kvt_demo_policy_name(unsigned bit)
{
	const struct kvti_demo_policy *p = kvti_demo_policy_of(bit);

	return p ? p->name : NULL;
}

int kvt_demo_policy_parse(const char *s, unsigned *bits)
{
	char buf[256], *tok, *save = NULL;
	unsigned b = 0;

	if (!s || kvti_strlcpy(buf, s, sizeof(buf)))
		return kvti_fail(-EINVAL, "demo: policy list too long or "
				 "missing");
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		size_t i;

		if (kvti_streq_ci(tok, "all")) {
			b |= KVT_DEMO_ALL;
			continue;
		}
		for (i = 0; i < KVT_ARRAY_SIZE(policies); i++)
			if (kvti_streq_ci(tok, policies[i].name))
				break;
		if (i == KVT_ARRAY_SIZE(policies))
			return kvti_fail(-EINVAL, "demo: unknown policy '%s' "
					 "(lmcache, lmcache-layerwise, vllm, "
					 "kvtier, all)", tok);
		b |= policies[i].bit;
	}
	if (!b)
		return kvti_fail(-EINVAL, "demo: no policy in '%s'", s);
	*bits = b;
	return 0;
}

void kvti_demo_sched(const struct kvti_demo_policy *p, uint32_t off,
		     uint32_t budget, kvt_sched_config *out)
{
	kvt_sched_config_preset(out, p->preset);
	out->features = (out->features | p->add) & ~(p->remove | off);
	out->sync_store = p->sync_store;
	out->wait_loads = (uint32_t)p->wait_loads;
	if (budget)
		out->token_budget = budget;
}

/* ---- configuration --------------------------------------------------------- */

void kvt_demo_config_init(kvt_demo_config *c)
{
	memset(c, 0, sizeof(*c));
	kvti_strlcpy(c->model, "llama-3.2-1b", sizeof(c->model));
	kvti_strlcpy(c->hardware, "testbed-b", sizeof(c->hardware));
	kvti_strlcpy(c->fabric, "memfd", sizeof(c->fabric));
	c->page_tokens = 16;
	c->sessions = 8;
	c->turns = 4;
	c->system_tokens = 2048;
	c->context_tokens = 4096;
	c->turn_tokens = 1024;
	c->output_tokens = 64;
	c->rate = 2.0;
	c->think_s = 1.5;
	c->think_sigma = 0.5;
	c->policies = KVT_DEMO_ALL;
	c->token_budget = 8192;
	c->stress_bytes = 256ull << 20;
	c->seed = 1;
	c->repeat = 1;
}

/* Prompt length of turn @k (before its answer). */
static uint64_t prompt_len(const kvt_demo_config *c, uint32_t k)
{
	return (uint64_t)c->system_tokens + c->context_tokens +
	       (uint64_t)k * (c->turn_tokens + c->output_tokens);
}

/* Tokens of a session's last request: its prompt and answer. */
static uint64_t last_tokens(const kvt_demo_config *c)
{
	return prompt_len(c, c->turns - 1) + c->output_tokens;
}

uint32_t kvt_demo_sessions_at(const kvt_demo_config *c, double rate)
{
	double n = (double)c->sessions * rate / c->rate;

	if (!(n >= 1))
		return 1;
	return n > KVT_DEMO_MAX_SESSIONS ? KVT_DEMO_MAX_SESSIONS :
					   (uint32_t)(n + 0.5);
}

int kvti_demo_wl_config(const kvt_demo_config *c, double rate,
			kvt_sim_config *s)
{
	kvt_sim_config_init(s);
	s->workload = KVT_WL_AGENTIC;
	s->sessions = kvt_demo_sessions_at(c, rate);
	s->turns = c->turns;
	s->context = (uint32_t)prompt_len(c, c->turns - 1);
	s->append = c->turn_tokens;
	s->output = c->output_tokens;
	s->think_s = c->think_s;
	s->think_sigma = c->think_sigma;
	s->system = c->system_tokens;
	s->session_rate = rate;
	s->seed = c->seed;
	s->page_tokens = c->page_tokens;
	kvti_strlcpy(s->model, c->model, sizeof(s->model));
	return 0;
}

static int size_check(const kvt_demo_config *c)
{
	if (!c->sessions || c->sessions > KVT_DEMO_MAX_SESSIONS)
		return kvti_fail(-EINVAL, "demo: sessions must be 1..%d",
				 KVT_DEMO_MAX_SESSIONS);
	if (!c->turns || c->turns > KVT_DEMO_MAX_TURNS)
		return kvti_fail(-EINVAL, "demo: turns must be 1..%d",
				 KVT_DEMO_MAX_TURNS);
	if (!c->page_tokens)
		return kvti_fail(-EINVAL, "demo: page_tokens must be > 0");
	if (c->context_tokens < c->page_tokens)
		return kvti_fail(-EINVAL, "demo: a session's own context (%u "
				 "tokens) must hold a page (%u)",
				 c->context_tokens, c->page_tokens);
	if (!c->output_tokens)
		return kvti_fail(-EINVAL, "demo: answers of 0 tokens");
	if (last_tokens(c) > (1u << 30))
		return kvti_fail(-EINVAL, "demo: a session of %llu tokens is "
				 "too long", (unsigned long long)last_tokens(c));
	if (!c->policies || (c->policies & ~(unsigned)KVT_DEMO_ALL))
		return kvti_fail(-EINVAL, "demo: bad policy set");
	if (!(c->rate > 0) || !isfinite(c->rate))
		return kvti_fail(-EINVAL, "demo: the session rate must be > 0");
	if (!(c->think_s >= 0) || !(c->think_sigma >= 0) ||
	    !isfinite(c->think_s) || !isfinite(c->think_sigma))
		return kvti_fail(-EINVAL, "demo: think time and its sigma must "
				 "be >= 0");
	if (c->nrates > KVT_DEMO_MAX_RATES || c->ntargets > KVT_DEMO_MAX_TARGETS)
		return kvti_fail(-EINVAL, "demo: at most %d rates and %d targets",
				 KVT_DEMO_MAX_RATES, KVT_DEMO_MAX_TARGETS);
	for (uint32_t i = 0; i < c->nrates; i++)
		if (!(c->rates[i] > 0) || !isfinite(c->rates[i]) ||
		    (i && c->rates[i] <= c->rates[i - 1]))
			return kvti_fail(-EINVAL, "demo: sweep rates must be "
					 "positive and increasing");
	for (uint32_t i = 0; i < c->ntargets; i++)
		if (!(c->targets_ms[i] > 0) || !isfinite(c->targets_ms[i]))
			return kvti_fail(-EINVAL, "demo: TTFT targets must be > 0");
	if (!c->repeat || c->repeat > 64)
		return kvti_fail(-EINVAL, "demo: repeat must be 1..64");
	if (!c->token_budget)
		return kvti_fail(-EINVAL, "demo: a token budget of 0");
	return 0;
}

int kvt_demo_size(kvt_demo_config *c)
{
	uint64_t req, sess, page, mem_cap, need_mem, want, avail;
	kvt_machine m;
	kvt_hw hw;
	kvt_geom g;
	struct statvfs v;
	const char *d;
	int err;

	if ((err = size_check(c)) ||
	    (err = kvt_geom_preset(&g, c->model, c->page_tokens, 1, 0)) ||
	    (err = kvt_hw_load(&hw, c->hardware)))
		return err;
	page = kvt_geom_page_bytes(&g);
	/* the largest request's blocks: its prompt and answer */
	req = (last_tokens(c) + c->page_tokens - 1) / c->page_tokens * page;
	sess = req;
	kvt_probe(&m);
	/* one policy's tiers at a time: the engine's memory four of the
	 * largest requests; fabric and dram three sessions each; ssd all of
	 * them and a quarter more (a page keeps at most one ssd copy) */
	if (!c->hbm_bytes)
		c->hbm_bytes = KVT_ALIGN_UP(4 * req + 4 * page, page);
	if (!c->fabric_bytes)
		c->fabric_bytes = 3 * sess;
	if (!c->dram_bytes)
		c->dram_bytes = 3 * sess;
	if (!c->ssd_bytes) { /* the sweep's largest pass */
		uint32_t most = c->sessions;

		for (uint32_t i = 0; i < c->nrates; i++)
			most = KVT_MAX(most, kvt_demo_sessions_at(c, c->rates[i]));
		c->ssd_bytes = (uint64_t)most * sess / 4 * 5 + 64 * page;
	}
	if (c->hbm_bytes < req)
		return kvti_fail(-EINVAL, "demo: engine memory (--hbm) of %llu "
				 "bytes cannot hold one session's last request "
				 "(%llu bytes)", (unsigned long long)c->hbm_bytes,
				 (unsigned long long)req);
	if (c->fabric_bytes < sess)
		return kvti_fail(-EINVAL, "demo: fabric (the top tier) of %llu "
				 "bytes cannot hold one session (%llu bytes): a "
				 "store brings the whole prefix into it",
				 (unsigned long long)c->fabric_bytes,
				 (unsigned long long)sess);
	mem_cap = m.mem_available / 3;
	need_mem = c->hbm_bytes + c->fabric_bytes + c->dram_bytes;
	if (mem_cap && need_mem > mem_cap) {
		uint64_t rest;

		if (mem_cap < c->hbm_bytes + 2 * sess)
			return kvti_fail(-ENOMEM, "demo: needs at least %llu MiB "
					 "of memory, %llu MiB is available; use "
					 "--sessions, --context or a smaller "
					 "--model", (unsigned long long)
					 ((c->hbm_bytes + 2 * sess) * 3 >> 20),
					 (unsigned long long)(m.mem_available >> 20));
		rest = mem_cap - c->hbm_bytes;
		c->fabric_bytes = KVT_ALIGN_UP(rest / 2 - page, page);
		c->dram_bytes = c->fabric_bytes;
		kvti_info("demo: fabric and dram cut to %llu MiB each to fit "
			  "in memory", (unsigned long long)(c->dram_bytes >> 20));
	}
	want = c->ssd_bytes;
	d = c->dir[0] ? c->dir : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (statvfs(d, &v) == 0) {
		avail = (uint64_t)v.f_bavail * v.f_frsize;
		if (avail < want + HEADROOM)
			return kvti_fail(-ENOSPC, "demo: the ssd tier needs %llu "
					 "MiB in %s and %llu MiB of headroom; "
					 "%llu MiB is free",
					 (unsigned long long)(want >> 20), d,
					 (unsigned long long)(HEADROOM >> 20),
					 (unsigned long long)(avail >> 20));
	}
	return 0;
}

int kvt_demo_sim_config(const kvt_demo_config *c, unsigned policy,
			double rate, const kvt_hw *hw, kvt_sim_config *s)
{
	const struct kvti_demo_policy *p = kvti_demo_policy_of(policy);
	kvt_geom g;
	int err;

	if (!p || !hw)
		return kvti_fail(-EINVAL, "demo: no such policy (%u)", policy);
	kvti_demo_wl_config(c, rate, s);
	s->hw = *hw;
	if ((err = kvt_sim_config_policy(s, p->preset)))
		return err;
	s->page_tokens = c->page_tokens;
	s->page_contig = 0;      /* the demo's engine: vLLM's per-layer layout */
	kvti_demo_sched(p, 0, c->token_budget, &s->sched);
	s->write_policy = KVT_WRITE_BACK;
	s->store_top = 1;        /* a store per step, into fabric */
	s->store_align = p->store_align;
	s->measured_rates = 1;   /* the scheduler's rates, as the demo's */
	s->hbm_share = 0;        /* no prefix cache of its own */
	s->hbm_reuse = 0;
	s->noffload = 3;
	s->offload[0] = KVT_TIER_FABRIC;
	s->offload[1] = KVT_TIER_DRAM;
	s->offload[2] = KVT_TIER_SSD;
	s->offload_bytes[0] = (double)c->fabric_bytes;
	s->offload_bytes[1] = (double)c->dram_bytes;
	s->offload_bytes[2] = (double)c->ssd_bytes;
	/* the demo's cache runs its background demotion at the defaults */
	s->bg_high = KVT_CACHE_HIGH;
	s->bg_low = KVT_CACHE_LOW;
	/* its ssd loads do not go through the cache's bounce tier: the demo
	 * registers host engine memory without a device and without
	 * KVT_CACHE_STAGE_SSD (dplane.c), so the io lane reads each page
	 * straight into engine memory (src/xfer/io.c: through its
	 * huge-page bounce slice, scattered into the layers and verified
	 * on the io thread) and there is no second hop
	 * (docs/SIMULATOR.md section 7 point 28) */
	s->ssd_stage_pages = 0;
	/* its store calls return at once: the copies making their room run
	 * on the cache's room thread, the step thread waits for none of
	 * them (store_room_wait stays 0) */
	s->store_room_wait = 0;
	if ((err = kvt_geom_preset(&g, c->model, c->page_tokens, 1, 0)))
		return err;
	s->kv_bytes = (double)(c->hbm_bytes / kvt_geom_page_bytes(&g) *
			       kvt_geom_page_bytes(&g));
	return 0;
}

/* ---- statistics -------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void dist_of(double *v, size_t n, kvt_dist *d)
{
	double sum = 0;

	memset(d, 0, sizeof(*d));
	if (!n)
		return;
	qsort(v, n, sizeof(*v), cmp_d);
	for (size_t i = 0; i < n; i++)
		sum += v[i];
	d->n = n;
	d->mean = sum / (double)n;
	d->p50 = v[(size_t)ceil(0.50 * (double)n) - 1];
	d->p90 = v[(size_t)ceil(0.90 * (double)n) - 1];
	d->p99 = v[(size_t)ceil(0.99 * (double)n) - 1];
	d->max = v[n - 1];
}

static int pass_stats(kvt_demo_pass *p)
{
	kvt_demo_stat *st = &p->st;
	double *a = kvt_malloc((p->nreqs + 1) * sizeof(double) * 3);
	double *w, *tp, first = INFINITY, last = 0;
	size_t na = 0, nw = 0, nt = 0;

	if (!a)
		return -ENOMEM;
	w = a + p->nreqs + 1;
	tp = w + p->nreqs + 1;
	st->prompt_tokens = st->output_tokens = st->computed_tokens = 0;
	memset(st->loaded_tokens, 0, sizeof(st->loaded_tokens));
	memset(st->recomputed_tokens, 0, sizeof(st->recomputed_tokens));
	for (size_t i = 0; i < p->nreqs; i++) {
		const kvt_demo_req *q = &p->reqs[i];

		if (!q->done)
			continue;
		a[na++] = q->ttft_s * 1e3;
		if (q->turn)
			w[nw++] = q->ttft_s * 1e3;
		if (q->output_tokens > 1)
			tp[nt++] = q->tpot_s * 1e3;
		st->prompt_tokens += q->prompt_tokens;
		st->output_tokens += q->output_tokens;
		st->computed_tokens += q->computed_tokens;
		for (int t = 0; t < KVT_TIER_COUNT; t++) {
			st->loaded_tokens[t] += q->loaded_tokens[t];
			st->recomputed_tokens[t] += q->recomputed_tokens[t];
		}
		first = KVT_MIN(first, q->arrival);
		last = KVT_MAX(last, q->finish);
	}
	dist_of(a, na, &st->ttft_ms);
	dist_of(w, nw, &st->warm_ttft_ms);
	dist_of(tp, nt, &st->tpot_ms);
	st->makespan_s = na ? last - first : 0;
	if (st->makespan_s > 0) {
		st->tokens_per_s = (double)(st->prompt_tokens +
					    st->output_tokens) / st->makespan_s;
		st->output_per_s = (double)st->output_tokens / st->makespan_s;
	}
	kvt_free(a);
	return 0;
}

double kvt_demo_loadavg(void)
{
	double v = 0;
	FILE *f = fopen("/proc/loadavg", "r");

	if (f) {
		if (fscanf(f, "%lf", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

int kvt_demo_throughput_at(const kvt_demo_result *r, const char *policy,
			   uint32_t repeat, double target_ms, double *thr)
{
	double tv[KVT_DEMO_MAX_RATES], pv[KVT_DEMO_MAX_RATES];
	uint32_t n = 0;

	if (!r || !policy || !thr)
		return -EINVAL;
	for (uint32_t k = 0; k < r->config.nrates || (!k && !r->config.nrates);
	     k++) {
		double rate = r->config.nrates ? r->config.rates[k] :
						 r->config.rate;

		for (int i = 0; i < r->npasses; i++) {
			const kvt_demo_pass *p = &r->pass[i];

			if (strcmp(p->policy, policy) || p->variant[0] ||
			    p->repeat != repeat || p->rate != rate || p->err)
				continue;
			if (n < KVT_DEMO_MAX_RATES) {
				tv[n] = p->st.tokens_per_s;
				pv[n++] = p->st.ttft_ms.p90;
			}
		}
	}
	if (!n)
		return -ENOENT;
	return kvt_curve_throughput_at(tv, pv, n, target_ms, thr);
}

/* ---- the run ------------------------------------------------------------------ */

static int demo_tmpdir(const kvt_demo_config *c, char *dir, size_t len,
		       int *made)
{
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

	if (c->dir[0]) {
		snprintf(dir, len, "%s", c->dir);
		return 0;
	}
	snprintf(dir, len, "%s/kvtier-demo-XXXXXX", tmp);
	if (!mkdtemp(dir))
		return kvti_fail(-errno, "demo: mkdtemp %s: %s", dir,
				 strerror(errno));
	*made = 1;
	return 0;
}

/* The passes to run, in order: for each repeat, each rate, each policy in
 * the order kvti_demo_order() gives group (repeat + rate index); then the
 * ablation at @rate. */
struct plan_item {
	unsigned bit;
	uint32_t off;
	double rate;
	uint32_t repeat, order;
	const char *variant;
};

static const struct {
	uint32_t bit;
	const char *name;
} ablate[] = {
	{ KVT_SCHED_OVERLAP, "-overlap" },
	{ KVT_SCHED_PREFETCH, "-prefetch" },
	{ KVT_SCHED_DELAYHIT, "-delay-hit" },
	{ KVT_SCHED_BALANCE, "-balance" },
	{ KVT_SCHED_STALLHIDE, "-stall-hide" },
	{ KVT_SCHED_STARVE, "-starve" },
	{ KVT_SCHED_RECOMPUTE, "-recompute" },
};

/* A Latin square, balanced for an even n (Williams): row 0 is 0, 1, n-1, 2,
 * n-2, ..., row r adds r (mod n). Over any n consecutive rows every policy
 * runs once in every position; for an even n it also follows every other
 * policy once. So neither the load's drift nor a policy's leftovers (page
 * cache, warm ssd files) favour one policy, and since a rate's repeats are
 * consecutive rows (repeat + rate index), they run in different orders. */
uint32_t kvti_demo_order(uint32_t n, uint32_t row, uint32_t j)
{
	uint32_t k = (j + 1) / 2, x;

	if (n < 2)
		return 0;
	x = j & 1 ? k : (n - k) % n; /* 0, 1, n-1, 2, n-2, ... */
	return (x + row) % n;
}

static size_t plan_passes(const kvt_demo_config *c, struct plan_item *it)
{
	size_t n = 0;
	uint32_t nr = c->nrates ? c->nrates : 1;

	for (uint32_t rep = 0; rep < c->repeat; rep++)
		for (uint32_t k = 0; k < nr; k++) {
			unsigned bits[KVT_ARRAY_SIZE(policies)];
			uint32_t nb = 0;

			for (size_t i = 0; i < KVT_ARRAY_SIZE(policies); i++)
				if (c->policies & policies[i].bit)
					bits[nb++] = policies[i].bit;
			for (uint32_t j = 0; j < nb; j++) {
				uint32_t x = kvti_demo_order(nb, rep + k, j);

				it[n++] = (struct plan_item){
					bits[x], 0,
					c->nrates ? c->rates[k] : c->rate, rep,
					j, "" };
			}
		}
	if (c->ablation)
		for (size_t i = 0; i < KVT_ARRAY_SIZE(ablate); i++)
			it[n++] = (struct plan_item){ KVT_DEMO_KVTIER,
				ablate[i].bit, c->rate, 0, (uint32_t)i,
				ablate[i].name };
	return n;
}

/* @hw with the data plane pass @p measured: every CPU-copy rate (links,
 * copy curves, host.copy_gbps, the fabric link) scaled by the pass's mean
 * fabric/dram load rate over the profile's link.gbps, the ssd rates by its
 * ssd load rate over ssd.read_gbps, engine.host_us set to its host time
 * per step. Into @out; 0, or 1 when the pass measured too little. */
static int env_hw(const kvt_hw *hw, kvt_demo_pass *p, kvt_hw *out)
{
	const double *m = p->st.load_gbps_mean;
	double cpu = 0, f_cpu, f_ssd = 1, from, to;
	int n = 0;
	char v[32];

	for (int t = KVT_TIER_FABRIC; t <= KVT_TIER_DRAM; t++)
		if (m[t] > 0) {
			cpu += m[t];
			n++;
		}
	if (!n || !(hw->link_gbps > 0) || !(p->st.host_us_per_step > 0))
		return 1;
	*out = *hw;
	f_cpu = cpu / n / hw->link_gbps;
	if (m[KVT_TIER_SSD] > 0 && hw->ssd_read_gbps > 0)
		f_ssd = m[KVT_TIER_SSD] / hw->ssd_read_gbps;
	for (size_t i = 0; kvt_hw_key_name(i); i++) {
		const char *k = kvt_hw_key_name(i);
		int cpu_key = !strcmp(k, "link.gbps") ||
			      !strcmp(k, "link.raw_gbps") ||
			      !strcmp(k, "host.copy_gbps") ||
			      !strcmp(k, "fabric.link_gbps") ||
			      (!strncmp(k, "copy.", 5) && !strstr(k, "_call_us"));

		if (cpu_key)
			kvt_hw_key_scale(out, i, f_cpu, &from, &to);
		else if (!strcmp(k, "ssd.read_gbps") ||
			 !strcmp(k, "ssd.write_gbps"))
			kvt_hw_key_scale(out, i, f_ssd, &from, &to);
	}
	/* host time per step, decode-only and prefill steps apart (a pass
	 * with one kind only: the mean of all) */
	snprintf(v, sizeof(v), "%.1f", p->st.host_us_decode_step > 0 ?
		 p->st.host_us_decode_step : p->st.host_us_per_step);
	if (kvt_hw_set(out, "engine.host_us", v))
		return 1;
	snprintf(v, sizeof(v), "%.1f", p->st.host_us_prefill_step > 0 ?
		 p->st.host_us_prefill_step : p->st.host_us_per_step);
	if (kvt_hw_set(out, "engine.host_prefill_us", v))
		return 1;
	p->penv_cpu_f = f_cpu;
	p->penv_ssd_f = f_ssd;
	return 0;
}

/* The simulator's prediction of a pass (the same workload, engine and
 * policy, on the profile of this machine). */
static void predict(const kvt_demo_config *c, const struct plan_item *it,
		    const kvt_hw *hw, kvt_demo_pass *p)
{
	kvt_sim_config *sc = kvt_malloc(sizeof(*sc));
	kvt_sim_result *sr = kvt_malloc(sizeof(*sr));

	if (sc && sr && !kvt_demo_sim_config(c, it->bit, it->rate, hw, sc)) {
		sc->sched.features &= ~it->off;
		if (!kvt_sim_run(sc, sr)) {
			p->predicted = 1;
			p->pred_ttft_ms = sr->ttft_ms;
			p->pred_tpot_ms = sr->tpot_ms;
			p->pred_tokens_per_s = sr->throughput_tok_s;
			p->pred_recomputed = sr->prompt_tokens -
					     sr->computed_tokens;
			for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT; t++)
				p->pred_loaded += sr->hit_tokens[t];
		} else {
			kvti_warn("demo: the prediction of %s failed: %s",
				  p->policy, kvt_errdetail());
		}
	}
	if (sc && sr && p->predicted && !env_hw(hw, p, &sc->hw)) {
		if (!kvt_sim_run(sc, sr)) {
			p->predicted_env = 1;
			p->penv_ttft_ms = sr->ttft_ms;
			p->penv_tokens_per_s = sr->throughput_tok_s;
		} else {
			kvti_warn("demo: the prediction of %s on its measured "
				  "data plane failed: %s", p->policy,
				  kvt_errdetail());
		}
	}
	kvt_free(sc);
	kvt_free(sr);
}

/* The caller's pass_done hook, with the result as of now. */
static void passed(const kvt_demo_config *c, kvt_demo_result *r,
		   uint64_t t0, int err, size_t done, size_t total)
{
	if (!c->pass_done)
		return;
	r->seconds = (double)(kvt_now_ns() - t0) / 1e9;
	r->loadavg_end = kvt_demo_loadavg();
	c->pass_done(c->pass_arg, r, err, done, total);
}

int kvt_demo_run(const kvt_demo_config *cin, kvt_demo_result **out)
{
	kvt_demo_config c = *cin;
	struct plan_item *plan = NULL;
	kvt_demo_result *r;
	char dir[KVT_PATH_MAX + 16], sub[KVT_PATH_MAX + 48];
	uint64_t t0 = kvt_now_ns();
	size_t np, done = 0;
	kvt_hw hw, phw;
	int err, made_dir = 0;

	kvti_errclear();
	*out = NULL;
	if ((err = kvt_demo_size(&c)))
		return err;
	if (!(r = kvt_calloc(1, sizeof(*r))))
		return -ENOMEM;
	r->config = c;
	r->loadavg_start = kvt_demo_loadavg();
	np = (size_t)c.repeat * (c.nrates ? c.nrates : 1) *
		     KVT_ARRAY_SIZE(policies) +
	     KVT_ARRAY_SIZE(ablate);
	plan = kvt_calloc(np, sizeof(*plan));
	r->pass = kvt_calloc(np, sizeof(*r->pass));
	if (!plan || !r->pass) {
		err = -ENOMEM;
		goto fail;
	}
	if ((err = kvt_geom_preset(&r->geom, c.model, c.page_tokens, 1, 0)) ||
	    (err = kvt_hw_load(&hw, c.hardware)))
		goto fail;
	if (c.predict[0] && (err = kvt_hw_load(&phw, c.predict)))
		goto fail;
	kvti_strlcpy(r->gpu_name, hw.gpu_name, sizeof(r->gpu_name));
	if ((err = demo_tmpdir(&c, dir, sizeof(dir), &made_dir)))
		goto fail;
	np = plan_passes(&c, plan);
	passed(&c, r, t0, 0, 0, np);
	for (size_t i = 0; i < np; i++) {
		struct kvti_demo_pass_cfg pc = {
			.c = &c, .pol = kvti_demo_policy_of(plan[i].bit),
			.off = plan[i].off, .rate = plan[i].rate,
			.sessions = kvt_demo_sessions_at(&c, plan[i].rate),
			.g = &r->geom, .hw = &hw, .dir = sub,
			.tamper = i == 0, .pass = i, .passes = np,
		};
		kvt_demo_pass *p = &r->pass[r->npasses++];
		int perr;

		if (c.stop && *c.stop) {
			err = kvti_fail(-EINTR, "demo: interrupted");
			break;
		}
		snprintf(sub, sizeof(sub), "%s/pass%zu", dir, i);
		if (mkdir(sub, 0700) && errno != EEXIST) {
			err = kvti_fail(-errno, "demo: mkdir %s: %s", sub,
					strerror(errno));
			goto fail;
		}
		snprintf(p->variant, sizeof(p->variant), "%s", plan[i].variant);
		perr = kvti_demo_pass(&pc, p);
		p->repeat = plan[i].repeat;
		p->order = plan[i].order;
		p->loadavg = kvt_demo_loadavg();
		rmdir(sub);
		if (pass_stats(p))
			perr = perr ? perr : -ENOMEM;
		done += p->done;
		if (c.predict[0] && !perr)
			predict(&c, &plan[i], &phw, p);
		if (p->cache.corrupt && !perr)
			perr = KVT_ECORRUPT;
		if (p->check_err && p->check_err != 1 && !perr)
			perr = p->check_err;
		if (perr && !err) {
			err = perr;
			snprintf(r->error, sizeof(r->error), "%s: %s",
				 p->policy, p->error[0] ? p->error :
				 kvt_strerror(perr));
		}
		passed(&c, r, t0, err, i + 1, np);
		if (perr && perr != KVT_ECORRUPT)
			break; /* the machine is in trouble: stop here */
	}
fail:
	if (err && !r->error[0])
		snprintf(r->error, sizeof(r->error), "%s", kvt_errdetail()[0] ?
			 kvt_errdetail() : kvt_strerror(err));
	if (made_dir)
		rmdir(dir);
	kvt_free(plan);
	r->seconds = (double)(kvt_now_ns() - t0) / 1e9;
	r->loadavg_end = kvt_demo_loadavg();
	if (err && !done) {
		kvt_demo_result_free(r);
		return err;
	}
	*out = r;
	return err;
}

void kvt_demo_result_free(kvt_demo_result *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->npasses; i++)
		kvt_free(r->pass[i].reqs);
	kvt_free(r->pass);
	kvt_free(r);
}
