/*
 * bench_xfer.c — kvtier bench xfer: how close the transfer engine comes to
 * the link, for fragmented KV pages.
 *
 * For each page size P: the KV of --tokens tokens as pages in a page-first
 * dram tier and a layer-first tier (hostdev here; hbm on a GPU), slot
 * lists shuffled on both sides (a pool after some churn; --order seq for
 * consecutive slots). Each method moves every page in both directions:
 *
 *   load   dram (page-first) -> hostdev/hbm (layer-first)
 *   store  hostdev/hbm -> dram
 *
 * and in the same repeat, the same bytes move as one contiguous copy
 * between the same two regions — the practical limit: on the CPU the
 * faster of one memcpy() call and the engine's thread count copying 4 MiB
 * pieces in turn with streaming stores (kvt_xfer_contig_copy()); one
 * cudaMemcpy from pinned memory on a GPU. Methods and the limit run in a rotating
 * order each repeat; a row reports medians, and the ratio is the median of
 * the per-repeat ratios (with its min and max: the noise). Checksums cost:
 * the cpu+xxh3 rows move the same pages computing (store) or verifying
 * (load) XXH3 of every page.
 *
 * --stress N measures everything again while N stressor threads copy, and
 * reports the slowdown. --ssd DIR adds io_uring (and pread) page reads and
 * writes against fio on the same file, block size (one slot) and queue
 * depth.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_P 16
#define MAX_REP 64
#define MAX_ROWS 256
#define DMIN(a, b) ((a) < (b) ? (a) : (b))
#define DMAX(a, b) ((a) > (b) ? (a) : (b))

enum { DIR_LOAD, DIR_STORE };
static const char *dir_name[] = { "load", "store" };

struct bopt {
	const char *model;
	uint64_t tokens, tp, rank, repeat, stress, stress_bytes, threads;
	uint64_t p[MAX_P];
	int np, json, seq, nt, depth, blocks, checksum, layout;
	const char *ssd;
	const char *methods; /* comma list filter, NULL: all */
};

struct row {
	char method[24];
	int dir, stressed;
	uint32_t p;
	uint64_t pages, bytes, chunk;
	const char *limit_name;
	double runs[MAX_REP], lruns[MAX_REP], ratios[MAX_REP];
	double m1[MAX_REP], mt[MAX_REP];
	int n;
	double gbps, limit, ratio, rmin, rmax, m1_gbps, mt_gbps;
	double target;       /* 0: none */
	double stressor_gbps;
	int blocks;          /* cuda-kernel */
	double vs_batch, vs_chunk;
	int err;
	char note[160];
};

static struct row rows[MAX_ROWS];
static int nrows;

/* ---- measuring ------------------------------------------------------ */

static double gbps(uint64_t bytes, double sec)
{
	return sec > 0 ? bytes / sec / 1e9 : 0;
}

static int timed_job(kvt_xfer *x, kvt_tier *s, kvt_tier *d, const uint32_t *ss,
		     const uint32_t *ds, size_t n, int method, unsigned flags,
		     uint64_t *sums, double *sec)
{
	kvt_xfer_desc desc = { .src = s, .dst = d, .src_slots = ss,
			       .dst_slots = ds, .npages = n, .method = method,
			       .flags = flags, .sums = sums };
	uint64_t t0 = kvt_now_ns();
	kvt_xfer_job *j;
	int err = kvt_xfer_submit(x, &desc, &j);

	if (err)
		return err;
	err = kvt_xfer_wait(j, -1);
	*sec = (kvt_now_ns() - t0) / 1e9;
	kvt_xfer_job_free(j);
	return err;
}

static struct row *row_new(const char *method, int dir, uint32_t p,
			   const kvt_geom *g, uint64_t pages, int stressed)
{
	struct row *r;

	if (nrows == MAX_ROWS)
		return NULL;
	r = &rows[nrows++];
	memset(r, 0, sizeof(*r));
	snprintf(r->method, sizeof(r->method), "%s", method);
	r->dir = dir;
	r->p = p;
	r->pages = pages;
	r->bytes = pages * kvt_geom_page_bytes(g);
	r->chunk = kvt_geom_chunk_bytes(g);
	r->stressed = stressed;
	return r;
}

static void row_finish(struct row *r)
{
	double lo = 1e300, hi = 0;

	r->gbps = cli_median(r->runs, r->n);
	r->limit = cli_median(r->lruns, r->n);
	r->ratio = cli_median(r->ratios, r->n);
	r->m1_gbps = cli_median(r->m1, r->n);
	r->mt_gbps = cli_median(r->mt, r->n);
	for (int i = 0; i < r->n; i++) {
		lo = DMIN(lo, r->ratios[i]);
		hi = DMAX(hi, r->ratios[i]);
	}
	r->rmin = r->n ? lo : 0;
	r->rmax = hi;
}

/* A method to time in the rotation. */
struct meas {
	struct row *row;
	int method;
	unsigned flags;
};

/* The limit: the faster of one memcpy thread and T threads (CPU), or one
 * cudaMemcpy (GPU), between the job's two regions. */
