/*
 * geom.c — model geometry: presets, Hugging Face config.json, TP split.
 *
 * A geometry is the KV shape on one tensor-parallel rank (see
 * include/kvtier/geom.h for the formulas). Presets carry the figures of the
 * published model configs; kvt_geom_from_config() reads the same figures
 * from a config.json so any model can be described without code.
 */
#include "core/core.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/*
 * Presets. Source: each model's config.json on the Hugging Face hub
 * (num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
 * hidden_size, torch_dtype) and the parameter counts of its model card.
 * DeepSeek-V3 is MLA: head_dim is kv_lora_rank 512 + qk_rope_head_dim 64.
 */
static const struct preset {
	const char *name;
	uint32_t layers, q_heads, kv_heads, head_dim, hidden, mla;
	double params, active;
} presets[] = {
	/* name                L   qh  kvh  D    hidden mla params  active */
	{ "llama-3.2-1b",      16, 32, 8,  64,  2048, 0, 1.24e9, 1.24e9 },
	{ "llama-3.2-3b",      28, 24, 8,  128, 3072, 0, 3.21e9, 3.21e9 },
	{ "llama-3.1-8b",      32, 32, 8,  128, 4096, 0, 8.03e9, 8.03e9 },
	{ "llama-3.1-70b",     80, 64, 8,  128, 8192, 0, 70.6e9, 70.6e9 },
	{ "qwen2.5-7b",        28, 28, 4,  128, 3584, 0, 7.62e9, 7.62e9 },
	{ "qwen2.5-14b",       48, 40, 8,  128, 5120, 0, 14.7e9, 14.7e9 },
	{ "qwen2.5-32b",       64, 40, 8,  128, 5120, 0, 32.5e9, 32.5e9 },
	{ "qwen2.5-72b",       80, 64, 8,  128, 8192, 0, 72.7e9, 72.7e9 },
	{ "mistral-small-24b", 40, 32, 8,  128, 5120, 0, 23.6e9, 23.6e9 },
	{ "deepseek-v3",       61, 128, 1, 576, 7168, 1, 671e9,  37e9 },
};

const char *kvt_geom_preset_name(size_t i)
{
	return i < KVT_ARRAY_SIZE(presets) ? presets[i].name : NULL;
}

/* "meta-llama/Llama-3.1-8B-Instruct" -> "llama-3.1-8b" */
static void normalize(const char *in, char *out, size_t n)
{
	static const char *suffixes[] = { "-instruct", "-chat", "-base",
					  "-2501", "-2503" };
	const char *slash = strrchr(in, '/');
	size_t k = 0, l;

	if (slash)
		in = slash + 1;
	if (!strncasecmp(in, "meta-", 5))
		in += 5;
	for (; *in && k + 1 < n; in++)
		out[k++] = (char)tolower((unsigned char)*in);
	out[k] = '\0';
	for (int again = 1; again;) {
		again = 0;
		for (size_t i = 0; i < KVT_ARRAY_SIZE(suffixes); i++) {
			size_t s = strlen(suffixes[i]);
			l = strlen(out);
			if (l > s && !strcmp(out + l - s, suffixes[i])) {
				out[l - s] = '\0';
				again = 1;
			}
		}
	}
}

int kvt_geom_finish(kvt_geom *g)
{
	if (g->layers < 1 || g->layers > 1024)
		return kvti_fail(KVT_EGEOM, "layers %u out of range 1..1024",
				 g->layers);
	if (g->kv_heads_total < 1 || g->kv_heads_total > 1024)
		return kvti_fail(KVT_EGEOM, "KV heads %u out of range 1..1024",
				 g->kv_heads_total);
	if (g->head_dim < 1 || g->head_dim > 16384)
		return kvti_fail(KVT_EGEOM, "head dim %u out of range 1..16384",
				 g->head_dim);
	if (g->dtype_bytes != 1 && g->dtype_bytes != 2 && g->dtype_bytes != 4)
		return kvti_fail(KVT_EGEOM, "dtype of %u bytes (1, 2 or 4)",
				 g->dtype_bytes);
	if (g->page_tokens < 1 || g->page_tokens > (1u << 20))
		return kvti_fail(KVT_EGEOM, "page of %u tokens out of range "
				 "1..1048576", g->page_tokens);
	if (g->tp_size < 1 || g->tp_size > 1024)
		return kvti_fail(KVT_EGEOM, "TP size %u out of range 1..1024",
				 g->tp_size);
	if (g->tp_rank >= g->tp_size)
		return kvti_fail(KVT_EGEOM, "TP rank %u not below TP size %u",
				 g->tp_rank, g->tp_size);
	if (g->mla) {
		g->kv_heads_total = 1;
		g->kv_heads = 1; /* every rank holds the whole latent */
	} else if (g->kv_heads_total >= g->tp_size) {
		if (g->kv_heads_total % g->tp_size)
			return kvti_fail(KVT_EGEOM,
					 "%u KV heads cannot be split evenly "
					 "over %u TP ranks", g->kv_heads_total,
					 g->tp_size);
		g->kv_heads = g->kv_heads_total / g->tp_size;
	} else {
		if (g->tp_size % g->kv_heads_total)
			return kvti_fail(KVT_EGEOM,
					 "%u TP ranks cannot replicate %u KV "
					 "heads evenly", g->tp_size,
					 g->kv_heads_total);
		g->kv_heads = 1; /* replicated, as vLLM does */
	}
	if (!g->q_heads)
		g->q_heads = g->kv_heads_total;
	if (!g->active_params)
		g->active_params = g->params;
	return 0;
}

