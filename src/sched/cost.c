/*
 * cost.c — the scheduler's cost model: what moving KV and running a forward
 * pass take, from a hardware profile's figures and a model's geometry.
 *
 * COPIES. A copy method moves a stream of chunks. Its engine (copy engine
 * or kernel) reaches a data rate that depends on the chunk size — a
 * measured curve, interpolated in log-log space — and each call costs CPU
 * time. Per-chunk methods (one cudaMemcpyAsync per chunk, one object copy
 * per LMCache object) pay the call on every chunk, so
 *
 *     rate = chunk / (call + chunk / curve(chunk))
 *
 * and batched methods (one cudaMemcpyBatchAsync, one kernel launch) pay it
 * once per job. No method beats the link's contiguous-copy rate. (In the
 * simulator one CPU thread per GPU issues the per-chunk calls, so their
 * rate bounds the GPU's total, not each stream's: src/sim/sim.c.)
 *
 *     curve (GB/s), testbed profiles
 *      54 |                  ___________________ contig / object
 *      48 |      ___------                gather (a curve too)
 *      38 |   /         _--                batch
 *      14 |  /        /
 *       7 | /    __--
 *       4 |/__--
 *         +--------------------------------- chunk bytes (log)
 *          4K  16K  64K  256K   16M
 *
 * COMPUTE. A forward pass is a roofline per part: GEMMs are FLOP-bound
 * (2 * active params per token) unless the batch is small, when streaming
 * the weights from HBM bounds them; attention is FLOP-bound in prefill
 * (4 * L * heads * D per (query, key) pair, half the square for the new
 * tokens themselves) and bandwidth-bound in decode (every context token's
 * KV read once); tensor parallelism adds two all-reduces per layer. The
 * efficiencies are the fractions of peak those kernels reach; the hardware
 * profiles give them as assumptions (docs/SIMULATOR.md section 3: the vLLM
 * blog's H100 prefill times imply higher ones).
 *
 * Everything here is a pure function of its arguments.
 */
#include "core/core.h"

#include <kvtier/sched.h>

#include <errno.h>
#include <math.h>
#include <string.h>

static const char *const method_names[KVT_COPY_COUNT] = {
	"contig", "memcpy", "batch", "gather", "object",
};

const char *kvt_copy_method_name(kvt_copy_method m)
{
	return (unsigned)m < KVT_COPY_COUNT ? method_names[m] : NULL;
}

int kvt_copy_method_parse(const char *s, kvt_copy_method *out)
{
	for (int i = 0; s && i < KVT_COPY_COUNT; i++)
		if (kvti_streq_ci(s, method_names[i])) {
			*out = (kvt_copy_method)i;
			return 0;
		}
	return kvti_fail(-EINVAL, "unknown copy method '%s' (contig, memcpy, "
			 "batch, gather, object)", s ? s : "(null)");
}

int kvt_cost_set_model(kvt_cost *c, const kvt_geom *g)
{
	if (!g->params || !g->active_params || !g->q_heads || !g->hidden ||
	    !g->layers || !g->tp_size)
		return kvti_fail(KVT_EGEOM, "model '%s' lacks the figures the "
				 "cost model needs (params, q_heads, hidden)",
				 g->name);
	c->layers = g->layers;
	c->tp = g->tp_size;
	c->q_heads = g->q_heads;
	/* MLA's head_dim is the latent; attention still runs per head on
	 * 128-dim values (DeepSeek-V3: 128 + 64 rope for q.k), so price it
	 * as 128-dim heads — an approximation, within ~1.5x. */
	c->head_dim = g->mla ? 128 : g->head_dim;
	c->hidden = g->hidden;
	c->page_tokens = g->page_tokens;
	c->active_params = g->active_params;
	c->token_bytes = kvt_geom_token_bytes(g);
	c->chunk_bytes = kvt_geom_chunk_bytes(g);
	c->weight_bytes = g->params * g->dtype_bytes / g->tp_size;
	return 0;
}

static int frac_ok(double f)
{
	return f > 0 && f <= 1;
}

static int curve_check(const kvt_copy_curve *k, const char *name)
{
	if (k->n > KVT_CURVE_MAX)
		return kvti_fail(KVT_ECONFIG, "copy curve %s: %u points (max %d)",
				 name, k->n, KVT_CURVE_MAX);
	for (uint32_t i = 0; i < k->n; i++) {
		if (!(k->chunk_bytes[i] > 0) || !(k->gbps[i] > 0))
			return kvti_fail(KVT_ECONFIG, "copy curve %s: point %u "
					 "is not positive", name, i);
		if (i && k->chunk_bytes[i] <= k->chunk_bytes[i - 1])
			return kvti_fail(KVT_ECONFIG, "copy curve %s: chunk "
					 "sizes must increase", name);
	}
	if (k->call_us < 0)
		return kvti_fail(KVT_ECONFIG, "copy curve %s: negative call "
				 "cost", name);
	return 0;
}

