/*
 * cmd_serve.c — kvtier serve (also installed as kvtierd): run the node
 * daemon in the foreground until SIGTERM / SIGINT, then drain and exit.
 * Options come from flags, KVT_* environment or a config file (the same
 * names); readiness goes to systemd (sd_notify READY=1) when run under it.
 */
#include "cli.h"
#include "server/server.h"

#include <kvtier/xfer.h>

#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void serve_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier serve [options]      (also: kvtierd [options])\n"
"\n"
"The node daemon: owns the fabric, dram and ssd tiers and the index over\n"
"them, and serves every engine process of this node over a Unix socket\n"
"(include/kvtier/client.h). Page data never crosses the socket: clients\n"
"share their KV memory once. Runs in the foreground; SIGTERM or SIGINT\n"
"drains the jobs in flight and exits 0. Under systemd it reports\n"
"readiness (Type=notify; contrib/kvtierd.service).\n"
"\n"
"  --socket PATH       the control socket (/run/kvtier/kvtierd.sock)\n"
"  --tiers SPEC        owned tiers, e.g. 'dram:8G,ssd:/var/lib/kvtier,100G'\n"
"  --model NAME|PATH   the namespace's model: preset or config.json\n"
"                      (llama-3.1-8b)\n"
"  --page-tokens P     tokens per page (16)\n"
"  --kv-dtype T        the engines' KV cache element type when it is not\n"
"                      the model's: bf16, fp16, fp32, fp8 (vLLM\n"
"                      --kv-cache-dtype fp8) (auto: the model's)\n"
"  --tp N              tensor-parallel degree of the engines (1)\n"
"  --namespace NAME    what clients name in HELLO (default)\n"
"  --tenants SPEC      'NAME:ID[,uid=U][,gid=G][,salt=S][,quota=TIER:SIZE]'\n"
"                      joined by ';'; a quota caps the tenant in that\n"
"                      tier (its own pages make room, never another's);\n"
"                      also clients=N, mem=SIZE, admin, and rkey=FILE: the\n"
"                      tenant's --remote values under a MAC key of its\n"
"                      own (docs/REMOTE.md \"Trust\")\n"
"                      (default: 'default:0' for this daemon's uid; root\n"
"                      may act as any tenant)\n"
"  --lease-ms MS       a job longer than this is cancelled (30000)\n"
"  --max-clients N     connections at once (64)\n"
"  --metrics ADDR      serve GET /metrics on HOST:PORT (off; loopback\n"
"                      127.0.0.1:9464 is the usual choice)\n"
"  --remote SPEC       a remote tier below the owned ones, shared across\n"
"                      nodes: 'remote:redis://HOST:PORT' or\n"
"                      'remote:redis-cluster://H:P,H:P,...' (docs/REMOTE.md)\n"
"  --devices LIST      devices whose memory engines will register, e.g.\n"
"                      'cuda:0,cuda:1' or 'emu' (the emulated device):\n"
"                      the tiers are page-locked and mapped for them at\n"
"                      start (a devdax fabric tier as I/O memory) instead\n"
"                      of at each device's first REGISTER\n"
"  --load-method M     loads into device memory by cuda-kernel (the\n"
"                      SM-capped gather kernel, default), cuda-batch\n"
"                      (batched copy-engine DMA: no SMs, which may disturb\n"
"                      the engine's kernels less when the GPU is\n"
"                      time-sliced) or cuda-chunk\n"
"  --store-method M    stores out of device memory: cuda-batch (default),\n"
"                      cuda-kernel, cuda-chunk\n"
"  --thread-nice N     the nice value of the cache's copy threads: 0 (as\n"
"                      started, default) to 19; on a host with few cores\n"
"                      the engines' own threads then keep their cores\n"
"                      while pages are copied (kvt_cache_config.thread_nice)\n"
"  --config FILE       options as 'name = value' lines (below the\n"
"                      environment and the flags)\n"
"\n"
"environment: KVT_SOCKET, KVT_TIERS, KVT_MODEL, KVT_PAGE_TOKENS, KVT_KV_DTYPE,\nKVT_TP, "
"KVT_NAMESPACE, KVT_TENANTS, KVT_LEASE_MS, KVT_MAX_CLIENTS, KVT_METRICS,\n"
"KVT_REMOTE, KVT_DEVICES, KVT_LOAD_METHOD, KVT_STORE_METHOD, KVT_THREAD_NICE,\n"
"KVT_LOG.\n");
}

static kvtd *g_daemon;

static void on_signal(int sig)
{
	(void)sig;
	if (g_daemon)
		kvtd_stop(g_daemon);
}

/* sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET. */
static void notify(const char *msg)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n;
	int fd;

	if (!path || !*path || (path[0] != '/' && path[0] != '@') ||
	    (n = strlen(path)) >= sizeof(sa.sun_path))
		return;
	memcpy(sa.sun_path, path, n);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = 0; /* abstract namespace */
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
		   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0) {
		/* not fatal: systemd will time the start out and say so */
	}
	close(fd);
}

/* A device copy method by name (cuda-kernel, cuda-batch, cuda-chunk). */
static int dev_method(const char *flag, const char *v, int *m)
{
	if (kvt_xfer_method_parse(v, m) || *m < KVT_XFER_CUDA_CHUNK ||
	    *m > KVT_XFER_CUDA_KERNEL)
		return cli_usage("serve", "%s '%s': cuda-kernel, cuda-batch or "
				 "cuda-chunk", flag, v);
	return 0;
}

