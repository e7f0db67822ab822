/* test_geom — presets, TP split, MLA, Hugging Face config.json parsing. */
#include "harness.h"

#include <errno.h>
#include <unistd.h>

static uint64_t token_bytes_all_ranks(const char *name)
{
	kvt_geom g;
	if (kvt_geom_preset(&g, name, 16, 1, 0))
		return 0;
	return kvt_geom_token_bytes(&g);
}

static void test_presets(void)
{
	kvt_geom g;
	size_t n = 0;

	/* SPEC.md: KV bytes per token (bf16, all ranks) */
	CHECK_EQ(token_bytes_all_ranks("llama-3.1-8b"), 128 * 1024);
	CHECK_EQ(token_bytes_all_ranks("qwen2.5-14b"), 192 * 1024);
	CHECK_EQ(token_bytes_all_ranks("qwen2.5-32b"), 256 * 1024);
	CHECK_EQ(token_bytes_all_ranks("llama-3.1-70b"), 320 * 1024);
	CHECK_EQ(token_bytes_all_ranks("mistral-small-24b"), 160 * 1024);
	CHECK_EQ(token_bytes_all_ranks("qwen2.5-7b"), 56 * 1024);
	/* deepseek-v3: 61 layers x (512 + 64) x 2 bytes, one latent */
	CHECK_EQ(token_bytes_all_ranks("deepseek-v3"), 61 * 576 * 2);

	/* Qwen2.5-32B at TP 4: 64 KiB per rank (SPEC.md testbed A) */
	CHECK_OK(kvt_geom_preset(&g, "qwen2.5-32b", 16, 4, 3));
	CHECK_EQ(kvt_geom_token_bytes(&g), 64 * 1024);
	CHECK_EQ(g.kv_heads, 2);
	CHECK_EQ(kvt_geom_chunk_bytes(&g), 16 * 2 * 128 * 2);
	CHECK_EQ(kvt_geom_page_bytes(&g), 16 * 64 * 1024);

	/* names: case, org prefix, suffixes */
	CHECK_OK(kvt_geom_preset(&g, "meta-llama/Llama-3.1-8B-Instruct", 1, 1, 0));
	CHECK(!strcmp(g.name, "llama-3.1-8b"));
	CHECK_OK(kvt_geom_preset(&g, "Qwen/Qwen2.5-7B-Instruct", 1, 1, 0));
	CHECK(!strcmp(g.name, "qwen2.5-7b"));

	CHECK_ERR(kvt_geom_preset(&g, "gpt-17", 16, 1, 0), KVT_EPRESET);
	CHECK(strstr(kvt_errdetail(), "gpt-17") && strstr(kvt_errdetail(), "llama-3.1-8b"));
	CHECK_ERR(kvt_geom_preset(&g, "", 16, 1, 0), KVT_EPRESET);

	while (kvt_geom_preset_name(n))
		CHECK_OK(kvt_geom_preset(&g, kvt_geom_preset_name(n++), 32, 1, 0));
	CHECK(n >= 7);
}

static void test_tp(void)
{
	kvt_geom g;

	CHECK_ERR(kvt_geom_preset(&g, "llama-3.1-8b", 16, 3, 0), KVT_EGEOM);
	CHECK(strstr(kvt_errdetail(), "8 KV heads"));
	CHECK_ERR(kvt_geom_preset(&g, "llama-3.1-8b", 16, 2, 2), KVT_EGEOM);
	CHECK_ERR(kvt_geom_preset(&g, "llama-3.1-8b", 0, 1, 0), KVT_EGEOM);
	CHECK_ERR(kvt_geom_preset(&g, "llama-3.1-8b", 16, 0, 0), KVT_EGEOM);
	/* qwen2.5-7b has 4 KV heads: TP 8 replicates one head per rank */
	CHECK_OK(kvt_geom_preset(&g, "qwen2.5-7b", 16, 8, 7));
	CHECK_EQ(g.kv_heads, 1);
	CHECK_OK(kvt_geom_preset(&g, "qwen2.5-7b", 16, 2, 1));
	CHECK_EQ(g.kv_heads, 2);
	/* MLA: every rank holds the whole latent */
	CHECK_OK(kvt_geom_preset(&g, "deepseek-v3", 16, 8, 5));
	CHECK_EQ(g.kv_heads, 1);
	CHECK_EQ(kvt_geom_kv(&g), 1);
	CHECK_EQ(kvt_geom_token_bytes(&g), 61 * 576 * 2);
	CHECK(g.active_params < g.params);
}

static const char *llama_json =
	"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096,"
	"\"intermediate_size\":14336,\"num_attention_heads\":32,"
	"\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
	"\"torch_dtype\":\"bfloat16\",\"vocab_size\":128256,"
	"\"tie_word_embeddings\":false}";

