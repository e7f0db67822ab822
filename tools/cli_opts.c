/*
 * cli_opts.c — the option sources every subcommand reads in the same order:
 * defaults < config file (--config FILE, or KVT_CONFIG) < environment
 * (KVT_<NAME>) < command-line flags (set by the subcommand afterwards).
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

int cli_opts_load(kvt_opts *o, const char *what, const char *config)
{
	int err;

	if (!config)
		config = getenv("KVT_CONFIG");
	if (config && *config && (err = kvt_opts_load_file(o, config)))
		return cli_fail(what, err);
	if ((err = kvt_opts_load_env(o)))
		return cli_fail(what, err);
	return 0;
}

/* The --config value from argv, looked up before getopt runs so the file
 * sits below the environment and the flags. */
const char *cli_config_arg(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc)
			return argv[i + 1];
		if (!strncmp(argv[i], "--config=", 9))
			return argv[i] + 9;
	}
	return NULL;
}
