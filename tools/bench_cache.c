/*
 * bench_cache.c — kvtier bench cache: how fast the node cache gets a long
 * prefix back into an engine's own KV memory, layer by layer, against the
 * transfer engine's bare copy of the same pages.
 *
 * Setup (untimed): the engine's memory is a layer-first region (hostdev:
 * host memory here; hbm with --gpu), registered with the cache as the
 * engine would register its per-layer KV tensors (vLLM strides). The cache
 * owns one dram tier big enough for every page. --tokens tokens of
 * --model (16-token pages) are stored out of the engine's blocks into dram
 * (checksums taken), then each repeat, in alternating order:
 *
 *   load   kvt_cache_load(every page -> shuffled engine blocks), then
 *          kvt_cache_job_wait_layer(l) for l = 0..L-1 in turn: the time
 *          from the call to layer 0 ready, and to every layer ready
 *          (verification on unless --no-verify)
 *   copy   kvt_xfer_submit() of the same pages, from the same dram slots
 *          into the same engine blocks, no checksums, on the cache's own
 *          transfer engine: the bare copy the cache is built on
 *
 * --ssd DIR: the cache owns one ssd tier in DIR instead (every page stored
 * there) and loads through its page-locked bounce (KVT_CACHE_STAGE_SSD,
 * the path into GPU memory: ssd -> bounce -> engine, in rounds of half the
 * bounce); the bare copy is the io lane's read of the same ssd slots into
 * page-first host memory of the same size, one job: what the tier gives
 * at best. --direct (host engine memory only): no bounce tier — the io
 * lane reads each page into its bounce slice (huge pages) and copies it
 * into the engine's layers, verified, as the cache loads host engine memory
 * registered without a device (the demo's path). With --ssd the JSON's
 * xfer_gbps is the transfer engine's own measured rate of those loads
 * (kvt_cache_rates(), ssd -> engine: its jobs' time, without the cache's
 * work around them) — the rate an engine's scheduler prices the ssd at,
 * and what scripts/demo-profile takes as the demo's ssd.read_gbps.
 *
 * Reported: medians over repeats; all_layers_vs_copy = copy time / time
 * to all layers ready (the median of the per-repeat ratios, with min and
 * max), layer0_fraction = time to layer 0 / time to all layers. Goals
 * (issues 9, 24): all_layers_vs_copy >= 0.9 with verification on; layer 0
 * ready within 2/L of the total. Both are printed as met or MISSED.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#define MAX_REP 64
#define GOAL_RATIO 0.9 /* all_layers_vs_copy, verification on (issue 24) */
#define MAX_L 512
#define DMIN(a, b) ((a) < (b) ? (a) : (b))
#define DMAX(a, b) ((a) > (b) ? (a) : (b))

struct copt {
	const char *model, *ssd;
	uint64_t tokens, page_tokens, repeats, threads;
	int json, gpu, verify, direct;
};

/* One repeat. */
struct run {
	int load_first;
	double layer0_s, all_s, done_s, copy_s;
	double stat_layer0_s, stat_total_s, wait_s;
	uint64_t verified;
	double *layer_s; /* L values: submit -> layer l ready */
};

struct bench {
	struct copt o;
	kvt_geom g;
	uint64_t n, page, bytes;
	kvt_tier *engine;      /* the engine's memory: hostdev or hbm */
	kvt_cache *c;
	kvt_tier *flat;        /* --ssd: the bare read's page-first memory */
	kvt_tier_kind from;    /* the tier the pages are loaded from */
	char ssd_sub[512];     /* --ssd: the cache's directory in DIR ('temp':
				* the tier removes it and its files) */
	kvt_page_key *keys;
	uint32_t *blocks;      /* engine blocks, shuffled */
	uint32_t *dram_slots;  /* where the cache put each page (in b->from) */
	uint32_t *flat_slots;  /* --ssd: 0..n-1 */
	double store_s;
	double xfer_gbps;      /* --ssd: the transfer engine's measured rate
				* of the loads (kvt_cache_rates()), 0: none */
	struct run runs[MAX_REP];
	int nruns;
	kvt_machine m;
};

