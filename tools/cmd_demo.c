/*
 * cmd_demo.c — kvtier demo: the agentic workload through the real cache
 * (src/demo/demo.c), printed for people (a progress bar, a table per turn,
 * the comparison) or for machines (--json).
 */
#include "cli.h"

#include <getopt.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void demo_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier demo [options]\n"
"\n"
"Runs an agentic workload through the real kvtier cache on this machine,\n"
"the demo acting as the inference engine: sessions with a cold turn and\n"
"warm turns over a growing context, idling between turns so their KV is\n"
"demoted down the tiers and restored. The engine owns its KV memory (host\n"
"memory in vLLM's layout, EMULATED hbm) and keeps no prefix cache of its\n"
"own; each request's TTFT is MEASURED on the wall clock from its arrival\n"
"to its first token: lookup, waits, the restore, a prefill that spends\n"
"each layer's MODELED GPU time (hardware profile) in real time, the save.\n"
"Every restored page is checksum-verified layer by layer. Runs the\n"
"workload as an LMCache-style baseline and with kvtier's policy, turn by\n"
"turn, and compares them request by request.\n"
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
"  --background P      policies whose cache demotes in the background:\n"
"                      lmcache, kvtier, both or none (both); the others\n"
"                      evict synchronously inside their stores\n"
"  --stress N          N memory-stressor threads copying during the runs\n"
"  --stress-bytes B    each stressor's two buffers (256M)\n"
"  --hbm SIZE          the engine's own KV memory, its blocks (default:\n"
"                      1.5 sessions)\n"
"  --fabric/--dram/--ssd SIZE  kvtier's tier sizes (default: from the\n"
"                      workload and the machine)\n"
"  --fabric numa=N,SIZE | /dev/daxX.Y[,SIZE] | memfd,SIZE | file=PATH,SIZE\n"
"                      where the fabric tier lives: a CPU-less NUMA node\n"
"                      (CXL memory onlined as RAM), a devdax device (one\n"
"                      owner: run one --policy), or EMULATED (memfd, the\n"
"                      default; a file)\n"
"  --dir DIR           directory for the ssd tier (default: a temp dir,\n"
"                      removed at the end)\n"
"  --seed N            workload seed (1)\n"
"  --daemon            each policy's cache in a node daemon process\n"
"                      (kvtierd), the engine a client of it: its KV memory\n"
"                      shared as a memfd, every call through the socket\n"
"  --json              machine-readable result on stdout\n"
"  --quiet             no progress bar and no tables: one summary line\n"
"\n"
"Exit status: 0 when every request ran, every load and store succeeded\n"
"and every checksum matched; 1 otherwise (the summary says what failed).\n");
}

#define KVT_MIN_U64(a, b) ((uint64_t)(a) < (uint64_t)(b) ? (uint64_t)(a) : (uint64_t)(b))

static int progress_on;

static void progress(void *arg, const char *policy, size_t done, size_t total)
{
	int width = 40, fill = total ? (int)(done * (size_t)width / total) : 0;

	(void)arg;
	if (!progress_on)
		return;
	fprintf(stderr, "\r  [%.*s%*s] %3zu/%zu  %-8s", fill,
		"########################################", width - fill, "",
		done, total, policy);
	if (done == total)
		fputc('\n', stderr);
	fflush(stderr);
}

/* ---- statistics ----------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Nearest-rank percentiles (q in [0, 1]) of @n values, sorted in place. */
static double pct_sorted(const double *s, size_t n, double q)
{
	size_t k;

	if (!n)
		return 0;
	k = (size_t)ceil(q * (double)n);
	return s[k ? k - 1 : 0];
}

/* Sorted values of one field over a set of requests. */
struct dist {
	double *v;
	size_t n;
	double sum;
};

static void dist_add(struct dist *d, double x)
{
	d->v[d->n++] = x;
	d->sum += x;
}

static double dist_mean(const struct dist *d)
{
	return d->n ? d->sum / (double)d->n : 0;
}

static double dist_pct(struct dist *d, double q)
{
	qsort(d->v, d->n, sizeof(*d->v), cmp_double);
	return pct_sorted(d->v, d->n, q);
}

enum { F_TTFT, F_LOOKUP, F_BLOCK, F_LOADW, F_PREFILL, F_RECOMP, F_SAVE,
       F_RESTORE, F_MODEL, F_DECODE, F_READY, F_NFIELDS };

static const char *const field_names[F_NFIELDS] = {
	"ttft", "lookup", "block_wait", "load_wait", "prefill", "recompute",
	"save", "restore", "prefill_modeled", "decode_modeled", "ready",
};

