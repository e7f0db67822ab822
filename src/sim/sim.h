/*
 * sim.h — the run: clock, events, topology, results (internal). The engine
 * calls back into these; sim.c holds the picture.
 */
#ifndef KVT_SIM_SIM_H
#define KVT_SIM_SIM_H

#include "sim/engine.h"

enum ev_type { EV_ARRIVAL = 1, EV_NET, EV_STEP };

struct ev {
	double t;
	uint64_t seq;          /* insertion order: breaks ties */
	int type;
	void *p;
	uint64_t gen;
};

/* Per GPU: the resources its transfers cross. */
struct gpu_res {
	int h2d, d2h;          /* its link (a CPU root port unless uplinked) */
	int up_h2d, up_d2h;    /* the shared switch port, -1 if none */
	int fab_out, fab_in;   /* link to its fabric controller, -1 if none */
	int fab_dev;           /* the controller's memory */
	int issue_ld, issue_st;/* the CPU thread issuing one copy call per
				* chunk (per-chunk methods), -1 if none */
	int socket;
};

struct dvec {
	double *v;
	uint64_t n, cap;
};

struct sim {
	const kvt_sim_config *cfg;
	kvt_sim_result *res;
	double now;
	struct ev *heap;
	uint32_t nheap, heap_cap;
	uint64_t seq, events;
	struct net net;
	uint64_t net_gen;
	int net_dirty;
	struct gpu_res gpu[KVT_MAX_GPUS * 4];
	int ssd_rd, ssd_wr;
	int cpu_copy;          /* host.copy_gbps: every flow crosses it, -1 */
	int lane_cpu, lane_io; /* with cpu_copy: the transfer engine's lanes
				* (net.h), -1 without */
	struct wl wl;
	struct engine *eng;
	uint32_t neng;
	uint64_t next_id;
	int hbm_reuse;
	int error;             /* first error inside a callback */
	uint64_t flow_owner;   /* owner of the flows kvti_sim_flow starts */
	/* finished requests, for the statistics */
	struct dvec ttft, warm_ttft, tpot, e2e;
	double first_arrival, last_finish;  /* measured requests */
	int first_arrival_set;
	double run_start, run_end;          /* all requests */
	int run_start_set;
	uint64_t prompt_tokens, output_tokens, finished, measured;
	uint64_t generated_reqs;
	double load_bytes[KVT_TIER_COUNT], store_bytes[KVT_TIER_COUNT];
};

int kvti_sim_push(struct sim *s, double t, int type, void *p, uint64_t gen);
/* Start a flow moving @bytes per rank of engine @e from @src to @dst tier
 * (hbm is the GPU side) on GPU @gpu with rate cap @cap (0: none). The
 * callback gets @arg. 0 or -ENOMEM. */
int kvti_sim_flow(struct sim *s, uint32_t gpu, kvt_tier_kind src,
		  kvt_tier_kind dst, double bytes, double cap,
		  net_done_fn done, void *arg, uint64_t tag);
/* A copy by the host's CPU alone, on the cpu lane at load priority: only
 * the host's copy resource (host.copy_gbps) carries it — the second hop of
 * an ssd load through the cache's bounce (engine.c). 0, -EINVAL when the
 * host has no lanes, -ENOMEM. */
int kvti_sim_flow_host(struct sim *s, double bytes, double cap,
		       net_done_fn done, void *arg, uint64_t tag);
/* A request is over: statistics, the next turn. */
int kvti_sim_finished(struct sim *s, struct sreq *r);
/* The model's geometry for this run (preset or config.json path). */
int kvti_sim_geom(const kvt_sim_config *c, kvt_geom *g);

#endif
