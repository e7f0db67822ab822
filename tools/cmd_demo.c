/*
 * cmd_demo.c — kvtier demo: the agentic workload through the real cache
 * (src/demo/demo.c), printed for people (a progress bar, a table per turn,
 * the comparison) or for machines (--json).
 */
#include "cli.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void demo_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier demo [options]\n"
"\n"
"Runs an agentic workload through the real kvtier cache on this machine:\n"
"sessions with a cold turn and warm turns over a growing context, idling\n"
"between turns so their KV is demoted down the tiers and restored. Every\n"
"lookup, eviction, demotion and restore is real, and every restored page is\n"
"checksum-verified; GPU prefill and decode time are MODELED from a hardware\n"
"profile. Runs the workload once as an LMCache-style baseline and once with\n"
"kvtier's policy, and compares them.\n"
"\n"
"  --sessions N        agent sessions (10)\n"
"  --turns N           turns per session, the first cold (6)\n"
"  --system N          shared system prompt tokens (2048)\n"
"  --context N         each session's own tokens at the cold turn (4096)\n"
"  --turn-tokens N     new tokens per turn: tool output, user input (1024)\n"
"  --output N          answer tokens per turn (256)\n"
"  --model NAME        geometry preset (llama-3.2-1b)\n"
"  --page-tokens P     tokens per page (16)\n"
"  --hardware NAME     GPU profile for the modeled compute (testbed-b: H200)\n"
"  --policy P          lmcache, kvtier or both (both)\n"
"  --stress N          N memory-stressor threads copying during the runs\n"
"  --stress-bytes B    each stressor's two buffers (256M)\n"
"  --hbm/--fabric/--dram/--ssd SIZE  tier sizes (default: from the workload\n"
"                      and the machine)\n"
"  --dir DIR           directory for the ssd tier (default: a temp dir,\n"
"                      removed at the end)\n"
"  --seed N            workload seed (1)\n"
"  --json              machine-readable result on stdout\n"
"  --quiet             no progress bar and no tables: one summary line\n"
"\n"
"Exit status: 0 when every request ran and every checksum matched.\n");
}

static int progress_on;

static void progress(void *arg, const char *policy, size_t done, size_t total)
{
	int width = 40, fill = total ? (int)(done * (size_t)width / total) : 0;

	if (!progress_on)
		return;
	fprintf(stderr, "\r  [%.*s%*s] %3zu/%zu  %-8s", fill,
		"########################################", width - fill, "",
		done, total, policy);
	if (done == total)
		fputc('\n', stderr);
	fflush(stderr);
}

/* ---- statistics over the requests of one turn ------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile (q in [0, 1]) of @n values; sorts a copy. */
static double pct(const double *v, size_t n, double q)
{
	double s[4096];
	size_t k;

	if (!n)
		return 0;
	n = n > 4096 ? 4096 : n;
	memcpy(s, v, n * sizeof(*v));
	qsort(s, n, sizeof(*s), cmp_double);
	k = (size_t)ceil(q * (double)n);
	return s[k ? k - 1 : 0];
}

struct turn_stat {
	double ttft[4096], restore[4096], prefill[4096];
	size_t n;
	double ttft_mean;
	uint64_t prompt, hit[KVT_TIER_COUNT], computed, bytes, evicted, demoted,
		verified;
	double restore_s, evict_s, decode_s;
};

static void turn_collect(const kvt_demo_result *r, const kvt_demo_pass *p,
			 uint32_t k, struct turn_stat *ts)
{
	memset(ts, 0, sizeof(*ts));
	for (uint32_t s = 0; s < r->config.sessions; s++) {
		const kvt_demo_req *q = &p->reqs[(size_t)k * r->config.sessions + s];

		if (ts->n < 4096) {
			ts->ttft[ts->n] = q->ttft_s;
			ts->restore[ts->n] = q->restore_s;
			ts->prefill[ts->n] = q->prefill_s;
			ts->n++;
		}
		ts->ttft_mean += q->ttft_s;
		ts->prompt += q->prompt_tokens;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			ts->hit[t] += q->hit_tokens[t];
		ts->computed += q->computed_tokens;
		ts->bytes += q->restore_bytes;
		ts->restore_s += q->restore_s;
		ts->evict_s += q->evict_s;
		ts->decode_s += q->decode_s;
		ts->evicted += q->evicted;
		ts->demoted += q->demoted;
		ts->verified += q->verified_pages;
	}
	ts->ttft_mean /= r->config.sessions;
}

