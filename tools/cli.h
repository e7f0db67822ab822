/*
 * cli.h — shared pieces of the kvtier command: the subcommand table and
 * small helpers every subcommand uses. The command only parses, calls the
 * library and prints; no kvtier logic lives under tools/.
 *
 * Exit codes: 0 success, 1 the operation failed, 2 bad usage.
 */
#ifndef KVT_CLI_H
#define KVT_CLI_H

#include <kvtier.h>
#include <cjson/cJSON.h>
#include <stdio.h>

#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

/* Subcommands: one file each (tools/cmd_<name>.c). */
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_stress(int argc, char **argv);
int cmd_sim(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_stat(int argc, char **argv);

/* Benchmarks: one file each (tools/bench_<name>.c), run by cmd_bench. */
int bench_pool(int argc, char **argv);
int bench_index(int argc, char **argv);
int bench_sim(int argc, char **argv);
int bench_xfer(int argc, char **argv);
int bench_cache(int argc, char **argv);
int bench_remote(int argc, char **argv);
int bench_server(int argc, char **argv);
int bench_contend(int argc, char **argv);

/* Print "kvtier <what>: <detail or strerror>" to stderr; returns
 * CLI_EXIT_FAIL (or CLI_EXIT_USAGE for spec/config errors). */
int cli_fail(const char *what, int err);
/* Print a usage error and return CLI_EXIT_USAGE. */
int cli_usage(const char *what, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Parse an unsigned integer within [lo, hi]; 0 or -1 after a usage message
 * naming @flag. */
int cli_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi,
	    uint64_t *out);
/* Parse a finite number within [lo, hi] (NaN and infinities fail); 0 or
 * -1 after a usage message naming @flag. */
int cli_double(const char *flag, const char *s, double lo, double hi,
	       double *out);
/* Parse a comma-separated list of unsigned integers; returns the count or
 * -1 after a message. */
int cli_u64_list(const char *flag, const char *s, uint64_t lo, uint64_t hi,
		 uint64_t *out, int max);

/* Option sources below the flags: config file (@config, else KVT_CONFIG),
 * then KVT_<NAME>. Returns 0, or an exit code after printing the error. */
int cli_opts_load(kvt_opts *o, const char *what, const char *config);
/* The value of --config in argv, or NULL. */
const char *cli_config_arg(int argc, char **argv);

/* A geometry from a preset name or a config.json path. */
int cli_geom(kvt_geom *g, const char *model, uint32_t page_tokens,
	     uint32_t tp, uint32_t rank);

/* Print a cJSON tree (formatted) to stdout and free it. */
void cli_json_print(cJSON *root);
/* A distribution as {mean, p50, p90, p99, max, n} (the caller owns it):
 * sim's and demo's JSON share it, so their keys cannot drift apart. */
cJSON *cli_dist_json(const kvt_dist *d);

/* Median of @n values (at most 1024 are looked at; @v is not changed). */
double cli_median(const double *v, int n);

#endif
