/*
 * net.h — the simulator's fluid model of bytes in motion (internal).
 *
 * A flow moves a number of bytes over a path of resources (link
 * directions, devices) and, optionally, through one socket's DRAM. Between
 * two events every flow moves at a constant rate; whenever the set of
 * flows changes, rates are solved again:
 *
 *   1. each flow has its own cap (the copy method's rate);
 *   2. rates are max-min fair over the resources (progressive filling:
 *      raise every unfrozen flow together; freeze a flow at its cap or
 *      when one of its resources is full);
 *   3. DRAM is not a hard capacity but a queue: its latency grows with its
 *      utilisation U (M/D/1: lat = L0 * (1 + U / (2(1 - U)))), which slows
 *      latency-bound requesters. Those are the CPU's root ports (a "port"
 *      resource: device DMA enters the CPU there and the port has a fixed
 *      number of reads in flight — Little's law: rate = window / (fixed
 *      round trip + DRAM latency), the window sized to reach the port's
 *      rate at idle latency) and the CPU stressor threads (copy loops with
 *      a fixed number of misses in flight). The latency per socket is the
 *      fixed point of "traffic at this latency = capacity * U(latency)",
 *      found by bisection.
 *
 *      DRAM latency
 *        ^            stressors' demand grows -> latency rises -> every
 *        |         /  latency-bound stream slows until the traffic fits
 *        |      __/
 *        |_____/
 *        +----------> utilisation
 *
 *   4. lanes (optional): kvtier's transfer engine does not share its
 *      threads between every job at once. Its lanes (src/xfer: the cpu
 *      lane's workers, the io lane's one ring) take units of work only
 *      from the head of the highest-priority non-empty FIFO queue
 *      (kvti_queue_head()), so one job runs at a time per lane and the
 *      next one starts when the head's last unit is taken. A flow given a
 *      lane waits in its lane's queue for its priority (0 first) and runs
 *      alone on the lane; a flow of a higher priority arriving while a
 *      lower one runs takes the lane at once (the workers take its units
 *      as their current ones end: preemption at task or page granularity,
 *      which the fluid model takes as immediate), and the preempted flow
 *      goes back to the front of its queue with what it has left. Flows
 *      of different lanes run at once and share resources as above.
 *
 *        lane cpu:  [load A]  [load B]  [store C]  [demotion D]
 *                    prio 0 FIFO ----->  prio 1     prio 2
 *                   only the head (A) moves; B starts when A ends
 *
 *      What the fluid lane leaves out: the tail of a job, when fewer units
 *      are left than the lane has workers and the next job's first units
 *      already run beside them (one task of 4 MiB per spare worker).
 *
 * Invariants: a resource never carries more than its capacity; a flow
 * never exceeds its cap; bytes_in of a resource = bytes of flows started
 * on it, bytes_out = bytes of flows finished on it (equal once idle); a
 * lane runs at most one flow, and it is the head of the highest-priority
 * non-empty queue; a waiting flow has rate 0 and is not counted on its
 * resources (nactive, busy_s).
 * Single-threaded: one simulation owns one net.
 */
#ifndef KVT_SIM_NET_H
#define KVT_SIM_NET_H

#include "core/core.h"

#define NET_MAX_HOPS 5
#define NET_NPRIO 3     /* lane priorities, 0 first (the transfer engine's) */
#define NET_MAX_LANES 4

struct net_res {
	char name[32];
	double cap;          /* bytes/s */
	int socket;          /* a root port into this socket's DRAM, or -1 */
	double lfix;         /* port: fixed round trip of its reads, s */
	double window;       /* port: bytes in flight */
	double bytes_in, bytes_out, busy_s;
	uint32_t nactive;    /* flows on it now */
	/* solver scratch */
	double left;
	uint32_t nfree;
};

struct net_flow;
typedef void (*net_done_fn)(void *arg, struct net_flow *f, double now);