int kvt_geom_preset(kvt_geom *g, const char *name, uint32_t page_tokens,
		    uint32_t tp_size, uint32_t tp_rank)
{
	char want[KVT_NAME_MAX], known[512];
	size_t k = 0;
	kvt_geom t;
	int err;

	if (!name || !*name)
		return kvti_fail(KVT_EPRESET, "empty model name");
	normalize(name, want, sizeof(want));
	for (size_t i = 0; i < KVT_ARRAY_SIZE(presets); i++) {
		const struct preset *p = &presets[i];

		if (strcmp(want, p->name))
			continue;
		memset(&t, 0, sizeof(t));
		kvti_strlcpy(t.name, p->name, sizeof(t.name));
		t.layers = p->layers;
		t.q_heads = p->q_heads;
		t.kv_heads_total = p->kv_heads;
		t.head_dim = p->head_dim;
		t.hidden = p->hidden;
		t.mla = p->mla;
		t.dtype_bytes = 2; /* every preset ships bf16 weights */
		t.params = (uint64_t)p->params;
		t.active_params = (uint64_t)p->active;
		t.page_tokens = page_tokens;
		t.tp_size = tp_size;
		t.tp_rank = tp_rank;
		err = kvt_geom_finish(&t);
		if (err) {
			kvti_errctx("model %s", p->name);
			return err;
		}
		*g = t;
		return 0;
	}
	known[0] = '\0';
	for (size_t i = 0; i < KVT_ARRAY_SIZE(presets); i++)
		k += (size_t)snprintf(known + k, sizeof(known) - k, "%s%s",
				      i ? ", " : "", presets[i].name);
	return kvti_fail(KVT_EPRESET, "unknown model '%s' (presets: %s; or "
			 "give a path to a config.json)", name, known);
}

/* ---- config.json ----------------------------------------------------- */

/* The largest size a config.json may give (layers, heads, hidden, vocab...):
 * 2^24, far above any real model, low enough that the parameter estimate's
 * products stay finite. */
#define JSON_SIZE_MAX (1u << 24)

static int json_u32(const cJSON *o, const char *key, uint32_t *out,
		    int required)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	if (!v || cJSON_IsNull(v)) {
		if (required)
			return kvti_fail(KVT_ECONFIG, "missing \"%s\"", key);
		return 1; /* absent */
	}
	/* the test against the upper bound comes before any cast: a cast of
	 * a double out of the integer's range is undefined */
	if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) ||
	    v->valuedouble > JSON_SIZE_MAX ||
	    v->valuedouble != (double)(uint32_t)v->valuedouble)
		return kvti_fail(KVT_ECONFIG, "\"%s\" is not an integer in "
				 "0..%u", key, JSON_SIZE_MAX);
	*out = (uint32_t)v->valuedouble;
	return 0;
}

static int dtype_bytes(const char *s, uint32_t *out);

int kvt_geom_dtype_bytes(const char *name, uint32_t *out)
{
	if (!name || !out || dtype_bytes(name, out))
		return kvti_fail(KVT_ECONFIG, "unknown element type '%s' "
				 "(bfloat16, float16, float32, fp8, "
				 "float8_e4m3fn, float8_e5m2)",
				 name ? name : "(null)");
	return 0;
}

static int dtype_bytes(const char *s, uint32_t *out)
{
	static const struct {
		const char *name;
		uint32_t bytes;
	} t[] = {
		{ "bfloat16", 2 }, { "float16", 2 }, { "half", 2 },
		{ "bf16", 2 },     { "fp16", 2 },    { "float32", 4 },
		{ "float", 4 },    { "fp32", 4 },    { "float8_e4m3fn", 1 },
		{ "float8_e5m2", 1 }, { "fp8", 1 },
	};
	for (size_t i = 0; i < KVT_ARRAY_SIZE(t); i++)
		if (kvti_streq_ci(s, t[i].name)) {
			*out = t[i].bytes;
			return 0;
		}
	return -1;
}

