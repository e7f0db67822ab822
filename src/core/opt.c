/*
 * opt.c — the one table of runtime options.
 *
 * Every option is one line of KVT_OPTIONS below: name, type, default, help.
 * A value comes, in increasing precedence, from the default, a config file
 * ("name = value"), the environment (KVT_<NAME>, upper case) and a
 * command-line flag (--name, with '-' or '_'). The command line parses
 * flags itself and calls kvt_opts_set(); the library only keeps the table.
 */
#include "core/core.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum opt_type { OPT_STR, OPT_INT, OPT_BOOL };

/*        name          type      default  help */
#define KVT_OPTIONS(X)                                                        \
	X(tiers, OPT_STR, "", "tier specs, e.g. 'dram:8G,ssd:/var/lib/kvtier,100G'") \
	X(model, OPT_STR, "llama-3.1-8b", "model preset or path to a config.json") \
	X(page_tokens, OPT_INT, "16", "tokens per KV page")                   \
	X(kv_dtype, OPT_STR, "auto", "KV cache element type: auto (the model's), bf16, fp16, fp32, fp8") \
	X(tp, OPT_INT, "1", "tensor-parallel degree")                          \
	X(tp_rank, OPT_INT, "0", "tensor-parallel rank of this process")       \
	X(log, OPT_STR, "warn", "log level: error, warn, info, debug")         \
	X(seed, OPT_INT, "1", "random seed for workloads and tests")       \
	X(socket, OPT_STR, "/run/kvtier/kvtierd.sock", "the daemon's Unix socket") \
	X(namespace, OPT_STR, "default", "the model namespace the daemon serves") \
	X(tenants, OPT_STR, "", "daemon tenants: 'NAME:ID[,uid=U][,gid=G][,salt=S][,quota=TIER:SIZE]' joined by ';'") \
	X(lease_ms, OPT_INT, "30000", "daemon: a job's lease (ms)")           \
	X(max_clients, OPT_INT, "64", "daemon: clients served at once")       \
	X(metrics, OPT_STR, "", "daemon: HOST:PORT for GET /metrics ('' off)") \
	X(remote, OPT_STR, "", "a remote tier below the owned ones, e.g. 'remote:redis://127.0.0.1:6379' ('' none)") \
	X(devices, OPT_STR, "", "daemon: devices engines register memory on, e.g. 'cuda:0,cuda:1' or 'emu': the host tiers are page-locked for them at start ('' at first use)") \
	X(load_method, OPT_STR, "cuda-kernel", "daemon: how loads move pages into device memory: cuda-kernel (the SM-capped gather kernel), cuda-batch (batched copy-engine DMA), cuda-chunk") \
	X(store_method, OPT_STR, "cuda-batch", "daemon: how stores move pages out of device memory: cuda-batch, cuda-kernel, cuda-chunk") \
	X(thread_nice, OPT_INT, "0", "daemon: nice value of the cache's copy threads, 0 (as started) to 19 (below the engines' threads on a host with few cores)")

static const struct opt_def {
	const char *name;
	enum opt_type type;
	const char *def;
	const char *help;
} opt_defs[] = {
#define X(n, t, d, h) { #n, t, d, h },
	KVT_OPTIONS(X)
#undef X
};
#define NOPTS KVT_ARRAY_SIZE(opt_defs)

static const char *src_names[] = { "default", "file", "env", "flag" };
enum { SRC_DEFAULT, SRC_FILE, SRC_ENV, SRC_FLAG };

struct kvt_opts {
	char *val[NOPTS]; /* NULL: the default */
	int src[NOPTS];
};

/* Option names compare with '-' and '_' as one character. */
static int opt_find(const char *name)
{
	for (size_t i = 0; i < NOPTS; i++) {
		const char *a = opt_defs[i].name, *b = name;

		while (*a && *b) {
			char ca = *a == '-' ? '_' : (char)tolower((unsigned char)*a);
			char cb = *b == '-' ? '_' : (char)tolower((unsigned char)*b);
			if (ca != cb)
				break;
			a++, b++;
		}
		if (!*a && !*b)
			return (int)i;
	}
	return -1;
}

static int opt_check(const struct opt_def *d, const char *v)
{
	char *end;

	switch (d->type) {
	case OPT_INT:
		errno = 0;
		(void)strtoll(v, &end, 10);
		if (!*v || *end || errno)
			return kvti_fail(KVT_ECONFIG,
					 "option %s: '%s' is not an integer",
					 d->name, v);
		return 0;
	case OPT_BOOL:
		if (strcmp(v, "0") && strcmp(v, "1") &&
		    !kvti_streq_ci(v, "true") && !kvti_streq_ci(v, "false") &&
		    !kvti_streq_ci(v, "yes") && !kvti_streq_ci(v, "no"))
			return kvti_fail(KVT_ECONFIG,
					 "option %s: '%s' is not a boolean",
					 d->name, v);
		return 0;
	default:
		return 0;
	}
}

