/*
 * cmd_info.c — kvtier info: what the machine offers, and what a tier spec
 * would build here (it builds the tiers for real, reports, closes them).
 */
#include "cli.h"
#include "kvt_build.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TIERS 16

static void info_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier info [--json] [--tiers SPEC] [--model NAME|CONFIG]\n"
"                   [--page-tokens P] [--tp N] [--tp-rank R] [--config FILE]\n"
"\n"
"Reports NUMA nodes (and which are CPU-less), devdax devices, hugepages,\n"
"CUDA devices and io_uring support. With --tiers, builds each tier of the\n"
"spec for the model's page size and reports its size and slots.\n"
"\n"
"  --tiers SPEC       e.g. 'dram:1G,fabric:file=/tmp/x,1G,ssd:/tmp/kvt,2G'\n"
"                     (grammar: docs/FORMATS.md; env KVT_TIERS)\n"
"  --model M          preset or config.json path (default llama-3.1-8b)\n"
"  --page-tokens P    tokens per page (default 16)\n"
"  --tp N, --tp-rank R  tensor parallelism (default 1, 0)\n"
"  --config FILE      options file ('name = value'; env KVT_CONFIG)\n"
"  --json             machine-readable output\n");
}

static cJSON *machine_json(const kvt_machine *m)
{
	cJSON *o = cJSON_CreateObject(), *a, *x;

	cJSON_AddNumberToObject(o, "cpus", m->cpus);
	cJSON_AddNumberToObject(o, "mem_total", (double)m->mem_total);
	cJSON_AddNumberToObject(o, "mem_available", (double)m->mem_available);
	cJSON_AddBoolToObject(o, "numa_available", m->numa_available);
	a = cJSON_AddArrayToObject(o, "numa_nodes");
	for (int i = 0; i < m->nnodes; i++) {
		x = cJSON_CreateObject();
		cJSON_AddNumberToObject(x, "id", m->nodes[i].id);
		cJSON_AddNumberToObject(x, "cpus", m->nodes[i].cpus);
		cJSON_AddBoolToObject(x, "cpuless", m->nodes[i].cpus == 0);
		cJSON_AddNumberToObject(x, "mem_total", (double)m->nodes[i].mem_total);
		cJSON_AddNumberToObject(x, "mem_free", (double)m->nodes[i].mem_free);
		cJSON_AddItemToArray(a, x);
	}
	a = cJSON_AddArrayToObject(o, "dax");
	for (int i = 0; i < m->ndax; i++) {
		x = cJSON_CreateObject();
		cJSON_AddStringToObject(x, "path", m->dax[i].path);
		cJSON_AddNumberToObject(x, "size", (double)m->dax[i].size);
		cJSON_AddNumberToObject(x, "align", (double)m->dax[i].align);
		cJSON_AddNumberToObject(x, "target_node", m->dax[i].target_node);
		cJSON_AddStringToObject(x, "mode", m->dax[i].mode);
		cJSON_AddItemToArray(a, x);
	}
	x = cJSON_AddObjectToObject(o, "hugepages");
	cJSON_AddNumberToObject(x, "page_bytes", (double)m->hugepage_bytes);
	cJSON_AddNumberToObject(x, "total", (double)m->hugepages_total);
	cJSON_AddNumberToObject(x, "free", (double)m->hugepages_free);
	cJSON_AddStringToObject(x, "transparent", m->thp);
	x = cJSON_AddObjectToObject(o, "cuda");
	cJSON_AddBoolToObject(x, "built", m->cuda_built);
	cJSON_AddNumberToObject(x, "devices", m->ngpus);
	if (m->cuda_note[0])
		cJSON_AddStringToObject(x, "note", m->cuda_note);
	a = cJSON_AddArrayToObject(x, "gpus");
	for (int i = 0; i < m->ngpus; i++) {
		cJSON *g = cJSON_CreateObject();
		char cc[16];
		snprintf(cc, sizeof(cc), "%d.%d", m->gpus[i].cc_major,
			 m->gpus[i].cc_minor);
		cJSON_AddStringToObject(g, "name", m->gpus[i].name);
		cJSON_AddNumberToObject(g, "mem", (double)m->gpus[i].mem);
		cJSON_AddStringToObject(g, "compute_capability", cc);
		cJSON_AddItemToArray(a, g);
	}
	x = cJSON_AddObjectToObject(o, "io_uring");
	cJSON_AddBoolToObject(x, "available", m->io_uring);
	if (m->io_uring_note[0])
		cJSON_AddStringToObject(x, "note", m->io_uring_note);
	return o;
}