static double secs(uint64_t t0)
{
	return (kvt_now_ns() - t0) / 1e9;
}

static void shuffle(uint32_t *v, uint64_t n, uint64_t seed)
{
	for (uint64_t i = 0; i < n; i++)
		v[i] = (uint32_t)i;
	for (uint64_t i = n - 1; i > 0; i--) {
		uint64_t k;
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		k = seed % (i + 1);
		uint32_t t = v[i];
		v[i] = v[k];
		v[k] = t;
	}
}

/* ---- setup ---------------------------------------------------------- */

/* Enough memory for the engine region and the dram tier? */
static int check_memory(struct bench *b)
{
	/* the engine's region and a dram tier, or (--ssd) the bare read's
	 * host memory of the same size */
	uint64_t need = (b->o.gpu && !b->o.ssd ? 1 : 2) * b->bytes +
			(256ull << 20);
	char a[32], w[32];

	kvt_probe(&b->m);
	if (b->o.gpu && b->m.ngpus < 1) {
		fprintf(stderr, "kvtier bench cache --gpu: no usable GPU here "
			"(%s)\n", b->m.cuda_built ? b->m.cuda_note :
			"built without CUDA");
		return CLI_EXIT_FAIL;
	}
	if (b->m.mem_available && b->m.mem_available < need) {
		uint64_t fit = (b->m.mem_available - DMIN(b->m.mem_available,
			256ull << 20)) / (b->o.gpu ? 1 : 2) / b->page *
			b->g.page_tokens;
		fprintf(stderr, "kvtier bench cache: %llu tokens of %s need %s "
			"of memory (the engine's KV region and a dram tier of "
			"the same size); %s is available: use --tokens %llu or "
			"fewer\n", (unsigned long long)b->o.tokens, b->g.name,
			kvt_size_format(need, w, sizeof(w)),
			kvt_size_format(b->m.mem_available, a, sizeof(a)),
			(unsigned long long)fit);
		return CLI_EXIT_FAIL;
	}
	if (b->o.gpu && b->m.ngpus > 0 && b->m.gpus[0].mem &&
	    b->m.gpus[0].mem < b->bytes + (512ull << 20)) {
		fprintf(stderr, "kvtier bench cache: %s of KV do not fit in "
			"the GPU's %s: use fewer --tokens\n",
			kvt_size_format(b->bytes, w, sizeof(w)),
			kvt_size_format(b->m.gpus[0].mem, a, sizeof(a)));
		return CLI_EXIT_FAIL;
	}
	return 0;
}

static int open_engine(struct bench *b)
{
	kvt_tier_spec spec[1];
	char text[128];
	size_t n;
	int err;

	snprintf(text, sizeof(text), b->o.gpu ? "hbm:%llu" :
		 "hostdev:%llu,populate", (unsigned long long)b->bytes);
	if ((err = kvt_tier_spec_parse(text, spec, 1, &n)) ||
	    (err = kvt_tier_open(&b->engine, spec, &b->g)))
		return err;
	if (!b->o.gpu) { /* bytes in every block: the store hashes them */
		const kvt_layout *l = kvt_tier_layout(b->engine);
		void *const *bufs = kvt_tier_bufs(b->engine);
		for (uint32_t i = 0; i < l->nbufs; i++)
			memset(bufs[i], 0x11 + (int)i, l->buf_bytes);
	}
	return 0;
}

