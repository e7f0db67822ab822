/*
 * workload.c — what arrives, when, and with which tokens.
 *
 * Every workload is a deterministic function of the seed. Token ids are
 * never stored: token i of a stream is a hash of (stream kind, stream id,
 * i), so two requests share exactly the prefix their streams share:
 *
 *   agentic   session s: one stream; turn k's prompt is its first
 *             P0 + k * (append + output) tokens (the previous prompt, the
 *             previous answer, the new tokens); P_last = --context. Turn
 *             k + 1 arrives a think time after turn k finishes, drawn
 *             from (seed, s, k + 1) alone: the same for every policy and
 *             run whatever order turns finish in.
 *   loogle,   document d: one stream of len(d) tokens; a question is the
 *   narrativeqa  document followed by its own question stream.
 *   reviewmt  paper d: one stream; turn k appends review/discussion
 *             tokens, so turn k's prompt is the paper plus k+1 turns.
 *   sharegpt  every request its own stream.
 *   trace     the i-th 512-token block of a request is the stream of its
 *             i-th hash id: requests sharing k ids share k blocks.
 *
 * Cache distance (documents): cache_distance + 1 documents rotate; request
 * j asks about the document in slot j mod (cache_distance + 1), so between
 * two questions on one document come cache_distance questions on others.
 * A document that has had all its questions is replaced by a new one; the
 * first documents start with 1..questions questions left (uniform), so
 * replacements — cold first questions — spread evenly over time instead
 * of arriving all together every cycle.
 *
 * Warm-up (documents): the first 2 * (cache_distance + 1) requests meet an
 * empty cache (the first pass over the rotation is all cold); they run
 * but are left out of the statistics (wl_item.measure = 0).
 *
 * Length distributions (medians, log-sd, clip) and why: docs/SIMULATOR.md.
 */
#include "sim/sim_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

double kvti_rng_exp(struct rng *r, double mean)
{
	return -mean * log(rng_unit(r));
}

uint32_t kvti_rng_lognormal(struct rng *r, double median, double sigma,
			    uint32_t lo, uint32_t hi)
{
	/* Box-Muller, one draw */
	double z = sqrt(-2 * log(rng_unit(r))) * cos(2 * M_PI * rng_unit(r));
	double v = median * exp(sigma * z);

	if (v < lo)
		v = lo;
	if (v > hi)
		v = hi;
	return (uint32_t)(v + 0.5);
}

/* ---- the shapes ------------------------------------------------------- */

struct shape {
	uint32_t doc_median;     /* documents: median length */
	double doc_sigma;
	uint32_t doc_lo, doc_hi;
	uint32_t questions;      /* per document (reviewmt: turns) */
	uint32_t q_median;       /* question / turn tokens */
	double q_sigma;
	uint32_t q_lo, q_hi;
	uint32_t out_median;
	double out_sigma;
	uint32_t out_lo, out_hi;
};

static const struct shape shapes[KVT_WL_COUNT] = {
	/*            doc: med  sigma lo    hi      qs  q: med sg  lo  hi
	 *            out: med sigma lo hi */
	[KVT_WL_LOOGLE] = { 24000, 0.4, 8000, 64000, 8, 40, 0.5, 8, 200,
			    32, 0.6, 4, 256 },
	[KVT_WL_NARRATIVEQA] = { 20000, 0.6, 4000, 100000, 30, 16, 0.4, 4, 64,
				 12, 0.5, 2, 64 },
	[KVT_WL_REVIEWMT] = { 10000, 0.3, 4000, 24000, 6, 600, 0.4, 100, 2000,
			      400, 0.4, 64, 1024 },
	[KVT_WL_SHAREGPT] = { 180, 1.0, 4, 4096, 1, 0, 0, 0, 0,
			      200, 0.8, 4, 1024 },
};

static const char *const wl_names[KVT_WL_COUNT] = {
	"agentic", "loogle", "narrativeqa", "reviewmt", "sharegpt", "trace",
};

const char *kvt_workload_name(kvt_workload w)
{
	return (unsigned)w < KVT_WL_COUNT ? wl_names[w] : NULL;
}

int kvt_workload_parse(const char *s, kvt_workload *w, char *path, size_t len)
{
	if (s && !strncmp(s, "trace:", 6)) {
		if (!s[6])
			return kvti_fail(-EINVAL, "workload 'trace:' needs a "
					 "file: trace:FILE");
		if (path && kvti_strlcpy(path, s + 6, len))
			return kvti_fail(-EINVAL, "trace path too long");
		*w = KVT_WL_TRACE;
		return 0;
	}
	for (int i = 0; s && i < KVT_WL_TRACE; i++)
		if (kvti_streq_ci(s, wl_names[i])) {
			*w = (kvt_workload)i;
			return 0;
		}
	return kvti_fail(-EINVAL, "unknown workload '%s' (agentic, loogle, "
			 "narrativeqa, reviewmt, sharegpt, trace:FILE)",
			 s ? s : "(null)");
}