static int measure_limit(kvt_xfer *x, kvt_tier *s, kvt_tier *d, uint64_t bytes,
			 unsigned threads, int gpu, double *one, double *many)
{
	double sec;
	int err;

	if ((err = kvt_xfer_contig_copy(x, s, d, bytes, 1, &sec)))
		return err;
	*one = gbps(bytes, sec);
	*many = *one;
	if (!gpu && threads > 1) {
		if ((err = kvt_xfer_contig_copy(x, s, d, bytes, threads, &sec)))
			return err;
		*many = gbps(bytes, sec);
	}
	return 0;
}

/* R repeats of: the limit and every method, in a rotating order. */
static int measure(kvt_xfer *x, const struct bopt *o, kvt_tier *s, kvt_tier *d,
		   const uint32_t *ss, const uint32_t *ds, size_t n,
		   struct meas *m, int nm, uint64_t *sums, int gpu)
{
	unsigned threads = (unsigned)o->threads;
	uint64_t bytes = m[0].row->bytes;

	for (int r = 0; r < (int)o->repeat; r++) {
		double one = 0, many = 0, lim, res[8];
		for (int k = 0; k <= nm; k++) {
			int i = (k + r) % (nm + 1), err;
			double sec;

			if (i == nm) {
				err = measure_limit(x, s, d, bytes, threads, gpu,
						    &one, &many);
			} else {
				err = timed_job(x, s, d, ss, ds, n, m[i].method,
						m[i].flags, sums, &sec);
				res[i] = gbps(bytes, sec);
			}
			if (err)
				return err;
		}
		lim = DMAX(one, many);
		for (int i = 0; i < nm; i++) {
			struct row *w = m[i].row;
			w->runs[w->n] = res[i];
			w->lruns[w->n] = lim;
			w->ratios[w->n] = lim > 0 ? res[i] / lim : 0;
			w->m1[w->n] = one;
			w->mt[w->n] = many;
			w->n++;
		}
	}
	for (int i = 0; i < nm; i++) {
		m[i].row->limit_name = gpu ? "cudaMemcpy" : "memcpy";
		row_finish(m[i].row);
	}
	return 0;
}

static int want(const struct bopt *o, const char *method)
{
	const char *p;
	size_t l = strlen(method);

	if (!o->methods)
		return 1;
	for (p = o->methods; (p = strstr(p, method)); p += l)
		if ((p == o->methods || p[-1] == ',') &&
		    (p[l] == ',' || !p[l]))
			return 1;
	return 0;
}

/* ---- one page size, memory tiers ------------------------------------ */

static void shuffle(uint32_t *v, size_t n, uint64_t seed, int seq)
{
	for (size_t i = 0; i < n; i++)
		v[i] = (uint32_t)i;
	if (seq)
		return;
	for (size_t i = n - 1; i > 0; i--) {
		size_t k;
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		k = seed % (i + 1);
		uint32_t t = v[i];
		v[i] = v[k];
		v[k] = t;
	}
}

static kvt_tier *open_tier(const char *fmt, const kvt_geom *g, uint64_t bytes,
			   const char *extra, int *err)
{
	char text[600];
	kvt_tier_spec spec[1];
	kvt_tier *t = NULL;
	size_t n;

	snprintf(text, sizeof(text), fmt, (unsigned long long)bytes, extra);
	if ((*err = kvt_tier_spec_parse(text, spec, 1, &n)) ||
	    (*err = kvt_tier_open(&t, spec, g)))
		return NULL;
	return t;
}

struct pair {
	kvt_tier *pf, *lf;   /* page-first dram, layer-first */
	uint32_t *a, *b;     /* slots on pf, on lf */
	uint64_t *sums;
	size_t n;
};

/* Load and store rows for the methods on this pair; CPU or GPU. */
static int run_pair(kvt_xfer *x, const struct bopt *o, const kvt_geom *g,
		    struct pair *pr, int gpu, int stressed)
{
	static const int gm[] = { KVT_XFER_CUDA_CHUNK, KVT_XFER_CUDA_BATCH,
				  KVT_XFER_CUDA_KERNEL };
	struct meas m[4];
	int nm = 0, err;
	double sec;

	/* untimed: fault everything in, and record sums of what dram holds */
	if ((err = timed_job(x, pr->lf, pr->pf, pr->b, pr->a, pr->n,
			     KVT_XFER_AUTO, KVT_XFER_SUM, pr->sums, &sec)) ||
	    (err = timed_job(x, pr->pf, pr->lf, pr->a, pr->b, pr->n,
			     KVT_XFER_AUTO, 0, NULL, &sec)))
		return err;
	for (int dir = DIR_LOAD; dir <= DIR_STORE; dir++) {
		nm = 0;
		if (!gpu) {
			if (want(o, "cpu"))
				m[nm++] = (struct meas){ row_new("cpu", dir, g->page_tokens, g, pr->n, stressed), KVT_XFER_CPU, 0 };
			if (o->checksum && want(o, "cpu+xxh3"))
				m[nm++] = (struct meas){ row_new("cpu+xxh3", dir, g->page_tokens, g, pr->n, stressed), KVT_XFER_CPU, dir == DIR_LOAD ? KVT_XFER_VERIFY : KVT_XFER_SUM };
		} else {
			for (int i = 0; i < 3; i++)
				if (want(o, kvt_xfer_method_name(gm[i])))
					m[nm++] = (struct meas){ row_new(kvt_xfer_method_name(gm[i]), dir, g->page_tokens, g, pr->n, stressed), gm[i], 0 };
		}
		for (int i = 0; i < nm; i++)
			if (!m[i].row)
				return -ENOSPC;
			else if (m[i].method == KVT_XFER_CUDA_KERNEL)
				m[i].row->blocks = o->blocks;
		if (!nm)
			continue;
		err = dir == DIR_LOAD ?
			measure(x, o, pr->pf, pr->lf, pr->a, pr->b, pr->n, m, nm, pr->sums, gpu) :
			measure(x, o, pr->lf, pr->pf, pr->b, pr->a, pr->n, m, nm, pr->sums, gpu);
		if (err)
			return err;
	}
	return 0;
}