struct net_flow {
	uint32_t res[NET_MAX_HOPS];
	uint32_t nres;
	int socket;          /* DRAM socket it goes through, -1: none */
	double amp;          /* DRAM bytes per byte moved */
	double cap;          /* own rate limit, bytes/s (0: none) */
	double total, remaining, rate;
	double start;
	net_done_fn done;
	void *arg;
	uint64_t tag;        /* the caller's */
	uint64_t owner;      /* the caller's too (sim: request of a store) */
	int lane;            /* its lane, -1 (flow_new's): none, runs at once */
	int prio;            /* on a lane: 0 (first) .. NET_NPRIO - 1 */
	double run_start;    /* when it first moved (= start without a lane) */
	/* private */
	uint32_t slot;       /* index in net->act */
	int frozen;
	int waiting;         /* queued on its lane, not moving */
	struct net_flow *qnext;
};

/* One lane of the transfer engine: FIFO queues per priority, one flow
 * running (see above). */
struct net_lane {
	char name[32];
	struct net_flow *head[NET_NPRIO], *tail[NET_NPRIO];
	struct net_flow *cur;   /* the flow moving now, NULL: idle */
	uint64_t flows;         /* flows that ran on it */
	uint64_t preempted;     /* times a running flow gave way */
	double wait_s;          /* summed submit-to-first-move time */
};

struct net_socket {
	uint32_t res;        /* its resource (accounting only) */
	double cap;          /* sustainable bytes/s */
	double lat0;         /* idle latency, s */
	double lat;          /* latency now */
	uint32_t stressors;  /* CPU copy threads on it */
	double stress_rate;  /* one stressor's copy rate now, bytes/s */
};

struct net {
	struct net_res *res;
	uint32_t nres, res_cap;
	struct net_socket sock[8];
	uint32_t nsock;
	double dma_window;   /* in units of rate x idle round trip */
	double stress_cap;   /* one stressor's idle copy rate, bytes/s */
	struct net_lane lane[NET_MAX_LANES];
	uint32_t nlane;
	struct net_flow **act;   /* every started flow, waiting ones too */
	uint32_t nact, act_cap;
	struct net_flow *free_list; /* recycled flows (linked by arg) */
	double now;
	double stress_bytes; /* bytes the stressors copied */
	uint64_t solves;
};

int kvti_net_init(struct net *n, double dma_window, double stress_cap);
void kvti_net_fini(struct net *n);
/* A resource; returns its index or -ENOMEM. */
int kvti_net_add_res(struct net *n, const char *name, double cap);
/* A root port into socket @socket's DRAM: a resource whose rate falls as
 * DRAM latency rises (see above); index or -ENOMEM. */
int kvti_net_add_port(struct net *n, const char *name, double cap,
		      int socket, double lfix);
/* A DRAM socket with its accounting resource; index or -ENOMEM/-E2BIG. */
int kvti_net_add_socket(struct net *n, const char *name, double cap,
			double lat0);
/* A lane (see above); its index or -E2BIG. */
int kvti_net_add_lane(struct net *n, const char *name);
/* A zeroed flow to fill and start (NULL: out of memory); lane -1. */
struct net_flow *kvti_net_flow_new(struct net *n);
/* Start @f at the net's current time: it joins the active set (rates are
 * solved again), on its lane (f->lane, f->prio) when it has one: running
 * if the lane is idle or runs a lower priority, else queued. 0, -EINVAL
 * (a bad lane or priority) or -ENOMEM (then @f is freed). A flow of 0
 * bytes takes no lane and completes at the next kvti_net_complete(). */
int kvti_net_flow_start(struct net *n, struct net_flow *f);
/* Move every flow forward to time @t (>= now) at the current rates. */
void kvti_net_advance(struct net *n, double t);
/* Earliest completion among active flows (INFINITY if none). */
double kvti_net_next(const struct net *n);
/* Advance to @t and finish every flow that is done by then: each one's
 * callback runs (it may start new flows), the flow is recycled, and rates
 * are solved again. Returns the number finished. */
uint32_t kvti_net_complete(struct net *n, double t);
/* Solve the rates again (after starting flows). */
void kvti_net_solve(struct net *n);
/* When @f will be done at current rates (INFINITY if stalled); a flow
 * waiting on its lane: after the running one and every flow queued before
 * it, at the running one's rate (its own cap when the lane is idle). */
double kvti_net_eta(const struct net *n, const struct net_flow *f);
/* Set the stressor threads on socket @s. */
void kvti_net_set_stress(struct net *n, uint32_t s, uint32_t threads);

#endif