/* Mean TTFT of the warm turns of one pass. */
static double warm_mean(const kvt_demo_result *r, const kvt_demo_pass *p)
{
	double sum = 0;
	size_t n = 0;

	for (size_t i = 0; i < p->nreqs; i++)
		if (p->reqs[i].turn > 0) {
			sum += p->reqs[i].ttft_s;
			n++;
		}
	return n ? sum / (double)n : 0;
}

/* The same warm request under both policies, side by side in time: how
 * often kvtier's TTFT was lower, and the median of lmcache/kvtier. */
struct paired {
	size_t n, kvtier_lower;
	double median_ratio;
};

static void paired(const kvt_demo_pass *lm, const kvt_demo_pass *kv,
		   struct paired *pr)
{
	double v[4096];
	size_t n = 0;

	memset(pr, 0, sizeof(*pr));
	for (size_t i = 0; i < lm->nreqs && i < kv->nreqs && n < 4096; i++) {
		const kvt_demo_req *a = &lm->reqs[i], *b = &kv->reqs[i];

		if (!a->turn || b->ttft_s <= 0)
			continue;
		v[n++] = a->ttft_s / b->ttft_s;
		pr->kvtier_lower += b->ttft_s < a->ttft_s;
	}
	pr->n = n;
	pr->median_ratio = pct(v, n, 0.5);
}

/* ---- text output ---------------------------------------------------- */

static const char *tier_label(int t, const kvt_demo_result *r)
{
	static const char *n[] = { "hbm", "fabric", "dram", "ssd", "remote" };
	return t == KVT_TIER_HBM && !r->config.gpu ? "hbm*" : n[t];
}

static void print_pass(const kvt_demo_result *r, const kvt_demo_pass *p)
{
	printf("\n%s — %s\n", p->policy, !strcmp(p->policy, "lmcache") ?
	       "restore the whole prefix, then prefill (write-through)" :
	       "restore overlapped layer by layer with prefill (write-back)");
	printf("  %-7s %-15s %-9s %-9s %-7s | %-50s | %s\n", "", "TTFT ms",
	       "restore", "prefill", "restore", "tokens, all sessions of the turn:",
	       "pages");
	printf("  %-7s %7s %7s %9s %9s %7s | %7s %-26s %7s %7s | %7s %7s\n",
	       "turn", "p50", "p90", "p50 ms", "p50 ms", "GB/s", "prompt",
	       "  cached, found in", "", "compute", "evicted", "demoted");
	printf("  %-7s %7s %7s %9s %9s %7s | %7s %6s %6s %6s %6s %7s | %7s %7s\n",
	       "", "", "", "", "", "", "", tier_label(0, r), "fabric", "dram",
	       "ssd", "", "", "");
	for (uint32_t k = 0; k < r->config.turns; k++) {
		struct turn_stat ts;
		char name[16];

		turn_collect(r, p, k, &ts);
		if (k)
			snprintf(name, sizeof(name), "warm %u", k);
		else
			snprintf(name, sizeof(name), "cold");
		printf("  %-7s %7.1f %7.1f %9.1f %9.2f %7.2f | %7llu %6llu %6llu "
		       "%6llu %6llu %7llu | %7llu %7llu\n", name,
		       pct(ts.ttft, ts.n, 0.5) * 1e3, pct(ts.ttft, ts.n, 0.9) * 1e3,
		       pct(ts.restore, ts.n, 0.5) * 1e3,
		       pct(ts.prefill, ts.n, 0.5) * 1e3,
		       ts.restore_s > 0 ? (double)ts.bytes / 1e9 / ts.restore_s : 0,
		       (unsigned long long)ts.prompt,
		       (unsigned long long)ts.hit[0], (unsigned long long)ts.hit[1],
		       (unsigned long long)ts.hit[2], (unsigned long long)ts.hit[3],
		       (unsigned long long)ts.computed,
		       (unsigned long long)ts.evicted,
		       (unsigned long long)ts.demoted);
	}
}

