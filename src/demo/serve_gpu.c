/*
 * serve_gpu.c — the emulated GPU of a demo pass and the jobs it waits for.
 *
 *   step      takes the cost model's time, spent layer by layer on the wall
 *             clock (sleep, then spin the last 50 us); before layer l it
 *             waits for layer l of every load of its requests (layer-wise
 *             policies) or for whole loads (before layer 0); during layer
 *             l it writes layer l of every page the step completes (the
 *             layers the engine checks: bytes.c). Time
 *             past the modeled span is counted (overrun: writing pages
 *             took longer than the layer; late: the step as a whole).
 *   kvti_sv_reap      every job that is done: a load's pages up to the first
 *             failed one are queued for the engine's check (below), and the
 *             engine told when all of a request's loads are home; a store's
 *             blocks are let go and its pages leave the transient table.
 *   checks    the engine's own check of every restored block
 *             (kvti_dmem_check), a test harness's check no serving engine
 *             makes: run in the thread's slack while no copy runs — while
 *             the emulated GPU's layer has time to spare, and in idle
 *             waits — and at the
 *             latest before the block is reused or the pass ends. Run
 *             inline after each load (as it was until 2026-12-07) it took
 *             the step thread about 1 ms between a step's end and its
 *             first tokens, on two cores shared with the copy workers.
 *
 * Runs on the pass's one thread, between the engine's plans.
 */
#include "demo/serve_impl.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

#define SPIN_NS 50000u  /* spin, not sleep, for the last 50 us of a span */

/* ---- jobs done -------------------------------------------------------------- */

static void job_unlink(struct serve *s, struct pjob *x)
{
	for (struct pjob **pp = &s->jobs; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			s->njobs--;
			return;
		}
}

/* A load job is done: which pages came, checked by the engine too. */
static void load_end(struct serve *s, struct pjob *x, int rc)
{
	struct dreq *r = x->r;
	kvt_demo_req *o;
	kvt_cache_job_stat st;
	long nf;
	uint32_t ok = x->end;

	if (!r)
		return;
	s->bd_loads++;
	kvti_dj_stat(x->j, &st);
	s->bd_ld_actual += st.total_s;
	s->bd_ld_room += st.wait_s;
	s->bd_ld_l0 += st.layer0_s;
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		if (x->bytes[t] > 0) {
			s->bd_ld_bytes += x->bytes[t];
			s->bd_ld_expect += s->gbps[t] > 0 ?
				x->bytes[t] / (s->gbps[t] * 1e9) : 0;
		}
	o = r->out;
	nf = kvti_dj_failed(x->j, s->failed, x->end - x->first);
	if (nf > 0) {
		/* the first failed page: the request computes from there */
		for (uint32_t p = x->first; p < x->end && ok == x->end; p++)
			for (long f = 0; f < nf; f++)
				if (s->failed[f] == r->blk[p]) {
					ok = p;
					break;
				}
		o->failed_pages += (uint64_t)nf;
		o->failed_busy += st.busy;
		o->failed_absent += st.absent;
	} else if (rc && rc != -ECANCELED) {
		ok = x->first;
	}
	if (rc && rc != KVT_ENOTFOUND && rc != KVT_EBUSY && rc != -ECANCELED &&
	    !(nf > 0 && rc == KVT_ECORRUPT))
		kvti_sv_fail(s, rc, "load");
	if (ok > x->first && s->pc->tamper && s->c->tamper_engine_after &&
	    !s->tampered_engine && s->finished >= s->c->tamper_engine_after) {
		kvti_warn("demo: spoiling engine block %u after its load "
			  "(test hook)", r->blk[x->first]);
		kvti_dmem_spoil(&s->mem, r->blk[x->first]);
		s->tampered_engine = 1;
	}
	for (uint32_t p = x->first; p < ok; p++)
		kvti_sv_check_defer(s, r->blk[p], kvti_page_seed(r->keys[p]), o);
	if (ok < x->end)
		r->fail_at = KVT_MIN(r->fail_at, ok);
	r->nloads--;
	if (--r->er.load_flows)
		return;
	/* every load home: the prefix up to the first failure is good */
	o->loads_home = kvti_sv_now(s);
	r->landed = KVT_MIN(r->er.load_upto, r->fail_at * s->P);
	r->fail_at = UINT32_MAX;
	kvti_eng_loads_done(&s->eng, &r->er, r->landed);
}