/* Parameter estimate from the sizes in a config (docs/FORMATS.md). Fails
 * with KVT_ECONFIG when it passes 10^15 parameters (sizes no model has,
 * and beyond them the estimate would not fit a uint64_t). */
#define PARAMS_MAX 1e15

static int estimate_params(const cJSON *c, kvt_geom *g)
{
	uint32_t inter = 0, vocab = 0, moe_inter = 0, experts = 0, topk = 0,
		 shared = 0, dense_first = 0;
	const cJSON *tie = cJSON_GetObjectItemCaseSensitive(
		c, "tie_word_embeddings");
	double h = g->hidden, attn, mlp_dense, mlp_moe_all, mlp_moe_act,
	       embed, L = g->layers, Lmoe, all, act;

	const struct {
		const char *key;
		uint32_t *v;
	} opt[] = {
		{ "intermediate_size", &inter }, { "vocab_size", &vocab },
		{ "moe_intermediate_size", &moe_inter },
		{ "num_experts_per_tok", &topk }, { "n_shared_experts", &shared },
		{ "first_k_dense_replace", &dense_first },
	};
	int r;

	/* optional sizes: absent is 0, present but bad fails */
	for (size_t i = 0; i < KVT_ARRAY_SIZE(opt); i++)
		if ((r = json_u32(c, opt[i].key, opt[i].v, 0)) < 0)
			return r;
	if ((r = json_u32(c, "n_routed_experts", &experts, 0)) == 1 &&
	    (r = json_u32(c, "num_local_experts", &experts, 0)) == 1)
		r = json_u32(c, "num_experts", &experts, 0);
	if (r < 0)
		return r;
	if (experts && topk > experts)
		return kvti_fail(KVT_ECONFIG, "num_experts_per_tok %u is more "
				 "than the %u experts", topk, experts);
	if (!moe_inter)
		moe_inter = inter;

	if (g->mla) { /* DeepSeek MLA projections; defaults are V3's */
		uint32_t qlora = 0, nope = 128, vdim = 128, rope = 64;
		double nq = g->q_heads, qk;

		if ((r = json_u32(c, "q_lora_rank", &qlora, 0)) < 0 ||
		    (r = json_u32(c, "qk_nope_head_dim", &nope, 0)) < 0 ||
		    (r = json_u32(c, "v_head_dim", &vdim, 0)) < 0 ||
		    (r = json_u32(c, "qk_rope_head_dim", &rope, 0)) < 0)
			return r;
		qk = nq * (nope + rope);
		attn = (qlora ? h * qlora + (double)qlora * qk : h * qk) +
		       h * g->head_dim +                      /* kv_a: latent */
		       (double)(g->head_dim - rope) * nq * (nope + vdim) +
		       nq * vdim * h;                         /* o_proj */
	} else {
		attn = 2.0 * h * g->q_heads * g->head_dim +
		       2.0 * h * g->kv_heads_total * g->head_dim;
	}
	mlp_dense = 3.0 * h * inter;
	mlp_moe_all = 3.0 * h * moe_inter * (experts + shared);
	mlp_moe_act = 3.0 * h * moe_inter * (topk + shared);
	embed = (double)vocab * h * (tie && cJSON_IsTrue(tie) ? 1 : 2);
	Lmoe = experts ? L - KVT_MIN((double)dense_first, L) : 0;
	all = L * attn + (L - Lmoe) * mlp_dense + Lmoe * mlp_moe_all + embed;
	act = L * attn + (L - Lmoe) * mlp_dense + Lmoe * mlp_moe_act + embed;
	if (!(all <= PARAMS_MAX) || !(act <= PARAMS_MAX))
		return kvti_fail(KVT_ECONFIG, "its sizes give %.3g parameters "
				 "(more than %.0e: not a real model)",
				 KVT_MAX(all, act), PARAMS_MAX);
	g->params = (uint64_t)all;
	g->active_params = (uint64_t)act;
	return 0;
}