static void print_header(const kvt_demo_result *r)
{
	const kvt_demo_config *c = &r->config;
	char a[32], b[32], d[32], e[32];

	printf("kvtier demo: %u agent sessions x %u turns (1 cold + %u warm), "
	       "system prompt %u + context %u tokens,\n  +%u new and +%u answer "
	       "tokens per turn; %s geometry (%s of KV per token), %u-token "
	       "pages\n", c->sessions, c->turns, c->turns - 1, c->system_tokens,
	       c->context_tokens, c->turn_tokens, c->output_tokens, r->geom.name,
	       kvt_size_format(kvt_geom_token_bytes(&r->geom), a, sizeof(a)),
	       c->page_tokens);
	printf("tiers: %s %s | fabric %s (EMULATED: memfd) | dram %s | ssd %s "
	       "(temp dir, removed at the end)\n", c->gpu ? "hbm" : "hostdev",
	       kvt_size_format(c->hbm_bytes, a, sizeof(a)),
	       kvt_size_format(c->fabric_bytes, b, sizeof(b)),
	       kvt_size_format(c->dram_bytes, d, sizeof(d)),
	       kvt_size_format(c->ssd_bytes, e, sizeof(e)));
	if (!c->gpu)
		printf("       (hbm* = hostdev: host memory in the GPU's layer-first "
		       "layout, EMULATED: no GPU here)\n");
	printf("MEASURED on this machine: lookups, restores, evictions, "
	       "demotions, checksums.\nMODELED: GPU prefill and decode on %s "
	       "(profile %s).%s\n", r->gpu_name, c->hardware,
	       c->stress ? "" : "");
	if (c->stress)
		printf("stress: %u memory-stressor threads copying %s buffers "
		       "during both runs\n", c->stress,
		       kvt_size_format(c->stress_bytes, a, sizeof(a)));
}

static void print_summary(const kvt_demo_result *r, int quiet)
{
	const kvt_demo_pass *lm = NULL, *kv = NULL;
	uint64_t checked = 0, loads = 0, moves = 0, bad = 0;

	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];
		if (!strcmp(p->policy, "lmcache"))
			lm = p;
		else
			kv = p;
		checked += p->check.checked;
		bad += p->check.bad + p->cache.corrupt + p->cache.move_errors;
		for (size_t j = 0; j < p->nreqs; j++)
			loads += p->reqs[j].verified_pages;
		moves += p->cache.verified - (uint64_t)0;
	}
	if (quiet) {
		char a[64] = "", b[64] = "";
		if (lm)
			snprintf(a, sizeof(a), " lmcache %.1f ms", warm_mean(r, lm) * 1e3);
		if (kv)
			snprintf(b, sizeof(b), "%s kvtier %.1f ms", lm ? "," : "",
				 warm_mean(r, kv) * 1e3);
		printf("kvtier demo: warm-turn mean TTFT%s%s; checksums: %llu "
		       "restored pages verified, %llu copies re-read, %llu bad; "
		       "%.1f s\n", a, b, (unsigned long long)loads,
		       (unsigned long long)checked, (unsigned long long)bad,
		       r->seconds);
		return;
	}
	printf("\n");
	if (lm && kv) {
		double a = warm_mean(r, lm), b = warm_mean(r, kv);
		struct paired pr;

		paired(lm, kv, &pr);
		printf("warm-turn mean TTFT: lmcache %.1f ms, kvtier %.1f ms "
		       "(%.2fx)%s\n", a * 1e3, b * 1e3, b > 0 ? a / b : 0,
		       r->config.stress ? " under memory stress" : "");
		printf("request by request (same session and turn, side by side): "
		       "kvtier lower in %zu of %zu warm requests,\n  median "
		       "lmcache/kvtier %.2fx\n", pr.kvtier_lower, pr.n,
		       pr.median_ratio);
	}
	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];
		printf("%-8s %.1f s: %llu loads (%.2f GB), %llu demotion/copy jobs "
		       "(%.2f GB) in %llu waves%s\n", p->policy, p->seconds,
		       (unsigned long long)p->cache.loads,
		       (double)p->cache.load_bytes / 1e9,
		       (unsigned long long)p->cache.moves,
		       (double)p->cache.move_bytes / 1e9,
		       (unsigned long long)p->cache.move_waves,
		       p->stress_gbps > 0 ? "" : "");
		if (p->stress_gbps > 0)
			printf("         stressors copied %.1f GB/s meanwhile\n",
			       p->stress_gbps);
	}
	printf("checksums: %llu restored pages and %llu demoted/copied pages "
	       "verified in flight;\n           %llu page copies re-read in "
	       "every tier at the end: %llu bad.%s\n",
	       (unsigned long long)loads, (unsigned long long)moves,
	       (unsigned long long)checked, (unsigned long long)bad,
	       bad ? "  DATA WAS LOST OR CORRUPTED" : " Nothing lost or corrupted.");
	printf("done in %.1f s (%.1f s of it opening the tiers and faulting "
	       "their memory in)\n", r->seconds, r->setup_s);
}

