/*
 * bench_server.h — what the files of `kvtier bench server` share: the
 * options, the run (struct bsrv: everything set-up makes and teardown
 * frees, and the figures), the child-process plumbing and the helpers.
 * The command's design comment (what is measured, how) is atop
 * bench_server.c.
 *
 *   bench_server.c       options; the phases in order; the report; teardown
 *   bench_server_proc.c  child processes: a daemon, clients on pipes
 *   bench_server_load.c  the timed comparison: client processes and
 *                        in-process threads loading the same pages
 *   bench_server_ctl.c   the control path on a small daemon: latency,
 *                        the load test, the Python package's figures
 *   bench_server_bl.c    --baselines: the same bytes by other means
 *
 * THE ORDER (the invariant the split keeps): every fork — the daemon, the
 * small daemon, the client processes, the load-test processes — happens
 * before this process starts a thread (the in-process cache, its threads,
 * the baselines' transfer engine), so no child inherits a lock a thread
 * held; each child reports once that it is set up before anything is
 * timed; teardown closes the pipes, waits for every child, stops both
 * daemons, then frees what lives in this process.
 *
 * LOCKING: none shared; the children talk to this process through their
 * own pipes (one byte 'g' per go, doubles or structs back), the in-process
 * threads meet on a barrier per repeat.
 */
#ifndef KVT_TOOLS_BENCH_SERVER_H
#define KVT_TOOLS_BENCH_SERVER_H

#include "cli.h"
#include "server/server.h"

#include <kvtier/client.h>
#include <kvtier/dev.h>
#include <cjson/cJSON.h>

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#define MAX_CLIENTS 16
#define MAX_REP 64
#define MAX_L 1024
#define LAT_TOKENS 32768        /* the latency prompt */
#define LAT_P 16
#define LT_PAGES 512            /* a load-test client's prompt */
#define LT_LOAD 64              /* pages loaded per request */
#define LT_STORE 8              /* pages stored every 4th request */
#define LT_MAX_SAMPLES (1u << 18)

struct sopt {
	const char *model, *python;
	uint64_t pages, page_tokens, clients, repeats, seconds;
	uint64_t reps, load_clients, load_seconds; /* 0: that phase off */
	int json;
	int device;          /* KVT_DEVICE_HOST: memfd memory */
	int baselines;       /* --baselines */
};

/* Engine memory of one client or thread: host (a sealed memfd mapped
 * shared, the kind kvt_client_mem_alloc() registers: both sides load into
 * the same kind of memory) or device memory (kvt_dev_alloc()). */
struct emem {
	kvt_dev *dev;
	void *p;
	size_t len;          /* host: the mapping */
};

/* A child process and the parent's ends of its two pipes. */
struct child {
	pid_t pid;
	int go, back; /* parent's ends: commands to, results from */
};

/* An in-process client thread of the timed comparison. */
struct ithread {
	kvt_cache *c;
	kvt_cache_mem *m;
	struct emem mem;
	uint64_t id, n;
	kvt_page_key *keys;
	uint32_t *blk;
	pthread_barrier_t *bar;
	int err, rep;
};

/* --baselines (bench_server_bl.c) */
enum { B_CONTIG, B_BATCH, B_CHUNK, B_KERNEL, B_KERNEL_V, B_STORE,
       B_STORE_CONTIG, B_COUNT };

struct bl {
	kvt_xfer *x;
	kvt_dev *dev;
	kvt_tier *dram, *back, *hbm;
	uint32_t *ss, *ds;
	uint64_t *sums, n, bytes;
};

/* The latency figures (bench_server_ctl.c). */
struct lat {
	double hash_p50, hash_p99;
	double one_p50, one_p99, all_p50, all_p99;
	uint64_t keys, reps;
};

/* The load test's figures, all clients together. */
struct lt_sum {
	uint64_t requests, errors;
	double rps, p50, p99;
};

/*
 * One run: filled in phase by phase (bench_server.c says which), freed by
 * its teardown whatever phase failed. The counts (nch, nlt, nth) say how
 * much of each array was made.
 */
struct bsrv {
	struct sopt o;
	kvt_geom g;
	uint64_t bytes;                 /* one client's page bytes */
	char devname[16];               /* "host" or the device */

	/* the timed comparison: a daemon, its clients, the in-process cache */
	char sock[108], tiers[64];
	kvtd_config dc;
	pid_t d;
	struct child ch[MAX_CLIENTS];
	int nch;
	kvt_cache_config cc;
	kvt_cache *c;
	struct ithread th[MAX_CLIENTS];
	int nth;
	struct bl bl;