static void pair_close(struct pair *pr)
{
	kvt_tier_close(pr->pf);
	kvt_tier_close(pr->lf);
	free(pr->a);
	free(pr->b);
	free(pr->sums);
	memset(pr, 0, sizeof(*pr));
}

static int pair_open(struct pair *pr, const struct bopt *o, const kvt_geom *g,
		     int gpu)
{
	uint64_t n = (o->tokens + g->page_tokens - 1) / g->page_tokens;
	uint64_t bytes = n * kvt_geom_page_bytes(g);
	const char *layout = o->layout == KVT_LAYOUT_SGLANG ? ",layout=sglang" : "";
	int err;

	memset(pr, 0, sizeof(*pr));
	pr->n = n;
	pr->a = malloc(n * sizeof(uint32_t));
	pr->b = malloc(n * sizeof(uint32_t));
	pr->sums = malloc(n * sizeof(uint64_t));
	if (!pr->a || !pr->b || !pr->sums)
		return -ENOMEM;
	shuffle(pr->a, n, 0x9e3779b97f4a7c15ull, o->seq);
	shuffle(pr->b, n, 0xd1b54a32d192ed03ull, o->seq);
	pr->pf = open_tier(gpu ? "dram:%llu,populate,pin%s" :
				 "dram:%llu,populate%s", g, bytes, "", &err);
	if (!pr->pf)
		return err;
	pr->lf = open_tier(gpu ? "hbm:%llu%s" : "hostdev:%llu%s", g, bytes,
			   layout, &err);
	if (!pr->lf)
		return err;
	return 0;
}

/* ---- ssd: the io lane against fio ------------------------------------- */

static double fio_run(const char *file, int write, int seq, uint64_t bs,
		      uint64_t size, unsigned depth, int uring, int direct,
		      char *note, size_t len)
{
	char cmd[1400], *buf = NULL;
	size_t cap = 0, used = 0;
	double bw = -1;
	FILE *f;
	cJSON *root, *job;

	snprintf(cmd, sizeof(cmd),
		 "fio --name=kvt --filename='%s' --rw=%s%s --bs=%llu "
		 "--iodepth=%u --ioengine=%s --direct=%d --offset=4096 "
		 "--size=%llu --numjobs=1 --output-format=json 2>/dev/null",
		 file, seq ? "" : "rand", write ? "write" : "read",
		 (unsigned long long)bs, depth, uring ? "io_uring" : "psync",
		 direct, (unsigned long long)size);
	if (!(f = popen(cmd, "r"))) {
		snprintf(note, len, "fio could not be run");
		return -1;
	}
	for (;;) {
		if (used + 4096 + 1 > cap) {
			char *nb = realloc(buf, cap = cap * 2 + 8192);
			if (!nb)
				break;
			buf = nb;
		}
		size_t k = fread(buf + used, 1, 4096, f);
		if (!k)
			break;
		used += k;
	}
	if (pclose(f) != 0 || !buf) {
		snprintf(note, len, "fio failed (%s)", cmd);
		free(buf);
		return -1;
	}
	buf[used] = '\0';
	root = cJSON_Parse(strchr(buf, '{') ? strchr(buf, '{') : buf);
	job = root ? cJSON_GetArrayItem(cJSON_GetObjectItem(root, "jobs"), 0) : NULL;
	if (job) {
		cJSON *io = cJSON_GetObjectItem(job, write ? "write" : "read");
		cJSON *b = io ? cJSON_GetObjectItem(io, "bw_bytes") : NULL;
		if (cJSON_IsNumber(b))
			bw = b->valuedouble / 1e9;
	}
	if (bw < 0)
		snprintf(note, len, "could not read fio's JSON output");
	cJSON_Delete(root);
	free(buf);
	return bw;
}

static int have_fio(void)
{
	return system("fio --version >/dev/null 2>&1") == 0;
}

/* The io lane against fio. Host buffers: fio reads into ordinary 4 KiB
 * pages, so the fair row ("uring") uses a dram tier without hugepages;
 * "uring-thp" shows what transparent hugepages add (fewer segments per
 * O_DIRECT request), against the same fio. */
struct ssd_var {
	const char *name;
	int pread, thp;
};