static void test_config(void)
{
	kvt_geom g, p;
	const char *path = "/tmp/kvt-test-config.json";
	FILE *f;

	CHECK_OK(kvt_geom_from_json(&g, llama_json, "llama", 16, 1, 0));
	CHECK_OK(kvt_geom_preset(&p, "llama-3.1-8b", 16, 1, 0));
	CHECK(kvt_geom_same_shape(&g, &p));
	CHECK_EQ(g.head_dim, 128);
	/* parameter estimate within 3% of the published 8.03 B */
	CHECK(g.params > 7.8e9 && g.params < 8.3e9);

	/* head_dim given explicitly, fp32, MHA (no num_key_value_heads) */
	CHECK_OK(kvt_geom_from_json(&g, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":4,\"hidden_size\":64,\"head_dim\":32,"
		"\"torch_dtype\":\"float32\"}", "tiny", 1, 1, 0));
	CHECK_EQ(g.kv_heads, 4);
	CHECK_EQ(g.head_dim, 32);
	CHECK_EQ(g.dtype_bytes, 4);
	/* head_dim null falls back to hidden/heads; "dtype" key is read too */
	CHECK_OK(kvt_geom_from_json(&g, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":4,\"hidden_size\":64,\"head_dim\":null,"
		"\"num_key_value_heads\":2,\"dtype\":\"float16\"}", "t", 1, 2, 1));
	CHECK_EQ(g.head_dim, 16);
	CHECK_EQ(g.kv_heads, 1);
	/* MLA (DeepSeek-like) */
	CHECK_OK(kvt_geom_from_json(&g, "{\"num_hidden_layers\":61,"
		"\"num_attention_heads\":128,\"hidden_size\":7168,"
		"\"num_key_value_heads\":128,\"kv_lora_rank\":512,"
		"\"qk_rope_head_dim\":64,\"torch_dtype\":\"bfloat16\","
		"\"q_lora_rank\":1536,\"qk_nope_head_dim\":128,\"v_head_dim\":128,"
		"\"n_routed_experts\":256,\"num_experts_per_tok\":8,"
		"\"moe_intermediate_size\":2048,\"intermediate_size\":18432,"
		"\"n_shared_experts\":1,\"first_k_dense_replace\":3,"
		"\"vocab_size\":129280}", "dsv3", 1, 1, 0));
	CHECK(g.mla);
	CHECK_EQ(g.head_dim, 576);
	CHECK_EQ(kvt_geom_token_bytes(&g), 61 * 576 * 2);
	CHECK(g.params > 600e9 && g.params < 720e9);
	CHECK(g.active_params > 30e9 && g.active_params < 45e9);
	/* multimodal: text_config */
	CHECK_OK(kvt_geom_from_json(&g, "{\"model_type\":\"mllama\","
		"\"torch_dtype\":\"bfloat16\",\"text_config\":{"
		"\"num_hidden_layers\":40,\"num_attention_heads\":32,"
		"\"hidden_size\":4096,\"num_key_value_heads\":8}}", "mm", 1, 1, 0));
	CHECK_EQ(g.layers, 40);
	CHECK_EQ(g.dtype_bytes, 2);

	/* bad configs: each names its problem */
	CHECK_ERR(kvt_geom_from_json(&g, "{not json", "bad", 1, 1, 0), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "JSON"));
	CHECK_ERR(kvt_geom_from_json(&g, "[1,2]", "bad", 1, 1, 0), KVT_ECONFIG);
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_attention_heads\":4,"
		"\"hidden_size\":64}", "bad", 1, 1, 0), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "num_hidden_layers"));
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":\"x\","
		"\"num_attention_heads\":4,\"hidden_size\":64}", "bad", 1, 1, 0),
		KVT_ECONFIG);
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":-2,"
		"\"num_attention_heads\":4,\"hidden_size\":64}", "bad", 1, 1, 0),
		KVT_ECONFIG);
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":4,\"hidden_size\":64,"
		"\"torch_dtype\":\"int3\"}", "bad", 1, 1, 0), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "int3"));
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":3,\"hidden_size\":64}", "bad", 1, 1, 0),
		KVT_ECONFIG);
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":4,\"hidden_size\":64,"
		"\"kv_lora_rank\":512}", "bad", 1, 1, 0), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "qk_rope_head_dim"));
	/* Regression (issue 10): sizes whose parameter estimate overflowed
	 * the cast to uint64_t (undefined; clang's UBSan float-cast-overflow) */
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":1,\"hidden_size\":4294967295,"
		"\"head_dim\":128,\"vocab_size\":4294967295}", "bad", 1, 1, 0),
		KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "hidden_size"));
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":1000,"
		"\"num_attention_heads\":1,\"hidden_size\":16777216,"
		"\"head_dim\":128,\"intermediate_size\":16777216,"
		"\"vocab_size\":16777216}", "bad", 1, 1, 0), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "parameters"));
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":4,\"hidden_size\":64,"
		"\"vocab_size\":1e300}", "bad", 1, 1, 0), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "vocab_size"));
	CHECK_ERR(kvt_geom_from_json(&g, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":4,\"hidden_size\":64,"
		"\"num_experts\":4,\"num_experts_per_tok\":8}", "bad", 1, 1, 0),
		KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "more than the 4 experts"));
	/* a failed parse leaves the output alone */
	memset(&p, 0x5a, sizeof(p));
	g = p;
	CHECK(kvt_geom_from_json(&g, "{}", "bad", 1, 1, 0) != 0);
	CHECK(!memcmp(&g, &p, sizeof(g)));

	/* from a file */
	f = fopen(path, "w");
	fputs(llama_json, f);
	fclose(f);
	CHECK_OK(kvt_geom_from_config(&g, path, 32, 2, 0));
	CHECK_EQ(g.kv_heads, 4);
	unlink(path);
	CHECK_ERR(kvt_geom_from_config(&g, path, 32, 2, 0), -ENOENT);
	CHECK_ERR(kvt_geom_from_config(&g, "/tmp", 32, 2, 0), -EISDIR);
}

int main(void)
{
	test_presets();
	test_tp();
	test_config();
	TEST_DONE();
}
