/*
 * cmd_demo_json.c — `kvtier demo --json`: the configuration, the headline
 * pass of each policy, every pass, throughput at equal p90 TTFT and the
 * speed goals (with a sweep), the integrity counters, ok/error and the
 * load average. The format is tabled in docs/FORMATS.md.
 */
#include "cmd_demo.h"

/* ---- JSON ---------------------------------------------------------------- */

static cJSON *tiers_json(const uint64_t *v)
{
	cJSON *o = cJSON_CreateObject();

	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		cJSON_AddNumberToObject(o, kvt_tier_kind_name((kvt_tier_kind)t),
					(double)v[t]);
	return o;
}

static cJSON *stat_json(const kvt_demo_pass *p)
{
	const kvt_demo_stat *s = &p->st;
	cJSON *o = cJSON_CreateObject(), *x;

	cJSON_AddItemToObject(o, "ttft_ms", cli_dist_json(&s->ttft_ms));
	cJSON_AddItemToObject(o, "warm_ttft_ms", cli_dist_json(&s->warm_ttft_ms));
	cJSON_AddItemToObject(o, "tpot_ms", cli_dist_json(&s->tpot_ms));
	cJSON_AddNumberToObject(o, "tokens_per_s", s->tokens_per_s);
	cJSON_AddNumberToObject(o, "output_tokens_per_s", s->output_per_s);
	cJSON_AddNumberToObject(o, "makespan_s", s->makespan_s);
	cJSON_AddItemToObject(o, "loaded_tokens", tiers_json(s->loaded_tokens));
	cJSON_AddItemToObject(o, "recomputed_tokens",
			      tiers_json(s->recomputed_tokens));
	cJSON_AddNumberToObject(o, "computed_tokens", (double)s->computed_tokens);
	cJSON_AddNumberToObject(o, "prompt_tokens", (double)s->prompt_tokens);
	cJSON_AddNumberToObject(o, "output_tokens", (double)s->output_tokens);
	cJSON_AddNumberToObject(o, "steps", (double)s->steps);
	cJSON_AddNumberToObject(o, "decode_only_steps",
				(double)s->decode_only_steps);
	cJSON_AddNumberToObject(o, "deferred", (double)s->deferred);
	cJSON_AddNumberToObject(o, "preemptions", (double)s->preemptions);
	cJSON_AddNumberToObject(o, "gpu_busy_modeled", s->gpu_busy);
	cJSON_AddNumberToObject(o, "gpu_overrun_s", s->gpu_overrun_s);
	cJSON_AddNumberToObject(o, "load_wait_s", s->load_wait_s);
	cJSON_AddNumberToObject(o, "engine_ms_per_step", s->plan_ms_mean);
	cJSON_AddNumberToObject(o, "host_us_per_step", s->host_us_per_step);
	cJSON_AddNumberToObject(o, "host_us_prefill_step",
				s->host_us_prefill_step);
	cJSON_AddNumberToObject(o, "host_us_decode_step",
				s->host_us_decode_step);
	cJSON_AddNumberToObject(o, "load_stretch", s->load_stretch);
	cJSON_AddNumberToObject(o, "store_skipped_pages",
				(double)s->store_skipped_pages);
	x = cJSON_AddObjectToObject(o, "load_gbps_measured");
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		cJSON_AddNumberToObject(x, kvt_tier_kind_name((kvt_tier_kind)t),
					s->load_gbps[t]);
	x = cJSON_AddObjectToObject(o, "load_gbps_mean");
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		cJSON_AddNumberToObject(x, kvt_tier_kind_name((kvt_tier_kind)t),
					s->load_gbps_mean[t]);
	x = cJSON_AddObjectToObject(o, "load_job_kib");
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		cJSON_AddNumberToObject(x, kvt_tier_kind_name((kvt_tier_kind)t),
					s->load_job_kib[t]);
	return o;
}