static int ssd_rows(const struct bopt *o, const kvt_geom *g, kvt_xfer *x,
		    const struct ssd_var *v, struct pair *pr, kvt_tier *mem,
		    int dir, const char *file, int direct, int fio)
{
	uint64_t slot = (kvt_geom_page_bytes(g) + 4095) / 4096 * 4096;
	kvt_tier *s = dir == DIR_LOAD ? pr->lf : mem;
	kvt_tier *d = dir == DIR_LOAD ? mem : pr->lf;
	const uint32_t *ss = dir == DIR_LOAD ? pr->b : pr->a;
	const uint32_t *ds = dir == DIR_LOAD ? pr->a : pr->b;
	struct row *r = row_new(v->name, dir, g->page_tokens, g, pr->n, 0);
	double sec;
	int err;

	if (!r)
		return -ENOSPC;
	r->limit_name = "fio";
	if (!fio)
		snprintf(r->note, sizeof(r->note),
			 "fio not installed: no limit measured");
	if (!direct)
		snprintf(r->note, sizeof(r->note), "no O_DIRECT on this "
			 "filesystem: buffered I/O on both sides");
	if (v->thp)
		snprintf(r->note, sizeof(r->note), "THP-backed buffers; fio's "
			 "are 4 KiB pages");
	for (int rep = 0; rep < (int)o->repeat; rep++) {
		double lim = -1, ours = 0;

		for (int k = 0; k < 2; k++) {
			if ((k + rep) % 2 == 0) {
				err = timed_job(x, s, d, ss, ds, pr->n,
						v->pread ? KVT_XFER_PREAD :
							   KVT_XFER_URING,
						0, NULL, &sec);
				if (err)
					return err;
				ours = gbps(r->bytes, sec);
			} else if (fio) {
				lim = fio_run(file, dir == DIR_STORE, o->seq,
					      slot, pr->n * slot,
					      v->pread ? 1 : (unsigned)o->depth,
					      !v->pread, direct, r->note,
					      sizeof(r->note));
			}
		}
		r->runs[r->n] = ours;
		r->lruns[r->n] = lim;
		r->ratios[r->n] = lim > 0 ? ours / lim : 0;
		r->n++;
	}
	row_finish(r);
	if (r->limit <= 0)
		r->limit = r->ratio = r->rmin = r->rmax = 0;
	if (!v->pread && !v->thp && dir == DIR_LOAD)
		r->target = 0.9;
	return 0;
}

static int run_ssd(const struct bopt *o, const kvt_geom *g, kvt_xfer *xu,
		   kvt_xfer *xp)
{
	static const struct ssd_var vars[] = {
		{ "uring", 0, 0 }, { "uring-thp", 0, 1 }, { "pread", 1, 0 },
	};
	uint64_t n = (o->tokens + g->page_tokens - 1) / g->page_tokens;
	uint64_t page = kvt_geom_page_bytes(g), slot = (page + 4095) / 4096 * 4096;
	struct pair pr = { 0 };
	kvt_tier *thp = NULL;
	kvt_xfer_info info;
	kvt_tier_desc sd;
	char file[700], spec[700], sub[600];
	int err = 0, fio = have_fio(), made = 0;

	pr.n = n;
	pr.a = malloc(n * sizeof(uint32_t));
	pr.b = malloc(n * sizeof(uint32_t));
	if (!pr.a || !pr.b) {
		err = -ENOMEM;
		goto out;
	}
	shuffle(pr.a, n, 0x9e3779b97f4a7c15ull, o->seq);
	shuffle(pr.b, n, 0xd1b54a32d192ed03ull, o->seq);
	if (!(pr.pf = open_tier("dram:%llu,populate,nohuge%s", g, n * page, "",
				&err)) ||
	    !(thp = open_tier("dram:%llu,populate,thp%s", g, n * page, "",
			      &err)))
		goto out;
	/* a directory of our own inside DIR: nothing there is touched, and
	 * 'temp' removes the files and the directory at the end (DIR too,
	 * if this run made it) */
	made = mkdir(o->ssd, 0700) == 0;
	snprintf(sub, sizeof(sub), "%s/kvtier-bench-%d", o->ssd, (int)getpid());
	snprintf(spec, sizeof(spec), "ssd:%s,%%llu,temp%%s", sub);
	if (!(pr.lf = open_tier(spec, g, n * slot, "", &err)))
		goto out;
	kvt_tier_info(pr.lf, &sd);
	kvt_xfer_info_get(xu, &info);
	/* fio reads the tier's own file: a 'temp' tier's files have no name
	 * while it is open, so through our descriptor of it */
	{
		uint64_t off;
		int fd;

		if ((err = kvt_tier_ssd_loc(pr.lf, 0, &fd, &off)))
			goto out;
		snprintf(file, sizeof(file), "/proc/%d/fd/%d", (int)getpid(),
			 fd);
	}
	for (int dir = DIR_STORE; dir >= DIR_LOAD && !err; dir--)
		for (size_t v = 0; v < sizeof(vars) / sizeof(vars[0]) && !err; v++) {
			if (!want(o, vars[v].pread ? "pread" : "uring") ||
			    (!vars[v].pread && info.ssd_io != KVT_XFER_URING))
				continue;
			err = ssd_rows(o, g, vars[v].pread ? xp : xu, &vars[v],
				       &pr, vars[v].thp ? thp : pr.pf, dir, file,
				       strstr(sd.where, "O_DIRECT") != NULL, fio);
		}
out:
	kvt_tier_close(thp);
	pair_close(&pr);
	if (made)
		rmdir(o->ssd);
	return err;
}