static double req_field(const kvt_demo_req *q, int f)
{
	switch (f) {
	case F_TTFT: return q->ttft_s;
	case F_LOOKUP: return q->lookup_s;
	case F_BLOCK: return q->block_wait_s;
	case F_LOADW: return q->load_wait_s;
	case F_PREFILL: return q->prefill_s;
	case F_RECOMP: return q->recompute_s;
	case F_SAVE: return q->save_s;
	case F_RESTORE: return q->restore_s;
	case F_MODEL: return q->prefill_model_s;
	case F_DECODE: return q->decode_s;
	default: return q->ready_s;
	}
}

/* Requests of one turn (or every warm turn: @k < 0) that ran. */
struct turn_stat {
	struct dist f[F_NFIELDS];
	uint64_t prompt, hit[KVT_TIER_COUNT], computed, bytes, loaded,
		verified, failed, engine_checked, engine_bad, stored;
	double restore_sum;
};

static int turn_collect(const kvt_demo_result *r, const kvt_demo_pass *p,
			int k, struct turn_stat *ts)
{
	memset(ts, 0, sizeof(*ts));
	for (int f = 0; f < F_NFIELDS; f++)
		if (!(ts->f[f].v = calloc(p->nreqs + 1, sizeof(double))))
			return -1;
	for (size_t i = 0; i < p->nreqs; i++) {
		const kvt_demo_req *q = &p->reqs[i];

		if (!q->prompt_tokens || (k >= 0 ? q->turn != (uint32_t)k :
					  q->turn == 0))
			continue; /* did not run, or another turn */
		for (int f = 0; f < F_NFIELDS; f++)
			dist_add(&ts->f[f], req_field(q, f));
		ts->prompt += q->prompt_tokens;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			ts->hit[t] += q->hit_tokens[t];
		ts->computed += q->computed_tokens;
		ts->bytes += q->restore_bytes;
		ts->restore_sum += q->restore_s;
		ts->loaded += q->loaded_pages;
		ts->verified += q->verified_pages;
		ts->failed += q->failed_pages;
		ts->engine_checked += q->engine_checked;
		ts->engine_bad += q->engine_bad;
		ts->stored += q->stored_pages;
	}
	(void)r;
	return 0;
}

static void turn_free(struct turn_stat *ts)
{
	for (int f = 0; f < F_NFIELDS; f++)
		free(ts->f[f].v);
}

/* The same warm request under both policies: how often kvtier's TTFT was
 * lower, and the spread of lmcache/kvtier. */
struct paired {
	size_t n, kvtier_lower;
	double median, p25, p75, min, max;
};

static void paired(const kvt_demo_pass *lm, const kvt_demo_pass *kv,
		   struct paired *pr)
{
	double *v = calloc(lm->nreqs + 1, sizeof(double));
	size_t n = 0;

	memset(pr, 0, sizeof(*pr));
	if (!v)
		return;
	for (size_t i = 0; i < lm->nreqs && i < kv->nreqs; i++) {
		const kvt_demo_req *a = &lm->reqs[i], *b = &kv->reqs[i];

		if (!a->turn || !a->prompt_tokens || !b->prompt_tokens ||
		    b->ttft_s <= 0)
			continue;
		v[n++] = a->ttft_s / b->ttft_s;
		pr->kvtier_lower += b->ttft_s < a->ttft_s;
	}
	qsort(v, n, sizeof(*v), cmp_double);
	pr->n = n;
	pr->median = pct_sorted(v, n, 0.5);
	pr->p25 = pct_sorted(v, n, 0.25);
	pr->p75 = pct_sorted(v, n, 0.75);
	pr->min = n ? v[0] : 0;
	pr->max = n ? v[n - 1] : 0;
	free(v);
}

/* What was checked and what failed, over both policies: never more than
 * was verified. */
struct integrity {
	uint64_t loaded, verified, failed, engine_checked,
		engine_bad, moves_verified, moves_corrupt, move_errors,
		store_errors, checked, check_bad;
	int check_incomplete;  /* a final re-read did not finish */
	uint64_t bad;          /* verification failures, all kinds */
};

