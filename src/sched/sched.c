/*
 * sched.c — the cache-aware batch scheduler (see <kvtier/sched.h>).
 *
 * One call plans one step. The queue is walked from the head in passes; a
 * request is decided once and keeps its decision:
 *
 *   A  forced     STARVE: requests passed over max_skips times run first
 *   B  in order   running prefills continue; waiting requests run unless
 *                 DELAYHIT defers them (transient overlap, or a context a
 *                 request earlier in this step computes) or BALANCE finds
 *                 their loads would not hide under the batch's compute
 *                 (they become "I/O candidates"); FCFS stops at the first
 *                 request that does not fit
 *   C  pairing    BALANCE: I/O candidates, in order, join once the
 *                 compute-heavy requests found in B cover their loads
 *   D  no prefill nothing runs but candidates wait on I/O: STALLHIDE runs
 *                 the decodes alone; otherwise the first candidate runs and
 *                 the step stalls on its loads
 *   E  prefetch   PREFETCH: the first `lookahead` waiting requests that do
 *                 not run start their loads, while hbm pages last
 *
 * Then every request still waiting with one behind it running counts a
 * skip. The link is modelled as a queue: a load issued now starts when the
 * loads already queued (st->link_free_at) and those issued earlier in this
 * plan are done.
 *
 * Invariants of a plan: compute tokens + decodes <= token_budget, sequences
 * <= max_batch, pages <= free_pages, every RUN computes >= 1 token.
 *
 * Locking: none; a kvt_sched belongs to one thread at a time.
 */
#include "core/core.h"

#include <kvtier/sched.h>

#include <errno.h>
#include <string.h>

struct kvt_sched {
	kvt_sched_config cfg;
	kvt_cost cost;
	uint64_t chunk;         /* chunk size the copy method moves */
	kvt_cost_prefill *pf;   /* max_batch prefills of the step being built */
	uint64_t *groups;       /* groups computed in the step being built */
};

/* ---- names, presets, features ----------------------------------------- */

static const char *const feature_names[] = {
	"overlap", "prefetch", "delay-hit", "balance", "stall-hide", "starve",
	"recompute",
};

const char *kvt_sched_feature_name(uint32_t bit)
{
	for (size_t i = 0; i < KVT_ARRAY_SIZE(feature_names); i++)
		if (bit == 1u << i)
			return feature_names[i];
	return NULL;
}

int kvt_sched_features_parse(const char *s, uint32_t *features)
{
	uint32_t f = *features;
	char buf[256], *tok, *save = NULL;

	if (!s || kvti_strlcpy(buf, s, sizeof(buf)))
		return kvti_fail(KVT_ECONFIG, "feature list too long or missing");
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		int set = *tok != '-';
		size_t i;

		if (*tok == '+' || *tok == '-')
			tok++;
		if (kvti_streq_ci(tok, "all") || kvti_streq_ci(tok, "none")) {
			int all = kvti_streq_ci(tok, "all") == set;

			f = all ? KVT_SCHED_ALL : 0;
			continue;
		}
		for (i = 0; i < KVT_ARRAY_SIZE(feature_names); i++)
			if (kvti_streq_ci(tok, feature_names[i]))
				break;
		if (i == KVT_ARRAY_SIZE(feature_names))
			return kvti_fail(KVT_ECONFIG, "unknown scheduler feature "
					 "'%s' (overlap, prefetch, delay-hit, "
					 "balance, stall-hide, starve, "
					 "recompute, all, none)", tok);
		f = set ? f | 1u << i : f & ~(1u << i);
	}
	*features = f;
	return 0;
}

static const char *const policy_names[KVT_POLICY_COUNT] = {
	"lmcache", "hicache", "kvtier", "hicache-kernel", "vllm",
};

const char *kvt_sched_policy_name(kvt_sched_policy p)
{
	return (unsigned)p < KVT_POLICY_COUNT ? policy_names[p] : NULL;
}

int kvt_sched_policy_parse(const char *s, kvt_sched_policy *out)
{
	for (int i = 0; s && i < KVT_POLICY_COUNT; i++)
		if (kvti_streq_ci(s, policy_names[i])) {
			*out = (kvt_sched_policy)i;
			return 0;
		}
	return kvti_fail(-EINVAL, "unknown policy '%s' (lmcache, hicache, "
			 "hicache-kernel, vllm, kvtier)", s ? s : "(null)");
}