/* ---- token streams ------------------------------------------------------ */

enum { ST_SESSION = 1, ST_DOC, ST_QUESTION, ST_PROMPT, ST_BLOCK, ST_TAIL,
       ST_SYSTEM };

static inline uint64_t mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

static void stream(uint64_t seed, int kind, uint64_t id, uint32_t from,
		   uint32_t n, uint32_t *tok)
{
	uint64_t base = mix(seed ^ ((uint64_t)kind << 56) ^ mix(id + 1));

	for (uint32_t i = 0; i < n; i++)
		tok[i] = (uint32_t)mix(base + from + i);
}

/* ---- set up ------------------------------------------------------------- */

static void doc_new(struct wl *w, struct wl_doc *d)
{
	d->id = w->next_doc++;
	d->len = kvti_rng_lognormal(&w->rng, w->doc_median, w->doc_sigma,
				    w->doc_lo, w->doc_hi);
	d->left = w->questions;
	d->asked = 0;
}

int kvti_wl_init(struct wl *w, const kvt_sim_config *c, double rate)
{
	const struct shape *sh = &shapes[c->workload];
	int err;

	memset(w, 0, sizeof(*w));
	w->kind = c->workload;
	w->seed = c->seed;
	rng_seed(&w->rng, c->seed);
	w->engines = c->engines ? c->engines : 1;
	w->rate = rate;
	w->requests = c->requests;
	switch (c->workload) {
	case KVT_WL_AGENTIC:
		w->sessions = c->sessions;
		w->turns = c->turns;
		w->context = c->context;
		w->append = c->append;
		w->output = c->output ? c->output : 256;
		w->think_s = c->think_s;
		w->system = c->system;
		w->session_rate = c->session_rate;
		if (!w->sessions || !w->turns || !w->context)
			return kvti_fail(KVT_ECONFIG, "agentic: sessions, turns "
					 "and context must be > 0");
		if (c->session_rate < 0 || c->think_sigma < 0)
			return kvti_fail(KVT_ECONFIG, "agentic: session rate and "
					 "think sigma must be >= 0");
		if ((uint64_t)(w->turns - 1) * (w->append + w->output) >=
		    w->context)
			return kvti_fail(KVT_ECONFIG, "agentic: %u turns of "
					 "%u + %u tokens do not fit a %u-token "
					 "context", w->turns - 1, w->append,
					 w->output, w->context);
		w->first = w->context - (w->turns - 1) * (w->append + w->output);
		if (w->system >= w->first)
			return kvti_fail(KVT_ECONFIG, "agentic: a system prompt of "
					 "%u tokens leaves nothing of the %u-token "
					 "first turn", w->system, w->first);
		if (c->think_sigma > 0) {
			/* every session its own pace (drawn only then: runs
			 * without it draw exactly what they always did) */
			w->think = kvt_calloc(w->sessions, sizeof(*w->think));
			if (!w->think)
				return -ENOMEM;
			for (uint32_t s = 0; s < w->sessions; s++)
				w->think[s] = w->think_s *
					exp(c->think_sigma *
					    sqrt(-2 * log(rng_unit(&w->rng))) *
					    cos(2 * M_PI * rng_unit(&w->rng)));
		}
		return 0;
	case KVT_WL_TRACE:
		if ((err = kvt_trace_open(&w->trace, c->trace_path)))
			return err;
		w->trace_speed = c->trace_speed > 0 ? c->trace_speed : 1;
		return 0;
	case KVT_WL_LOOGLE:
	case KVT_WL_NARRATIVEQA:
	case KVT_WL_REVIEWMT:
	case KVT_WL_SHAREGPT:
		break;
	default:
		return kvti_fail(KVT_ECONFIG, "unknown workload %d",
				 (int)c->workload);
	}
	if (!(rate > 0))
		return kvti_fail(KVT_ECONFIG, "%s: the arrival rate must be > 0",
				 wl_names[c->workload]);
	if (!w->requests)
		w->requests = 1000;
	w->doc_median = c->context ? c->context : sh->doc_median;
	w->doc_sigma = c->context ? 0 : sh->doc_sigma;
	w->doc_lo = KVT_MIN(sh->doc_lo, w->doc_median);
	w->doc_hi = KVT_MAX(sh->doc_hi, w->doc_median);
	w->questions = c->questions ? c->questions : sh->questions;
	w->output = c->output;
	if (c->workload == KVT_WL_SHAREGPT)
		return 0;
	w->nslot = c->cache_distance + 1;
	if (!(w->slot = kvt_calloc(w->nslot, sizeof(*w->slot))))
		return -ENOMEM;
	for (uint32_t i = 0; i < w->nslot; i++) {
		doc_new(w, &w->slot[i]);
		w->slot[i].left = 1 + (uint32_t)(rng_next(&w->rng) %
						 w->questions);
	}
	w->warmup = 2 * w->nslot;
	return 0;
}

