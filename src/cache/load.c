/*
 * load.c — kvt_cache_load(): lease the leading pages that have a copy (or,
 * KVT_CACHE_IO_EACH, each one-page prefix on its own), pick each page's
 * fastest committed copy under c->smu, one sub per source tier, submit.
 * A page with no committed copy fails at once (never waited for). ssd ->
 * GPU loads go through the stage tier (job_finish.c runs them).
 */
#include "cache/cache_impl.h"

#include <errno.h>
#include <string.h>

/* KVT_CACHE_IO_EACH load (c->mu held): each page's record, and a lease
 * on each one-page prefix that has a copy (pin_each[i]); a page absent
 * or not pinnable gets a zeroed record (no copy: its block fails). */
static int inspect_each(kvt_cache *c, kvt_cache_job *j, kvt_page_info **info)
{
	*info = kvt_calloc(j->nkeys ? j->nkeys : 1, sizeof(**info));
	if (!*info)
		return -ENOMEM;
	for (size_t i = 0; i < j->nkeys; i++) {
		kvt_prefix px = kvti_cache_page_prefix(j->tenant, j->keys + i);
		kvt_page_info pi;
		size_t found = 0;
		int err = kvt_index_inspect(c->idx, &px, &pi, 1, &found);

		if (err)
			return err; /* the tenant: nothing pinned yet matters */
		if (!found || !pi.resident || kvt_index_pin(c->idx, &px))
			continue;
		(*info)[i] = pi;
		j->pin_each[i] = 1;
		j->pinned = 1;
	}
	return 0;
}

int kvt_cache_load(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		   size_t nkeys, size_t first, const uint32_t *blocks,
		   kvt_cache_job **out)
{
	return kvt_cache_load_ex(c, tenant, keys, nkeys, first, blocks, NULL,
				 out);
}

int kvt_cache_load_ex(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		      size_t nkeys, size_t first, const uint32_t *blocks,
		      const kvt_cache_io *io, kvt_cache_job **out)
{
	kvt_page_info *info = NULL;
	kvt_cache_job *j;
	size_t found = 0, npin;
	int err;

	kvti_errclear();
	if (!out)
		return kvti_fail(-EINVAL, "cache load: no job handle to fill");
	if ((err = kvti_cache_job_new(c, JOB_LOAD, tenant, keys, nkeys, first,
				      blocks, io, &j)))
		return err;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		j->sub[t].cj = j;
		j->sub[t].src = t;
		j->sub[t].dst = ENGINE;
		if ((err = kvti_cache_sub_alloc(c, &j->sub[t], j->n)))
			goto fail;
	}
	j->sub[HOLD].cj = j;
	j->nsub = KVT_TIER_COUNT;

	pthread_mutex_lock(&c->mu);
	npin = 0;
	if (j->pin_each) {
		err = inspect_each(c, j, &info);
	} else {
		err = kvti_cache_inspect(c, tenant, keys, nkeys, &info, &found);
		/* lease the leading pages that have a copy (pin needs every
		 * page of the prefix to have one) */
		while (!err && npin < found && info[npin].resident)
			npin++;
		if (!err && npin) {
			kvt_prefix px = kvti_cache_prefix(j, npin);
			err = kvt_index_pin(c->idx, &px);
			j->nkeys = npin;
			j->pinned = !err;
		}
	}
	kvti_cache_unlock(c);
	if (err)
		goto fail;

	/* each page's fastest committed copy (the lease keeps it) */
	pthread_mutex_lock(&c->smu);
	for (size_t i = 0; i < j->n; i++) {
		size_t p = first + i;
		int pend = 0, t = -1;

		if (j->pin_each ? j->pin_each[p] : p < npin)
			t = kvti_cache_best_copy(c, &info[p], &pend);
		if (t < 0) {
			/* never waited for: a load starts at once */
			j->failed[i] = 1;
			j->st.failed++;
			if (pend)
				j->st.busy++;
			else
				j->st.absent++;
			if (!j->result)
				j->result = pend ?
					kvti_fail(KVT_EBUSY, "cache load: page "
						  "%zu is being stored or moved: "
						  "not loadable yet", p) :
					kvti_fail(KVT_ENOTFOUND, "cache load: "
						  "page %zu is not in the cache",
						  p);
			continue;
		}
		struct sub *s = &j->sub[t];
		s->ss[s->n] = info[p].slot[t];
		s->ds[s->n] = blocks[i];
		s->pg[s->n] = i;
		memcpy(s->sums + s->n * c->L,
		       c->m[t].sums + (uint64_t)info[p].slot[t] * c->L,
		       c->L * sizeof(uint64_t));
		s->n++;
	}
	pthread_mutex_unlock(&c->smu);
	j->absent = j->st.failed;
	if (j->sub[KVT_TIER_SSD].n &&
	    (c->stage_ssd || kvt_tier_kind_of(j->mem->t) == KVT_TIER_HBM) &&
	    c->stage)
		j->sub[KVT_TIER_SSD].staged = 1;
	kvt_free(info);
	kvti_cache_job_start(c, j);
	*out = j;
	return 0;
fail:
	kvt_free(info);
	kvti_cache_job_abort(c, j);
	return err;
}