/* ---- JSON ----------------------------------------------------------- */

static cJSON *ms_obj(const double *v, size_t n, double mean)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "mean", mean * 1e3);
	cJSON_AddNumberToObject(o, "p50", pct(v, n, 0.5) * 1e3);
	cJSON_AddNumberToObject(o, "p90", pct(v, n, 0.9) * 1e3);
	return o;
}

static cJSON *tiers_obj(const uint64_t *v)
{
	cJSON *o = cJSON_CreateObject();
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		cJSON_AddNumberToObject(o, kvt_tier_kind_name((kvt_tier_kind)t),
					(double)v[t]);
	return o;
}

static cJSON *result_json(const kvt_demo_result *r, int err)
{
	const kvt_demo_config *c = &r->config;
	cJSON *root = cJSON_CreateObject(), *o, *a;

	o = cJSON_AddObjectToObject(root, "config");
	cJSON_AddStringToObject(o, "model", r->geom.name);
	cJSON_AddNumberToObject(o, "token_bytes", (double)kvt_geom_token_bytes(&r->geom));
	cJSON_AddNumberToObject(o, "page_tokens", c->page_tokens);
	cJSON_AddNumberToObject(o, "sessions", c->sessions);
	cJSON_AddNumberToObject(o, "turns", c->turns);
	cJSON_AddNumberToObject(o, "system_tokens", c->system_tokens);
	cJSON_AddNumberToObject(o, "context_tokens", c->context_tokens);
	cJSON_AddNumberToObject(o, "turn_tokens", c->turn_tokens);
	cJSON_AddNumberToObject(o, "output_tokens", c->output_tokens);
	cJSON_AddStringToObject(o, "hardware", c->hardware);
	cJSON_AddStringToObject(o, "gpu_modeled", r->gpu_name);
	cJSON_AddBoolToObject(o, "real_gpu", c->gpu);
	cJSON_AddNumberToObject(o, "stress_threads", c->stress);
	cJSON_AddNumberToObject(o, "hbm_bytes", (double)c->hbm_bytes);
	cJSON_AddNumberToObject(o, "fabric_bytes", (double)c->fabric_bytes);
	cJSON_AddNumberToObject(o, "dram_bytes", (double)c->dram_bytes);
	cJSON_AddNumberToObject(o, "ssd_bytes", (double)c->ssd_bytes);
	a = cJSON_AddArrayToObject(root, "passes");
	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];
		cJSON *po = cJSON_CreateObject(), *turns, *x;

		cJSON_AddStringToObject(po, "policy", p->policy);
		cJSON_AddStringToObject(po, "tiers", p->tiers);
		cJSON_AddNumberToObject(po, "seconds", p->seconds);
		cJSON_AddNumberToObject(po, "warm_ttft_mean_ms", warm_mean(r, p) * 1e3);
		if (c->stress)
			cJSON_AddNumberToObject(po, "stress_gbps", p->stress_gbps);
		turns = cJSON_AddArrayToObject(po, "turns");
		for (uint32_t k = 0; k < c->turns; k++) {
			struct turn_stat ts;
			cJSON *t = cJSON_CreateObject();

			turn_collect(r, p, k, &ts);
			cJSON_AddNumberToObject(t, "turn", k);
			cJSON_AddStringToObject(t, "kind", k ? "warm" : "cold");
			cJSON_AddNumberToObject(t, "prompt_tokens", (double)ts.prompt);
			cJSON_AddItemToObject(t, "ttft_ms", ms_obj(ts.ttft, ts.n, ts.ttft_mean));
			cJSON_AddItemToObject(t, "restore_ms_measured",
					      ms_obj(ts.restore, ts.n, ts.restore_s / ts.n));
			cJSON_AddItemToObject(t, "prefill_ms_modeled",
					      ms_obj(ts.prefill, ts.n, 0));
			cJSON_AddNumberToObject(t, "decode_ms_modeled_mean",
						ts.decode_s / ts.n * 1e3);
			cJSON_AddNumberToObject(t, "evict_ms_measured_mean",
						ts.evict_s / ts.n * 1e3);
			cJSON_AddNumberToObject(t, "restore_bytes", (double)ts.bytes);
			cJSON_AddNumberToObject(t, "restore_gbps", ts.restore_s > 0 ?
						(double)ts.bytes / 1e9 / ts.restore_s : 0);
			cJSON_AddItemToObject(t, "hit_tokens", tiers_obj(ts.hit));
			cJSON_AddNumberToObject(t, "computed_tokens", (double)ts.computed);
			cJSON_AddNumberToObject(t, "verified_pages", (double)ts.verified);
			cJSON_AddNumberToObject(t, "evicted_pages", (double)ts.evicted);
			cJSON_AddNumberToObject(t, "demoted_pages", (double)ts.demoted);
			cJSON_AddItemToArray(turns, t);
		}
		x = cJSON_AddObjectToObject(po, "data");
		cJSON_AddNumberToObject(x, "loads", (double)p->cache.loads);
		cJSON_AddNumberToObject(x, "load_bytes", (double)p->cache.load_bytes);
		cJSON_AddNumberToObject(x, "move_jobs", (double)p->cache.moves);
		cJSON_AddNumberToObject(x, "move_bytes", (double)p->cache.move_bytes);
		cJSON_AddNumberToObject(x, "move_waves", (double)p->cache.move_waves);
		cJSON_AddNumberToObject(x, "move_errors", (double)p->cache.move_errors);
		cJSON_AddNumberToObject(x, "verified_in_flight", (double)p->cache.verified);
		cJSON_AddNumberToObject(x, "corrupt", (double)p->cache.corrupt);
		cJSON_AddNumberToObject(x, "final_checked", (double)p->check.checked);
		cJSON_AddNumberToObject(x, "final_bad", (double)p->check.bad);
		cJSON_AddNumberToObject(x, "final_unsummed", (double)p->check.unsummed);
		cJSON_AddItemToObject(x, "final_checked_by_tier",
				      tiers_obj(p->check.per_tier));
		cJSON_AddItemToObject(x, "evicted_by_tier", tiers_obj(p->index.evicted));
		cJSON_AddItemToObject(x, "demoted_into", tiers_obj(p->index.demoted));
		cJSON_AddItemToObject(x, "copied_into", tiers_obj(p->index.copied));
		cJSON_AddNumberToObject(x, "dropped", (double)p->index.dropped);
		cJSON_AddItemToArray(a, po);
	}
	if (r->npasses == 2) {
		struct paired pr;

		paired(&r->pass[0], &r->pass[1], &pr);
		o = cJSON_AddObjectToObject(root, "paired_warm");
		cJSON_AddNumberToObject(o, "requests", (double)pr.n);
		cJSON_AddNumberToObject(o, "kvtier_lower", (double)pr.kvtier_lower);
		cJSON_AddNumberToObject(o, "median_ratio", pr.median_ratio);
	}
	cJSON_AddBoolToObject(root, "ok", !err);
	if (err)
		cJSON_AddStringToObject(root, "error", kvt_errdetail()[0] ?
					kvt_errdetail() : kvt_strerror(err));
	cJSON_AddNumberToObject(root, "setup_seconds", r->setup_s);
	cJSON_AddNumberToObject(root, "seconds", r->seconds);
	return root;
}