/* ---- targets and cross-method ratios ---------------------------------- */

static void targets(void)
{
	for (int i = 0; i < nrows; i++) {
		struct row *r = &rows[i];

		if (!strcmp(r->method, "cpu") && !r->stressed)
			r->target = r->p >= 16 ? 0.9 : r->p == 1 ? 0.6 : 0;
		if (!strcmp(r->method, "cuda-kernel") && r->dir == DIR_LOAD &&
		    r->p == 32 && !r->stressed)
			r->target = 0.9;
		if (strcmp(r->method, "cuda-kernel"))
			continue;
		for (int k = 0; k < nrows; k++) {
			struct row *q = &rows[k];
			if (q->p != r->p || q->dir != r->dir ||
			    q->stressed != r->stressed || !q->gbps)
				continue;
			if (!strcmp(q->method, "cuda-batch"))
				r->vs_batch = r->gbps / q->gbps;
			if (!strcmp(q->method, "cuda-chunk"))
				r->vs_chunk = r->gbps / q->gbps;
		}
	}
}

/* The unstressed row matching a stressed one. */
static struct row *calm_twin(const struct row *r)
{
	for (int k = 0; k < nrows; k++)
		if (!rows[k].stressed && rows[k].p == r->p &&
		    rows[k].dir == r->dir && !strcmp(rows[k].method, r->method))
			return &rows[k];
	return NULL;
}

/* ---- output ------------------------------------------------------------ */

static cJSON *row_json(const struct row *r)
{
	cJSON *o = cJSON_CreateObject(), *a, *b;
	struct row *calm = r->stressed ? calm_twin(r) : NULL;

	cJSON_AddStringToObject(o, "method", r->method);
	cJSON_AddStringToObject(o, "direction", dir_name[r->dir]);
	cJSON_AddNumberToObject(o, "page_tokens", r->p);
	cJSON_AddNumberToObject(o, "pages", (double)r->pages);
	cJSON_AddNumberToObject(o, "chunk_bytes", (double)r->chunk);
	cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
	cJSON_AddNumberToObject(o, "gbps", r->gbps);
	if (r->limit > 0) {
		cJSON_AddNumberToObject(o, "limit_gbps", r->limit);
		cJSON_AddNumberToObject(o, "ratio", r->ratio);
		cJSON_AddNumberToObject(o, "ratio_min", r->rmin);
		cJSON_AddNumberToObject(o, "ratio_max", r->rmax);
	} else {
		cJSON_AddNullToObject(o, "limit_gbps");
		cJSON_AddNullToObject(o, "ratio");
	}
	cJSON_AddStringToObject(o, "limit", r->limit_name ? r->limit_name : "");
	if (r->limit_name && !strcmp(r->limit_name, "memcpy")) {
		cJSON_AddNumberToObject(o, "memcpy_1thread_gbps", r->m1_gbps);
		cJSON_AddNumberToObject(o, "memcpy_threads_gbps", r->mt_gbps);
	}
	cJSON_AddNumberToObject(o, "repeats", r->n);
	a = cJSON_AddArrayToObject(o, "gbps_runs");
	b = cJSON_AddArrayToObject(o, "limit_runs");
	for (int i = 0; i < r->n; i++) {
		cJSON_AddItemToArray(a, cJSON_CreateNumber(r->runs[i]));
		cJSON_AddItemToArray(b, cJSON_CreateNumber(r->lruns[i]));
	}
	if (r->target > 0) {
		cJSON_AddNumberToObject(o, "target", r->target);
		cJSON_AddBoolToObject(o, "meets_target", r->ratio >= r->target);
	}
	if (r->blocks)
		cJSON_AddNumberToObject(o, "blocks", r->blocks);
	if (r->vs_batch > 0)
		cJSON_AddNumberToObject(o, "vs_batch", r->vs_batch);
	if (r->vs_chunk > 0)
		cJSON_AddNumberToObject(o, "vs_chunk", r->vs_chunk);
	if (r->stressed) {
		cJSON_AddBoolToObject(o, "stressed", 1);
		cJSON_AddNumberToObject(o, "stressor_gbps", r->stressor_gbps);
		if (calm && r->gbps > 0)
			cJSON_AddNumberToObject(o, "slowdown", calm->gbps / r->gbps);
	}
	if (!strcmp(r->method, "cpu+xxh3")) {
		for (int k = 0; k < nrows; k++)
			if (!strcmp(rows[k].method, "cpu") && rows[k].p == r->p &&
			    rows[k].dir == r->dir && rows[k].stressed == r->stressed &&
			    rows[k].gbps > 0)
				cJSON_AddNumberToObject(o, "checksum_cost",
							1 - r->gbps / rows[k].gbps);
	}
	if (r->note[0])
		cJSON_AddStringToObject(o, "note", r->note);
	return o;
}