static void integrity_get(const kvt_demo_result *r, struct integrity *g)
{
	memset(g, 0, sizeof(*g));
	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];
		uint64_t verified = 0;

		for (size_t j = 0; j < p->nreqs; j++) {
			const kvt_demo_req *q = &p->reqs[j];

			g->loaded += q->loaded_pages;
			verified += q->verified_pages;
			g->failed += q->failed_pages;
			g->engine_checked += q->engine_checked;
			g->engine_bad += q->engine_bad;
			g->store_errors += q->store_err != 0;
		}
		g->verified += verified;
		/* the cache's count includes the loads' pages */
		g->moves_verified += p->cache.verified - KVT_MIN_U64(
			p->cache.verified, verified);
		g->moves_corrupt += p->cache.corrupt;
		g->move_errors += p->cache.move_errors;
		g->checked += p->check.checked;
		g->check_bad += p->check.bad;
		g->check_incomplete |= p->check_err != 0 &&
				       p->check_err != KVT_ECORRUPT;
		/* the cache counts every copy that failed verification:
		 * loads, stores, moves */
		g->bad += p->cache.corrupt + p->check.bad;
	}
	g->bad += g->engine_bad;
}

/* ---- text output ---------------------------------------------------- */

static void print_pass(const kvt_demo_result *r, const kvt_demo_pass *p)
{
	printf("\n%s — %s\n", p->policy, !strcmp(p->policy, "lmcache") ?
	       "write-through; restore the whole prefix, then prefill; "
	       "synchronous save" :
	       "write-back; restore overlapped layer by layer with the "
	       "prefill; asynchronous save");
	printf("  %-7s %-20s | %-46s | %-7s | %s\n", "", "TTFT ms, measured",
	       "mean ms, measured; they add up to the mean TTFT", "prefill",
	       "tokens, all sessions of the turn:");
	printf("  %-7s %6s %6s %6s | %6s %6s %6s %7s %6s %6s | %7s | %7s %-20s %7s\n",
	       "turn", "p50", "p90", "mean", "lookup", "blocks", "load", "prefill",
	       "redo", "save", "modeled", "prompt", "   loaded from", "compute");
	printf("  %-7s %6s %6s %6s | %6s %6s %6s %7s %6s %6s | %7s | %7s %6s %6s %6s %7s\n",
	       "", "", "", "", "", "wait", "wait", "spent", "", "", "mean ms",
	       "", "fabric", "dram", "ssd", "");
	for (uint32_t k = 0; k < r->config.turns; k++) {
		struct turn_stat ts;
		char name[16];

		if (turn_collect(r, p, (int)k, &ts) || !ts.f[F_TTFT].n) {
			turn_free(&ts);
			continue;
		}
		snprintf(name, sizeof(name), k ? "warm %u" : "cold", k);
		printf("  %-7s %6.1f %6.1f %6.1f | %6.2f %6.1f %6.1f %7.1f %6.1f "
		       "%6.1f | %7.1f | %7llu %6llu %6llu %6llu %7llu\n", name,
		       dist_pct(&ts.f[F_TTFT], 0.5) * 1e3,
		       dist_pct(&ts.f[F_TTFT], 0.9) * 1e3,
		       dist_mean(&ts.f[F_TTFT]) * 1e3,
		       dist_mean(&ts.f[F_LOOKUP]) * 1e3,
		       dist_mean(&ts.f[F_BLOCK]) * 1e3,
		       dist_mean(&ts.f[F_LOADW]) * 1e3,
		       dist_mean(&ts.f[F_PREFILL]) * 1e3,
		       dist_mean(&ts.f[F_RECOMP]) * 1e3,
		       dist_mean(&ts.f[F_SAVE]) * 1e3,
		       dist_mean(&ts.f[F_MODEL]) * 1e3,
		       (unsigned long long)ts.prompt,
		       (unsigned long long)ts.hit[KVT_TIER_FABRIC],
		       (unsigned long long)ts.hit[KVT_TIER_DRAM],
		       (unsigned long long)ts.hit[KVT_TIER_SSD],
		       (unsigned long long)ts.computed);
		turn_free(&ts);
	}
}

/* How the fabric backing will be opened. The demo never passes
 * allow-cpus, so a numa=N tier that opens is on a CPU-less node. */
static const char *fabric_label(const char *b, char *buf, size_t len)
{
	if (!b[0] || !strncmp(b, "memfd", 5))
		return "EMULATED: memfd";
	if (!strncmp(b, "file=", 5))
		snprintf(buf, len, "EMULATED: %s", b);
	else if (!strncmp(b, "numa=", 5))
		snprintf(buf, len, "CPU-less NUMA node %s", b + 5);
	else
		snprintf(buf, len, "devdax %s", b);
	return buf;
}