static void machine_text(const kvt_machine *m)
{
	char a[32], b[32];
	int cpuless = 0;

	printf("machine:   %d CPUs, %s memory (%s available)\n", m->cpus,
	       kvt_size_format(m->mem_total, a, sizeof(a)),
	       kvt_size_format(m->mem_available, b, sizeof(b)));
	if (!m->numa_available) {
		printf("numa:      not available\n");
	} else {
		printf("numa:      %d node%s\n", m->nnodes, m->nnodes == 1 ? "" : "s");
		for (int i = 0; i < m->nnodes; i++) {
			printf("           node %d: %d CPUs, %s%s\n", m->nodes[i].id,
			       m->nodes[i].cpus,
			       kvt_size_format(m->nodes[i].mem_total, a, sizeof(a)),
			       m->nodes[i].cpus ? "" : "  CPU-less: fabric candidate");
			cpuless += m->nodes[i].cpus == 0;
		}
		if (!cpuless)
			printf("           no CPU-less node (no CXL memory onlined)\n");
	}
	if (!m->ndax)
		printf("dax:       no devdax device\n");
	for (int i = 0; i < m->ndax; i++) {
		const char *mode = m->dax[i].mode;

		printf("dax:       %s %s (align %llu, node %d)  ", m->dax[i].path,
		       kvt_size_format(m->dax[i].size, a, sizeof(a)),
		       (unsigned long long)m->dax[i].align, m->dax[i].target_node);
		if (!strcmp(mode, "devdax"))
			printf("devdax: fabric candidate\n");
		else if (!strcmp(mode, "system-ram"))
			printf("system-ram: onlined into node %d, not a device now\n",
			       m->dax[i].target_node);
		else
			printf("%s%s\n", *mode ? "driver " : "no driver", mode);
	}
	printf("hugepages: %s pages, %llu reserved, %llu free; transparent: %s\n",
	       kvt_size_format(m->hugepage_bytes, a, sizeof(a)),
	       (unsigned long long)m->hugepages_total,
	       (unsigned long long)m->hugepages_free, m->thp);
	printf("cuda:      %s; %d GPU%s%s%s\n",
	       m->cuda_built ? "built" : "not built", m->ngpus,
	       m->ngpus == 1 ? "" : "s", m->cuda_note[0] ? " — " : "",
	       m->cuda_note);
	for (int i = 0; i < m->ngpus; i++)
		printf("           %d: %s, %s, sm_%d%d\n", i, m->gpus[i].name,
		       kvt_size_format(m->gpus[i].mem, a, sizeof(a)),
		       m->gpus[i].cc_major, m->gpus[i].cc_minor);
	printf("io_uring:  %s%s%s\n", m->io_uring ? "yes" : "no",
	       m->io_uring_note[0] ? " — " : "", m->io_uring_note);
}

static cJSON *geom_json(const kvt_geom *g)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddStringToObject(o, "name", g->name);
	cJSON_AddNumberToObject(o, "layers", g->layers);
	cJSON_AddNumberToObject(o, "kv_heads", g->kv_heads);
	cJSON_AddNumberToObject(o, "kv_heads_total", g->kv_heads_total);
	cJSON_AddNumberToObject(o, "head_dim", g->head_dim);
	cJSON_AddNumberToObject(o, "dtype_bytes", g->dtype_bytes);
	cJSON_AddBoolToObject(o, "mla", g->mla);
	cJSON_AddNumberToObject(o, "page_tokens", g->page_tokens);
	cJSON_AddNumberToObject(o, "tp_size", g->tp_size);
	cJSON_AddNumberToObject(o, "tp_rank", g->tp_rank);
	cJSON_AddNumberToObject(o, "token_bytes", (double)kvt_geom_token_bytes(g));
	cJSON_AddNumberToObject(o, "chunk_bytes", (double)kvt_geom_chunk_bytes(g));
	cJSON_AddNumberToObject(o, "page_bytes", (double)kvt_geom_page_bytes(g));
	cJSON_AddNumberToObject(o, "params", (double)g->params);
	return o;
}