int cmd_serve(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, 0, 's' },
		{ "tiers", required_argument, 0, 't' },
		{ "model", required_argument, 0, 'm' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "kv-dtype", required_argument, 0, 'K' },
		{ "tp", required_argument, 0, 'T' },
		{ "namespace", required_argument, 0, 'n' },
		{ "tenants", required_argument, 0, 'u' },
		{ "lease-ms", required_argument, 0, 'l' },
		{ "max-clients", required_argument, 0, 'C' },
		{ "metrics", required_argument, 0, 'M' },
		{ "remote", required_argument, 0, 'r' },
		{ "devices", required_argument, 0, 'D' },
		{ "load-method", required_argument, 0, 'L' },
		{ "store-method", required_argument, 0, 'S' },
		{ "thread-nice", required_argument, 0, 'N' },
		{ "config", required_argument, 0, 'c' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	kvtd_config cfg = { 0 };
	uint64_t P, tp, lease, maxc, nice;
	struct sigaction sa;
	kvt_opts *o;
	int c, err, rc = 0;
	kvtd *d = NULL;

	if ((err = kvt_opts_create(&o)))
		return cli_fail("serve", err);
	if ((rc = cli_opts_load(o, "serve", cli_config_arg(argc, argv))))
		goto out;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		const char *name = NULL;

		switch (c) {
		case 's': name = "socket"; break;
		case 't': name = "tiers"; break;
		case 'm': name = "model"; break;
		case 'p': name = "page_tokens"; break;
		case 'K': name = "kv_dtype"; break;
		case 'T': name = "tp"; break;
		case 'n': name = "namespace"; break;
		case 'u': name = "tenants"; break;
		case 'l': name = "lease_ms"; break;
		case 'C': name = "max_clients"; break;
		case 'M': name = "metrics"; break;
		case 'r': name = "remote"; break;
		case 'D': name = "devices"; break;
		case 'L': name = "load_method"; break;
		case 'S': name = "store_method"; break;
		case 'N': name = "thread_nice"; break;
		case 'c': break; /* read before the environment */
		case 'h': serve_usage(stdout); goto out;
		default: serve_usage(stderr); rc = CLI_EXIT_USAGE; goto out;
		}
		if (name && (err = kvt_opts_set(o, name, optarg))) {
			rc = cli_fail("serve", err);
			goto out;
		}
	}
	if (optind < argc) {
		rc = cli_usage("serve", "unexpected argument '%s'", argv[optind]);
		goto out;
	}
	if (cli_u64("--page-tokens", kvt_opts_get(o, "page_tokens"), 1, 1 << 20,
		    &P) ||
	    cli_u64("--tp", kvt_opts_get(o, "tp"), 1, 1024, &tp) ||
	    cli_u64("--lease-ms", kvt_opts_get(o, "lease_ms"), 1, 3600000,
		    &lease) ||
	    cli_u64("--max-clients", kvt_opts_get(o, "max_clients"), 1, 4096,
		    &maxc) ||
	    cli_u64("--thread-nice", kvt_opts_get(o, "thread_nice"), 0, 19,
		    &nice)) {
		rc = CLI_EXIT_USAGE;
		goto out;
	}
	if (!*kvt_opts_get(o, "tiers")) {
		rc = cli_usage("serve", "no tiers: give --tiers (e.g. "
			       "'dram:8G,ssd:/var/lib/kvtier,100G') or "
			       "KVT_TIERS");
		goto out;
	}
	cfg.socket = kvt_opts_get(o, "socket");
	cfg.tiers = kvt_opts_get(o, "tiers");
	cfg.model = kvt_opts_get(o, "model");
	cfg.kv_dtype = kvt_opts_get(o, "kv_dtype");
	cfg.ns = kvt_opts_get(o, "namespace");
	cfg.tenants = kvt_opts_get(o, "tenants");
	cfg.metrics = kvt_opts_get(o, "metrics");
	cfg.remote = kvt_opts_get(o, "remote");
	cfg.devices = kvt_opts_get(o, "devices");
	if ((rc = dev_method("--load-method", kvt_opts_get(o, "load_method"),
			     &cfg.dev_load)) ||
	    (rc = dev_method("--store-method", kvt_opts_get(o, "store_method"),
			     &cfg.dev_store)))
		goto out;
	cfg.page_tokens = (uint32_t)P;
	cfg.tp = (uint32_t)tp;
	cfg.lease_ms = (uint32_t)lease;
	cfg.max_clients = (uint32_t)maxc;
	cfg.thread_nice = (int)nice;
	if ((err = kvtd_open(&d, &cfg))) {
		rc = cli_fail("serve", err);
		goto out;
	}
	g_daemon = d;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	fprintf(stderr, "kvtier serve: serving %s on %s (tiers %s)\n",
		cfg.ns, cfg.socket, cfg.tiers);
	notify("READY=1");
	err = kvtd_run(d);
	notify("STOPPING=1");
	fprintf(stderr, "kvtier serve: draining\n");
	kvtd_close(d);
	g_daemon = NULL;
	if (err)
		rc = cli_fail("serve", err);
out:
	kvt_opts_destroy(o);
	return rc;
}