static int open_cache(struct bench *b)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	const kvt_layout *l = kvt_tier_layout(b->engine);
	char tiers[700];

	/* every page fits, two to spare: nothing is demoted or evicted */
	if (b->o.ssd) {
		snprintf(b->ssd_sub, sizeof(b->ssd_sub), "%s/kvtier-bench-"
			 "cache-%d", b->o.ssd, (int)getpid());
		snprintf(tiers, sizeof(tiers), "ssd:%s,%llu,temp", b->ssd_sub,
			 (unsigned long long)((b->n + 2) * (b->page + 4096)));
	} else {
		snprintf(tiers, sizeof(tiers), "dram:%llu,populate%s",
			 (unsigned long long)((b->n + 2) * b->page),
			 b->o.gpu ? ",pin" : "");
	}
	cfg.tiers = tiers;
	cfg.geom = &b->g;
	cfg.high = 1.0;
	cfg.low = 0.95;
	cfg.xfer_threads = (uint32_t)b->o.threads;
	cfg.flags = (b->o.verify ? 0 : KVT_CACHE_NO_VERIFY) |
		    (b->o.ssd && !b->o.direct ? KVT_CACHE_STAGE_SSD : 0);
	int err = kvt_cache_open(&b->c, &cfg);
	if (err)
		return err;
	if (b->o.ssd) { /* the bare read's destination: page-first memory */
		kvt_tier_spec spec[1];
		char text[64];
		size_t n;

		snprintf(text, sizeof(text), "dram:%llu,populate",
			 (unsigned long long)(b->n * b->page));
		if ((err = kvt_tier_spec_parse(text, spec, 1, &n)) ||
		    (err = kvt_tier_open(&b->flat, spec, &b->g)))
			return err;
		for (uint64_t i = 0; i < b->n; i++)
			b->flat_slots[i] = (uint32_t)i;
	}
	/* vLLM strides over the layer-first region: per layer [kv][block] */
	return kvt_cache_register(b->c, kvt_tier_bufs(b->engine), b->g.layers,
				  l->slots, l->chunk_bytes,
				  l->slots * l->chunk_bytes,
				  (uint64_t)b->g.kv_heads * b->g.head_dim *
					  b->g.dtype_bytes,
				  b->o.gpu ? 0 : -1);
}

/* Store every page out of blocks 0..n-1; find where dram holds them. */
static int store_pages(struct bench *b)
{
	uint32_t *tok = malloc(b->n * b->g.page_tokens * sizeof(uint32_t));
	uint32_t *blk = malloc(b->n * sizeof(uint32_t));
	kvt_page_info *info = malloc(b->n * sizeof(*info));
	kvt_prefix px = { .keys = NULL };
	kvt_cache_job *j;
	uint64_t t0;
	size_t found = 0;
	int err = -ENOMEM;

	if (!tok || !blk || !info)
		goto out;
	for (uint64_t i = 0; i < b->n * b->g.page_tokens; i++)
		tok[i] = (uint32_t)(i * 2654435761u);
	if ((err = kvt_cache_hash_tokens(b->c, 0, tok, b->n * b->g.page_tokens,
					 b->keys)))
		goto out;
	for (uint64_t i = 0; i < b->n; i++)
		blk[i] = (uint32_t)i;
	t0 = kvt_now_ns();
	if ((err = kvt_cache_store(b->c, 0, b->keys, b->n, 0, blk, &j)))
		goto out;
	err = kvt_cache_job_wait(j, -1);
	b->store_s = secs(t0);
	kvt_cache_job_free(j);
	if (err)
		goto out;
	kvt_cache_quiesce(b->c);
	px.keys = b->keys;
	px.nkeys = b->n;
	if ((err = kvt_index_inspect(kvt_cache_index(b->c), &px, info, b->n,
				     &found)))
		goto out;
	err = 0;
	for (uint64_t i = 0; i < b->n && !err; i++) {
		if (i >= found || !(info[i].resident & (1u << b->from))) {
			fprintf(stderr, "kvtier bench cache: page %llu is not in "
				"%s after the store\n", (unsigned long long)i,
				kvt_tier_kind_name(b->from));
			err = KVT_ENOTFOUND;
		} else {
			b->dram_slots[i] = info[i].slot[b->from];
		}
	}
out:
	free(tok);
	free(blk);
	free(info);
	return err;
}

/* ---- the two measurements -------------------------------------------- */

