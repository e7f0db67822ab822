/*
 * sweep.c — configuration defaults, the public run call, capacity
 * estimates and sweeps over arrival rates with a TTFT target.
 *
 * A sweep runs the same configuration (same seed: the same documents and
 * questions, only denser or sparser in time) at increasing arrival rates.
 * With a target, the highest rate whose mean TTFT meets it is found by
 * bisection between the last coarse rate that met it and the first that
 * did not, so "throughput at the TTFT target" is resolved to ~1/16 of the
 * coarse step without running a fine grid.
 */
#include "sim/sim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

void kvt_sim_config_init(kvt_sim_config *c)
{
	memset(c, 0, sizeof(*c));
	kvti_strlcpy(c->model, "llama-3.1-8b", sizeof(c->model));
	c->tp = 1;
	c->page_tokens = 16;
	c->engines = 1;
	kvt_sim_config_policy(c, KVT_POLICY_KVTIER);
	c->write_policy = KVT_WRITE_THROUGH;
	c->evict_policy = KVT_EVICT_LRU;
	c->offload[0] = KVT_TIER_DRAM;
	c->noffload = 1;
	c->hbm_reuse = -1;
	c->workload = KVT_WL_AGENTIC;
	c->trace_speed = 1;
	c->seed = 1;
	c->sessions = 10;
	c->turns = 6;
	c->append = 1024;
	c->think_s = 5.0;
	c->hbm_share = 1;
	c->cache_distance = 64;
	c->cpu_mem_latency = 1;
	c->store_holds_hbm = 1;
}

int kvt_sim_config_policy(kvt_sim_config *c, kvt_sched_policy p)
{
	static const kvt_copy_method store[KVT_POLICY_COUNT] = {
		[KVT_POLICY_LMCACHE] = KVT_COPY_OBJECT,
		[KVT_POLICY_HICACHE] = KVT_COPY_MEMCPY,
		[KVT_POLICY_KVTIER] = KVT_COPY_BATCH,
		[KVT_POLICY_HICACHE_KERNEL] = KVT_COPY_GATHER,
		[KVT_POLICY_VLLM] = KVT_COPY_MEMCPY,
	};
	int err;

	if ((err = kvt_sched_config_preset(&c->sched, p)))
		return err;
	c->policy = p;
	c->store_method = store[p];
	/* the engines' own layouts: SGLang's best practices run HiCache with
	 * 64-token pages; vLLM >= 0.12 keeps a block's layers contiguous */
	c->page_tokens = p == KVT_POLICY_HICACHE_KERNEL ? 64 : 16;
	c->page_contig = p == KVT_POLICY_VLLM;
	return 0;
}

int kvti_sim_geom(const kvt_sim_config *c, kvt_geom *g)
{
	char *text = NULL;
	int err;

	struct stat st;
	char path[4096 + 16];

	/* an existing file or directory is a config; anything else a preset */
	if (stat(c->model, &st) == 0) {
		snprintf(path, sizeof(path), "%s%s", c->model,
			 S_ISDIR(st.st_mode) ? "/config.json" : "");
		if ((err = kvti_read_file(path, 1 << 22, &text, NULL)))
			return kvti_fail(err, "model config '%s': %s", path,
					 kvti_file_strerror(err));
		err = kvt_geom_from_json(g, text, c->model, c->page_tokens,
					 c->tp, 0);
		kvt_free(text);
		return err;
	}
	return kvt_geom_preset(g, c->model, c->page_tokens, c->tp, 0);
}

/* Fill the "0: auto" fields the run needs resolved. */
static void resolve(kvt_sim_config *c)
{
	if (c->workload == KVT_WL_AGENTIC) {
		if (!c->context)
			c->context = 32768;
		if (!c->output)
			c->output = 256;
	}
}

int kvt_sim_run(const kvt_sim_config *c, kvt_sim_result *r)
{
	kvt_sim_config *x;
	kvt_sim_result tmp;
	int err;

	kvti_errclear();
	if (!c || !r)
		return kvti_fail(-EINVAL, "kvt_sim_run: NULL argument");
	if (!(x = kvt_malloc(sizeof(*x))))
		return -ENOMEM;
	*x = *c;
	resolve(x);
	err = kvti_sim_run(x, &tmp);
	if (!err)
		*r = tmp;
	kvt_free(x);
	return err;
}

double kvti_sim_capacity(const kvt_sim_config *c)
{
	double prompt, output, reuse, unc, cached, pre, load, dec, S;
	kvt_cost cost;
	kvt_geom g;
	struct wl w;

	if (kvti_sim_geom(c, &g) || kvt_hw_cost(&c->hw, &g, &cost))
		return 1;
	if (kvti_wl_init(&w, c, 1.0))
		return 1;
	kvti_wl_shape(&w, &prompt, &output, &reuse);
	kvti_wl_fini(&w);
	cached = prompt * reuse;
	unc = prompt - cached;
	pre = kvt_cost_prefill_s(&cost, (uint32_t)KVT_MAX(unc, 1.0),
				 (uint32_t)cached);
	load = cached * cost.token_bytes / (cost.link_gbps * 1e9);
	/* decodes share a step with ~64 others */
	dec = output * kvt_cost_step_s(&cost, NULL, 0, 64,
				       (uint64_t)(64 * (prompt + output))) / 64;
	S = KVT_MAX(pre, load) + dec;
	return c->engines / KVT_MAX(S, 1e-6);
}