static void print_text(const struct bopt *o, const kvt_xfer_info *info)
{
	printf("%-12s %-5s %4s %10s %8s %8s %6s %13s  %s\n", "method", "dir", "P",
	       "chunk", "GB/s", "limit", "ratio", "(min-max)", "target / note");
	for (int i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		const struct row *calm = r->stressed ? calm_twin(r) : NULL;
		char c[32], t[96] = "";

		kvt_size_format(r->chunk, c, sizeof(c));
		if (r->target > 0)
			snprintf(t, sizeof(t), ">= %.2f %s", r->target,
				 r->ratio >= r->target ? "met" : "MISSED");
		if (r->stressed && calm && r->gbps > 0)
			snprintf(t, sizeof(t), "stressed: %.2fx slower, "
				 "stressors %.1f GB/s", calm->gbps / r->gbps,
				 r->stressor_gbps);
		if (r->vs_batch > 0)
			snprintf(t + strlen(t), sizeof(t) - strlen(t),
				 " %.2fx batch %.2fx chunk", r->vs_batch,
				 r->vs_chunk);
		if (r->note[0])
			snprintf(t + strlen(t), sizeof(t) - strlen(t), " %s",
				 r->note);
		if (r->limit > 0)
			printf("%-12s %-5s %4u %10s %8.2f %8.2f %6.2f   (%.2f-%.2f)  %s\n",
			       r->method, dir_name[r->dir], r->p, c, r->gbps,
			       r->limit, r->ratio, r->rmin, r->rmax, t);
		else
			printf("%-12s %-5s %4u %10s %8.2f %8s %6s %13s  %s\n",
			       r->method, dir_name[r->dir], r->p, c, r->gbps, "-",
			       "-", "", t);
	}
	printf("\nlimit: memcpy = the same bytes as one contiguous copy between "
	       "the same regions:\nthe faster of one memcpy() and %u threads "
	       "taking 4 MiB pieces (streaming stores);\ncudaMemcpy = one copy "
	       "from pinned memory; fio = same file, block size and queue\n"
	       "depth. ratio: median of the per-repeat ratios (min-max over %llu "
	       "repeats).\n", info->cpu_threads, (unsigned long long)o->repeat);
}

static void print_json(const struct bopt *o, const kvt_xfer_info *info,
		       const kvt_geom *g)
{
	cJSON *root = cJSON_CreateObject(), *e, *a;

	cJSON_AddNumberToObject(root, "version", 1);
	cJSON_AddStringToObject(root, "model", g->name);
	cJSON_AddNumberToObject(root, "tokens", (double)o->tokens);
	cJSON_AddNumberToObject(root, "tp", (double)o->tp);
	cJSON_AddNumberToObject(root, "tp_rank", (double)o->rank);
	cJSON_AddNumberToObject(root, "repeat", (double)o->repeat);
	cJSON_AddStringToObject(root, "order", o->seq ? "seq" : "random");
	cJSON_AddStringToObject(root, "layout", kvt_layout_name(o->layout));
	e = cJSON_AddObjectToObject(root, "engine");
	cJSON_AddNumberToObject(e, "cpu_threads", info->cpu_threads);
	cJSON_AddStringToObject(e, "nt", o->nt == KVT_XFER_NT_ON ? "on" :
				o->nt == KVT_XFER_NT_OFF ? "off" : "auto");
	cJSON_AddStringToObject(e, "copy_isa", info->copy_isa);
	cJSON_AddStringToObject(e, "ssd_io", kvt_xfer_method_name(info->ssd_io));
	cJSON_AddStringToObject(e, "ssd_io_note", info->ssd_io_note);
	cJSON_AddNumberToObject(e, "uring_depth", info->uring_depth);
	cJSON_AddBoolToObject(e, "cuda", info->cuda);
	cJSON_AddStringToObject(e, "cuda_note", info->cuda_note);
	cJSON_AddNumberToObject(e, "cuda_blocks", info->cuda_blocks);
	cJSON_AddBoolToObject(e, "cuda_batch_built", info->cuda_batch);
	if (o->stress) {
		e = cJSON_AddObjectToObject(root, "stress");
		cJSON_AddNumberToObject(e, "threads", (double)o->stress);
		cJSON_AddNumberToObject(e, "buffer_bytes", (double)o->stress_bytes);
	}
	a = cJSON_AddArrayToObject(root, "results");
	for (int i = 0; i < nrows; i++)
		cJSON_AddItemToArray(a, row_json(&rows[i]));
	cli_json_print(root);
}

/* ---- the command --------------------------------------------------------- */