	/* the control path: a small daemon, its load-test clients */
	int small;                      /* latency or load test on */
	char dir[64], cfgpath[128], ssock[108], stiers[64];
	kvtd_config ds;
	pid_t dsm;
	struct child lt[MAX_CLIENTS];
	int nlt;

	/* the figures */
	int nrep;
	double d_gbps[MAX_REP], i_gbps[MAX_REP], ratio[MAX_REP];
	double bl_r[MAX_REP][B_COUNT];
	double c0[3], c1[3];            /* the daemon's counts before, after */
	double load0, load1;
	struct lat lat;
	struct lt_sum lts;
	cJSON *py;
};

/* ---- helpers (bench_server.c) -------------------------------------------- */

double kvti_bs_secs(uint64_t t0);
kvt_page_key kvti_bs_key_of(uint64_t client, uint64_t i);
/* @v = a permutation of 0..n-1 drawn from @seed. */
void kvti_bs_shuffle(uint32_t *v, uint64_t n, uint64_t seed);
/* Sorts @v; the @p quantile (0..1). */
double kvti_bs_quantile(double *v, uint64_t n, double p);
/* The 1-minute load average, -1 if unknown. */
void kvti_bs_loadavg(double *l);

/* ---- child processes (bench_server_proc.c) ------------------------------- */

/* A daemon in a child process on @cfg; its pid once its socket answers,
 * -1 if it did not start. */
pid_t kvti_bs_daemon_start(const kvtd_config *cfg);
/* The body of a child: reads commands on @in, writes results to @out. */
typedef int kvti_bs_child_fn(const struct sopt *o, const char *sock,
			     uint64_t id, int in, int out);
/* Process @id running @fn; ch[0..id) are the ones started before (their
 * pipe ends are closed in the new child, or they would never see EOF). */
int kvti_bs_child_start(struct child *ch, const struct sopt *o,
			const char *sock, uint64_t id, kvti_bs_child_fn *fn);
/* One double from the child: 0, or -1 if it failed or went away. */
int kvti_bs_child_read(struct child *ch, double *s);
/* Read @n bytes whole from @fd: 0 or -1. */
int kvti_bs_read_all(int fd, void *p, size_t n);
/* Closes the parent's pipe ends of @n children (each then sees EOF and
 * exits); idempotent. Every group's pipes must be closed before any is
 * reaped: a later group's children inherited an earlier group's write
 * ends, so an earlier child sees EOF only once those have exited too. */
void kvti_bs_children_close(struct child *ch, int n);
/* kvti_bs_children_close(), then wait for each of the @n children. */
void kvti_bs_children_reap(struct child *ch, int n);

/* ---- the timed comparison (bench_server_load.c) -------------------------- */

/* A client process of the big daemon (kvti_bs_child_fn): set up, then per
 * 'g' one timed load of its pages, its seconds back. */
int kvti_bs_client_main(const struct sopt *o, const char *sock, uint64_t id,
			int in, int out);
/* The in-process cache and its threads, each with its pages stored. An
 * exit code: 0, or cli_fail()'s after the message. */
int kvti_bs_inproc_open(struct bsrv *r);
/* The repeats, alternating sides, and the daemon's counts around them. */
int kvti_bs_load_run(struct bsrv *r);
/* Free the in-process threads' memory (the cache closed first). */
void kvti_bs_inproc_free(struct bsrv *r);

/* ---- the control path (bench_server_ctl.c) ------------------------------- */

/* The small daemon's model (its geometry; with a latency or load-test
 * phase, a directory with its config.json) and configuration (r->ds).
 * 0 or a negative code. */
int kvti_bs_ctl_prepare(struct bsrv *r);
/* A load-test client of the small daemon (kvti_bs_child_fn). */
int kvti_bs_lt_client(const struct sopt *o, const char *sock, uint64_t id,
		      int in, int out);
/* Latency, the Python figures, the load test, as the options ask. */
int kvti_bs_ctl_run(struct bsrv *r);
void kvti_bs_ctl_json(cJSON *root, const struct bsrv *r);
void kvti_bs_ctl_print(const struct bsrv *r);
/* Free the Python figures; remove the small daemon's config.json and
 * directory. */
void kvti_bs_ctl_cleanup(struct bsrv *r);

/* ---- --baselines (bench_server_bl.c) ------------------------------------- */

int kvti_bs_bl_setup(struct bl *b, const kvt_geom *g, int device, uint64_t n);
/* One round of every baseline, GB/s into @r. */
int kvti_bs_bl_run(struct bl *b, double *r);
void kvti_bs_bl_free(struct bl *b);
void kvti_bs_bl_json(cJSON *root, double (*r)[B_COUNT], const double *dg,
		     int n);
void kvti_bs_bl_print(double (*r)[B_COUNT], const double *dg, int n);

#endif