int kvt_opts_create(kvt_opts **out)
{
	kvt_opts *o = kvt_calloc(1, sizeof(*o));

	if (!o)
		return -ENOMEM;
	*out = o;
	return 0;
}

void kvt_opts_destroy(kvt_opts *o)
{
	if (!o)
		return;
	for (size_t i = 0; i < NOPTS; i++)
		kvt_free(o->val[i]);
	kvt_free(o);
}

static int opts_set_src(kvt_opts *o, const char *name, const char *value,
			int src)
{
	int i = opt_find(name), err;
	char *v;

	if (i < 0) {
		char q[64];

		return kvti_fail(KVT_ENOTFOUND, "unknown option '%s'",
				 kvti_printable(q, sizeof(q), name, SIZE_MAX));
	}
	err = opt_check(&opt_defs[i], value);
	if (err)
		return err;
	v = kvt_strdup(value);
	if (!v)
		return -ENOMEM;
	kvt_free(o->val[i]);
	o->val[i] = v;
	o->src[i] = src;
	return 0;
}

int kvt_opts_set(kvt_opts *o, const char *name, const char *value)
{
	return opts_set_src(o, name, value, SRC_FLAG);
}

int kvt_opts_load_env(kvt_opts *o)
{
	char var[80];

	for (size_t i = 0; i < NOPTS; i++) {
		const char *n = opt_defs[i].name, *e;
		size_t k = 0;
		int err;

		k = (size_t)snprintf(var, sizeof(var), "KVT_");
		for (; *n && k + 1 < sizeof(var); n++)
			var[k++] = (char)toupper((unsigned char)*n);
		var[k] = '\0';
		e = getenv(var);
		if (!e)
			continue;
		err = opts_set_src(o, opt_defs[i].name, e, SRC_ENV);
		if (err) {
			kvti_errctx("environment %s", var);
			return err;
		}
	}
	return 0;
}

int kvti_opts_parse(kvt_opts *o, char *text, const char *name)
{
	char *line = text, *next;
	int err = 0, lineno = 0;

	for (; line; line = next) {
		char *eq, *hash, *k, *v;

		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		lineno++;
		hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		k = kvti_trim(line);
		if (!*k)
			continue;
		eq = strchr(k, '=');
		if (!eq)
			return kvti_fail(KVT_ECONFIG,
					 "%s:%d: expected 'name = value'", name,
					 lineno);
		*eq = '\0';
		v = kvti_trim(eq + 1);
		k = kvti_trim(k);
		err = opts_set_src(o, k, v, SRC_FILE);
		if (err) {
			kvti_errctx("%s:%d", name, lineno);
			return err;
		}
	}
	return 0;
}

int kvt_opts_load_file(kvt_opts *o, const char *path)
{
	char *text;
	int err;

	err = kvti_read_file(path, 1 << 20, &text, NULL);
	if (err)
		return kvti_fail(err, "config file %s: %s", path,
				 kvti_file_strerror(err));
	err = kvti_opts_parse(o, text, path);
	kvt_free(text);
	return err;
}

const char *kvt_opts_get(const kvt_opts *o, const char *name)
{
	int i = opt_find(name);

	if (i < 0)
		return NULL;
	return o->val[i] ? o->val[i] : opt_defs[i].def;
}

int64_t kvt_opts_get_int(const kvt_opts *o, const char *name)
{
	int i = opt_find(name);
	const char *v;

	if (i < 0)
		return 0;
	v = o->val[i] ? o->val[i] : opt_defs[i].def;
	if (opt_defs[i].type == OPT_BOOL)
		return !strcmp(v, "1") || kvti_streq_ci(v, "true") ||
		       kvti_streq_ci(v, "yes");
	return strtoll(v, NULL, 10);
}

int kvt_opts_describe(const kvt_opts *o, int i, const char **name,
		      const char **value, const char **help,
		      const char **source)
{
	if (i < 0 || (size_t)i >= NOPTS)
		return -1;
	*name = opt_defs[i].name;
	*value = o->val[i] ? o->val[i] : opt_defs[i].def;
	*help = opt_defs[i].help;
	*source = src_names[o->src[i]];
	return 0;
}
