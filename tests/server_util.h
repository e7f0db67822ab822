/*
 * server_util.h — helpers for the daemon tests: run kvtierd in a child
 * process (kvtd_open + kvtd_run, SIGTERM drains it, SIGKILL kills it),
 * wait for its socket, connect clients with the small test geometry, and
 * fill / check engine blocks through a client's registered memory.
 */
#ifndef KVT_TEST_SERVER_UTIL_H
#define KVT_TEST_SERVER_UTIL_H

#include "harness.h"
#include "server/server.h"

#include <cjson/cJSON.h>
#include <kvtier/client.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define SRV_L 4
#define SRV_P 4

static kvtd *srv_child_daemon;

static void srv_on_term(int sig)
{
	(void)sig;
	kvtd_stop(srv_child_daemon);
}

/* The test model: SRV_L layers, 2 KV heads of 64 (bf16), P tokens a page,
 * as a config.json text. */
static inline const char *srv_model(void)
{
	static char path[600];
	FILE *f;

	snprintf(path, sizeof(path), "/tmp/kvtd-model-%d.json", (int)getpid());
	f = fopen(path, "w");
	if (!f)
		return NULL;
	fprintf(f, "{\"num_hidden_layers\":%d,\"num_attention_heads\":2,"
		"\"hidden_size\":128,\"num_key_value_heads\":2,"
		"\"torch_dtype\":\"bfloat16\"}", SRV_L);
	fclose(f);
	return path;
}

/* Start a daemon in a child; returns its pid once its socket answers, or
 * -1. */
static inline pid_t srv_start(const kvtd_config *cfg)
{
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct sigaction sa = { .sa_handler = srv_on_term };
		int err = kvtd_open(&srv_child_daemon, cfg);

		if (err) {
			fprintf(stderr, "daemon: %s (%s)\n", kvt_strerror(err),
				kvt_errdetail());
			_exit(3);
		}
		sigaction(SIGTERM, &sa, NULL);
		err = kvtd_run(srv_child_daemon);
		kvtd_close(srv_child_daemon);
		_exit(err ? 4 : 0);
	}
	/* the daemon answers, or has exited (it failed to open) */
	for (int i = 0; i < 100; i++) {
		int st;

		if (!kvt_client_wait_daemon(cfg->socket, 100))
			return pid;
		if (waitpid(pid, &st, WNOHANG) == pid)
			return -1;
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* SIGTERM and wait: the daemon's exit status (0: drained cleanly). */
static inline int srv_stop(pid_t pid)
{
	int st = 0;

	kill(pid, SIGTERM);
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static inline int srv_connect(kvt_client **cl, const char *sock,
			      const char *model, uint32_t tenant, uint32_t tp,
			      uint32_t rank)
{
	kvt_client_config c = KVT_CLIENT_CONFIG_INIT;

	c.socket = sock;
	c.model = model;
	c.page_tokens = SRV_P;
	c.tp_size = tp;
	c.tp_rank = rank;
	c.tenant = tenant;
	return kvt_client_connect(cl, &c);
}

/* A client's memory from kvt_client_mem_alloc(): vLLM layout. */
typedef struct srv_mem {
	kvt_client_mem *m;
	void *base[SRV_L];
	uint64_t bs, ks, ts, chunk, nblocks;
} srv_mem;

static inline int srv_mem_alloc(kvt_client *cl, srv_mem *sm, uint64_t nb)
{
	sm->nblocks = nb;
	sm->chunk = kvt_geom_chunk_bytes(kvt_client_geom(cl));
	return kvt_client_mem_alloc(cl, nb, sm->base, &sm->bs, &sm->ks, &sm->ts,
				    &sm->m);
}

/* Chunk (l, k) of block b. */
static inline uint8_t *srv_chunk(const srv_mem *sm, uint32_t l, uint64_t b,
				 uint32_t k)
{
	return (uint8_t *)sm->base[l] + b * sm->bs + k * sm->ks;
}

/* Bytes of page @key, layer l, K/V k: from the key alone. */
static inline void srv_fill(const srv_mem *sm, uint64_t b, kvt_page_key key)
{
	for (uint32_t l = 0; l < SRV_L; l++)
		for (uint32_t k = 0; k < 2; k++) {
			uint64_t s[4] = { key.lo, key.hi, l, k };
			uint64_t seed = XXH3_64bits(s, sizeof(s)) | 1;
			uint8_t *p = srv_chunk(sm, l, b, k);

			for (uint64_t i = 0; i < sm->chunk; i += 8) {
				uint64_t v = test_rand(&seed);
				memcpy(p + i, &v, 8);
			}
		}
}

/* 1 if block @b holds the page @key (every layer, K and V). */
static inline int srv_holds(const srv_mem *sm, uint64_t b, kvt_page_key key)
{
	for (uint32_t l = 0; l < SRV_L; l++)
		for (uint32_t k = 0; k < 2; k++) {
			uint64_t s[4] = { key.lo, key.hi, l, k };
			uint64_t seed = XXH3_64bits(s, sizeof(s)) | 1;
			const uint8_t *p = srv_chunk(sm, l, b, k);

			for (uint64_t i = 0; i < sm->chunk; i += 8) {
				uint64_t v = test_rand(&seed);
				if (memcmp(p + i, &v, 8))
					return 0;
			}
		}
	return 1;
}

static inline void srv_zero(const srv_mem *sm, uint64_t b)
{
	for (uint32_t l = 0; l < SRV_L; l++)
		for (uint32_t k = 0; k < 2; k++)
			memset(srv_chunk(sm, l, b, k), 0, sm->chunk);
}

/* Tokens of session @s: @n of them. */
static inline void srv_tokens(uint32_t s, uint32_t *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t k[2] = { s, i };
		t[i] = (uint32_t)XXH3_64bits(k, sizeof(k));
	}
}

/* Run a client job to the end: its result; the failed count. */
static inline int srv_job_end(kvt_client_job *j, long *nfailed)
{
	int err = kvt_client_job_wait(j, 30ll * 1000000000);
	long n = kvt_client_job_failed(j, NULL, 0);

	if (nfailed)
		*nfailed = n;
	kvt_client_job_free(j);
	return err;
}

/* @obj.@name of the daemon's STATS (docs/METRICS.md), or -1 (none; also
 * when @obj is not an object). */
static inline double srv_stat_num(kvt_client *cl, const char *obj,
				  const char *name)
{
	char *js = NULL;
	double v = -1;
	cJSON *root, *g;

	if (kvt_client_stats(cl, &js))
		return -1;
	root = cJSON_Parse(js);
	g = cJSON_GetObjectItem(cJSON_GetObjectItem(root, obj), name);
	if (cJSON_IsNumber(g))
		v = g->valuedouble;
	cJSON_Delete(root);
	free(js);
	return v;
}

/* A gauge of the daemon's STATS, or -1. */
static inline double srv_gauge(kvt_client *cl, const char *name)
{
	return srv_stat_num(cl, "gauges", name);
}

#endif /* KVT_TEST_SERVER_UTIL_H */