static int time_load(struct bench *b, struct run *r)
{
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	uint64_t t0 = kvt_now_ns();
	long nf;
	int err;

	if ((err = kvt_cache_load(b->c, 0, b->keys, b->n, 0, b->blocks, &j)))
		return err;
	for (uint32_t l = 0; l < b->g.layers; l++) {
		if ((err = kvt_cache_job_wait_layer(j, l, -1)))
			break;
		r->layer_s[l] = secs(t0);
	}
	if (!err)
		err = kvt_cache_job_wait(j, -1);
	r->done_s = secs(t0);
	nf = kvt_cache_job_failed(j, NULL, 0);
	kvt_cache_job_stat_get(j, &st);
	kvt_cache_job_free(j);
	if (err || nf) {
		fprintf(stderr, "kvtier bench cache: the load failed (%ld "
			"blocks)\n", nf);
		return err ? err : -EIO;
	}
	r->layer0_s = r->layer_s[0];
	r->all_s = r->layer_s[b->g.layers - 1];
	r->stat_layer0_s = st.layer0_s;
	r->stat_total_s = st.total_s;
	r->wait_s = st.wait_s;
	r->verified = st.verified;
	return 0;
}

static int time_copy(struct bench *b, struct run *r)
{
	kvt_xfer_desc d = { .src = kvt_cache_tier(b->c, b->from),
			    .dst = b->flat ? b->flat : b->engine,
			    .src_slots = b->dram_slots,
			    .dst_slots = b->flat ? b->flat_slots : b->blocks,
			    .npages = b->n };
	kvt_xfer_job *j;
	uint64_t t0 = kvt_now_ns();
	int err = kvt_xfer_submit(kvt_cache_xfer(b->c), &d, &j);

	if (err)
		return err;
	err = kvt_xfer_wait(j, -1);
	r->copy_s = secs(t0);
	kvt_xfer_job_free(j);
	return err;
}

/* ---- output ------------------------------------------------------------ */

struct summary {
	double layer0, all, done, copy, ratio, rmin, rmax, frac, fmin, fmax;
	double goal_frac;
};

static void summarize(const struct bench *b, struct summary *s)
{
	double v[6][MAX_REP];
	int n = b->nruns;

	for (int i = 0; i < n; i++) {
		const struct run *r = &b->runs[i];
		v[0][i] = r->layer0_s;
		v[1][i] = r->all_s;
		v[2][i] = r->done_s;
		v[3][i] = r->copy_s;
		v[4][i] = r->all_s > 0 ? r->copy_s / r->all_s : 0;
		v[5][i] = r->all_s > 0 ? r->layer0_s / r->all_s : 0;
	}
	s->layer0 = cli_median(v[0], n);
	s->all = cli_median(v[1], n);
	s->done = cli_median(v[2], n);
	s->copy = cli_median(v[3], n);
	s->ratio = cli_median(v[4], n);
	s->frac = cli_median(v[5], n);
	s->rmin = s->fmin = 1e300;
	s->rmax = s->fmax = 0;
	for (int i = 0; i < n; i++) {
		s->rmin = DMIN(s->rmin, v[4][i]);
		s->rmax = DMAX(s->rmax, v[4][i]);
		s->fmin = DMIN(s->fmin, v[5][i]);
		s->fmax = DMAX(s->fmax, v[5][i]);
	}
	s->goal_frac = 2.0 / b->g.layers;
}

