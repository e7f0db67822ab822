/*
 * bench_server_ctl.c — the control path of `kvtier bench server`, on a
 * second daemon with a small model (2 layers, 1 KV head of 64, bf16:
 * 16-token pages of 8 KiB, so a request's cost is in its keys, not in the
 * bytes):
 *
 *   latency    one client holding a 32k-token prompt: HASH of its 32,768
 *              tokens, LOOKUP of 1 key and of its 2,048 keys, back to
 *              back, p50 and p99; --python: the same from the package
 *   load test  --load-clients processes for --load-seconds: LOOKUP of a
 *              512-page prompt, LOAD of 64 of its pages, wait; every 4th
 *              request a STORE of 8 new pages, wait; requests/s, request
 *              latency p50 and p99, errors
 *
 * The small daemon's model is a config.json of its own in a directory of
 * this run (/tmp/kvtier-bench-PID), made before any process starts and
 * removed at teardown.
 *
 * Invariants: the latency client checks what it measures (the prompt's
 * LOOKUP finds every page, HASH gives the keys of the store), a load-test
 * request that fails is counted as an error, not dropped; the load-test
 * processes are set up (their prompts stored) before anything is timed.
 *
 * Locking: none; each load-test process is single-threaded and reports
 * once, through its pipe, after its run.
 */
#include "bench_server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct lt_result {
	uint64_t requests, errors, nsamples;
};

/* The small daemon's model (kvti_bs_ctl_prepare). */
static kvt_geom g_tiny;

static const char *tiny_json =
	"{\"num_hidden_layers\":2,\"num_attention_heads\":1,"
	"\"hidden_size\":64,\"num_key_value_heads\":1,"
	"\"torch_dtype\":\"bfloat16\"}";