static cJSON *tier_json(const kvt_tier_spec *s, const kvt_tier_desc *d)
{
	cJSON *o = cJSON_CreateObject();
	char buf[512];

	cJSON_AddStringToObject(o, "spec", kvt_tier_spec_format(s, buf, sizeof(buf)));
	cJSON_AddStringToObject(o, "kind", d->name);
	cJSON_AddStringToObject(o, "backing", kvt_backing_name(d->backing));
	cJSON_AddBoolToObject(o, "emulated", d->emulated);
	cJSON_AddStringToObject(o, "where", d->where);
	cJSON_AddNumberToObject(o, "bytes", (double)d->bytes);
	cJSON_AddNumberToObject(o, "slots", (double)d->nslots);
	cJSON_AddNumberToObject(o, "slot_bytes", (double)d->slot_bytes);
	cJSON_AddNumberToObject(o, "page_bytes", (double)d->page_bytes);
	cJSON_AddStringToObject(o, "layout", d->layer_first ? "layer-first" :
				"page-first");
	if (d->backing == KVT_BACK_ANON || d->backing == KVT_BACK_NUMA ||
	    d->backing == KVT_BACK_HOSTDEV)
		cJSON_AddStringToObject(o, "hugepages", kvt_huge_name(d->huge));
	if (d->numa_node >= 0)
		cJSON_AddNumberToObject(o, "numa_node", d->numa_node);
	cJSON_AddBoolToObject(o, "mlocked", d->locked);
	cJSON_AddBoolToObject(o, "cuda_registered", d->cuda_registered);
	if (d->note[0])
		cJSON_AddStringToObject(o, "note", d->note);
	return o;
}