static int by_rate(const void *a, const void *b)
{
	const kvt_sweep_point *x = a, *y = b;

	return x->rate < y->rate ? -1 : x->rate > y->rate;
}

static int point(const kvt_sim_config *c, double rate, kvt_sweep *out)
{
	kvt_sim_config *x;
	int err;

	if (out->n == KVT_SWEEP_MAX)
		return kvti_fail(KVT_ECONFIG, "a sweep holds at most %d points",
				 KVT_SWEEP_MAX);
	if (!(x = kvt_malloc(sizeof(*x))))
		return -ENOMEM;
	*x = *c;
	x->rate = rate;
	out->pt[out->n].rate = rate;
	err = kvt_sim_run(x, &out->pt[out->n].r);
	kvt_free(x);
	if (!err)
		out->n++;
	return err;
}

static int meets(const kvt_sweep_point *p, double target)
{
	return p->r.ttft_ms.mean <= target;
}

int kvt_sim_sweep(const kvt_sim_config *c, const double *rates,
		  uint32_t nrates, double target_ms, kvt_sweep *out)
{
	double cap, lo = 0, hi = 0;
	int err;

	kvti_errclear();
	if (!c || !out || (nrates && !rates))
		return kvti_fail(-EINVAL, "kvt_sim_sweep: NULL argument");
	if (c->workload == KVT_WL_AGENTIC || c->workload == KVT_WL_TRACE)
		return kvti_fail(KVT_ECONFIG, "a sweep over arrival rates needs "
				 "an open-loop workload (loogle, narrativeqa, "
				 "reviewmt, sharegpt), not %s",
				 kvt_workload_name(c->workload));
	if (nrates > KVT_SWEEP_MAX - 8)
		return kvti_fail(KVT_ECONFIG, "at most %d rates",
				 KVT_SWEEP_MAX - 8);
	memset(out, 0, sizeof(*out));
	cap = kvti_sim_capacity(c);
	for (uint32_t i = 0; i < (nrates ? nrates : 12); i++) {
		double r = nrates ? rates[i] :
			cap * 0.05 * pow(30.0, (double)i / 11);

		if (!(r > 0))
			return kvti_fail(KVT_ECONFIG, "rate %g is not > 0", r);
		if ((err = point(c, r, out)))
			return err;
	}
	qsort(out->pt, out->n, sizeof(out->pt[0]), by_rate);
	if (!(target_ms > 0))
		return 0;
	out->have_target = 1;
	out->target_ms = target_ms;
	for (uint32_t i = 0; i < out->n; i++) {
		if (meets(&out->pt[i], target_ms)) {
			lo = out->pt[i].rate;
		} else {
			hi = out->pt[i].rate;
			break;
		}
	}
	/* refine between the last rate that met it and the first that did
	 * not (TTFT is not strictly monotone in the rate, so this finds one
	 * crossing, the first) */
	for (int k = 0; k < 4 && lo > 0 && hi > lo; k++) {
		double mid = sqrt(lo * hi);

		if ((err = point(c, mid, out)))
			return err;
		if (meets(&out->pt[out->n - 1], target_ms))
			lo = mid;
		else
			hi = mid;
	}
	qsort(out->pt, out->n, sizeof(out->pt[0]), by_rate);
	for (uint32_t i = 0; i < out->n; i++)
		if (out->pt[i].rate == lo && lo > 0) {
			out->met = 1;
			out->at_rate = lo;
			out->at_throughput = out->pt[i].r.throughput_tok_s;
			out->at_ttft_ms = out->pt[i].r.ttft_ms.mean;
			out->at_top = i == out->n - 1;
		}
	return 0;
}

int kvt_curve_throughput_at(const double *thr_v, const double *ttft_v,
			    uint32_t n, double ttft_ms, double *thr)
{
	uint32_t i;

	if (!thr_v || !ttft_v || !thr || !n || !(ttft_ms > 0))
		return -EINVAL;
	if (!(ttft_v[0] <= ttft_ms))
		return -ERANGE;
	for (i = 1; i < n && ttft_v[i] <= ttft_ms; i++)
		;
	if (i == n) {
		*thr = thr_v[n - 1];
		return 1;
	}
	{
		double la = log(KVT_MAX(ttft_v[i - 1], 1e-9));
		double lb = log(ttft_v[i]);
		double t = lb > la ? (log(ttft_ms) - la) / (lb - la) : 0;

		*thr = thr_v[i - 1] + t * (thr_v[i] - thr_v[i - 1]);
	}
	return 0;
}

int kvt_sweep_throughput_at(const kvt_sweep *w, double ttft_ms, double *thr)
{
	double tv[KVT_SWEEP_MAX], mv[KVT_SWEEP_MAX];

	if (!w || !thr || !w->n || w->n > KVT_SWEEP_MAX)
		return -EINVAL;
	for (uint32_t i = 0; i < w->n; i++) {
		tv[i] = w->pt[i].r.throughput_tok_s;
		mv[i] = w->pt[i].r.ttft_ms.mean;
	}
	return kvt_curve_throughput_at(tv, mv, w->n, ttft_ms, thr);
}