static void print_json(const struct bench *b, const struct summary *s)
{
	cJSON *root = cJSON_CreateObject(), *o, *a;
	kvt_xfer_info info;
	kvt_tier_desc td;
	struct utsname u;

	kvt_xfer_info_get(kvt_cache_xfer(b->c), &info);
	kvt_tier_info(b->engine, &td);
	cJSON_AddNumberToObject(root, "version", 1);
	cJSON_AddStringToObject(root, "bench", "cache");
	cJSON_AddStringToObject(root, "model", b->g.name);
	cJSON_AddNumberToObject(root, "layers", b->g.layers);
	cJSON_AddNumberToObject(root, "page_tokens", b->g.page_tokens);
	cJSON_AddNumberToObject(root, "tokens", (double)(b->n * b->g.page_tokens));
	cJSON_AddNumberToObject(root, "pages", (double)b->n);
	cJSON_AddNumberToObject(root, "page_bytes", (double)b->page);
	cJSON_AddNumberToObject(root, "bytes", (double)b->bytes);
	cJSON_AddStringToObject(root, "from", kvt_tier_kind_name(b->from));
	if (b->o.ssd)
		cJSON_AddBoolToObject(root, "staged", !b->o.direct);
	cJSON_AddStringToObject(root, "bare_copy", b->flat ?
				"io lane read into page-first host memory" :
				"transfer engine copy into the same blocks");
	cJSON_AddStringToObject(root, "engine_memory", b->o.gpu ? "gpu" : "host");
	cJSON_AddBoolToObject(root, "engine_memory_emulated", td.emulated);
	cJSON_AddBoolToObject(root, "verify", b->o.verify);
	cJSON_AddNumberToObject(root, "repeats", b->nruns);
	cJSON_AddStringToObject(root, "slot_order", "shuffled engine blocks");
	o = cJSON_AddObjectToObject(root, "machine");
	if (uname(&u) == 0)
		cJSON_AddStringToObject(o, "kernel", u.release);
	cJSON_AddNumberToObject(o, "cpus", b->m.cpus);
	cJSON_AddNumberToObject(o, "mem_total", (double)b->m.mem_total);
	cJSON_AddNumberToObject(o, "mem_available", (double)b->m.mem_available);
	cJSON_AddStringToObject(o, "gpu", b->m.ngpus ? b->m.gpus[0].name : "");
	o = cJSON_AddObjectToObject(root, "xfer");
	cJSON_AddNumberToObject(o, "cpu_threads", info.cpu_threads);
	cJSON_AddStringToObject(o, "copy_isa", info.copy_isa);
	cJSON_AddBoolToObject(o, "cuda", info.cuda);
	cJSON_AddStringToObject(o, "cuda_note", info.cuda_note);
	cJSON_AddNumberToObject(root, "store_s", b->store_s);
	cJSON_AddNumberToObject(root, "layer0_s", s->layer0);
	cJSON_AddNumberToObject(root, "all_layers_s", s->all);
	cJSON_AddNumberToObject(root, "done_s", s->done);
	cJSON_AddNumberToObject(root, "copy_s", s->copy);
	cJSON_AddNumberToObject(root, "load_gbps", s->all > 0 ? b->bytes / s->all / 1e9 : 0);
	if (b->xfer_gbps > 0)
		cJSON_AddNumberToObject(root, "xfer_gbps", b->xfer_gbps);
	else
		cJSON_AddNullToObject(root, "xfer_gbps");
	cJSON_AddNumberToObject(root, "copy_gbps", s->copy > 0 ? b->bytes / s->copy / 1e9 : 0);
	cJSON_AddNumberToObject(root, "all_layers_vs_copy", s->ratio);
	cJSON_AddNumberToObject(root, "all_layers_vs_copy_min", s->rmin);
	cJSON_AddNumberToObject(root, "all_layers_vs_copy_max", s->rmax);
	cJSON_AddNumberToObject(root, "layer0_fraction", s->frac);
	cJSON_AddNumberToObject(root, "layer0_fraction_min", s->fmin);
	cJSON_AddNumberToObject(root, "layer0_fraction_max", s->fmax);
	o = cJSON_AddObjectToObject(root, "goals");
	cJSON_AddNumberToObject(o, "all_layers_vs_copy", GOAL_RATIO);
	cJSON_AddBoolToObject(o, "all_layers_vs_copy_met",
			      b->o.verify && s->ratio >= GOAL_RATIO);
	if (b->flat)
		cJSON_AddStringToObject(o, "ssd_note", "from the ssd the goal "
					"is the same ratio against the io "
					"lane's bare read (two hops against "
					"one)");
	cJSON_AddNumberToObject(o, "layer0_fraction", s->goal_frac);
	if (b->flat) /* the rounds before the last are not reported */
		cJSON_AddNullToObject(o, "layer0_fraction_met");
	else
		cJSON_AddBoolToObject(o, "layer0_fraction_met",
				      s->frac <= s->goal_frac);
	if (!b->o.verify)
		cJSON_AddStringToObject(o, "note", "verification off: the "
					"ratio goal counts only with it on");
	a = cJSON_AddArrayToObject(root, "runs");
	for (int i = 0; i < b->nruns; i++) {
		const struct run *r = &b->runs[i];
		cJSON *e = cJSON_CreateObject(), *ls;

		cJSON_AddStringToObject(e, "order", r->load_first ?
					"load, copy" : "copy, load");
		cJSON_AddNumberToObject(e, "layer0_s", r->layer0_s);
		cJSON_AddNumberToObject(e, "all_layers_s", r->all_s);
		cJSON_AddNumberToObject(e, "done_s", r->done_s);
		cJSON_AddNumberToObject(e, "copy_s", r->copy_s);
		cJSON_AddNumberToObject(e, "job_layer0_s", r->stat_layer0_s);
		cJSON_AddNumberToObject(e, "job_total_s", r->stat_total_s);
		cJSON_AddNumberToObject(e, "job_wait_s", r->wait_s);
		cJSON_AddNumberToObject(e, "verified_pages", (double)r->verified);
		ls = cJSON_AddArrayToObject(e, "layer_s");
		for (uint32_t l = 0; l < b->g.layers; l++)
			cJSON_AddItemToArray(ls, cJSON_CreateNumber(r->layer_s[l]));
		cJSON_AddItemToArray(a, e);
	}
	cli_json_print(root);
}