static void xfer_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier bench xfer [--model NAME|CONFIG] [--tokens N] [--page-tokens LIST]\n"
"                         [--tp N] [--tp-rank R] [--stress N] [--stress-bytes B]\n"
"                         [--ssd DIR] [--repeat R] [--threads T] [--methods LIST]\n"
"                         [--order random|seq] [--layout vllm|sglang]\n"
"                         [--nt auto|on|off] [--uring-depth D] [--cuda-blocks B]\n"
"                         [--no-checksum] [--json]\n"
"\n"
"Moves the KV of N tokens, as pages of each size, between a page-first dram\n"
"tier and a layer-first one (hostdev; hbm where a GPU is) in both directions\n"
"with every method this machine has, and the same bytes as one contiguous\n"
"copy in the same run (the limit). Reports GB/s, the limit and their ratio:\n"
"medians over the repeats, with the ratio's spread.\n"
"\n"
"  --model M          preset or config.json (default llama-3.1-8b)\n"
"  --tokens N         tokens of KV to move (default 8192)\n"
"  --page-tokens L    page sizes (default 1,16,32,256)\n"
"  --tp N, --tp-rank R  tensor parallelism (default 1, 0)\n"
"  --stress N         measure again while N stressor threads copy\n"
"  --stress-bytes B   each stressor buffer (default 256M here; the\n"
"                     published experiment used 4G)\n"
"  --ssd DIR          also io_uring/pread page I/O against fio, in a\n"
"                     directory of its own under DIR (removed after)\n"
"  --repeat R         repeats per measurement (default 7)\n"
"  --threads T        cpu lane threads (default: the engine's, min(CPUs, 4))\n"
"  --methods LIST     only these: cpu,cpu+xxh3,cuda-chunk,cuda-batch,\n"
"                     cuda-kernel,uring (also uring-thp),pread\n"
"  --order O          slot lists shuffled (random, default) or consecutive\n"
"  --layout L         GPU layout (default vllm)\n"
"  --nt M             streaming stores on the cpu lane (default auto)\n"
"  --uring-depth D    io_uring queue depth, and fio's (default 32)\n"
"  --cuda-blocks B    thread blocks of the gather kernel (default 2)\n"
"  --no-checksum      skip the cpu+xxh3 rows\n"
"  --json             JSON (see docs/FORMATS.md)\n");
}

static int parse_args(int argc, char **argv, struct bopt *o)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' },
		{ "tokens", required_argument, 0, 'n' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "tp", required_argument, 0, 't' },
		{ "tp-rank", required_argument, 0, 'r' },
		{ "stress", required_argument, 0, 's' },
		{ "stress-bytes", required_argument, 0, 'B' },
		{ "ssd", required_argument, 0, 'd' },
		{ "repeat", required_argument, 0, 'R' },
		{ "threads", required_argument, 0, 'T' },
		{ "methods", required_argument, 0, 'M' },
		{ "order", required_argument, 0, 'o' },
		{ "layout", required_argument, 0, 'l' },
		{ "nt", required_argument, 0, 'N' },
		{ "uring-depth", required_argument, 0, 'D' },
		{ "cuda-blocks", required_argument, 0, 'b' },
		{ "no-checksum", no_argument, 0, 'x' },
		{ "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	uint64_t v;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'n': if (cli_u64("--tokens", optarg, 1, 1u << 24, &o->tokens)) return -1; break;
		case 'p':
			if ((o->np = cli_u64_list("--page-tokens", optarg, 1, 1u << 16, o->p, MAX_P)) < 0)
				return -1;
			break;
		case 't': if (cli_u64("--tp", optarg, 1, 1024, &o->tp)) return -1; break;
		case 'r': if (cli_u64("--tp-rank", optarg, 0, 1023, &o->rank)) return -1; break;
		case 's': if (cli_u64("--stress", optarg, 0, KVT_STRESS_MAX_THREADS, &o->stress)) return -1; break;
		case 'B':
			if (kvt_size_parse(optarg, &o->stress_bytes) ||
			    o->stress_bytes < (1u << 20)) {
				cli_usage("bench xfer", "--stress-bytes: '%s' is "
					  "not a size of at least 1M", optarg);
				return -1;
			}
			break;
		case 'd': o->ssd = optarg; break;
		case 'R': if (cli_u64("--repeat", optarg, 1, MAX_REP, &o->repeat)) return -1; break;
		case 'T': if (cli_u64("--threads", optarg, 1, 256, &o->threads)) return -1; break;
		case 'M': o->methods = optarg; break;
		case 'o':
			if (strcmp(optarg, "random") && strcmp(optarg, "seq")) {
				cli_usage("bench xfer", "--order: '%s' (random or seq)", optarg);
				return -1;
			}
			o->seq = !strcmp(optarg, "seq");
			break;
		case 'l': {
			kvt_layout_kind k;
			if (kvt_layout_parse(optarg, &k) || k == KVT_LAYOUT_PAGE_FIRST) {
				cli_usage("bench xfer", "--layout: '%s' (vllm or sglang)", optarg);
				return -1;
			}
			o->layout = k;
			break;
		}
		case 'N':
			if (!strcmp(optarg, "auto")) o->nt = KVT_XFER_NT_AUTO;
			else if (!strcmp(optarg, "on")) o->nt = KVT_XFER_NT_ON;
			else if (!strcmp(optarg, "off")) o->nt = KVT_XFER_NT_OFF;
			else {
				cli_usage("bench xfer", "--nt: '%s' (auto, on or off)", optarg);
				return -1;
			}
			break;
		case 'D': if (cli_u64("--uring-depth", optarg, 1, 4096, &v)) return -1; o->depth = (int)v; break;
		case 'b': if (cli_u64("--cuda-blocks", optarg, 1, 64, &v)) return -1; o->blocks = (int)v; break;
		case 'x': o->checksum = 0; break;
		case 'j': o->json = 1; break;
		case 'h': xfer_usage(stdout); return 1;
		default: cli_usage("bench xfer", "bad option"); return -1;
		}
	}
	if (optind < argc) {
		cli_usage("bench xfer", "unexpected argument '%s'", argv[optind]);
		return -1;
	}
	if (o->rank >= o->tp) {
		cli_usage("bench xfer", "--tp-rank %llu is not below --tp %llu",
			  (unsigned long long)o->rank, (unsigned long long)o->tp);
		return -1;
	}
	if (o->methods) {
		static const char *known[] = { "cpu", "cpu+xxh3", "cuda-chunk",
			"cuda-batch", "cuda-kernel", "uring", "pread" };
		char buf[256], *tok, *save = NULL;
		snprintf(buf, sizeof(buf), "%s", o->methods);
		for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
			size_t k = 0;
			while (k < sizeof(known) / sizeof(known[0]) && strcmp(tok, known[k]))
				k++;
			if (k == sizeof(known) / sizeof(known[0])) {
				cli_usage("bench xfer", "--methods: unknown method '%s'", tok);
				return -1;
			}
		}
	}
	return 0;
}