int kvt_cost_check(const kvt_cost *c)
{
	int err;

	if (!(c->gpu_flops > 0))
		return kvti_fail(KVT_ECONFIG, "cost: gpu_flops must be > 0");
	if (!frac_ok(c->gemm_eff) || !frac_ok(c->attn_eff) ||
	    !frac_ok(c->hbm_eff))
		return kvti_fail(KVT_ECONFIG, "cost: efficiencies must be in "
				 "(0, 1]");
	if (!(c->hbm_gbps > 0) || !(c->link_gbps > 0))
		return kvti_fail(KVT_ECONFIG, "cost: hbm_gbps and link_gbps "
				 "must be > 0");
	if (c->step_us < 0 || c->ar_us < 0)
		return kvti_fail(KVT_ECONFIG, "cost: negative step_us or ar_us");
	if (c->tp > 1 && !(c->ar_gbps > 0))
		return kvti_fail(KVT_ECONFIG, "cost: tp %u needs ar_gbps > 0",
				 c->tp);
	if (!c->layers || !c->tp || !c->token_bytes || !c->page_tokens)
		return kvti_fail(KVT_ECONFIG, "cost: model figures not set "
				 "(kvt_cost_set_model)");
	for (int m = 0; m < KVT_COPY_COUNT; m++)
		if ((err = curve_check(&c->copy[m], method_names[m])))
			return err;
	if (!c->copy[KVT_COPY_CONTIG].n)
		return kvti_fail(KVT_ECONFIG, "cost: the contig copy curve is "
				 "required");
	return 0;
}

/* The curve's rate at @x bytes: log-log interpolation, ends held. */
static double curve_at(const kvt_copy_curve *k, double x)
{
	uint32_t i;
	double t;

	if (x <= k->chunk_bytes[0] || k->n == 1)
		return k->gbps[0];
	if (x >= k->chunk_bytes[k->n - 1])
		return k->gbps[k->n - 1];
	for (i = 1; i < k->n && k->chunk_bytes[i] < x; i++)
		;
	t = log(x / k->chunk_bytes[i - 1]) /
	    log(k->chunk_bytes[i] / k->chunk_bytes[i - 1]);
	return exp(log(k->gbps[i - 1]) +
		   t * (log(k->gbps[i]) - log(k->gbps[i - 1])));
}

static int per_chunk_call(kvt_copy_method m)
{
	return m == KVT_COPY_MEMCPY || m == KVT_COPY_OBJECT;
}

double kvt_cost_copy_gbps(const kvt_cost *c, kvt_copy_method m,
			  uint64_t chunk_bytes)
{
	const kvt_copy_curve *k;
	double r;

	if ((unsigned)m >= KVT_COPY_COUNT || !c->copy[m].n || !chunk_bytes)
		return 0;
	k = &c->copy[m];
	r = curve_at(k, (double)chunk_bytes);
	if (per_chunk_call(m))
		r = (double)chunk_bytes /
		    (k->call_us * 1e3 + (double)chunk_bytes / r);
	return KVT_MIN(r, c->link_gbps);
}

double kvt_cost_copy_s(const kvt_cost *c, kvt_copy_method m,
		       uint64_t chunk_bytes, uint64_t bytes)
{
	double r = kvt_cost_copy_gbps(c, m, chunk_bytes);

	if (!bytes)
		return 0;
	if (r <= 0)
		return 1e30;
	return (per_chunk_call(m) ? 0 : c->copy[m].call_us * 1e-6) +
	       (double)bytes / (r * 1e9);
}

uint64_t kvt_cost_method_chunk(const kvt_cost *c, kvt_copy_method m,
			       uint32_t object_tokens)
{
	switch (m) {
	case KVT_COPY_OBJECT:
		return (uint64_t)(object_tokens ? object_tokens : 256) *
		       c->token_bytes;
	case KVT_COPY_CONTIG:
		return 64ull << 20;
	default:
		return c->chunk_bytes;
	}
}

double kvt_cost_step_s(const kvt_cost *c, const kvt_cost_prefill *p, size_t n,
		       uint32_t decodes, uint64_t decode_ctx)
{
	double tokens = decodes, pairs = 0, gemm, attn, ar = 0, rate;

	for (size_t i = 0; i < n; i++) {
		double t = p[i].tokens;

		tokens += t;
		pairs += t * p[i].context + t * (t + 1) / 2;
	}
	if (tokens <= 0)
		return 0;
	rate = c->gpu_flops * c->tp;
	gemm = 2.0 * (double)c->active_params * tokens / (rate * c->gemm_eff);
	gemm = KVT_MAX(gemm, (double)c->weight_bytes /
				     (c->hbm_gbps * 1e9 * c->hbm_eff));
	attn = 4.0 * c->layers * c->q_heads * c->head_dim * pairs /
	       (rate * c->attn_eff);
	attn += (double)decode_ctx * (double)c->token_bytes /
		(c->hbm_gbps * 1e9 * c->hbm_eff);
	if (c->tp > 1) {
		double bytes = tokens * c->hidden * 2.0;

		ar = 2.0 * c->layers *
		     (c->ar_us * 1e-6 + 2.0 * (c->tp - 1) / c->tp * bytes /
						(c->ar_gbps * 1e9));
	}
	return gemm + attn + ar + c->step_us * 1e-6;
}

double kvt_cost_prefill_s(const kvt_cost *c, uint32_t tokens, uint32_t context)
{
	kvt_cost_prefill p = { tokens, context };

	return kvt_cost_step_s(c, &p, 1, 0, 0);
}

double kvt_cost_overlap_s(const kvt_cost *c, double compute_s, double load_s,
			  int overlap)
{
	double L = c->layers ? c->layers : 1;

	if (load_s <= 0)
		return compute_s;
	if (!overlap)
		return load_s + compute_s;
	return KVT_MAX(compute_s + load_s / L, load_s + compute_s / L);
}