static void print_text(const struct bench *b, const struct summary *s)
{
	char sz[32];
	kvt_xfer_info info;

	kvt_xfer_info_get(kvt_cache_xfer(b->c), &info);
	printf("%s, %llu tokens = %llu pages of %u tokens (%s) from %s into "
	       "%s engine memory%s;\nverification %s; %u cpu thread%s; median "
	       "of %d repeats, load and bare %s alternating\n\n", b->g.name,
	       (unsigned long long)(b->n * b->g.page_tokens),
	       (unsigned long long)b->n, b->g.page_tokens,
	       kvt_size_format(b->bytes, sz, sizeof(sz)),
	       kvt_tier_kind_name(b->from),
	       b->o.gpu ? "GPU" : "host",
	       !b->flat ? "" : b->o.direct ? " straight (io lane, no bounce)" :
	       " through the bounce",
	       b->o.verify ? "on" : "OFF",
	       info.cpu_threads, info.cpu_threads == 1 ? "" : "s", b->nruns,
	       b->flat ? "read (io lane, page-first host memory)" : "copy");
	printf("  layer 0 ready      %8.1f ms\n", s->layer0 * 1e3);
	printf("  all layers ready   %8.1f ms  (%.2f GB/s)\n", s->all * 1e3,
	       s->all > 0 ? b->bytes / s->all / 1e9 : 0);
	printf("  job done           %8.1f ms\n", s->done * 1e3);
	if (b->xfer_gbps > 0)
		printf("  transfer engine    %8.2f GB/s  (its measured ssd -> "
		       "engine rate: the jobs' own time, no cache overhead)\n",
		       b->xfer_gbps);
	printf("  bare %-14s%8.1f ms  (%.2f GB/s)\n", b->flat ? "read" :
	       "copy", s->copy * 1e3,
	       s->copy > 0 ? b->bytes / s->copy / 1e9 : 0);
	printf("\n  all_layers_vs_copy %.3f (%.3f-%.3f)  goal >= 0.9: %s\n",
	       s->ratio, s->rmin, s->rmax,
	       !b->o.verify ? "n/a (verification off)" :
	       s->ratio >= GOAL_RATIO ? "met" : "MISSED");
	printf("  layer0_fraction    %.3f (%.3f-%.3f)  goal <= 2/L = %.3f: %s\n",
	       s->frac, s->fmin, s->fmax, s->goal_frac,
	       b->flat ? "n/a (from the ssd, the layers of a page land "
	       "together)" : s->frac <= s->goal_frac ? "met" : "MISSED");
}