static void prompt_tokens(uint32_t *t, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		t[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

/* Connect to the small daemon and store @n pages of prompt @seed out of
 * fresh memory; its keys in *@keys (kvt_free()). */
static int small_client(const char *sock, const kvt_geom *g, uint32_t seed,
			uint64_t n, kvt_client **cl, kvt_client_mem **m,
			kvt_page_key **keys)
{
	kvt_client_config cc = KVT_CLIENT_CONFIG_INIT;
	uint32_t *tok = kvt_malloc(n * LAT_P * sizeof(*tok));
	uint32_t *blk = kvt_malloc(n * sizeof(*blk));
	void *base[MAX_L];
	kvt_client_job *j;
	int err;

	*keys = kvt_malloc(n * sizeof(**keys));
	cc.socket = sock;
	cc.geom = g;
	if (!tok || !blk || !*keys) {
		err = -ENOMEM;
		goto out;
	}
	prompt_tokens(tok, n * LAT_P, seed);
	for (uint64_t i = 0; i < n; i++)
		blk[i] = (uint32_t)i;
	if ((err = kvt_client_connect(cl, &cc)) ||
	    (err = kvt_client_mem_alloc(*cl, n, base, NULL, NULL, NULL, m)) ||
	    (err = kvt_client_hash_tokens(*cl, tok, n * LAT_P, *keys)) ||
	    (err = kvt_client_store(*cl, *m, *keys, n, 0, blk, &j)))
		goto out;
	err = kvt_client_job_wait(j, -1);
	kvt_client_job_free(j);
out:
	kvt_free(tok);
	kvt_free(blk);
	return err;
}

static int latency(const char *sock, const kvt_geom *g, uint64_t reps,
		   struct lat *r)
{
	uint64_t n = LAT_TOKENS / LAT_P;
	double *v = kvt_malloc(reps * sizeof(*v));
	uint32_t *tok = kvt_malloc(LAT_TOKENS * sizeof(*tok));
	kvt_page_key *keys = NULL, *hk = kvt_malloc(n * sizeof(*hk));
	kvt_cache_lookup_result lr;
	kvt_client_mem *m = NULL;
	kvt_client *cl = NULL;
	int err;

	memset(r, 0, sizeof(*r));
	r->keys = n;
	r->reps = reps;
	if (!v || !tok || !hk) {
		err = -ENOMEM;
		goto out;
	}
	if ((err = small_client(sock, g, 7, n, &cl, &m, &keys)))
		goto out;
	prompt_tokens(tok, LAT_TOKENS, 7);
	for (int what = 0; what < 3 && !err; what++) {
		for (uint64_t i = 0; i < reps && !err; i++) {
			uint64_t t0 = kvt_now_ns();

			err = what == 0 ? kvt_client_hash_tokens(cl, tok,
						LAT_TOKENS, hk) :
			      kvt_client_lookup(cl, keys, what == 1 ? 1 : n, 0,
						&lr);
			v[i] = (kvt_now_ns() - t0) / 1e3;
			if (!err && what == 2 && lr.pages != n) {
				fprintf(stderr, "kvtier bench server: the "
					"prompt's lookup found %llu of %llu "
					"pages\n", (unsigned long long)lr.pages,
					(unsigned long long)n);
				err = KVT_ENOTFOUND;
			}
		}
		if (what == 0) {
			r->hash_p99 = kvti_bs_quantile(v, reps, 0.99);
			r->hash_p50 = kvti_bs_quantile(v, reps, 0.50);
		} else if (what == 1) {
			r->one_p99 = kvti_bs_quantile(v, reps, 0.99);
			r->one_p50 = kvti_bs_quantile(v, reps, 0.50);
		} else {
			r->all_p99 = kvti_bs_quantile(v, reps, 0.99);
			r->all_p50 = kvti_bs_quantile(v, reps, 0.50);
		}
	}
	if (!err && memcmp(hk, keys, n * sizeof(*hk))) {
		fprintf(stderr, "kvtier bench server: HASH gave other keys "
			"than at store\n");
		err = KVT_ECORRUPT;
	}
out:
	kvt_client_close(cl);
	kvt_free(v);
	kvt_free(tok);
	kvt_free(keys);
	kvt_free(hk);
	return err;
}

/* A load-test client: on 'g', requests for --load-seconds; writes a
 * struct lt_result, then nsamples latencies (us, doubles). */
int kvti_bs_lt_client(const struct sopt *o, const char *sock, uint64_t id,
		      int in, int out)
{
	struct lt_result res = { 0 };
	double *lat = malloc(LT_MAX_SAMPLES * sizeof(*lat));
	uint32_t blk[LT_LOAD], sblk[LT_STORE], stok[LT_STORE * LAT_P];
	kvt_page_key *keys = NULL, skeys[LT_STORE];
	kvt_client_mem *m = NULL;
	kvt_client *cl = NULL;
	uint64_t end, seq = 0;
	char cmd;
	int err;

	err = !lat ? -ENOMEM :
	      small_client(sock, &g_tiny, 100 + (uint32_t)id, LT_PAGES, &cl,
			   &m, &keys);
	if (write(out, &(double){ err ? -1.0 : 0.0 }, sizeof(double)) !=
	    sizeof(double) || err)
		goto out;
	if (read(in, &cmd, 1) != 1 || cmd != 'g')
		goto out;
	for (uint32_t i = 0; i < LT_STORE; i++)
		sblk[i] = LT_LOAD + i;
	end = kvt_now_ns() + o->load_seconds * 1000000000ull;
	while (kvt_now_ns() < end) {
		uint64_t t0 = kvt_now_ns(), r = res.requests;
		kvt_cache_lookup_result lr;
		kvt_client_job *j;
		int e;

		kvti_bs_shuffle(blk, LT_LOAD, id * 7919 + r);
		e = kvt_client_lookup(cl, keys, LT_PAGES, KVT_LOOKUP_TOUCH,
				      &lr);
		if (!e && lr.pages != LT_PAGES)
			e = KVT_ENOTFOUND;
		if (!e && !(e = kvt_client_load(cl, m, keys, LT_LOAD, 0, blk,
						&j))) {
			e = kvt_client_job_wait(j, -1);
			kvt_client_job_free(j);
		}
		if (!e && r % 4 == 3) { /* a new 8-page prompt */
			prompt_tokens(stok, LT_STORE * LAT_P, (uint32_t)(100 +
				      id) ^ (uint32_t)(++seq << 20));
			if (!(e = kvt_client_hash_tokens(cl, stok, LT_STORE *
							 LAT_P, skeys)) &&
			    !(e = kvt_client_store(cl, m, skeys, LT_STORE, 0,
						   sblk, &j))) {
				e = kvt_client_job_wait(j, -1);
				kvt_client_job_free(j);
			}
		}
		res.errors += e != 0;
		res.requests++;
		if (res.nsamples < LT_MAX_SAMPLES)
			lat[res.nsamples++] = (kvt_now_ns() - t0) / 1e3;
	}
	if (write(out, &res, sizeof(res)) == sizeof(res) &&
	    write(out, lat, res.nsamples * sizeof(*lat)) !=
	    (ssize_t)(res.nsamples * sizeof(*lat)))
		err = -EIO;
out:
	kvt_client_close(cl);
	kvt_free(keys);
	free(lat);
	return err ? 1 : 0;
}

static int load_test(struct child *ch, int n, double seconds,
		     struct lt_sum *s)
{
	double *all = NULL;
	uint64_t nall = 0;
	int err = 0;

	memset(s, 0, sizeof(*s));
	for (int i = 0; i < n; i++)
		if (write(ch[i].go, "g", 1) != 1)
			return -EIO;
	for (int i = 0; i < n && !err; i++) {
		struct lt_result r;
		double *grow;

		if (kvti_bs_read_all(ch[i].back, &r, sizeof(r)) ||
		    r.nsamples > LT_MAX_SAMPLES) {
			err = -EIO;
			break;
		}
		grow = realloc(all, (nall + r.nsamples + 1) * sizeof(*all));
		if (!grow) {
			err = -ENOMEM;
			break;
		}
		all = grow;
		if (kvti_bs_read_all(ch[i].back, all + nall,
			     r.nsamples * sizeof(*all))) {
			err = -EIO;
			break;
		}
		nall += r.nsamples;
		s->requests += r.requests;
		s->errors += r.errors;
	}
	if (!err) {
		s->rps = (double)s->requests / seconds;
		s->p99 = kvti_bs_quantile(all, nall, 0.99);
		s->p50 = kvti_bs_quantile(all, nall, 0.50);
	}
	free(all);
	return err;
}

/* ---- the Python package's figures (--python) ----------------------------- */

/* Run `PY -m kvtier.bench --socket S ...` and take its JSON. */
static cJSON *python_figures(const char *py, const char *sock,
			     const char *model, uint64_t reps)
{
	char cmd[1024], buf[4096];
	size_t n = 0;
	FILE *f;
	cJSON *j;

	snprintf(cmd, sizeof(cmd), "%s -m kvtier.bench --socket '%s' --model "
		 "'%s' --page-tokens %d --tokens %d --reps %llu 2>&1", py, sock,
		 model, LAT_P, LAT_TOKENS, (unsigned long long)reps);
	if (!(f = popen(cmd, "r")))
		return NULL;
	while (n < sizeof(buf) - 1 && fgets(buf + n, (int)(sizeof(buf) - n), f))
		n += strlen(buf + n);
	buf[n] = 0;
	if (pclose(f) != 0 || !(j = cJSON_Parse(buf))) {
		j = cJSON_CreateObject();
		cJSON_AddStringToObject(j, "skipped", "python -m kvtier.bench "
					"failed");
		cJSON_AddStringToObject(j, "output", buf);
	}
	return j;
}

/* The control-path figures into the JSON (those measured). */
void kvti_bs_ctl_json(cJSON *root, const struct bsrv *r)
{
	const struct sopt *o = &r->o;
	const struct lat *l = &r->lat;
	const struct lt_sum *t = &r->lts;
	cJSON *py = r->py;
	cJSON *x, *a, *goals = cJSON_AddObjectToObject(root, "goals");
	double py_all = -1;

	cJSON_AddNumberToObject(goals, "load_ratio_vs_inprocess", 0.9);
	if (o->reps) {
		x = cJSON_AddObjectToObject(root, "latency");
		cJSON_AddStringToObject(x, "model", "2 layers, 1 KV head of "
					"64, bf16 (8 KiB pages), a daemon of "
					"its own");
		cJSON_AddNumberToObject(x, "page_tokens", LAT_P);
		cJSON_AddNumberToObject(x, "tokens", LAT_TOKENS);
		cJSON_AddNumberToObject(x, "keys", (double)l->keys);
		cJSON_AddNumberToObject(x, "reps", (double)l->reps);
		a = cJSON_AddObjectToObject(x, "lookup_1_key");
		cJSON_AddNumberToObject(a, "lookup_us_p50", l->one_p50);
		cJSON_AddNumberToObject(a, "lookup_us_p99", l->one_p99);
		a = cJSON_AddObjectToObject(x, "lookup_32k_prompt");
		cJSON_AddNumberToObject(a, "lookup_us_p50", l->all_p50);
		cJSON_AddNumberToObject(a, "lookup_us_p99", l->all_p99);
		cJSON_AddNumberToObject(x, "hash_us_p50", l->hash_p50);
		cJSON_AddNumberToObject(x, "hash_us_p99", l->hash_p99);
		cJSON_AddNumberToObject(goals, "lookup_1_key_us_p50", 25);
		cJSON_AddBoolToObject(goals, "lookup_1_key_us_p50_met",
				      l->one_p50 <= 25);
	}
	if (o->load_seconds) {
		x = cJSON_AddObjectToObject(root, "load_test");
		cJSON_AddNumberToObject(x, "clients", (double)o->load_clients);
		cJSON_AddNumberToObject(x, "seconds", (double)o->load_seconds);
		cJSON_AddStringToObject(x, "request", "LOOKUP of a 512-page "
					"prompt, LOAD of 64 of its pages "
					"(waited), every 4th request a STORE "
					"of 8 new pages (waited)");
		cJSON_AddNumberToObject(x, "requests", (double)t->requests);
		cJSON_AddNumberToObject(x, "throughput_rps", t->rps);
		cJSON_AddNumberToObject(x, "latency_us_p50", t->p50);
		cJSON_AddNumberToObject(x, "latency_us_p99", t->p99);
		cJSON_AddNumberToObject(x, "errors", (double)t->errors);
		cJSON_AddBoolToObject(goals, "load_test_errors_0",
				      t->errors == 0);
	}
	if (py) {
		cJSON *p = cJSON_GetObjectItem(py, "lookup_32k_prompt");

		p = p ? cJSON_GetObjectItem(p, "us_p50") : NULL;
		py_all = cJSON_IsNumber(p) ? p->valuedouble : -1;
		cJSON_AddItemToObject(root, "python", cJSON_Duplicate(py, 1));
	} else {
		x = cJSON_AddObjectToObject(root, "python");
		cJSON_AddStringToObject(x, "skipped", o->reps ? "no --python" :
					"no latency phase");
	}
	cJSON_AddNumberToObject(goals, "python_lookup_32k_us_p50", 200);
	if (py_all >= 0)
		cJSON_AddBoolToObject(goals, "python_lookup_32k_us_p50_met",
				      py_all <= 200);
}

void kvti_bs_ctl_print(const struct bsrv *r)
{
	const struct sopt *o = &r->o;
	const struct lat *l = &r->lat;
	const struct lt_sum *t = &r->lts;
	cJSON *py = r->py;

	printf("  load average %.2f -> %.2f on %ld cpus\n", r->load0, r->load1,
	       sysconf(_SC_NPROCESSORS_ONLN));
	if (o->reps) {
		printf("  latency from C (a small-model daemon, %llu samples "
		       "each):\n", (unsigned long long)l->reps);
		printf("    lookup 1 key           p50 %7.1f us  p99 %7.1f us  "
		       "goal p50 <= 25: %s\n", l->one_p50, l->one_p99,
		       l->one_p50 <= 25 ? "met" : "MISSED");
		printf("    lookup %llu keys (32k) p50 %7.1f us  p99 %7.1f us\n",
		       (unsigned long long)l->keys, l->all_p50, l->all_p99);
		printf("    hash %d tokens       p50 %7.1f us  p99 %7.1f us\n",
		       LAT_TOKENS, l->hash_p50, l->hash_p99);
	}
	if (o->load_seconds)
		printf("  load test: %llu clients, %llu s: %.0f requests/s, "
		       "p50 %.0f us, p99 %.0f us, %llu errors\n",
		       (unsigned long long)o->load_clients,
		       (unsigned long long)o->load_seconds, t->rps, t->p50,
		       t->p99, (unsigned long long)t->errors);
	if (py) {
		char *js = cJSON_PrintUnformatted(py);

		printf("  python: %s\n", js ? js : "?");
		free(js);
	}
}

int kvti_bs_ctl_prepare(struct bsrv *r)
{
	FILE *f;
	int err;

	if ((err = kvt_geom_from_json(&g_tiny, tiny_json, "tiny", LAT_P, 1, 0)))
		return err;
	r->small = r->o.reps || r->o.load_seconds;
	/* the small daemon's model: a config.json of its own */
	snprintf(r->dir, sizeof(r->dir), "/tmp/kvtier-bench-%d", (int)getpid());
	snprintf(r->cfgpath, sizeof(r->cfgpath), "%s/config.json", r->dir);
	if (r->small && (mkdir(r->dir, 0700) < 0 ||
			 !(f = fopen(r->cfgpath, "w")) ||
			 fputs(tiny_json, f) < 0 || fclose(f)))
		return -errno;
	snprintf(r->ssock, sizeof(r->ssock), "%s/small.sock", r->dir);
	snprintf(r->stiers, sizeof(r->stiers), "dram:%llu",
		 (unsigned long long)(kvt_geom_page_bytes(&g_tiny) * 4 *
				      (LAT_TOKENS / LAT_P + (LT_PAGES + 64) *
				       r->o.load_clients)));
	r->ds.socket = r->ssock;
	r->ds.tiers = r->stiers;
	r->ds.model = r->cfgpath;
	r->ds.page_tokens = LAT_P;
	r->ds.lease_ms = 3600 * 1000;
	return 0;
}

int kvti_bs_ctl_run(struct bsrv *r)
{
	const struct sopt *o = &r->o;
	int err;

	if (o->reps && (err = latency(r->ssock, &g_tiny, o->reps, &r->lat)))
		return cli_fail("bench server: latency", err);
	if (o->reps && o->python)
		r->py = python_figures(o->python, r->ssock, r->cfgpath,
				       o->reps);
	if (r->nlt && (err = load_test(r->lt, r->nlt, (double)o->load_seconds,
				       &r->lts)))
		return cli_fail("bench server: load test", err);
	return 0;
}

void kvti_bs_ctl_cleanup(struct bsrv *r)
{
	cJSON_Delete(r->py);
	r->py = NULL;
	if (r->small) {
		unlink(r->cfgpath);
		rmdir(r->dir);
	}
}
