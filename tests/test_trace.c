/*
 * test_trace — the Mooncake trace reader: a generated trace read back
 * exactly (the differential: what was written is what is read), blank
 * lines and CRLF, every kind of malformed line refused with its line
 * number, files that are missing or empty, failing allocations. The data
 * is generated here; the real traces are read by `kvtier trace replay`.
 */
#include "harness.h"

static char *gen(uint64_t seed, int nreq, uint64_t ***ids, int **nids,
		 uint64_t **ts, size_t *len)
{
	size_t cap = 1 << 20, n = 0;
	char *buf = malloc(cap);
	uint64_t r = seed, next = 3;

	*ids = calloc((size_t)nreq, sizeof(**ids));
	*nids = calloc((size_t)nreq, sizeof(**nids));
	*ts = calloc((size_t)nreq, sizeof(**ts));
	for (int i = 0; i < nreq; i++) {
		int k = (int)(test_rand(&r) % 40);
		(*ts)[i] = i * 7 + test_rand(&r) % 5;
		(*nids)[i] = k;
		(*ids)[i] = calloc((size_t)k + 1, sizeof(uint64_t));
		n += (size_t)snprintf(buf + n, cap - n, "%s{\"timestamp\": %llu, "
				      "\"input_length\": %d, \"output_length\""
				      ": %d, \"hash_ids\": [",
				      i % 9 == 3 ? "\r\n" : "",
				      (unsigned long long)(*ts)[i], k * 512,
				      i);
		for (int j = 0; j < k; j++) {
			/* share prefixes with the previous requests */
			uint64_t v = j < 3 ? (uint64_t)j : next++;
			(*ids)[i][j] = v;
			n += (size_t)snprintf(buf + n, cap - n, "%s%llu",
					      j ? ", " : "",
					      (unsigned long long)v);
		}
		n += (size_t)snprintf(buf + n, cap - n, "]}\n");
	}
	*len = n;
	return buf;
}

static void test_roundtrip(void)
{
	uint64_t **ids, *ts, total = 0;
	int *nids;
	size_t len;
	char *text = gen(7, 300, &ids, &nids, &ts, &len);
	kvt_trace *t;

	CHECK_OK(kvt_trace_parse(&t, text, len, "gen"));
	CHECK_EQ(kvt_trace_count(t), 300);
	for (int i = 0; i < 300; i++) {
		const kvt_trace_req *r = kvt_trace_get(t, (size_t)i);
		CHECK_EQ(r->time_ns, ts[i] * 1000000);
		CHECK_EQ(r->nhash, nids[i]);
		CHECK_EQ(r->output_length, i);
		for (int j = 0; j < nids[i]; j++)
			CHECK_EQ(r->hash_ids[j], ids[i][j]);
		total += (uint64_t)nids[i];
		free(ids[i]);
	}
	CHECK(kvt_trace_get(t, 300) == NULL);
	CHECK_EQ(kvt_trace_blocks(t), total);
	{
		uint64_t distinct = total; /* ids 0..2 repeat, the rest do not */
		int with[3] = { 0 };
		for (int i = 0; i < 300; i++)
			for (int j = 0; j < nids[i] && j < 3; j++)
				with[j]++;
		for (int j = 0; j < 3; j++)
			distinct -= with[j] ? (uint64_t)with[j] - 1 : 0;
		CHECK_EQ(kvt_trace_unique_blocks(t), distinct);
	}
	kvt_trace_close(t);
	free(ids);
	free(nids);
	free(ts);
	free(text);
}

static void bad(const char *text, int line, const char *what)
{
	kvt_trace *t = NULL;
	char want[64];

	CHECK_ERR(kvt_trace_parse(&t, text, strlen(text), "t.jsonl"),
		  KVT_ECONFIG);
	snprintf(want, sizeof(want), "t.jsonl:%d:", line);
	if (!strstr(kvt_errdetail(), want) || !strstr(kvt_errdetail(), what)) {
		fprintf(stderr, "for %s: detail '%s', want '%s' and '%s'\n",
			text, kvt_errdetail(), want, what);
		CHECK(0);
	}
}

#define OK1 "{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n"