/* ---- the command --------------------------------------------------------- */

static void cache_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier bench cache [--model NAME|CONFIG] [--tokens N] [--page-tokens P]\n"
"                          [--repeats R] [--threads T] [--gpu] [--no-verify]\n"
"                          [--ssd DIR [--direct]] [--json]\n"
"\n"
"Loads the KV of N tokens from the cache's dram tier into registered engine\n"
"memory with per-layer waits, and copies the same pages with the transfer\n"
"engine alone, alternating, in the same run. Reports the time to layer 0\n"
"ready and to every layer ready against the bare copy.\n"
"\n"
"  --model M          preset or config.json (default llama-3.1-8b)\n"
"  --tokens N         tokens to load (default 32768: 4 GiB of llama-3.1-8b;\n"
"                     needs twice that in memory, checked first)\n"
"  --page-tokens P    tokens per page (default 16)\n"
"  --repeats R        repeats (default 5)\n"
"  --threads T        transfer engine cpu threads (default: its own)\n"
"  --gpu              engine memory on GPU 0 (hbm) instead of host memory\n"
"  --no-verify        no checksums (ablation; the goal needs them on)\n"
"  --ssd DIR          from an ssd tier in DIR instead, through the cache's\n"
"                     bounce (its staged path), against the io lane's bare\n"
"                     read of the same pages into host memory (needs N\n"
"                     tokens' KV free on DIR's file system)\n"
"  --direct           with --ssd, host engine memory: no bounce tier, the io\n"
"                     lane reads straight into engine memory (the cache's\n"
"                     path for host memory registered without a device)\n"
"  --json             one JSON object (see docs/PERFORMANCE.md)\n");
}

static int parse_args(int argc, char **argv, struct copt *o)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' },
		{ "tokens", required_argument, 0, 'n' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "repeats", required_argument, 0, 'R' },
		{ "repeat", required_argument, 0, 'R' },
		{ "threads", required_argument, 0, 'T' },
		{ "gpu", no_argument, 0, 'g' },
		{ "no-verify", no_argument, 0, 'x' },
		{ "ssd", required_argument, 0, 'd' },
		{ "direct", no_argument, 0, 'D' },
		{ "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'n': if (cli_u64("--tokens", optarg, 1, 1u << 24, &o->tokens)) return -1; break;
		case 'p': if (cli_u64("--page-tokens", optarg, 1, 1u << 16, &o->page_tokens)) return -1; break;
		case 'R': if (cli_u64("--repeats", optarg, 1, MAX_REP, &o->repeats)) return -1; break;
		case 'T': if (cli_u64("--threads", optarg, 1, 256, &o->threads)) return -1; break;
		case 'g': o->gpu = 1; break;
		case 'x': o->verify = 0; break;
		case 'd': o->ssd = optarg; break;
		case 'D': o->direct = 1; break;
		case 'j': o->json = 1; break;
		case 'h': cache_usage(stdout); return 1;
		default: cli_usage("bench cache", "bad option"); return -1;
		}
	}
	if (optind < argc) {
		cli_usage("bench cache", "unexpected argument '%s'", argv[optind]);
		return -1;
	}
	if (o->direct && (!o->ssd || o->gpu)) {
		cli_usage("bench cache", "--direct needs --ssd and host engine "
			  "memory (a GPU's loads always go through the bounce)");
		return -1;
	}
	return 0;
}

static void bench_free(struct bench *b)
{
	kvt_cache_close(b->c);
	kvt_tier_close(b->flat);
	kvt_tier_close(b->engine);
	for (int i = 0; i < MAX_REP; i++)
		free(b->runs[i].layer_s);
	free(b->keys);
	free(b->blocks);
	free(b->dram_slots);
	free(b->flat_slots);
}