int kvt_sched_config_preset(kvt_sched_config *c, kvt_sched_policy p)
{
	if ((unsigned)p >= KVT_POLICY_COUNT)
		return kvti_fail(-EINVAL, "unknown policy %d", (int)p);
	memset(c, 0, sizeof(*c));
	c->object_tokens = 256;
	c->token_budget = 8192;
	c->max_batch = 256;
	c->delay_hit_tokens = 100;
	c->balance_ratio = 1.0;
	c->max_skips = 8;
	c->lookahead = 64;
	switch (p) {
	case KVT_POLICY_LMCACHE:
		c->method = KVT_COPY_OBJECT;
		c->sync_store = 1;
		c->hit_align = 256;
		break;
	case KVT_POLICY_HICACHE:
		c->method = KVT_COPY_MEMCPY;
		c->features = KVT_SCHED_OVERLAP;
		break;
	case KVT_POLICY_HICACHE_KERNEL:
		c->method = KVT_COPY_GATHER;
		c->features = KVT_SCHED_OVERLAP;
		break;
	case KVT_POLICY_VLLM:
		/* loads start as soon as the request is seen, and it joins a
		 * step only when they are home by the step's end: vLLM's
		 * asynchronous connector API */
		c->method = KVT_COPY_MEMCPY;
		c->features = KVT_SCHED_PREFETCH | KVT_SCHED_BALANCE;
		break;
	default:
		c->method = KVT_COPY_GATHER;
		c->features = KVT_SCHED_ALL;
		break;
	}
	return 0;
}

/* ---- create ------------------------------------------------------------ */