/* ---- main --------------------------------------------------------------- */

static int size_opt(const char *flag, const char *v, uint64_t *out)
{
	if (kvt_size_parse(v, out) || !*out) {
		fprintf(stderr, "kvtier demo: %s: bad size '%s' (e.g. 512M, 4G)\n",
			flag, v);
		return -1;
	}
	return 0;
}

int cmd_demo(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "sessions", required_argument, 0, 'S' },
		{ "turns", required_argument, 0, 'T' },
		{ "system", required_argument, 0, 'y' },
		{ "context", required_argument, 0, 'c' },
		{ "turn-tokens", required_argument, 0, 'n' },
		{ "output", required_argument, 0, 'o' },
		{ "model", required_argument, 0, 'm' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "hardware", required_argument, 0, 'H' },
		{ "policy", required_argument, 0, 'P' },
		{ "stress", required_argument, 0, 's' },
		{ "stress-bytes", required_argument, 0, 'B' },
		{ "hbm", required_argument, 0, 1 },
		{ "fabric", required_argument, 0, 2 },
		{ "dram", required_argument, 0, 3 },
		{ "ssd", required_argument, 0, 4 },
		{ "dir", required_argument, 0, 'd' },
		{ "seed", required_argument, 0, 'e' },
		{ "json", no_argument, 0, 'j' },
		{ "quiet", no_argument, 0, 'q' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	kvt_demo_config c;
	kvt_demo_result *r = NULL;
	int json = 0, quiet = 0, ch, err;
	uint64_t v;

	kvt_demo_config_init(&c);
	optind = 1;
	while ((ch = getopt_long(argc, argv, "jqh", lo, NULL)) != -1) {
		switch (ch) {
		case 'S': if (cli_u64("--sessions", optarg, 1, KVT_DEMO_MAX_SESSIONS, &v)) return 2; c.sessions = (uint32_t)v; break;
		case 'T': if (cli_u64("--turns", optarg, 1, KVT_DEMO_MAX_TURNS, &v)) return 2; c.turns = (uint32_t)v; break;
		case 'y': if (cli_u64("--system", optarg, 0, 1u << 24, &v)) return 2; c.system_tokens = (uint32_t)v; break;
		case 'c': if (cli_u64("--context", optarg, 0, 1u << 24, &v)) return 2; c.context_tokens = (uint32_t)v; break;
		case 'n': if (cli_u64("--turn-tokens", optarg, 0, 1u << 24, &v)) return 2; c.turn_tokens = (uint32_t)v; break;
		case 'o': if (cli_u64("--output", optarg, 0, 1u << 20, &v)) return 2; c.output_tokens = (uint32_t)v; break;
		case 'p': if (cli_u64("--page-tokens", optarg, 1, 4096, &v)) return 2; c.page_tokens = (uint32_t)v; break;
		case 'm': snprintf(c.model, sizeof(c.model), "%s", optarg); break;
		case 'H': snprintf(c.hardware, sizeof(c.hardware), "%s", optarg); break;
		case 'P':
			if (!strcmp(optarg, "lmcache")) c.policies = KVT_DEMO_LMCACHE;
			else if (!strcmp(optarg, "kvtier")) c.policies = KVT_DEMO_KVTIER;
			else if (!strcmp(optarg, "both")) c.policies = KVT_DEMO_LMCACHE | KVT_DEMO_KVTIER;
			else return cli_usage("demo", "--policy: '%s' is not lmcache, kvtier or both", optarg);
			break;
		case 's': if (cli_u64("--stress", optarg, 0, 64, &v)) return 2; c.stress = (unsigned)v; break;
		case 'B': if (size_opt("--stress-bytes", optarg, &c.stress_bytes)) return 2; break;
		case 1: if (size_opt("--hbm", optarg, &c.hbm_bytes)) return 2; break;
		case 2: if (size_opt("--fabric", optarg, &c.fabric_bytes)) return 2; break;
		case 3: if (size_opt("--dram", optarg, &c.dram_bytes)) return 2; break;
		case 4: if (size_opt("--ssd", optarg, &c.ssd_bytes)) return 2; break;
		case 'd': snprintf(c.dir, sizeof(c.dir), "%s", optarg); break;
		case 'e': if (cli_u64("--seed", optarg, 0, UINT64_MAX, &v)) return 2; c.seed = v; break;
		case 'j': json = 1; break;
		case 'q': quiet = 1; break;
		case 'h': demo_usage(stdout); return 0;
		default: demo_usage(stderr); return CLI_EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage("demo", "unexpected argument '%s'", argv[optind]);
	if ((err = kvt_demo_size(&c)))
		return cli_fail("demo", err);

	progress_on = !json && !quiet && isatty(2);
	c.progress = progress;
	if (!json && !quiet) {
		kvt_demo_result hdr = { .config = c };
		kvt_hw hw;
		kvt_geom_preset(&hdr.geom, c.model, c.page_tokens, 1, 0);
		if (!kvt_hw_load(&hw, c.hardware))
			snprintf(hdr.gpu_name, sizeof(hdr.gpu_name), "%s", hw.gpu_name);
		print_header(&hdr);
		fflush(stdout);
	}
	err = kvt_demo_run(&c, &r);
	if (!r)
		return cli_fail("demo", err);
	if (json) {
		cli_json_print(result_json(r, err));
	} else {
		if (!quiet)
			for (int i = 0; i < r->npasses; i++)
				print_pass(r, &r->pass[i]);
		print_summary(r, quiet);
	}
	if (err)
		cli_fail("demo", err);
	kvt_demo_result_free(r);
	return err ? CLI_EXIT_FAIL : 0;
}