static void print_header(const kvt_demo_result *r)
{
	char fab[KVT_PATH_MAX + 16];
	const kvt_demo_config *c = &r->config;
	char a[32], b[32], d[32], e[32];

	printf("kvtier demo: %u agent sessions x %u turns (1 cold + %u warm), "
	       "system prompt %u + context %u tokens,\n  +%u new and +%u answer "
	       "tokens per turn; %s geometry (%s of KV per token), %u-token "
	       "pages\n", c->sessions, c->turns, c->turns - 1, c->system_tokens,
	       c->context_tokens, c->turn_tokens, c->output_tokens, r->geom.name,
	       kvt_size_format(kvt_geom_token_bytes(&r->geom), a, sizeof(a)),
	       c->page_tokens);
	printf("engine KV memory %s (EMULATED hbm: host memory, vLLM layout; no "
	       "prefix cache of its own)\ntiers: fabric %s (%s) | "
	       "dram %s | ssd %s (temp dir, removed at the end)\n",
	       kvt_size_format(c->hbm_bytes, a, sizeof(a)),
	       kvt_size_format(c->fabric_bytes, b, sizeof(b)),
	       fabric_label(c->fabric, fab, sizeof(fab)),
	       kvt_size_format(c->dram_bytes, d, sizeof(d)),
	       kvt_size_format(c->ssd_bytes, e, sizeof(e)));
	printf("MEASURED on this machine: every TTFT, wall clock from arrival to "
	       "first token: lookups, waits,\n  restores, the prefill's time as "
	       "spent, saves; every checksum.\nMODELED: how long each layer's "
	       "prefill takes on %s (profile %s; spent in real time),\n  and "
	       "decode (reported, not spent).\n", r->gpu_name, c->hardware);
	if (c->stress)
		printf("stress: %u memory-stressor threads copying %s buffers "
		       "during both runs\n", c->stress,
		       kvt_size_format(c->stress_bytes, a, sizeof(a)));
}

static double warm(const kvt_demo_result *r, const kvt_demo_pass *p, int p50)
{
	struct turn_stat ts;
	double v = 0;

	if (!turn_collect(r, p, -1, &ts))
		v = p50 ? dist_pct(&ts.f[F_TTFT], 0.5) : dist_mean(&ts.f[F_TTFT]);
	turn_free(&ts);
	return v;
}

static void print_integrity(const kvt_demo_result *r, int err)
{
	struct integrity g;

	integrity_get(r, &g);
	printf("checksums: %llu restored pages loaded, %llu verified layer by "
	       "layer, %llu failed (recomputed);\n  the engine sampled %llu "
	       "restored blocks: %llu wrong; %llu page copies between tiers\n"
	       "  verified; %llu copies failed verification (loads, stores, "
	       "moves); %llu I/O errors\n  between tiers; %llu store jobs "
	       "failed;\n", (unsigned long long)g.loaded,
	       (unsigned long long)g.verified, (unsigned long long)g.failed,
	       (unsigned long long)g.engine_checked,
	       (unsigned long long)g.engine_bad,
	       (unsigned long long)g.moves_verified,
	       (unsigned long long)g.moves_corrupt,
	       (unsigned long long)g.move_errors,
	       (unsigned long long)g.store_errors);
	if (g.check_incomplete)
		printf("  the final re-read of every copy did NOT complete "
		       "(%llu re-read before it stopped).\n",
		       (unsigned long long)g.checked);
	else if (err || g.bad)
		printf("  of the page copies still in the tiers at the end, %llu "
		       "were re-read and %llu did not match\n  (copies that "
		       "failed before were dropped and are not among them).\n",
		       (unsigned long long)g.checked,
		       (unsigned long long)g.check_bad);
	else
		printf("  %llu page copies re-read in every tier at the end: "
		       "%llu bad.\n", (unsigned long long)g.checked,
		       (unsigned long long)g.check_bad);
	if (err)
		printf("THE RUN FAILED: %s\n  %llu verification failures in "
		       "all; what is above is what was checked before and after "
		       "it.\n", r->error[0] ? r->error : kvt_strerror(err),
		       (unsigned long long)g.bad);
	else
		printf("verification failures: 0. Every restore, demotion and "
		       "copy checked matched.\n");
}