static cJSON *pass_json(const kvt_demo_pass *p)
{
	cJSON *o = stat_json(p), *x;

	cJSON_AddStringToObject(o, "policy", p->policy);
	cJSON_AddStringToObject(o, "variant", p->variant);
	cJSON_AddNumberToObject(o, "rate", p->rate);
	cJSON_AddNumberToObject(o, "sessions", p->sessions);
	cJSON_AddNumberToObject(o, "repeat", p->repeat);
	cJSON_AddNumberToObject(o, "order", p->order);
	cJSON_AddStringToObject(o, "tiers", p->tiers);
	cJSON_AddStringToObject(o, "fabric_tier", p->fabric_where);
	cJSON_AddNumberToObject(o, "requests", (double)p->nreqs);
	cJSON_AddNumberToObject(o, "requests_run", (double)p->done);
	cJSON_AddNumberToObject(o, "engine_blocks", (double)p->nblocks);
	cJSON_AddNumberToObject(o, "seconds", p->seconds);
	cJSON_AddNumberToObject(o, "setup_seconds", p->setup_s);
	cJSON_AddNumberToObject(o, "loadavg", p->loadavg);
	if (p->predicted) {
		x = cJSON_AddObjectToObject(o, "predicted");
		cJSON_AddItemToObject(x, "ttft_ms", cli_dist_json(&p->pred_ttft_ms));
		cJSON_AddItemToObject(x, "tpot_ms", cli_dist_json(&p->pred_tpot_ms));
		cJSON_AddNumberToObject(x, "tokens_per_s", p->pred_tokens_per_s);
		cJSON_AddNumberToObject(x, "loaded_tokens", (double)p->pred_loaded);
	}
	if (p->predicted_env) {
		x = cJSON_AddObjectToObject(o, "predicted_measured_env");
		cJSON_AddItemToObject(x, "ttft_ms", cli_dist_json(&p->penv_ttft_ms));
		cJSON_AddNumberToObject(x, "tokens_per_s", p->penv_tokens_per_s);
		cJSON_AddNumberToObject(x, "cpu_copy_factor", p->penv_cpu_f);
		cJSON_AddNumberToObject(x, "ssd_factor", p->penv_ssd_f);
		cJSON_AddNumberToObject(x, "host_us", p->st.host_us_per_step);
		cJSON_AddNumberToObject(x, "load_stretch",
					p->st.load_stretch);
	}
	if (p->stress_gbps > 0)
		cJSON_AddNumberToObject(o, "stress_gbps", p->stress_gbps);
	x = cJSON_AddObjectToObject(o, "data");
	cJSON_AddNumberToObject(x, "loads", (double)p->cache.loads);
	cJSON_AddNumberToObject(x, "load_bytes", (double)p->cache.load_bytes);
	cJSON_AddNumberToObject(x, "stores", (double)p->cache.stores);
	cJSON_AddNumberToObject(x, "store_bytes", (double)p->cache.store_bytes);
	cJSON_AddNumberToObject(x, "move_pages", (double)p->cache.move_pages);
	cJSON_AddNumberToObject(x, "move_bytes", (double)p->cache.move_bytes);
	cJSON_AddNumberToObject(x, "move_errors", (double)p->cache.move_errors);
	cJSON_AddNumberToObject(x, "verified", (double)p->cache.verified);
	cJSON_AddNumberToObject(x, "corrupt", (double)p->cache.corrupt);
	cJSON_AddNumberToObject(x, "failed_blocks",
				(double)p->cache.failed_blocks);
	cJSON_AddNumberToObject(x, "bg_passes", (double)p->cache.bg_passes);
	cJSON_AddNumberToObject(x, "cache_wait_seconds", p->cache.wait_s);
	cJSON_AddBoolToObject(x, "final_check_complete",
			      p->check_err == 0 || p->check_err == KVT_ECORRUPT);
	cJSON_AddNumberToObject(x, "final_checked", (double)p->check.checked);
	cJSON_AddNumberToObject(x, "final_bad", (double)p->check.bad);
	if (p->err)
		cJSON_AddStringToObject(o, "error", p->error);
	return o;
}