void kvti_wl_fini(struct wl *w)
{
	kvt_free(w->think);
	kvt_free(w->slot);
	kvt_trace_close(w->trace);
	memset(w, 0, sizeof(*w));
}

/* ---- arrivals ----------------------------------------------------------- */

static uint32_t out_len(struct wl *w)
{
	const struct shape *sh = &shapes[w->kind];

	if (w->output)
		return w->output;
	return kvti_rng_lognormal(&w->rng, sh->out_median, sh->out_sigma,
				  sh->out_lo, sh->out_hi);
}

static void doc_request(struct wl *w, uint32_t j, struct wl_item *it)
{
	const struct shape *sh = &shapes[w->kind];
	struct wl_doc *d = &w->slot[j % w->nslot];
	uint32_t q;

	if (!d->left)
		doc_new(w, d);
	q = kvti_rng_lognormal(&w->rng, sh->q_median, sh->q_sigma, sh->q_lo,
			       sh->q_hi);
	it->source = d->id;
	it->turn = d->asked;
	it->affinity = d->id;
	it->doc_tokens = d->len;
	it->group = (uint64_t)d->id + 1;
	it->group_tokens = d->len;
	it->warm = d->asked > 0;
	/* reviewmt: each turn adds a fixed-length turn to the paper */
	it->prompt = w->kind == KVT_WL_REVIEWMT ?
			     d->len + (d->asked + 1) * sh->q_median :
			     d->len + q;
	it->output = out_len(w);
	d->asked++;
	d->left--;
}

static int trace_initial(struct wl *w, struct wl_item *it, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		const kvt_trace_req *t = kvt_trace_get(w->trace, i);

		it[i].arrival = (double)t->time_ns * 1e-9 / w->trace_speed;
		it[i].prompt = t->input_length ? t->input_length : 1;
		it[i].output = t->output_length ? t->output_length : 1;
		it[i].source = i;
		/* route by the first two blocks: turns of one conversation
		 * stay together, a prompt prefix shared by all (block 0)
		 * does not pull everything onto one engine */
		it[i].affinity = t->nhash ? (uint32_t)mix(t->hash_ids[0] * 31 +
				(t->nhash > 1 ? t->hash_ids[1] : 0)) : i;
		it[i].warm = 0;
	}
	return 0;
}

static int by_arrival(const void *a, const void *b)
{
	const struct wl_item *x = a, *y = b;

	if (x->arrival != y->arrival)
		return x->arrival < y->arrival ? -1 : 1;
	return x->source < y->source ? -1 : x->source > y->source;
}

int kvti_wl_initial(struct wl *w, struct wl_item **items, uint32_t *n)
{
	struct wl_item *it;
	uint32_t cnt;
	double t = 0;

	switch (w->kind) {
	case KVT_WL_AGENTIC:
		cnt = w->sessions;
		break;
	case KVT_WL_TRACE:
		cnt = (uint32_t)KVT_MIN(kvt_trace_count(w->trace),
					(size_t)(w->requests ? w->requests :
							       UINT32_MAX));
		break;
	default:
		cnt = w->requests;
	}
	if (!(it = kvt_calloc(cnt ? cnt : 1, sizeof(*it))))
		return -ENOMEM;
	for (uint32_t i = 0; i < cnt; i++)
		it[i].measure = i >= w->warmup;
	for (uint32_t i = 0; i < cnt && w->kind == KVT_WL_AGENTIC; i++) {
		/* every session starts at once with its cold turn, or they
		 * arrive as a Poisson process */
		if (w->session_rate > 0)
			t += kvti_rng_exp(&w->rng, 1 / w->session_rate);
		it[i].arrival = t;
		it[i].prompt = w->first;
		it[i].output = w->output;
		it[i].source = i;
		it[i].affinity = i;
	}
	if (w->kind == KVT_WL_TRACE) {
		trace_initial(w, it, cnt);
		qsort(it, cnt, sizeof(*it), by_arrival);
	}
	if (w->warmup >= cnt && cnt) {
		kvt_free(it);
		return kvti_fail(KVT_ECONFIG, "%u requests are all warm-up "
				 "(the first %u meet an empty cache): ask for "
				 "more requests or a smaller cache distance",
				 cnt, w->warmup);
	}
	for (uint32_t i = 0; i < cnt && w->kind != KVT_WL_AGENTIC &&
			     w->kind != KVT_WL_TRACE; i++) {
		t += kvti_rng_exp(&w->rng, 1 / w->rate);
		it[i].arrival = t;
		if (w->kind == KVT_WL_SHAREGPT) {
			const struct shape *sh = &shapes[w->kind];

			it[i].prompt = kvti_rng_lognormal(&w->rng,
				w->doc_median, w->doc_sigma, w->doc_lo,
				w->doc_hi);
			it[i].output = out_len(w);
			it[i].source = i;
			it[i].affinity = i;
			(void)sh;
		} else {
			doc_request(w, i, &it[i]);
		}
	}
	*items = it;
	*n = cnt;
	return 0;
}

