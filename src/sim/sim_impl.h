/*
 * sim_impl.h — the simulator's insides, shared by its files (internal).
 *
 *   workload.c  what arrives when: request lengths, shared contexts, token
 *               ids (deterministic functions of the seed), session turns
 *   net.c       bytes in motion (net.h)
 *   engine.c    one engine instance: its index, pools, scheduler, steps
 *   sim.c       the event loop, the node's topology, results, sweeps
 */
#ifndef KVT_SIM_IMPL_H
#define KVT_SIM_IMPL_H

#include "core/core.h"
#include "sim/net.h"

#include <kvtier/sim.h>
#include <kvtier/index.h>
#include <kvtier/trace.h>

/* ---- random numbers: one generator per run, xorshift64* --------------- */

struct rng {
	uint64_t s;
};

static inline void rng_seed(struct rng *r, uint64_t seed)
{
	r->s = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
	if (!r->s)
		r->s = 1;
}

static inline uint64_t rng_next(struct rng *r)
{
	uint64_t x = r->s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	r->s = x;
	return x * 2685821657736338717ull;
}

/* Uniform in (0, 1). */
static inline double rng_unit(struct rng *r)
{
	return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

double kvti_rng_exp(struct rng *r, double mean);
/* Log-normal with this median and log-sd, clipped to [lo, hi]. */
uint32_t kvti_rng_lognormal(struct rng *r, double median, double sigma,
			    uint32_t lo, uint32_t hi);

/* ---- workloads --------------------------------------------------------- */

/* One request as the workload defines it. */
struct wl_item {
	double arrival;        /* s */
	uint32_t prompt;       /* tokens */
	uint32_t output;       /* tokens to generate (>= 1) */
	uint32_t source;       /* session, document or trace line */
	uint32_t turn;         /* agentic/reviewmt turn; document question */
	uint32_t affinity;     /* routes the request to an engine */
	uint64_t group;        /* shared uncached context (0: none) */
	uint32_t group_tokens;
	uint32_t doc_tokens;   /* documents: length of the shared document */
	int warm;              /* a turn after the first / a question after
				* the first on its document */
	int measure;           /* counts in the statistics (not warm-up) */
};

struct wl_doc {
	uint32_t id;
	uint32_t len;
	uint32_t left;         /* questions (turns) still to ask */
	uint32_t asked;
};

struct wl {
	kvt_workload kind;
	uint64_t seed;
	struct rng rng;
	uint32_t engines;
	/* agentic */
	uint32_t sessions, turns, context, append, output, first, system;
	double think_s, session_rate;
	double *think;         /* per session: its mean think time */
	/* documents */
	struct wl_doc *slot;   /* cache_distance + 1 documents in rotation */
	uint32_t nslot, next_doc, questions, doc_median;
	double doc_sigma;
	uint32_t doc_lo, doc_hi;
	/* trace */
	kvt_trace *trace;
	double trace_speed;
	/* open loop */
	double rate;
	uint32_t requests;
	uint32_t warmup;       /* leading requests left out of statistics */
};

/* Set up from the run's configuration; 0, -ENOMEM, KVT_ECONFIG, or an
 * error reading the trace. */
int kvti_wl_init(struct wl *w, const kvt_sim_config *c, double rate);
void kvti_wl_fini(struct wl *w);
/* The arrivals known up front, in time order: every request of an open
 * loop, the first turn of every session. *@items is kvt_malloc'ed. */
int kvti_wl_initial(struct wl *w, struct wl_item **items, uint32_t *n);
/* Agentic: the turn after @prev, finished at @finish; 1 and *@out, or 0
 * when the session is over. */
int kvti_wl_next(struct wl *w, const struct wl_item *prev, double finish,
		 struct wl_item *out);
/* The prompt's token ids, @it->prompt of them. */
void kvti_wl_tokens(const struct wl *w, const struct wl_item *it,
		    uint32_t *tok);
/* Median prompt and output lengths and the share of the prompt a warm
 * request finds cached (capacity estimates for sweeps). */
void kvti_wl_shape(const struct wl *w, double *prompt, double *output,
		   double *reuse);

/* ---- the run ----------------------------------------------------------- */

struct sim;
struct engine;

int kvti_sim_run(const kvt_sim_config *c, kvt_sim_result *r);
/* The node's estimated capacity in requests/s for this configuration (a
 * scale for automatic rates). */
double kvti_sim_capacity(const kvt_sim_config *c);

#endif