static void store_end(struct serve *s, struct pjob *x, int rc)
{
	kvt_cache_job_stat st;

	kvti_dj_stat(x->j, &st);
	s->bd_stores++;
	s->bd_st_room += st.wait_s;
	s->bd_st_total += st.total_s;
	if (rc == KVT_EFULL || rc == KVT_ENOTFOUND) {
		/* no room for some pages (every tier full of leased pages), or
		 * a parent gone: those pages are not cached; counted */
		long nf = kvti_dj_failed(x->j, s->failed, x->end - x->first);

		s->store_skipped += nf > 0 ? (uint64_t)nf : x->end - x->first;
	} else if (rc && rc != -ECANCELED) {
		kvti_sv_fail(s, rc, "store");
	}
	for (uint32_t i = 0; i < x->end - x->first; i++) {
		uint32_t b = x->blocks[i];

		if (--s->bref[b] == 0 && s->borphan[b])
			kvti_sv_block_put(s, b);
	}
	if (x->r) /* committed: no longer transient */
		kvti_tt_drop(s, x->r, x->first, x->end);
	kvti_eng_storing_sub(&s->eng, x->owner, x->end - x->first);
	kvti_eng_store_done(&s->eng, x->tag);
}

/* Collect every job that is done. @block: wait for one first. */
void kvti_sv_reap(struct serve *s)
{
	struct pjob *x, *next;

	kvti_dplane_drain_fd(&s->dp);
	for (x = s->jobs; x; x = next) {
		int rc;

		next = x->next;
		if ((rc = kvti_dj_poll(x->j)) == -EINPROGRESS)
			continue;
		job_unlink(s, x);
		if (x->store)
			store_end(s, x, rc);
		else
			load_end(s, x, rc);
		kvti_dj_free(x->j);
		kvt_free(x->blocks);
		kvt_free(x);
		next = s->jobs; /* the lists moved under us: start over */
	}
}

/* ---- the engine's checks of restored blocks --------------------------------- */

#define CHECK_NS 20000u /* one block's check, with room to spare (~5 us) */

static void check_one(struct serve *s, uint32_t b)
{
	kvt_demo_req *o = s->chk_out[b];

	s->chk_pending[b] = 0;
	o->engine_checked++;
	if (!kvti_dmem_check(&s->mem, b, s->chk_seed[b]))
		return;
	o->engine_bad++;
	if (!s->err) {
		s->err = KVT_ECORRUPT;
		snprintf(s->out->error, sizeof(s->out->error),
			 "demo %s: session %u turn %u: a restored block holds "
			 "wrong bytes", s->out->policy, o->session, o->turn);
	}
}

/* The oldest entry of the FIFO (already checked ones are skipped). */
static void check_pop(struct serve *s)
{
	uint32_t b = s->chk_q[s->chk_head++ % s->chk_cap];

	if (s->chk_pending[b])
		check_one(s, b);
}

void kvti_sv_check_defer(struct serve *s, uint32_t b, uint64_t seed,
			 kvt_demo_req *o)
{
	s->chk_seed[b] = seed;
	s->chk_out[b] = o;
	if (s->chk_pending[b])
		return; /* queued already: checks what it holds now */
	while (s->chk_tail - s->chk_head >= s->chk_cap)
		check_pop(s);
	s->chk_pending[b] = 1;
	s->chk_q[s->chk_tail++ % s->chk_cap] = b;
}

void kvti_sv_check_run(struct serve *s, uint64_t deadline_ns)
{
	while (s->chk_head != s->chk_tail) {
		if (deadline_ns && kvt_now_ns() + CHECK_NS > deadline_ns)
			return;
		check_pop(s);
	}
}

void kvti_sv_check_block(struct serve *s, uint32_t b)
{
	if (s->chk_pending[b])
		check_one(s, b);
}

/* ---- the emulated GPU ------------------------------------------------------- */

/* Spend the time until @deadline, the engine's pending checks first while
 * they fit and no copy runs (they would take its CPU: on two cores the
 * copies of a layer-wise load ran 17 -> 22 ms with the checks beside them);
 * returns how late it ended (ns). */
static uint64_t spend_until(struct serve *s, uint64_t deadline)
{
	if (!s->njobs)
		kvti_sv_check_run(s, deadline - SPIN_NS);
	for (;;) {
		uint64_t now = kvt_now_ns();
		struct timespec ts;

		if (now >= deadline)
			return now - deadline;
		if (deadline - now > SPIN_NS) {
			uint64_t t = deadline - SPIN_NS;

			ts.tv_sec = (time_t)(t / 1000000000ull);
			ts.tv_nsec = (long)(t % 1000000000ull);
			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		}
	}
}

/* Wait for layer @l of every load of the step's requests (@whole: for the
 * whole loads, before layer 0). *@blocked: one was not home yet (the wait
 * blocked). Returns when the last of them landed (kvt_cache_job_layer_ns():
 * the copy's own instant, not this thread's wake-up), 0 when one's instant
 * is unknown (a daemon that stamps none): then the caller's wake-up is all
 * there is. */