static void test_bad(void)
{
	kvt_trace *t;

	bad(OK1 "{\"timestamp\": 1,\n", 2, "not JSON");
	bad(OK1 OK1 "[1, 2]\n", 3, "not a JSON object");
	bad("{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": []}",
	    1, "'timestamp' missing");
	bad("{\"timestamp\": -1, \"input_length\": 5, \"output_length\": 1, "
	    "\"hash_ids\": []}", 1, "'timestamp' out of range");
	bad("{\"timestamp\": \"x\", \"input_length\": 5, \"output_length\": 1, "
	    "\"hash_ids\": []}", 1, "not a number");
	bad("{\"timestamp\": 1, \"input_length\": 5.5, \"output_length\": 1, "
	    "\"hash_ids\": []}", 1, "'input_length' not a whole number");
	bad("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1e12, "
	    "\"hash_ids\": []}", 1, "'output_length' out of range");
	bad("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, "
	    "\"hash_ids\": 3}", 1, "'hash_ids' not an array");
	bad("\n\n{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, "
	    "\"hash_ids\": [1, -3]}", 3, "holds -3 (item 1)");
	bad("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, "
	    "\"hash_ids\": [1, \"a\"]}", 1, "item 1 is not a number");
	bad(OK1 "{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1}",
	    2, "'hash_ids' missing");
	CHECK_ERR(kvt_trace_parse(&t, "\n \n", 3, "t.jsonl"), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "no request") != NULL);
	CHECK_ERR(kvt_trace_open(&t, "/nonexistent/trace.jsonl"), -ENOENT);
	CHECK(strstr(kvt_errdetail(), "/nonexistent/trace.jsonl") != NULL);
	/* fractions of a ms and extra fields are fine */
	{
		const char *s = "{\"timestamp\": 1.5, \"input_length\": 0, "
				"\"output_length\": 0, \"hash_ids\": [], "
				"\"x\": 1}";
		CHECK_OK(kvt_trace_parse(&t, s, strlen(s), "t"));
	}
	CHECK_EQ(kvt_trace_get(t, 0)->time_ns, 1500000);
	/* Regression (issue 10): requests that all have "hash_ids": [] left
	 * the id array NULL and hash_ids = NULL + 0 */
	CHECK(kvt_trace_get(t, 0)->hash_ids != NULL);
	CHECK_EQ(kvt_trace_get(t, 0)->nhash, 0);
	kvt_trace_close(t);
	/* Regression (issue 10): data after the line's object was ignored */
	bad(OK1 "{\"timestamp\": 1, \"input_length\": 5, \"output_length\": "
	    "1, \"hash_ids\": [1]} garbage\n", 2, "data after the JSON object "
	    "(at column 74)");
	bad("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, "
	    "\"hash_ids\": [1]}{\"timestamp\": 2, \"input_length\": 5, "
	    "\"output_length\": 1, \"hash_ids\": [1]}\n", 1,
	    "data after the JSON object");
	bad("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, "
	    "\"hash_ids\": [1]} 1", 1, "data after the JSON object");
	/* trailing blanks and a CR (CRLF files) stay fine */
	{
		const char *s = "{\"timestamp\": 1, \"input_length\": 5, "
				"\"output_length\": 1, \"hash_ids\": [1]} \t\r\n";
		CHECK_OK(kvt_trace_parse(&t, s, strlen(s), "t"));
		kvt_trace_close(t);
	}
}

static void test_faults(void)
{
	uint64_t **ids, *ts;
	int *nids;
	size_t len;
	char *text = gen(9, 200, &ids, &nids, &ts, &len);
	int64_t live = kvt_alloc_live();
	kvt_trace *t;
	int failed = 0;

	for (uint64_t n = 1;; n++) {
		int err;
		kvt_alloc_fail_at(n);
		err = kvt_trace_parse(&t, text, len, "gen");
		kvt_alloc_fail_at(0);
		if (!err) {
			kvt_trace_close(t);
			break;
		}
		CHECK_ERR(err, -ENOMEM);
		CHECK_EQ(kvt_alloc_live(), live);
		failed++;
	}
	CHECK(failed >= 3);
	for (int i = 0; i < 200; i++)
		free(ids[i]);
	free(ids);
	free(nids);
	free(ts);
	free(text);
}

int main(void)
{
	test_roundtrip();
	test_bad();
	test_faults();
	TEST_DONE();
}