int kvt_sched_create(kvt_sched **out, const kvt_sched_config *cfg,
		     const kvt_cost *cost)
{
	kvt_sched *s;
	int err;

	kvti_errclear();
	if (!out || !cfg || !cost)
		return kvti_fail(-EINVAL, "kvt_sched_create: NULL argument");
	if ((err = kvt_cost_check(cost)))
		return err;
	if (!cfg->token_budget || !cfg->max_batch)
		return kvti_fail(KVT_ECONFIG, "scheduler: token_budget and "
				 "max_batch must be > 0");
	if (!(cfg->balance_ratio > 0))
		return kvti_fail(KVT_ECONFIG, "scheduler: balance_ratio must be "
				 "> 0");
	if (cfg->features & ~(uint32_t)KVT_SCHED_ALL)
		return kvti_fail(KVT_ECONFIG, "scheduler: unknown feature bits "
				 "0x%x", cfg->features);
	if ((unsigned)cfg->method >= KVT_COPY_COUNT ||
	    !cost->copy[cfg->method].n)
		return kvti_fail(KVT_ECONFIG, "scheduler: copy method '%s' has "
				 "no rate curve in this cost model",
				 kvt_copy_method_name(cfg->method) ?
					 kvt_copy_method_name(cfg->method) :
					 "?");
	if (!(s = kvt_calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->pf = kvt_calloc(cfg->max_batch, sizeof(*s->pf));
	s->groups = kvt_calloc(cfg->max_batch, sizeof(*s->groups));
	if (!s->pf || !s->groups) {
		kvt_sched_destroy(s);
		return -ENOMEM;
	}
	s->cfg = *cfg;
	s->cost = *cost;
	s->chunk = kvt_cost_method_chunk(cost, cfg->method, cfg->object_tokens);
	*out = s;
	return 0;
}

void kvt_sched_destroy(kvt_sched *s)
{
	if (!s)
		return;
	kvt_free(s->pf);
	kvt_free(s->groups);
	kvt_free(s);
}

const kvt_sched_config *kvt_sched_get_config(const kvt_sched *s)
{
	return &s->cfg;
}

const kvt_cost *kvt_sched_get_cost(const kvt_sched *s)
{
	return &s->cost;
}

/* ---- one request, as this step sees it --------------------------------- */

struct view {
	uint32_t reuse;    /* prefix used as is: hbm + loadable (or done) */
	uint32_t held;     /* prefix that already has hbm pages */
	uint32_t to_load;  /* loadable tokens not yet issued */
	uint32_t need;     /* tokens to compute if it runs now */
	uint32_t transient;/* of need, tokens another request computes */
	uint32_t recompute;/* RECOMPUTE: cached tokens left to compute */
	uint32_t recompute_tier[KVT_TIER_COUNT];
	uint32_t issue[KVT_TIER_COUNT]; /* to_load, by source tier */
};

/* The loadable span [hbm, hbm + n) as tier runs in prefix order. */
struct runs {
	uint32_t n;
	uint32_t tier[KVT_SCHED_RUNS + KVT_TIER_COUNT];
	uint32_t tokens[KVT_SCHED_RUNS + KVT_TIER_COUNT];
};

/* The request's runs (its own, or tier[] fastest first), cut to @len
 * tokens. 0, or -EINVAL when its runs disagree with tier[]. */
static int runs_of(const kvt_sched_req *r, uint32_t total, uint32_t len,
		   struct runs *ru, size_t i)
{
	uint64_t sum = 0;

	ru->n = 0;
	if (r->nruns) {
		if (r->nruns > KVT_SCHED_RUNS)
			return kvti_fail(-EINVAL, "request %zu: %u tier runs "
					 "(max %d)", i, r->nruns,
					 KVT_SCHED_RUNS);
		for (uint32_t k = 0; k < r->nruns; k++) {
			if (r->run_tier[k] < 1 ||
			    r->run_tier[k] >= KVT_TIER_COUNT)
				return kvti_fail(-EINVAL, "request %zu: run %u "
						 "of tier %u", i, k,
						 r->run_tier[k]);
			sum += r->run_tokens[k];
		}
		if (sum != total)
			return kvti_fail(-EINVAL, "request %zu: tier runs add up "
					 "to %llu tokens, tier[] to %u", i,
					 (unsigned long long)sum, total);
	}
	for (uint32_t k = 0, left = len; left; k++) {
		uint32_t t, n;

		if (r->nruns) {
			if (k >= r->nruns)
				break;
			t = r->run_tier[k];
			n = r->run_tokens[k];
		} else {
			if (k + 1 >= KVT_TIER_COUNT)
				break;
			t = k + 1;
			n = r->tier[t];
		}
		n = KVT_MIN(n, left);
		if (!n)
			continue;
		ru->tier[ru->n] = t;
		ru->tokens[ru->n++] = n;
		left -= n;
	}
	return 0;
}

static int rated(const kvt_sched_state *st)
{
	for (int t = 1; t < KVT_TIER_COUNT; t++)
		if (st->tier_gbps[t] > 0)
			return 1;
	return 0;
}

/* Bytes per second of loads from tier @t: measured, else the copy
 * method's rate on the host link. */
static double tier_rate(const kvt_sched *s, const kvt_sched_state *st, int t)
{
	if (st->tier_gbps[t] > 0)
		return st->tier_gbps[t] * 1e9;
	return kvt_cost_copy_gbps(&s->cost, s->cfg.method, s->chunk) * 1e9;
}

/* Tokens of the runs in [from, to), by tier. */
static void runs_split(const struct runs *ru, uint32_t from, uint32_t to,
		       uint32_t *by_tier)
{
	uint32_t at = 0;

	memset(by_tier, 0, KVT_TIER_COUNT * sizeof(*by_tier));
	for (uint32_t k = 0; k < ru->n && at < to; k++) {
		uint32_t a = KVT_MAX(at, from), b = KVT_MIN(at + ru->tokens[k], to);

		if (b > a)
			by_tier[ru->tier[k]] += b - a;
		at += ru->tokens[k];
	}
}

/* Seconds from now until tokens [from, to) of the span are home if they
 * were issued now: per tier behind its queue, tiers in parallel (rated),
 * or in one stream on the host link. */
static double span_load_s(const kvt_sched *s, const kvt_sched_state *st,
			  const struct runs *ru, uint32_t from, uint32_t to)
{
	uint32_t by[KVT_TIER_COUNT];
	double t = 0;

	if (to <= from)
		return 0;
	if (!rated(st))
		return KVT_MAX(0.0, st->link_free_at - st->now) +
		       kvt_cost_copy_s(&s->cost, s->cfg.method, s->chunk,
				       (uint64_t)(to - from) *
				       s->cost.token_bytes);
	runs_split(ru, from, to, by);
	for (int k = 1; k < KVT_TIER_COUNT; k++) {
		double q;

		if (!by[k])
			continue;
		q = KVT_MAX(0.0, st->tier_free_at[k] - st->now) +
		    (double)by[k] * (double)s->cost.token_bytes /
			    tier_rate(s, st, k);
		t = KVT_MAX(t, q);
	}
	return t;
}

/* RECOMPUTE: what loading the span's first x tokens (beyond hbm) and
 * computing the rest costs: the request's ready time, plus the GPU time the
 * extra compute takes from the @others sequences that share its steps
 * (running decodes and prefills), once each. */
struct cut {
	const kvt_sched *s;
	const kvt_sched_state *st;
	const kvt_sched_req *r;
	const struct runs *ru;
	uint32_t hbm;
	double others;
	double c_full;     /* compute when all of it is loaded */
};

static double cut_cost(const struct cut *k, uint32_t x)
{
	const kvt_sched_req *r = k->r;
	double ld = span_load_s(k->s, k->st, k->ru, r->loading, x), c;

	if (r->loading)
		ld = KVT_MAX(ld, r->loading_ready - k->st->now);
	c = kvt_cost_prefill_s(&k->s->cost, r->prompt - k->hbm - x, k->hbm + x);
	return kvt_cost_overlap_s(&k->s->cost, c, ld,
				  k->s->cfg.features & KVT_SCHED_OVERLAP) +
	       k->others * (c - k->c_full);
}

/* RECOMPUTE: the cut x in [lo, hi] minimising cut_cost(): the run
 * boundaries, the ends, and in each run the point where its load catches
 * up with the compute (the cost's minimum inside a run: load grows, compute
 * shrinks), found by bisection and rounded to whole pages. Ties keep the
 * longer load (less GPU work). */
static uint32_t best_cut(const kvt_sched *s, const kvt_sched_state *st,
			 const kvt_sched_req *r, const struct runs *ru,
			 uint32_t hbm, uint32_t lo, uint32_t hi,
			 uint32_t others)
{
	struct cut k = { s, st, r, ru, hbm, others,
			 kvt_cost_prefill_s(&s->cost, r->prompt - hbm - hi,
					    hbm + hi) };
	uint32_t P = s->cost.page_tokens, best = hi, at = 0;
	double bc = cut_cost(&k, hi);

#define TRY(x) do {							\
		uint32_t x_ = (x);					\
		double c_;						\
		if (x_ < lo || x_ > hi)					\
			break;						\
		c_ = cut_cost(&k, x_);					\
		if (c_ < bc || (c_ == bc && x_ > best)) {		\
			bc = c_;					\
			best = x_;					\
		}							\
	} while (0)

	TRY(lo);
	for (uint32_t j = 0; j <= ru->n; j++) {
		uint32_t a = KVT_MAX(at, lo), b;

		TRY(a);
		if (j == ru->n)
			break;
		b = KVT_MIN(at + ru->tokens[j], hi);
		at += ru->tokens[j];
		if (b <= a)
			continue;
		{
			uint32_t l = a, h = b;

			/* load(x) - compute-left(x) grows with x */
			for (int it = 0; it < 20 && h - l > 1; it++) {
				uint32_t m = l + (h - l) / 2;
				double ld = span_load_s(s, st, ru, r->loading, m);
				double c = kvt_cost_prefill_s(&s->cost,
					r->prompt - hbm - m, hbm + m);

				if (ld < c)
					l = m;
				else
					h = m;
			}
			TRY(l / P * P);
			TRY((l + P - 1) / P * P);
		}
		TRY(b);
	}
#undef TRY
	return best;
}

static int req_view(const kvt_sched *s, const kvt_sched_state *st,
		    const kvt_sched_req *r, size_t i, uint32_t others,
		    struct view *v)
{
	uint32_t cap, hbm, loadable = 0, full;
	struct runs ru = { 0 };
	int err;

	if (!r->prompt)
		return kvti_fail(-EINVAL, "request %zu: empty prompt", i);
	memset(v, 0, sizeof(*v));
	if (r->state == KVT_SREQ_PREFILL) {
		if (r->done >= r->prompt)
			return kvti_fail(-EINVAL, "request %zu: prefill done "
					 "%u >= prompt %u", i, r->done,
					 r->prompt);
		v->reuse = v->held = r->done;
		v->need = r->prompt - r->done;
		return 0;
	}
	if (r->state != KVT_SREQ_WAITING)
		return kvti_fail(-EINVAL, "request %zu: bad state %u", i,
				 r->state);
	for (int t = 1; t < KVT_TIER_COUNT; t++)
		loadable += r->tier[t];
	if ((uint64_t)r->hbm + loadable + r->transient > r->prompt)
		return kvti_fail(-EINVAL, "request %zu: spans (hbm %u + "
				 "loadable %u + transient %u) exceed prompt %u",
				 i, r->hbm, loadable, r->transient, r->prompt);
	if (r->loading > loadable)
		return kvti_fail(-EINVAL, "request %zu: loading %u > loadable "
				 "%u", i, r->loading, loadable);
	/* at least the last prompt token is computed (it yields the first
	 * output token), as engines do on a full hit */
	cap = r->prompt - 1;
	hbm = KVT_MIN(r->hbm, cap);
	loadable = KVT_MIN(loadable, cap - hbm);
	if (s->cfg.hit_align) {
		uint32_t a = s->cfg.hit_align;
		uint32_t top = (hbm + loadable) / a * a;

		loadable = top > hbm ? top - hbm : 0;
	}
	full = loadable;
	if ((err = runs_of(r, r->tier[1] + r->tier[2] + r->tier[3] +
				      r->tier[4], loadable, &ru, i)))
		return err;
	if ((s->cfg.features & KVT_SCHED_RECOMPUTE) && loadable > r->loading) {
		uint32_t lo = KVT_MIN(r->loading, loadable);

		loadable = best_cut(s, st, r, &ru, hbm, lo, loadable, others);
		v->recompute = full - loadable;
		runs_split(&ru, loadable, full, v->recompute_tier);
	}
	v->reuse = hbm + loadable;
	v->held = hbm + KVT_MIN(r->loading, loadable);
	v->to_load = loadable > r->loading ? loadable - r->loading : 0;
	runs_split(&ru, KVT_MIN(r->loading, loadable), loadable, v->issue);
	v->need = r->prompt - v->reuse;
	v->transient = KVT_MIN(r->transient, v->need - 1);
	return 0;
}

static uint64_t pages_between(uint32_t P, uint64_t from, uint64_t to)
{
	uint64_t a = (from + P - 1) / P, b = (to + P - 1) / P;

	return b > a ? b - a : 0;
}

/* ---- the step being built ---------------------------------------------- */

struct build {
	kvt_sched *s;
	const kvt_sched_state *st;
	kvt_sched_req *reqs;
	kvt_sched_item *it;
	struct view *v;        /* one per request (caller's stack chunk) */
	size_t n;
	uint32_t budget;       /* tokens left */
	uint32_t seqs;         /* sequences left */
	uint64_t pages;        /* hbm pages left */
	double link_t;         /* link busy until, with this plan's loads */
	int rated;             /* loads priced per tier (measured rates) */
	double tier_t[KVT_TIER_COUNT]; /* rated: each tier's queue */
	double ready;          /* latest load-ready time of running requests */
	size_t npf;            /* prefills in s->pf */
	size_t ngroups;
	uint32_t decodes;
};

static double load_s(const struct build *b, uint32_t tokens)
{
	const kvt_sched *s = b->s;

	return kvt_cost_copy_s(&s->cost, s->cfg.method, s->chunk,
			       (uint64_t)tokens * s->cost.token_bytes);
}

/* When request i's loadable span would be home if its missing loads were
 * issued now (after everything already queued). @commit: queue them. */
static double ready_at(struct build *b, size_t i, int commit)
{
	const kvt_sched_req *r = &b->reqs[i];
	const struct view *v = &b->v[i];
	double t = r->loading ? KVT_MAX(r->loading_ready, b->st->now) :
				b->st->now;
	double link = b->link_t;

	if (!v->to_load)
		return t;
	if (b->rated) {
		for (int k = 1; k < KVT_TIER_COUNT; k++) {
			double q;

			if (!v->issue[k])
				continue;
			q = KVT_MAX(b->tier_t[k], b->st->now) +
			    (double)v->issue[k] *
				    (double)b->s->cost.token_bytes /
				    tier_rate(b->s, b->st, k);
			t = KVT_MAX(t, q);
			if (commit)
				b->tier_t[k] = q;
		}
		return t;
	}
	link = KVT_MAX(link, b->st->now) + load_s(b, v->to_load);
	t = KVT_MAX(t, link);
	if (commit)
		b->link_t = link;
	return t;
}

static double batch_compute(const struct build *b, const kvt_cost_prefill *x)
{
	const kvt_sched *s = b->s;

	if (x) {
		s->pf[b->npf] = *x;
		return kvt_cost_step_s(&s->cost, s->pf, b->npf + 1, b->decodes,
				       b->st->decode_ctx);
	}
	return kvt_cost_step_s(&s->cost, s->pf, b->npf, b->decodes,
			       b->st->decode_ctx);
}

static uint32_t chunk_of(const struct build *b, size_t i)
{
	return KVT_MIN(b->v[i].need, b->budget);
}

/* Would request i's loads hide under the batch's compute with it added? */
static int hidden(struct build *b, size_t i)
{
	kvt_cost_prefill x = { chunk_of(b, i), b->v[i].reuse };
	double mine = ready_at(b, i, 0);
	double ready = KVT_MAX(b->ready, mine);
	double load = ready - b->st->now;

	if (load <= 0)
		return 1;
	return load <= b->s->cfg.balance_ratio * batch_compute(b, &x);
}

static int in_groups(const struct build *b, uint64_t g)
{
	for (size_t k = 0; k < b->ngroups; k++)
		if (b->s->groups[k] == g)
			return 1;
	return 0;
}

/* DELAYHIT: is waiting for r's transient span (until transient_ready)
 * shorter than computing it? */
static int transient_cheaper(const kvt_sched *s, const kvt_sched_state *st,
			     const kvt_sched_req *r, const struct view *v)
{
	double wait = r->transient_ready - st->now;

	return wait <= 0 || wait < kvt_cost_prefill_s(&s->cost, v->transient,
						      v->reuse);
}

/* DELAYHIT: does request i wait for context someone else computes? */
static int waits_for_context(const struct build *b, size_t i)
{
	const kvt_sched_req *r = &b->reqs[i];
	uint32_t thr = b->s->cfg.delay_hit_tokens;

	if (r->state != KVT_SREQ_WAITING)
		return 0;
	if (b->v[i].transient > thr)
		return transient_cheaper(b->s, b->st, r, &b->v[i]);
	/* a context a request earlier in this very step is computing */
	return r->group && r->group_tokens > b->v[i].reuse &&
	       r->group_tokens - b->v[i].reuse > thr && in_groups(b, r->group);
}

/* wait_loads: request i has loads to issue or still moving. */
static int loads_away(const struct build *b, size_t i)
{
	const kvt_sched_req *r = &b->reqs[i];

	return r->state == KVT_SREQ_WAITING &&
	       (b->v[i].to_load ||
		(r->loading && r->loading_ready > b->st->now));
}

/* Pages request i takes from free_pages when it runs or starts loading:
 * its whole prompt beyond what it holds (admission without preemption). */
static uint64_t need_pages(const struct build *b, size_t i)
{
	uint64_t p = pages_between(b->s->cost.page_tokens, b->v[i].held,
				   b->reqs[i].prompt);

	return p > b->reqs[i].reserved ? p - b->reqs[i].reserved : 0;
}

/* Put request i into the step; 0, or the reason it cannot go. */
static int try_run(struct build *b, size_t i)
{
	const kvt_sched_req *r = &b->reqs[i];
	const struct view *v = &b->v[i];
	uint32_t chunk = chunk_of(b, i);
	uint64_t pages;
	double ready;

	if (!chunk || !b->seqs)
		return KVT_SWHY_BUDGET;
	pages = need_pages(b, i);
	if (pages > b->pages)
		return KVT_SWHY_CAPACITY;
	ready = ready_at(b, i, 1); /* once: it queues the loads */
	b->ready = KVT_MAX(b->ready, ready);
	b->it[i] = (kvt_sched_item){ .action = KVT_SACT_RUN, .compute = chunk,
				     .load = v->to_load, .reuse = v->reuse,
				     .recompute = v->recompute };
	memcpy(b->it[i].recompute_tier, v->recompute_tier,
	       sizeof(v->recompute_tier));
	b->s->pf[b->npf++] = (kvt_cost_prefill){ chunk, v->reuse };
	if (r->group && b->ngroups < b->s->cfg.max_batch)
		b->s->groups[b->ngroups++] = r->group;
	b->budget -= chunk;
	b->seqs--;
	b->pages -= pages;
	return 0;
}

/* Loads ahead of the batch, for the first `lookahead` waiting requests.
 * A prefetch never takes the pages the first request still waiting needs:
 * speculation must not block the head of the queue. */
static void prefetch(struct build *b)
{
	uint64_t keep = 0;
	uint32_t seen = 0;
	size_t head = b->n;

	for (size_t i = 0; i < b->n; i++)
		if (b->reqs[i].state == KVT_SREQ_WAITING &&
		    b->it[i].action != KVT_SACT_RUN) {
			head = i;
			keep = need_pages(b, i);
			break;
		}
	for (size_t i = head; i < b->n && seen < b->s->cfg.lookahead; i++) {
		const struct view *v = &b->v[i];
		uint64_t pages, room;

		if (b->reqs[i].state != KVT_SREQ_WAITING)
			continue;
		seen++;
		if (b->it[i].action == KVT_SACT_RUN || !v->to_load)
			continue;
		pages = need_pages(b, i);
		room = i == head ? b->pages :
				   (b->pages > keep ? b->pages - keep : 0);
		if (pages > room)
			break;
		ready_at(b, i, 1);
		b->pages -= pages;
		if (i == head)
			keep = 0;
		if (b->it[i].action != KVT_SACT_DEFER)
			b->it[i].action = KVT_SACT_PREFETCH;
		b->it[i].load = v->to_load;
	}
}

static void count_skips(struct build *b)
{
	int behind = 0;

	for (size_t i = b->n; i-- > 0;) {
		if (b->it[i].action == KVT_SACT_RUN) {
			b->reqs[i].skips = 0;
			behind = 1;
		} else if (behind) {
			b->reqs[i].skips++;
		}
	}
}

static void finish_plan(struct build *b, kvt_sched_plan *p)
{
	const kvt_sched *s = b->s;
	double compute, load;

	memset(p, 0, sizeof(*p));
	p->items = b->it;
	for (size_t i = 0; i < b->n; i++) {
		const kvt_sched_item *x = &b->it[i];

		p->nrun += x->action == KVT_SACT_RUN;
		p->nprefetch += x->action == KVT_SACT_PREFETCH;
		p->ndefer += x->action == KVT_SACT_DEFER;
		p->compute_tokens += x->action == KVT_SACT_RUN ? x->compute : 0;
		p->load_tokens += x->load;
		p->recompute_tokens += x->action == KVT_SACT_RUN ?
					       x->recompute : 0;
	}
	p->decodes = b->decodes;
	p->pages = b->st->free_pages - b->pages;
	compute = batch_compute(b, NULL);
	load = KVT_MAX(0.0, b->ready - b->st->now);
	p->decode_only = !p->nrun && b->decodes;
	p->est_compute_s = compute;
	p->est_load_s = p->nrun ? load : 0;
	p->est_step_s = kvt_cost_overlap_s(&s->cost, compute, p->est_load_s,
					   s->cfg.features & KVT_SCHED_OVERLAP);
}

/* ---- the passes -------------------------------------------------------- */

static int has(const struct build *b, uint32_t f)
{
	return (b->s->cfg.features & f) != 0;
}

static int decided(const struct build *b, size_t i)
{
	return b->it[i].action != KVT_SACT_WAIT ||
	       b->it[i].reason != KVT_SWHY_NONE;
}

static void pass_forced(struct build *b)
{
	int why;

	for (size_t i = 0; i < b->n; i++) {
		if (b->reqs[i].skips < b->s->cfg.max_skips)
			continue;
		if (!(why = try_run(b, i)))
			continue;
		/* the oldest starved request that does not fit blocks every
		 * request behind it, so its skips cannot grow */
		b->it[i].reason = (uint32_t)why;
		for (size_t k = i + 1; k < b->n; k++)
			if (!decided(b, k))
				b->it[k].reason = KVT_SWHY_ORDER;
		return;
	}
}

/* Pass B; returns the number of I/O candidates left in @cand. */
static size_t pass_order(struct build *b, size_t *cand)
{
	size_t nc = 0;
	int why;

	for (size_t i = 0; i < b->n; i++) {
		if (decided(b, i))
			continue;
		if (!b->budget || !b->seqs) {
			b->it[i].reason = KVT_SWHY_BUDGET;
			continue;
		}
		if (has(b, KVT_SCHED_DELAYHIT) && waits_for_context(b, i)) {
			b->it[i].action = KVT_SACT_DEFER;
			b->it[i].reason = KVT_SWHY_TRANSIENT;
			continue;
		}
		if (b->s->cfg.wait_loads && loads_away(b, i)) {
			/* vLLM: WAITING_FOR_REMOTE_KVS, skipped */
			b->it[i].reason = KVT_SWHY_IO;
			continue;
		}
		if (has(b, KVT_SCHED_BALANCE) &&
		    b->reqs[i].state == KVT_SREQ_WAITING && !hidden(b, i)) {
			b->it[i].reason = KVT_SWHY_IO;
			cand[nc++] = i;
			continue;
		}
		if ((why = try_run(b, i))) {
			b->it[i].reason = (uint32_t)why;
			/* FCFS: what does not fit blocks those behind it */
			for (size_t k = i + 1; k < b->n; k++)
				if (!decided(b, k))
					b->it[k].reason = KVT_SWHY_ORDER;
			break;
		}
	}
	return nc;
}

static void pass_pairing(struct build *b, const size_t *cand, size_t nc)
{
	for (size_t k = 0; k < nc && b->budget && b->seqs; k++) {
		size_t i = cand[k];

		if (hidden(b, i) && !try_run(b, i))
			b->it[i].reason = KVT_SWHY_NONE;
	}
}

static void pass_no_prefill(struct build *b, const size_t *cand, size_t nc)
{
	for (size_t i = 0; i < b->n; i++)
		if (b->it[i].action == KVT_SACT_RUN)
			return;
	if (!nc)
		return;
	if (has(b, KVT_SCHED_STALLHIDE) && b->decodes)
		return; /* decode-only step while the loads proceed */
	if (!try_run(b, cand[0]))
		b->it[cand[0]].reason = KVT_SWHY_NONE;
}

int kvt_sched_plan_step(kvt_sched *s, const kvt_sched_state *st,
			kvt_sched_req *reqs, size_t n, kvt_sched_item *items,
			kvt_sched_plan *plan)
{
	struct view vbuf[256], *v = vbuf;
	size_t cbuf[256], *cand = cbuf, nc;
	uint32_t others = st ? st->decodes : 0;
	struct build b;
	int err = 0;

	kvti_errclear();
	if (!s || !st || !items || !plan || (n && !reqs))
		return kvti_fail(-EINVAL, "kvt_sched_plan_step: NULL argument");
	if (n > KVT_ARRAY_SIZE(vbuf)) {
		v = kvt_malloc(n * sizeof(*v));
		cand = kvt_malloc(n * sizeof(*cand));
		if (!v || !cand) {
			err = -ENOMEM;
			goto out;
		}
	}
	for (size_t i = 0; i < n; i++)
		others += reqs[i].state == KVT_SREQ_PREFILL;
	for (size_t i = 0; i < n; i++)
		if ((err = req_view(s, st, &reqs[i], i, others, &v[i])))
			goto out;
	memset(items, 0, n * sizeof(*items));
	b = (struct build){ .s = s, .st = st, .reqs = reqs, .it = items,
			    .v = v, .n = n, .budget = s->cfg.token_budget,
			    .seqs = s->cfg.max_batch, .pages = st->free_pages,
			    .link_t = KVT_MAX(st->link_free_at, st->now),
			    .ready = st->now, .rated = rated(st) };
	for (int k = 0; k < KVT_TIER_COUNT; k++)
		b.tier_t[k] = KVT_MAX(st->tier_free_at[k], st->now);
	b.decodes = KVT_MIN(st->decodes, KVT_MIN(b.budget, b.seqs));
	b.budget -= b.decodes;
	b.seqs -= b.decodes;

	if (has(&b, KVT_SCHED_STARVE))
		pass_forced(&b);
	nc = pass_order(&b, cand);
	if (has(&b, KVT_SCHED_BALANCE))
		pass_pairing(&b, cand, nc);
	pass_no_prefill(&b, cand, nc);
	if (has(&b, KVT_SCHED_PREFETCH))
		prefetch(&b);
	count_skips(&b);
	finish_plan(&b, plan);
out:
	if (v != vbuf)
		kvt_free(v);
	if (cand != cbuf)
		kvt_free(cand);
	return err;
}

/* ---- one request's hit, for an engine's own scheduler ------------------- */

int kvt_sched_decide(const kvt_sched *s, const kvt_sched_state *st,
		     const kvt_sched_req *r, uint32_t others, kvt_sched_hit *out)
{
	uint32_t loadable = 0, hbm;
	struct runs ru;
	struct view v;
	int err;

	kvti_errclear();
	if (!s || !st || !r || !out)
		return kvti_fail(-EINVAL, "kvt_sched_decide: NULL argument");
	memset(out, 0, sizeof(*out));
	if (r->state != KVT_SREQ_WAITING)
		return kvti_fail(-EINVAL, "kvt_sched_decide: the request is not "
				 "waiting (state %u)", r->state);
	if ((err = req_view(s, st, r, 0, others, &v)))
		return err;
	hbm = KVT_MIN(r->hbm, r->prompt - 1);
	for (int t = 1; t < KVT_TIER_COUNT; t++)
		loadable += r->tier[t];
	if ((err = runs_of(r, loadable, v.reuse - hbm, &ru, 0)))
		return err;
	out->load = v.reuse - hbm;
	out->recompute = v.recompute;
	memcpy(out->recompute_tier, v.recompute_tier,
	       sizeof(out->recompute_tier));
	out->load_s = span_load_s(s, st, &ru, r->loading, out->load);
	if (r->loading)
		out->load_s = KVT_MAX(out->load_s, r->loading_ready - st->now);
	out->compute_s = kvt_cost_prefill_s(&s->cost, v.need, v.reuse);
	if (v.transient) {
		out->wait_s = KVT_MAX(0.0, r->transient_ready - st->now);
		out->wait = (s->cfg.features & KVT_SCHED_DELAYHIT) &&
			    v.transient > s->cfg.delay_hit_tokens &&
			    transient_cheaper(s, st, r, &v);
	}
	return 0;
}