static void print_summary(const kvt_demo_result *r, int quiet, int err)
{
	const kvt_demo_pass *lm = NULL, *kv = NULL;
	struct integrity g;
	struct paired pr = { 0 };

	for (int i = 0; i < r->npasses; i++)
		if (!strcmp(r->pass[i].policy, "lmcache"))
			lm = &r->pass[i];
		else
			kv = &r->pass[i];
	if (lm && kv)
		paired(lm, kv, &pr);
	integrity_get(r, &g);
	if (quiet) {
		char a[64] = "", b[64] = "", c[96] = "", e[300] = "";

		if (lm)
			snprintf(a, sizeof(a), " lmcache %.1f ms", warm(r, lm, 0) * 1e3);
		if (kv)
			snprintf(b, sizeof(b), "%s kvtier %.1f ms", lm ? "," : "",
				 warm(r, kv, 0) * 1e3);
		if (pr.n)
			snprintf(c, sizeof(c), " (kvtier lower in %zu of %zu, "
				 "median lmcache/kvtier %.2fx)", pr.kvtier_lower,
				 pr.n, pr.median);
		if (err)
			snprintf(e, sizeof(e), "; FAILED: %s", r->error[0] ?
				 r->error : kvt_strerror(err));
		printf("kvtier demo: warm-turn mean TTFT%s%s%s; checksums: %llu "
		       "restored pages verified, %llu copies re-read%s, %llu "
		       "bad%s; %.1f s\n", a, b, c, (unsigned long long)g.verified,
		       (unsigned long long)g.checked, g.check_incomplete ?
		       " (re-read incomplete)" : "", (unsigned long long)g.bad,
		       e, r->seconds);
		return;
	}
	printf("\n");
	if (lm && kv) {
		double a = warm(r, lm, 0), b = warm(r, kv, 0);

		printf("warm turns, measured TTFT: mean lmcache %.1f ms, kvtier "
		       "%.1f ms (%.2fx); median %.1f ms, %.1f ms%s\n", a * 1e3,
		       b * 1e3, b > 0 ? a / b : 0, warm(r, lm, 1) * 1e3,
		       warm(r, kv, 1) * 1e3,
		       r->config.stress ? " (under memory stress)" : "");
		printf("request by request (same session and turn): kvtier lower "
		       "in %zu of %zu warm requests;\n  lmcache/kvtier median "
		       "%.2fx, middle half %.2f-%.2fx, range %.2f-%.2fx\n",
		       pr.kvtier_lower, pr.n, pr.median, pr.p25, pr.p75, pr.min,
		       pr.max);
		if (pr.n && (2 * pr.kvtier_lower <= pr.n || pr.median <= 1.0))
			printf("kvtier did NOT win on this run: its TTFT was lower "
			       "in %zu of %zu warm requests, median ratio %.2fx.\n",
			       pr.kvtier_lower, pr.n, pr.median);
	}
	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];

		printf("%-8s %.1f s of requests: %llu loads (%.2f GB), %llu stores "
		       "(%llu pages), %llu pages moved between tiers (%.2f GB)\n"
		       "         in %llu background passes (%.1f s); the cache "
		       "waited %.3f s for room; %llu engine blocks;\n         "
		       "%.2f s drained before the other policy ran (in no TTFT)%s\n",
		       p->policy, p->seconds, (unsigned long long)p->cache.loads,
		       (double)p->cache.load_bytes / 1e9,
		       (unsigned long long)p->cache.stores,
		       (unsigned long long)p->cache.store_pages,
		       (unsigned long long)p->cache.move_pages,
		       (double)p->cache.move_bytes / 1e9,
		       (unsigned long long)p->cache.bg_passes, p->cache.bg_s,
		       p->cache.wait_s, (unsigned long long)p->nblocks, p->drain_s,
		       p->stress_gbps > 0 ? "" : "");
		if (p->stress_gbps > 0)
			printf("         stressors copied %.1f GB/s meanwhile\n",
			       p->stress_gbps);
	}
	print_integrity(r, err);
	printf("done in %.1f s (%.1f s of it opening the tiers and faulting "
	       "their memory in)\n", r->seconds, r->setup_s);
}

/* ---- JSON ----------------------------------------------------------- */

static cJSON *ms_obj(struct dist *d)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddNumberToObject(o, "mean", dist_mean(d) * 1e3);
	cJSON_AddNumberToObject(o, "p50", dist_pct(d, 0.5) * 1e3);
	cJSON_AddNumberToObject(o, "p90", dist_pct(d, 0.9) * 1e3);
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