cJSON *kvti_cd_result_json(const kvt_demo_result *r, int err)
{
	const kvt_demo_config *c = &r->config;
	cJSON *root = cJSON_CreateObject(), *o, *a;
	double tg[KVT_DEMO_MAX_TARGETS];
	uint32_t nt = c->nrates >= 2 ? kvti_cd_targets(r, tg) : 0;
	struct integrity g;

	o = cJSON_AddObjectToObject(root, "config");
	cJSON_AddStringToObject(o, "model", r->geom.name);
	cJSON_AddNumberToObject(o, "token_bytes",
				(double)kvt_geom_token_bytes(&r->geom));
	cJSON_AddNumberToObject(o, "page_tokens", c->page_tokens);
	cJSON_AddNumberToObject(o, "sessions", c->sessions);
	cJSON_AddNumberToObject(o, "turns", c->turns);
	cJSON_AddNumberToObject(o, "rate", c->rate);
	cJSON_AddNumberToObject(o, "think_s", c->think_s);
	cJSON_AddNumberToObject(o, "think_sigma", c->think_sigma);
	cJSON_AddNumberToObject(o, "system_tokens", c->system_tokens);
	cJSON_AddNumberToObject(o, "context_tokens", c->context_tokens);
	cJSON_AddNumberToObject(o, "turn_tokens", c->turn_tokens);
	cJSON_AddNumberToObject(o, "output_tokens", c->output_tokens);
	cJSON_AddNumberToObject(o, "token_budget", c->token_budget);
	cJSON_AddStringToObject(o, "hardware", c->hardware);
	cJSON_AddStringToObject(o, "gpu_modeled", r->gpu_name);
	cJSON_AddBoolToObject(o, "daemon", c->daemon);
	cJSON_AddNumberToObject(o, "stress_threads", c->stress);
	cJSON_AddNumberToObject(o, "hbm_bytes", (double)c->hbm_bytes);
	cJSON_AddNumberToObject(o, "fabric_bytes", (double)c->fabric_bytes);
	cJSON_AddNumberToObject(o, "dram_bytes", (double)c->dram_bytes);
	cJSON_AddNumberToObject(o, "ssd_bytes", (double)c->ssd_bytes);
	cJSON_AddNumberToObject(o, "seed", (double)c->seed);
	cJSON_AddNumberToObject(o, "repeat", c->repeat);
	a = cJSON_AddArrayToObject(o, "rates");
	for (uint32_t k = 0; k < kvti_cd_nrates(c); k++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(kvti_cd_rate_at(c, k)));
	/* the headline: each policy at the first rate, first run */
	o = cJSON_AddObjectToObject(root, "policies");
	for (int i = 0; i < NPOL; i++) {
		const kvt_demo_pass *p = kvti_cd_find(r, kvti_cd_pol[i],
						      kvti_cd_rate_at(c, 0), 0);

		if (p)
			cJSON_AddItemToObject(o, p->policy, stat_json(p));
	}
	a = cJSON_AddArrayToObject(root, "passes");
	for (int i = 0; i < r->npasses; i++)
		cJSON_AddItemToArray(a, pass_json(&r->pass[i]));
	if (nt) {
		struct goals gl;

		o = cJSON_AddObjectToObject(root, "throughput_at_equal_ttft");
		cJSON_AddStringToObject(o, "statistic", "p90");
		for (uint32_t j = 0; j < nt; j++) {
			char key[32];
			cJSON *t;

			snprintf(key, sizeof(key), "%.0f", tg[j]);
			t = cJSON_AddObjectToObject(o, key);
			for (int i = 0; i < NPOL; i++) {
				double v;
				int rc = kvt_demo_throughput_at(r, kvti_cd_pol[i],
								0, tg[j], &v);

				if (rc < 0)
					cJSON_AddNullToObject(t, kvti_cd_pol[i]);
				else
					cJSON_AddNumberToObject(t, kvti_cd_pol[i],
								v);
			}
		}
		kvti_cd_goals(r, tg, nt, &gl);
		o = cJSON_AddObjectToObject(root, "goals");
		cJSON_AddNumberToObject(o, "kvtier_over_lmcache", gl.ratio_lm);
		cJSON_AddNumberToObject(o, "kvtier_over_vllm", gl.ratio_vllm);
		cJSON_AddNumberToObject(o, "ratio_repeats", c->repeat);
		cJSON_AddNumberToObject(o, "kvtier_over_lmcache_min", gl.lm_lo);
		cJSON_AddNumberToObject(o, "kvtier_over_lmcache_max", gl.lm_hi);
		cJSON_AddNumberToObject(o, "kvtier_over_lmcache_at_ms", gl.at_lm);
		cJSON_AddNumberToObject(o, "kvtier_over_vllm_min", gl.vl_lo);
		cJSON_AddNumberToObject(o, "kvtier_over_vllm_max", gl.vl_hi);
		cJSON_AddNumberToObject(o, "kvtier_over_vllm_at_ms", gl.at_vllm);
		cJSON_AddBoolToObject(o, "throughput_goal_met", gl.pass_ratio);
		cJSON_AddNumberToObject(o, "highest_sustained_rate",
					gl.have_top ? gl.top_rate : 0);
		cJSON_AddBoolToObject(o, "p90_goal_met", gl.pass_p90);
	}
	kvti_cd_integrity(r, &g);
	o = cJSON_AddObjectToObject(root, "integrity");
	cJSON_AddNumberToObject(o, "engine_checked", (double)g.engine_checked);
	cJSON_AddNumberToObject(o, "engine_bad", (double)g.engine_bad);
	cJSON_AddNumberToObject(o, "restore_failed", (double)g.failed);
	cJSON_AddNumberToObject(o, "restore_failed_busy",
				(double)g.failed_busy);
	cJSON_AddNumberToObject(o, "restore_failed_absent",
				(double)g.failed_absent);
	cJSON_AddNumberToObject(o, "verified", (double)g.moves_verified);
	cJSON_AddNumberToObject(o, "corrupt", (double)g.corrupt);
	cJSON_AddNumberToObject(o, "move_io_errors", (double)g.move_errors);
	cJSON_AddNumberToObject(o, "final_checked", (double)g.checked);
	cJSON_AddNumberToObject(o, "final_bad", (double)g.check_bad);
	cJSON_AddBoolToObject(o, "final_check_complete", !g.incomplete);
	cJSON_AddNumberToObject(o, "bad", (double)g.bad);
	cJSON_AddBoolToObject(root, "ok", !err);
	if (err)
		cJSON_AddStringToObject(root, "error", r->error[0] ? r->error :
					kvt_strerror(err));
	cJSON_AddNumberToObject(root, "seconds", r->seconds);
	cJSON_AddNumberToObject(root, "loadavg_start", r->loadavg_start);
	cJSON_AddNumberToObject(root, "loadavg_end", r->loadavg_end);
	return root;
}
