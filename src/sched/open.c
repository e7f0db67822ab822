/*
 * open.c — a scheduler priced from a hardware profile, in one call
 * (kvt_sched_open(), <kvtier/sched.h>): for engines' connectors, which
 * hold no kvt_cost of their own and reach the library through a thin
 * binding (python/kvtier/decide.py). Profile -> kvt_hw_cost() -> preset
 * -> features -> kvt_sched_create(); nothing else.
 */
#include "core/core.h"

#include <kvtier/sched.h>
#include <kvtier/sim.h>

#include <errno.h>

int kvt_sched_open(kvt_sched **out, const char *policy, const char *features,
		   const char *profile, const kvt_geom *g)
{
	kvt_sched_policy p;
	kvt_sched_config cfg;
	kvt_hw hw;
	kvt_cost cost;
	int err;

	kvti_errclear();
	if (!out || !g)
		return kvti_fail(-EINVAL, "kvt_sched_open: NULL argument");
	*out = NULL;
	if (kvt_sched_policy_parse(policy ? policy : "kvtier", &p))
		return kvti_fail(KVT_ECONFIG, "kvt_sched_open: unknown policy "
				 "\"%s\" (lmcache, hicache, kvtier, "
				 "hicache-kernel, vllm)", policy);
	if ((err = kvt_hw_load(&hw, profile ? profile : "h100")))
		return err;
	if ((err = kvt_hw_cost(&hw, g, &cost)))
		return err;
	if ((err = kvt_sched_config_preset(&cfg, p)))
		return err;
	if (features && (err = kvt_sched_features_parse(features,
							&cfg.features)))
		return err;
	return kvt_sched_create(out, &cfg, &cost);
}