static cJSON *turn_json(const kvt_demo_result *r, const kvt_demo_pass *p,
			uint32_t k)
{
	struct turn_stat ts;
	cJSON *t = cJSON_CreateObject(), *m;

	if (turn_collect(r, p, (int)k, &ts)) {
		turn_free(&ts);
		return t;
	}
	cJSON_AddNumberToObject(t, "turn", k);
	cJSON_AddStringToObject(t, "kind", k ? "warm" : "cold");
	cJSON_AddNumberToObject(t, "requests", (double)ts.f[F_TTFT].n);
	cJSON_AddNumberToObject(t, "prompt_tokens", (double)ts.prompt);
	cJSON_AddItemToObject(t, "ttft_ms", ms_obj(&ts.f[F_TTFT]));
	m = cJSON_AddObjectToObject(t, "components_ms_mean");
	for (int f = F_LOOKUP; f <= F_SAVE; f++)
		cJSON_AddNumberToObject(m, field_names[f],
					dist_mean(&ts.f[f]) * 1e3);
	cJSON_AddItemToObject(t, "restore_ms_measured", ms_obj(&ts.f[F_RESTORE]));
	cJSON_AddItemToObject(t, "ready_ms_measured", ms_obj(&ts.f[F_READY]));
	cJSON_AddItemToObject(t, "prefill_ms_modeled", ms_obj(&ts.f[F_MODEL]));
	cJSON_AddNumberToObject(t, "decode_ms_modeled_mean",
				dist_mean(&ts.f[F_DECODE]) * 1e3);
	cJSON_AddNumberToObject(t, "restore_bytes", (double)ts.bytes);
	cJSON_AddNumberToObject(t, "restore_gbps", ts.restore_sum > 0 ?
				(double)ts.bytes / 1e9 / ts.restore_sum : 0);
	cJSON_AddItemToObject(t, "hit_tokens", tiers_obj(ts.hit));
	cJSON_AddNumberToObject(t, "computed_tokens", (double)ts.computed);
	cJSON_AddNumberToObject(t, "loaded_pages", (double)ts.loaded);
	cJSON_AddNumberToObject(t, "verified_pages", (double)ts.verified);
	cJSON_AddNumberToObject(t, "failed_pages", (double)ts.failed);
	cJSON_AddNumberToObject(t, "engine_checked_pages", (double)ts.engine_checked);
	cJSON_AddNumberToObject(t, "stored_pages", (double)ts.stored);
	turn_free(&ts);
	return t;
}

static cJSON *req_json(const kvt_demo_req *q)
{
	cJSON *o = cJSON_CreateObject();
	uint64_t hit[KVT_TIER_COUNT];

	cJSON_AddNumberToObject(o, "session", q->session);
	cJSON_AddNumberToObject(o, "turn", q->turn);
	for (int f = 0; f < F_NFIELDS; f++) {
		char key[40];

		snprintf(key, sizeof(key), "%s_ms", field_names[f]);
		cJSON_AddNumberToObject(o, key, req_field(q, f) * 1e3);
	}
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		hit[t] = q->hit_tokens[t];
	cJSON_AddItemToObject(o, "hit_tokens", tiers_obj(hit));
	cJSON_AddNumberToObject(o, "computed_tokens", q->computed_tokens);
	cJSON_AddNumberToObject(o, "inflight_pages", q->inflight_pages);
	cJSON_AddNumberToObject(o, "failed_pages", (double)q->failed_pages);
	return o;
}

static cJSON *data_json(const kvt_demo_pass *p)
{
	cJSON *x = cJSON_CreateObject();

	cJSON_AddNumberToObject(x, "engine_blocks", (double)p->nblocks);
	cJSON_AddNumberToObject(x, "loads", (double)p->cache.loads);
	cJSON_AddNumberToObject(x, "load_pages", (double)p->cache.load_pages);
	cJSON_AddNumberToObject(x, "load_bytes", (double)p->cache.load_bytes);
	cJSON_AddNumberToObject(x, "stores", (double)p->cache.stores);
	cJSON_AddNumberToObject(x, "store_pages", (double)p->cache.store_pages);
	cJSON_AddNumberToObject(x, "store_bytes", (double)p->cache.store_bytes);
	cJSON_AddNumberToObject(x, "move_jobs", (double)p->cache.moves);
	cJSON_AddNumberToObject(x, "move_pages", (double)p->cache.move_pages);
	cJSON_AddNumberToObject(x, "move_bytes", (double)p->cache.move_bytes);
	cJSON_AddNumberToObject(x, "move_errors", (double)p->cache.move_errors);
	cJSON_AddNumberToObject(x, "moves_verified", (double)p->cache.verified);
	cJSON_AddNumberToObject(x, "corrupt", (double)p->cache.corrupt);
	cJSON_AddNumberToObject(x, "failed_blocks", (double)p->cache.failed_blocks);
	cJSON_AddNumberToObject(x, "bg_passes", (double)p->cache.bg_passes);
	cJSON_AddNumberToObject(x, "bg_seconds", p->cache.bg_s);
	cJSON_AddNumberToObject(x, "cache_wait_seconds", p->cache.wait_s);
	cJSON_AddNumberToObject(x, "drain_seconds", p->drain_s);
	cJSON_AddBoolToObject(x, "final_check_complete",
			      p->check_err == 0 || p->check_err == KVT_ECORRUPT);
	cJSON_AddNumberToObject(x, "final_checked", (double)p->check.checked);
	cJSON_AddNumberToObject(x, "final_bad", (double)p->check.bad);
	cJSON_AddItemToObject(x, "final_checked_by_tier",
			      tiers_obj(p->check.per_tier));
	cJSON_AddItemToObject(x, "evicted_by_tier", tiers_obj(p->index.evicted));
	cJSON_AddItemToObject(x, "demoted_into", tiers_obj(p->index.demoted));
	cJSON_AddItemToObject(x, "copied_into", tiers_obj(p->index.copied));
	cJSON_AddNumberToObject(x, "dropped", (double)p->index.dropped);
	return x;
}