int cmd_info(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, 'j' },
		{ "tiers", required_argument, 0, 't' },
		{ "model", required_argument, 0, 'm' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "tp", required_argument, 0, 'T' },
		{ "tp-rank", required_argument, 0, 'R' },
		{ "config", required_argument, 0, 'c' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	kvt_tier_spec specs[MAX_TIERS];
	const char *tiers, *model;
	uint64_t P, tp, rank;
	kvt_machine m;
	kvt_opts *o;
	size_t ntiers = 0;
	int json = 0, c, err, rc = 0;
	cJSON *root = NULL, *arr = NULL;
	kvt_geom g;

	if ((err = kvt_opts_create(&o)))
		return cli_fail("info", err);
	if ((rc = cli_opts_load(o, "info", cli_config_arg(argc, argv))))
		goto out;
	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", lo, NULL)) != -1) {
		const char *name = NULL;
		switch (c) {
		case 'j': json = 1; break;
		case 'c': break; /* read before the environment */
		case 't':
			if (!*optarg) { /* leave the flag out for no tiers */
				rc = cli_usage("info", "--tiers: empty tier "
					       "spec (e.g. 'dram:8G')");
				goto out;
			}
			name = "tiers";
			break;
		case 'm': name = "model"; break;
		case 'p': name = "page_tokens"; break;
		case 'T': name = "tp"; break;
		case 'R': name = "tp_rank"; break;
		case 'h': info_usage(stdout); goto out;
		default: info_usage(stderr); rc = CLI_EXIT_USAGE; goto out;
		}
		if (name && (err = kvt_opts_set(o, name, optarg))) {
			rc = cli_fail("info", err);
			goto out;
		}
	}
	if (optind < argc) {
		rc = cli_usage("info", "unexpected argument '%s'", argv[optind]);
		goto out;
	}
	tiers = kvt_opts_get(o, "tiers");
	model = kvt_opts_get(o, "model");
	if (cli_u64("--page-tokens", kvt_opts_get(o, "page_tokens"), 1, 1 << 20, &P) ||
	    cli_u64("--tp", kvt_opts_get(o, "tp"), 1, 1024, &tp) ||
	    cli_u64("--tp-rank", kvt_opts_get(o, "tp_rank"), 0, 1023, &rank)) {
		rc = CLI_EXIT_USAGE;
		goto out;
	}
	if ((err = cli_geom(&g, model, (uint32_t)P, (uint32_t)tp, (uint32_t)rank))) {
		rc = cli_fail("info", err);
		goto out;
	}
	if (tiers && *tiers &&
	    (err = kvt_tier_spec_parse(tiers, specs, MAX_TIERS, &ntiers))) {
		rc = cli_fail("info", err);
		goto out;
	}

	kvt_probe(&m);
	if (json) {
		cJSON *b;
		root = cJSON_CreateObject();
		cJSON_AddStringToObject(root, "version", kvt_version());
		b = cJSON_AddObjectToObject(root, "build");
		cJSON_AddBoolToObject(b, "cuda", m.cuda_built);
		cJSON_AddStringToObject(b, "cuda_archs", KVT_BUILD_CUDA_ARCHS);
		cJSON_AddStringToObject(b, "sanitize", KVT_BUILD_SANITIZE);
		cJSON_AddStringToObject(b, "type", KVT_BUILD_TYPE);
		cJSON_AddItemToObject(root, "machine", machine_json(&m));
		cJSON_AddItemToObject(root, "model", geom_json(&g));
		arr = cJSON_AddArrayToObject(root, "tiers");
	} else {
		char a[32], b2[32];
		printf("kvtier %s (CUDA %s, build %s%s%s)\n", kvt_version(),
		       m.cuda_built ? "built" : "not built", KVT_BUILD_TYPE,
		       KVT_BUILD_SANITIZE[0] ? ", sanitizer " : "",
		       KVT_BUILD_SANITIZE);
		machine_text(&m);
		printf("model:     %s, %u tokens/page, TP %u rank %u: %s per page, "
		       "%s per token%s\n", g.name, g.page_tokens, g.tp_size,
		       g.tp_rank, kvt_size_format(kvt_geom_page_bytes(&g), a, sizeof(a)),
		       kvt_size_format(kvt_geom_token_bytes(&g), b2, sizeof(b2)),
		       g.mla ? " (MLA latent)" : "");
		if (ntiers)
			printf("tiers:\n  %-8s %-7s %-9s %-10s %-10s %-8s %s\n", "tier",
			       "backing", "huge", "size", "slot", "slots",
			       "where / notes");
	}
	for (size_t i = 0; i < ntiers; i++) {
		kvt_tier *t;
		kvt_tier_desc d;

		err = kvt_tier_open(&t, &specs[i], &g);
		if (err) {
			rc = cli_fail("info", err);
			break;
		}
		kvt_tier_info(t, &d);
		if (json) {
			cJSON_AddItemToArray(arr, tier_json(&specs[i], &d));
		} else {
			char a[32], b2[32];
			printf("  %-8s %-7s %-9s %-10s %-10s %-8llu %s%s%s%s\n",
			       d.name, kvt_backing_name(d.backing),
			       d.backing == KVT_BACK_ANON || d.backing == KVT_BACK_NUMA ||
			       d.backing == KVT_BACK_HOSTDEV ? kvt_huge_name(d.huge) : "-",
			       kvt_size_format(d.bytes, a, sizeof(a)),
			       kvt_size_format(d.slot_bytes, b2, sizeof(b2)),
			       (unsigned long long)d.nslots, d.where,
			       d.emulated ? "  EMULATED" : "",
			       d.note[0] ? ": " : "", d.note);
		}
		kvt_tier_close(t);
	}
	if (json && !rc)
		cli_json_print(root);
	else
		cJSON_Delete(root);
out:
	kvt_opts_destroy(o);
	return rc;
}