static uint64_t wait_loads(struct serve *s, uint32_t l, int whole,
			   int *blocked)
{
	uint64_t land = 0;
	int unknown = 0;

	*blocked = 0;
	for (struct pjob *x = s->jobs; x; x = x->next) {
		uint64_t at;

		if (x->store || !x->r || !x->r->er.in_step)
			continue;
		if ((whole ? kvti_dj_wait(x->j, 0) :
			     kvti_dj_wait_layer(x->j, l, 0)) == -ETIMEDOUT) {
			*blocked = 1;
			if (whole)
				kvti_dj_wait(x->j, -1);
			else
				kvti_dj_wait_layer(x->j, l, -1);
		}
		/* home (or failed: go on); a whole load is home when its
		 * last layer is */
		at = kvti_dj_layer_ns(x->j, whole ? s->L - 1 : l);
		if (!at)
			unknown = 1;
		land = KVT_MAX(land, at);
	}
	return unknown ? 0 : land;
}

void kvti_sv_gpu_step(struct serve *s)
{
	struct kvti_eng *e = &s->eng;
	int overlap = e->overlap;
	uint64_t t = kvt_now_ns(), t0 = t;
	uint64_t per = (uint64_t)(e->compute_s / s->L * 1e9);
	double wait0 = s->load_wait_s, over0 = s->overrun_s;
	int busy = s->njobs != 0;

	s->step_due = 0;
	s->bd_steps[busy]++;
	s->bd_pre[busy] += kvti_sv_now(s) - e->t0;
	s->bd_model[busy] += e->compute_s;
	if (!e->step_prefills) { /* decodes only */
		s->bd_sleep[busy] += spend_until(s, t + (uint64_t)(e->compute_s *
							      1e9)) / 1e9;
		s->late_s += KVT_MAX(0.0, (double)(kvt_now_ns() - t) / 1e9 -
					   e->compute_s);
		s->bd_wall[busy] += (double)(kvt_now_ns() - t0) / 1e9;
		return;
	}
	for (uint32_t l = 0; l < s->L; l++) {
		uint64_t w1, end, land = 0, start;
		int blocked = 0;

		if (!overlap && l == 0)
			land = wait_loads(s, 0, 1, &blocked);
		else if (overlap)
			land = wait_loads(s, l, 0, &blocked);
		w1 = kvt_now_ns();
		/* the GPU runs layer l from when the previous one ends (t, on
		 * the modeled schedule) or, if its loads landed later, from
		 * when they landed — the copy's instant, as a stream waiting
		 * on the copy's event starts, not when this thread woke: a
		 * late wake-up of this thread (the sleep below, a wait's
		 * wake-up, descheduled on a loaded host) is not GPU time; a
		 * GPU's layers run back to back whatever its host thread does.
		 * Where the instant is unknown the wake-up stands in for it. */
		if (blocked && !land)
			land = w1;
		start = KVT_MAX(t, land);
		if (blocked && w1 > land) {
			s->bd_wake_s += (double)(w1 - land) / 1e9;
			s->bd_wakes++;
		}
		s->load_wait_s += (double)(start - t) / 1e9;
		end = start + per;
		for (uint32_t i = 0; i < e->nrun; i++) {
			struct dreq *r = kvti_dq(e->run[i]);
			uint32_t a, b;

			if (!r->er.in_step || r->er.state != ER_PREFILL)
				continue;
			/* pages whose last token this step computes */
			a = r->er.done / s->P;
			b = KVT_MIN((r->er.done + r->er.step_compute) / s->P,
				    r->er.prompt / s->P);
			for (uint32_t p = a; p < b; p++)
				kvti_dmem_write_layer(&s->mem, r->blk[p], l,
						      kvti_page_seed(r->keys[p]));
		}
		w1 = kvt_now_ns();
		if (w1 > end) {
			s->overrun_s += (double)(w1 - end) / 1e9;
			end = w1;
		}
		s->bd_sleep[busy] += spend_until(s, end) / 1e9;
		t = end;
	}
	s->bd_wall[busy] += (double)(kvt_now_ns() - t0) / 1e9;
	s->bd_wait[busy] += s->load_wait_s - wait0;
	s->bd_write[busy] += s->overrun_s - over0;
	kvti_debug("demo: prefill step: modeled %.3f ms, wall %.3f (load wait "
		   "%.3f, writes over %.3f), %u jobs in flight",
		   e->compute_s * 1e3, (double)(kvt_now_ns() - t0) / 1e6,
		   (s->load_wait_s - wait0) * 1e3,
		   (s->overrun_s - over0) * 1e3, s->njobs);
	{
		double late = KVT_MAX(0.0, (double)(kvt_now_ns() - t0) / 1e9 -
					   e->compute_s -
					   (s->load_wait_s - wait0));

		s->late_s += late;
		s->late_pf_s += late;
	}
}