static cJSON *result_json(const kvt_demo_result *r, int err)
{
	const kvt_demo_config *c = &r->config;
	cJSON *root = cJSON_CreateObject(), *o, *a;
	struct integrity g;

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
	cJSON_AddBoolToObject(o, "daemon", c->daemon);
	cJSON_AddNumberToObject(o, "stress_threads", c->stress);
	cJSON_AddNumberToObject(o, "hbm_bytes", (double)c->hbm_bytes);
	cJSON_AddNumberToObject(o, "fabric_bytes", (double)c->fabric_bytes);
	cJSON_AddNumberToObject(o, "dram_bytes", (double)c->dram_bytes);
	cJSON_AddNumberToObject(o, "ssd_bytes", (double)c->ssd_bytes);
	a = cJSON_AddArrayToObject(root, "passes");
	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];
		cJSON *po = cJSON_CreateObject(), *turns, *reqs;

		cJSON_AddStringToObject(po, "policy", p->policy);
		cJSON_AddStringToObject(po, "tiers", p->tiers);
		cJSON_AddStringToObject(po, "fabric_tier", p->fabric_where);
		cJSON_AddNumberToObject(po, "seconds", p->seconds);
		cJSON_AddNumberToObject(po, "requests_run", (double)p->done);
		cJSON_AddNumberToObject(po, "warm_ttft_mean_ms", warm(r, p, 0) * 1e3);
		cJSON_AddNumberToObject(po, "warm_ttft_p50_ms", warm(r, p, 1) * 1e3);
		if (c->stress)
			cJSON_AddNumberToObject(po, "stress_gbps", p->stress_gbps);
		turns = cJSON_AddArrayToObject(po, "turns");
		for (uint32_t k = 0; k < c->turns; k++)
			cJSON_AddItemToArray(turns, turn_json(r, p, k));
		reqs = cJSON_AddArrayToObject(po, "requests");
		for (size_t j = 0; j < p->nreqs; j++)
			if (p->reqs[j].prompt_tokens)
				cJSON_AddItemToArray(reqs, req_json(&p->reqs[j]));
		cJSON_AddItemToObject(po, "data", data_json(p));
		cJSON_AddItemToArray(a, po);
	}
	if (r->npasses == 2) {
		struct paired pr;

		paired(&r->pass[0], &r->pass[1], &pr);
		o = cJSON_AddObjectToObject(root, "paired_warm");
		cJSON_AddNumberToObject(o, "requests", (double)pr.n);
		cJSON_AddNumberToObject(o, "kvtier_lower", (double)pr.kvtier_lower);
		cJSON_AddNumberToObject(o, "median_ratio", pr.median);
		cJSON_AddNumberToObject(o, "ratio_p25", pr.p25);
		cJSON_AddNumberToObject(o, "ratio_p75", pr.p75);
		cJSON_AddNumberToObject(o, "ratio_min", pr.min);
		cJSON_AddNumberToObject(o, "ratio_max", pr.max);
	}
	integrity_get(r, &g);
	o = cJSON_AddObjectToObject(root, "integrity");
	cJSON_AddNumberToObject(o, "restored_pages", (double)g.loaded);
	cJSON_AddNumberToObject(o, "restored_verified", (double)g.verified);
	cJSON_AddNumberToObject(o, "restore_failed", (double)g.failed);
	cJSON_AddNumberToObject(o, "engine_checked", (double)g.engine_checked);
	cJSON_AddNumberToObject(o, "engine_bad", (double)g.engine_bad);
	cJSON_AddNumberToObject(o, "moves_verified", (double)g.moves_verified);
	cJSON_AddNumberToObject(o, "corrupt", (double)g.moves_corrupt);
	cJSON_AddNumberToObject(o, "move_io_errors", (double)g.move_errors);
	cJSON_AddNumberToObject(o, "store_jobs_failed", (double)g.store_errors);
	cJSON_AddNumberToObject(o, "final_checked", (double)g.checked);
	cJSON_AddNumberToObject(o, "final_bad", (double)g.check_bad);
	cJSON_AddBoolToObject(o, "final_check_complete", !g.check_incomplete);
	cJSON_AddNumberToObject(o, "bad", (double)g.bad);
	cJSON_AddBoolToObject(root, "ok", !err);
	if (err)
		cJSON_AddStringToObject(root, "error", r->error[0] ? r->error :
					kvt_strerror(err));
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