int bench_cache(int argc, char **argv)
{
	static struct bench b;
	struct summary s;
	int err, rc;

	memset(&b, 0, sizeof(b));
	b.o = (struct copt){ .model = "llama-3.1-8b", .tokens = 32768,
			     .page_tokens = 16, .repeats = 5, .verify = 1 };
	if ((rc = parse_args(argc, argv, &b.o)))
		return rc > 0 ? 0 : CLI_EXIT_USAGE;
	if ((err = cli_geom(&b.g, b.o.model, (uint32_t)b.o.page_tokens, 1, 0)))
		return cli_fail("bench cache", err);
	if (b.g.layers > MAX_L)
		return cli_usage("bench cache", "%u layers: at most %d",
				 b.g.layers, MAX_L);
	b.n = b.o.tokens / b.g.page_tokens;
	if (!b.n)
		return cli_usage("bench cache", "--tokens %llu is less than one "
				 "page of %u", (unsigned long long)b.o.tokens,
				 b.g.page_tokens);
	b.page = kvt_geom_page_bytes(&b.g);
	b.bytes = b.n * b.page;
	if ((rc = check_memory(&b)))
		return rc;
	b.keys = malloc(b.n * sizeof(*b.keys));
	b.blocks = malloc(b.n * sizeof(*b.blocks));
	b.dram_slots = malloc(b.n * sizeof(*b.dram_slots));
	b.flat_slots = malloc(b.n * sizeof(*b.flat_slots));
	b.from = b.o.ssd ? KVT_TIER_SSD : KVT_TIER_DRAM;
	for (uint64_t i = 0; i < b.o.repeats; i++)
		b.runs[i].layer_s = calloc(b.g.layers, sizeof(double));
	if (!b.keys || !b.blocks || !b.dram_slots || !b.flat_slots ||
	    !b.runs[b.o.repeats - 1].layer_s) {
		rc = cli_fail("bench cache", -ENOMEM);
		goto out;
	}
	if ((err = open_engine(&b))) {
		rc = cli_fail(b.o.gpu ? "bench cache --gpu: engine memory" :
			      "bench cache: engine memory", err);
		goto out;
	}
	if ((err = open_cache(&b)) || (err = store_pages(&b))) {
		rc = cli_fail("bench cache", err);
		goto out;
	}
	shuffle(b.blocks, b.n, 0x9e3779b97f4a7c15ull);
	/* one untimed round of each: every page and block touched once */
	{
		struct run warm = { .layer_s = b.runs[0].layer_s };
		if ((err = time_load(&b, &warm)) || (err = time_copy(&b, &warm))) {
			rc = cli_fail("bench cache", err);
			goto out;
		}
	}
	for (b.nruns = 0; b.nruns < (int)b.o.repeats; b.nruns++) {
		struct run *r = &b.runs[b.nruns];

		r->load_first = b.nruns % 2 == 0;
		for (int k = 0; k < 2; k++) {
			int load = (k == 0) == r->load_first;
			if ((err = load ? time_load(&b, r) : time_copy(&b, r))) {
				rc = cli_fail(load ? "bench cache: load" :
					      "bench cache: copy", err);
				goto out;
			}
		}
	}
	/* from the ssd, the loads alone make the ssd -> engine rate the
	 * transfer engine measured (the bare read lands in page-first dram,
	 * another pair); from dram the bare copies share the loads' pair */
	if (b.o.ssd) {
		static kvt_xfer_rate rt[KVT_TIER_COUNT][KVT_TIER_COUNT];

		if (!kvt_cache_rates(b.c, rt))
			b.xfer_gbps = rt[b.from][KVT_TIER_HBM].gbps;
	}
	summarize(&b, &s);
	if (b.o.json)
		print_json(&b, &s);
	else
		print_text(&b, &s);
	rc = 0;
out:
	bench_free(&b);
	return rc;
}