/* Every measurement for one page size: memory (CPU, GPU), then ssd. */
static int run_p(const struct bopt *o, kvt_geom *g, kvt_xfer *x, kvt_xfer *xp,
		 int gpu, int stressed)
{
	struct pair pr;
	int err;

	if ((err = pair_open(&pr, o, g, 0)) ||
	    (err = run_pair(x, o, g, &pr, 0, stressed))) {
		pair_close(&pr);
		return err;
	}
	pair_close(&pr);
	if (gpu) {
		if ((err = pair_open(&pr, o, g, 1)) ||
		    (err = run_pair(x, o, g, &pr, 1, stressed))) {
			pair_close(&pr);
			return err;
		}
		pair_close(&pr);
	}
	if (o->ssd && !stressed)
		return run_ssd(o, g, x, xp);
	return 0;
}

int bench_xfer(int argc, char **argv)
{
	struct bopt o = { .model = "llama-3.1-8b", .tokens = 8192, .tp = 1,
			  .repeat = 7, .stress_bytes = 256u << 20,
			  .p = { 1, 16, 32, 256 }, .np = 4, .depth = 32,
			  .blocks = 2, .checksum = 1, .layout = KVT_LAYOUT_VLLM };
	kvt_xfer_config cfg = { 0 }, pcfg;
	kvt_xfer *x = NULL, *xp = NULL;
	kvt_xfer_info info;
	kvt_geom g;
	int err, rc;

	if ((rc = parse_args(argc, argv, &o)))
		return rc > 0 ? 0 : CLI_EXIT_USAGE;
	cfg.cpu_threads = (unsigned)o.threads;
	cfg.nt = o.nt;
	cfg.uring_depth = (unsigned)o.depth;
	cfg.cuda_blocks = (unsigned)o.blocks;
	pcfg = cfg;
	pcfg.ssd_io = KVT_XFER_PREAD;
	if ((err = cli_geom(&g, o.model, (uint32_t)o.p[0], (uint32_t)o.tp,
			    (uint32_t)o.rank)))
		return cli_fail("bench xfer", err);
	if ((err = kvt_xfer_create(&x, &cfg)) ||
	    (err = kvt_xfer_create(&xp, &pcfg))) {
		kvt_xfer_destroy(x);
		return cli_fail("bench xfer", err);
	}
	kvt_xfer_info_get(x, &info);
	o.threads = info.cpu_threads;
	nrows = 0;
	rc = 0;
	for (int s = 0; s <= (o.stress ? 1 : 0) && !rc; s++) {
		kvt_stress *st = NULL;
		kvt_stress_stat ss;
		int first = nrows;

		if (s && (err = kvt_stress_start(&st, (unsigned)o.stress,
						 o.stress_bytes, 0))) {
			rc = cli_fail("bench xfer --stress", err);
			break;
		}
		for (int i = 0; i < o.np && !rc; i++) {
			if ((err = cli_geom(&g, o.model, (uint32_t)o.p[i],
					    (uint32_t)o.tp, (uint32_t)o.rank)) ||
			    (err = run_p(&o, &g, x, xp, info.cuda, s))) {
				char what[64];
				snprintf(what, sizeof(what), "bench xfer (P=%llu)",
					 (unsigned long long)o.p[i]);
				rc = cli_fail(what, err);
			}
		}
		if (st) {
			kvt_stress_stop(st, &ss);
			for (int k = first; k < nrows; k++)
				rows[k].stressor_gbps = ss.gbps;
		}
	}
	if (rc)
		goto out;
	targets();
	if (o.json) {
		print_json(&o, &info, &g);
	} else {
		printf("%s, %llu tokens, TP %llu rank %llu; %u cpu thread%s (%s "
		       "streaming stores: %s); slot order %s; %s layout\n\n",
		       g.name, (unsigned long long)o.tokens,
		       (unsigned long long)o.tp, (unsigned long long)o.rank,
		       info.cpu_threads, info.cpu_threads == 1 ? "" : "s",
		       info.copy_isa, o.nt == KVT_XFER_NT_ON ? "on" :
		       o.nt == KVT_XFER_NT_OFF ? "off" : "auto",
		       o.seq ? "consecutive" : "shuffled",
		       kvt_layout_name(o.layout));
		if (!info.cuda)
			printf("GPU methods not measured: %s\n\n", info.cuda_note);
		print_text(&o, &info);
	}
out: /* info's strings live in the engine: destroy it only now */
	kvt_xfer_destroy(x);
	kvt_xfer_destroy(xp);
	return rc;
}