/* --fabric [BACKING,]SIZE or BACKING: the backing is a fabric tier-spec
 * option (checked when the tier opens). */
static int fabric_opt(const char *v, kvt_demo_config *c)
{
	const char *comma = strrchr(v, ',');
	uint64_t n;

	if (!kvt_size_parse(v, &n) && n) {
		c->fabric_bytes = n;
		return 0;
	}
	if (comma && !kvt_size_parse(comma + 1, &n) && n)
		c->fabric_bytes = n;
	else
		comma = v + strlen(v);
	if (comma == v || (size_t)(comma - v) >= sizeof(c->fabric) ||
	    (strncmp(v, "memfd", 5) && strncmp(v, "numa=", 5) &&
	     strncmp(v, "/dev/dax", 8) && strncmp(v, "file=", 5))) {
		fprintf(stderr, "kvtier demo: --fabric: '%s' is not SIZE or "
			"BACKING[,SIZE] (BACKING: memfd, numa=N, /dev/daxX.Y, "
			"file=PATH)\n", v);
		return -1;
	}
	snprintf(c->fabric, sizeof(c->fabric), "%.*s", (int)(comma - v), v);
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
		{ "background", required_argument, 0, 'g' },
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
		{ "daemon", no_argument, 0, 'D' },
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
		case 'g':
			if (!strcmp(optarg, "lmcache")) c.background = KVT_DEMO_LMCACHE;
			else if (!strcmp(optarg, "kvtier")) c.background = KVT_DEMO_KVTIER;
			else if (!strcmp(optarg, "both")) c.background = KVT_DEMO_LMCACHE | KVT_DEMO_KVTIER;
			else if (!strcmp(optarg, "none")) c.background = 0;
			else return cli_usage("demo", "--background: '%s' is not lmcache, kvtier, both or none", optarg);
			break;
		case 's': if (cli_u64("--stress", optarg, 0, 64, &v)) return 2; c.stress = (unsigned)v; break;
		case 'B': if (size_opt("--stress-bytes", optarg, &c.stress_bytes)) return 2; break;
		case 1: if (size_opt("--hbm", optarg, &c.hbm_bytes)) return 2; break;
		case 2: if (fabric_opt(optarg, &c)) return 2; break;
		case 3: if (size_opt("--dram", optarg, &c.dram_bytes)) return 2; break;
		case 4: if (size_opt("--ssd", optarg, &c.ssd_bytes)) return 2; break;
		case 'd': snprintf(c.dir, sizeof(c.dir), "%s", optarg); break;
		case 'e': if (cli_u64("--seed", optarg, 0, UINT64_MAX, &v)) return 2; c.seed = v; break;
		case 'j': json = 1; break;
		case 'q': quiet = 1; break;
		case 'D': c.daemon = 1; break;
		case 'h': demo_usage(stdout); return 0;
		default: demo_usage(stderr); return CLI_EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage("demo", "unexpected argument '%s'", argv[optind]);
	if ((err = kvt_demo_size(&c)))
		return cli_fail("demo", err);

	if (getenv("KVT_DEMO_TAMPER") &&
	    cli_u64("KVT_DEMO_TAMPER", getenv("KVT_DEMO_TAMPER"), 0,
		    UINT64_MAX, &c.tamper_after))
		return 2;
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
		print_summary(r, quiet, err);
	}
	if (err)
		fprintf(stderr, "kvtier demo: %s\n", r->error[0] ? r->error :
			kvt_strerror(err));
	kvt_demo_result_free(r);
	return err ? CLI_EXIT_FAIL : 0;
}