int kvti_wl_next(struct wl *w, const struct wl_item *prev, double finish,
		 struct wl_item *out)
{
	if (w->kind != KVT_WL_AGENTIC || prev->turn + 1 >= w->turns)
		return 0;
	*out = *prev;
	out->turn = prev->turn + 1;
	out->prompt = w->first + out->turn * (w->append + w->output);
	out->warm = 1;
	out->measure = 1;
	{
		double mean = w->think && prev->source < w->sessions ?
				      w->think[prev->source] : w->think_s;
		struct rng t;

		/* the think time is drawn from (seed, session, turn), not from
		 * the run's generator: turns finish in an order each policy
		 * and each run's noise decide, and a shared generator would
		 * hand the draws out in that order — another workload per
		 * policy, per repeat, and between kvtier sim and the demo */
		rng_seed(&t, mix(w->seed ^ 0x7468696e6bull ^
				 mix(((uint64_t)prev->source << 32 |
				      out->turn) + 1)));
		out->arrival = finish + (mean > 0 ? kvti_rng_exp(&t, mean) : 0);
	}
	return 1;
}

void kvti_wl_tokens(const struct wl *w, const struct wl_item *it,
		    uint32_t *tok)
{
	uint32_t n = it->prompt, b = 0;

	switch (w->kind) {
	case KVT_WL_AGENTIC: {
		/* the shared system prompt, then the session's own stream */
		uint32_t sys = KVT_MIN(w->system, n);

		if (sys)
			stream(w->seed, ST_SYSTEM, 0, 0, sys, tok);
		stream(w->seed, ST_SESSION, it->source, sys, n - sys, tok + sys);
		return;
	}
	case KVT_WL_LOOGLE:
	case KVT_WL_NARRATIVEQA:
		stream(w->seed, ST_DOC, it->source, 0, it->doc_tokens, tok);
		stream(w->seed, ST_QUESTION,
		       ((uint64_t)it->source << 20) + it->turn, 0,
		       n - it->doc_tokens, tok + it->doc_tokens);
		return;
	case KVT_WL_REVIEWMT:
		stream(w->seed, ST_DOC, it->source, 0, n, tok);
		return;
	case KVT_WL_SHAREGPT:
		stream(w->seed, ST_PROMPT, it->source, 0, n, tok);
		return;
	default:
		break;
	}
	/* trace: block i is the stream of hash id i (block size 512) */
	{
		const kvt_trace_req *t = kvt_trace_get(w->trace, it->source);

		for (uint32_t done = 0; done < n; b++) {
			uint32_t len = KVT_MIN(512u, n - done);

			if (t && b < t->nhash)
				stream(0, ST_BLOCK, t->hash_ids[b], 0, len,
				       tok + done);
			else
				stream(w->seed, ST_TAIL,
				       ((uint64_t)it->source << 24) + b, 0, len,
				       tok + done);
			done += len;
		}
	}
}

void kvti_wl_shape(const struct wl *w, double *prompt, double *output,
		   double *reuse)
{
	const struct shape *sh = &shapes[w->kind];

	switch (w->kind) {
	case KVT_WL_AGENTIC:
		*prompt = w->context;
		*output = w->output;
		*reuse = 1 - (double)(w->append + w->output) / w->context;
		return;
	case KVT_WL_SHAREGPT:
		*prompt = w->doc_median;
		*output = w->output ? w->output : sh->out_median;
		*reuse = 0;
		return;
	case KVT_WL_TRACE:
		*prompt = 8000;
		*output = 300;
		*reuse = 0.5;
		return;
	default:
		*prompt = w->doc_median + sh->q_median;
		*output = w->output ? w->output : sh->out_median;
		*reuse = w->questions > 1 ?
			(double)(w->questions - 1) / w->questions *
				w->doc_median / *prompt : 0;
	}
}