int kvt_geom_from_json(kvt_geom *g, const char *json, const char *name,
		       uint32_t page_tokens, uint32_t tp_size, uint32_t tp_rank)
{
	const cJSON *c, *tc, *dt;
	uint32_t heads = 0, lora = 0, rope = 0;
	kvt_geom t;
	cJSON *root;
	int err, r;

	root = cJSON_Parse(json);
	if (!root) {
		const char *at = cJSON_GetErrorPtr();
		char near[24];

		kvti_printable(near, sizeof(near), at ? at : "?", 20);
		return kvti_fail(KVT_ECONFIG, "%s: not valid JSON near '%s'",
				 name, near);
	}
	c = root;
	if (!cJSON_IsObject(c)) {
		err = kvti_fail(KVT_ECONFIG, "not a JSON object");
		goto out;
	}
	tc = cJSON_GetObjectItemCaseSensitive(c, "text_config");
	if (!cJSON_GetObjectItemCaseSensitive(c, "num_hidden_layers") &&
	    cJSON_IsObject(tc))
		c = tc;

	memset(&t, 0, sizeof(t));
	kvti_strlcpy(t.name, name, sizeof(t.name));
	if ((err = json_u32(c, "num_hidden_layers", &t.layers, 1)) ||
	    (err = json_u32(c, "num_attention_heads", &heads, 1)) ||
	    (err = json_u32(c, "hidden_size", &t.hidden, 1)))
		goto out;
	if (!heads || !t.hidden || !t.layers) {
		err = kvti_fail(KVT_ECONFIG, "zero layers, heads or hidden size");
		goto out;
	}
	t.q_heads = heads;
	r = json_u32(c, "kv_lora_rank", &lora, 0);
	if (r < 0) {
		err = r;
		goto out;
	}
	if (r == 0 && lora) { /* MLA */
		if ((err = json_u32(c, "qk_rope_head_dim", &rope, 1)))
			goto out;
		t.mla = 1;
		t.kv_heads_total = 1;
		t.head_dim = lora + rope;
	} else {
		r = json_u32(c, "num_key_value_heads", &t.kv_heads_total, 0);
		if (r < 0) {
			err = r;
			goto out;
		}
		if (r == 1)
			t.kv_heads_total = heads; /* plain multi-head attention */
		r = json_u32(c, "head_dim", &t.head_dim, 0);
		if (r < 0) {
			err = r;
			goto out;
		}
		if (r == 1) {
			if (t.hidden % heads) {
				err = kvti_fail(KVT_ECONFIG,
						"hidden_size %u not divisible "
						"by num_attention_heads %u",
						t.hidden, heads);
				goto out;
			}
			t.head_dim = t.hidden / heads;
		}
	}
	dt = cJSON_GetObjectItemCaseSensitive(c, "torch_dtype");
	if (!dt)
		dt = cJSON_GetObjectItemCaseSensitive(c, "dtype");
	if (!dt && c != root) {
		dt = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
		if (!dt)
			dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
	}
	if (!dt) {
		kvti_warn("%s: no torch_dtype in config; assuming bfloat16",
			  name);
		t.dtype_bytes = 2;
	} else if (!cJSON_IsString(dt) ||
		   dtype_bytes(dt->valuestring, &t.dtype_bytes)) {
		err = kvti_fail(KVT_ECONFIG, "unknown torch_dtype %s",
				cJSON_IsString(dt) ? dt->valuestring : "(not a string)");
		goto out;
	}
	if ((err = estimate_params(c, &t)))
		goto out;
	t.page_tokens = page_tokens;
	t.tp_size = tp_size;
	t.tp_rank = tp_rank;
	err = kvt_geom_finish(&t);
	if (!err)
		*g = t;
out:
	if (err)
		kvti_errctx("config %s", name);
	cJSON_Delete(root);
	return err;
}

int kvt_geom_from_config(kvt_geom *g, const char *path, uint32_t page_tokens,
			 uint32_t tp_size, uint32_t tp_rank)
{
	char *text, name[KVT_NAME_MAX];
	const char *base, *end;
	int err;

	err = kvti_read_file(path, 16u << 20, &text, NULL);
	if (err)
		return kvti_fail(err, "config %s: %s", path,
				 kvti_file_strerror(err));
	/* Label: the directory holding a config.json (a model's folder),
	 * else the file's own name. */
	end = strrchr(path, '/');
	base = end ? end + 1 : path;
	if (end && !strcmp(base, "config.json")) {
		const char *p = end;
		while (p > path && p[-1] != '/')
			p--;
		snprintf(name, sizeof(name), "%.*s", (int)(end - p), p);
	} else {
		kvti_strlcpy(name, base, sizeof(name));
	}
	if (!name[0])
		kvti_strlcpy(name, path, sizeof(name));
	err = kvt_geom_from_json(g, text, name, page_tokens, tp_size, tp_rank);
	kvt_free(text);
	return err;
}

int kvt_geom_same_shape(const kvt_geom *a, const kvt_geom *b)
{
	return a->layers == b->layers && a->kv_heads == b->kv_heads &&
	       a->head_dim == b->head_dim && a->dtype_bytes == b->dtype_bytes &&
	       a->page_tokens == b->page_tokens && !a->mla == !b->mla;
}
