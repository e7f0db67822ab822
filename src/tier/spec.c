/*
 * spec.c — the tier spec parser (grammar in include/kvtier/tier.h).
 *
 * Tokens are split on ',', ';' and blanks. "kind:" starts a tier; what
 * follows the colon is that tier's first option. Each tier is checked as a
 * whole when the next one starts or the string ends. Paths cannot contain
 * the separators.
 */
#include "tier/tier_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_names[] = { "hbm", "fabric", "dram", "ssd", "remote" };
static const char *backing_names[] = { "anon", "numa", "devdax", "file",
				       "memfd", "dir", "cuda", "hostdev",
				       "none", "engine" };
static const char *huge_names[] = { "auto", "explicit", "thp", "none" };

const char *kvt_tier_kind_name(kvt_tier_kind k)
{
	return (unsigned)k < KVT_TIER_COUNT ? kind_names[k] : "?";
}

const char *kvt_backing_name(kvt_backing b)
{
	return (unsigned)b < KVT_ARRAY_SIZE(backing_names) ?
		       backing_names[b] : "?";
}

const char *kvt_huge_name(int h)
{
	return (unsigned)h < KVT_ARRAY_SIZE(huge_names) ? huge_names[h] : "?";
}

static void spec_init(kvt_tier_spec *s, kvt_tier_kind kind, int hostdev)
{
	memset(s, 0, sizeof(*s));
	s->kind = kind;
	s->hostdev = hostdev;
	s->numa_node = -1;
	s->files = 1;
	s->layout = KVT_LAYOUT_VLLM;
	switch (kind) {
	case KVT_TIER_HBM:
		s->backing = hostdev ? KVT_BACK_HOSTDEV : KVT_BACK_CUDA;
		break;
	case KVT_TIER_SSD:
		s->backing = KVT_BACK_DIR;
		break;
	case KVT_TIER_REMOTE:
		s->backing = KVT_BACK_NONE;
		break;
	case KVT_TIER_FABRIC:
		s->backing = KVT_BACK_NONE; /* must be chosen */
		break;
	default:
		s->backing = KVT_BACK_ANON;
		break;
	}
}

/* Does @tok start a tier? Sets kind/hostdev and *rest (after the colon). */
static int tok_kind(const char *tok, kvt_tier_kind *kind, int *hostdev,
		    const char **rest)
{
	const char *colon = strchr(tok, ':');
	size_t n;

	if (!colon)
		return 0;
	n = (size_t)(colon - tok);
	*hostdev = 0;
	if (n == 7 && !strncmp(tok, "hostdev", 7)) {
		*kind = KVT_TIER_HBM;
		*hostdev = 1;
		*rest = colon + 1;
		return 1;
	}
	for (int k = 0; k < KVT_TIER_COUNT; k++)
		if (strlen(kind_names[k]) == n && !strncmp(tok, kind_names[k], n)) {
			*kind = (kvt_tier_kind)k;
			*rest = colon + 1;
			return 1;
		}
	return 0;
}

static int parse_int(const char *v, int lo, int hi, int *out)
{
	char *end;
	long x;

	errno = 0;
	x = strtol(v, &end, 10);
	if (!*v || *end || errno || x < lo || x > hi)
		return -1;
	*out = (int)x;
	return 0;
}

#define SPEC_FAIL(s, fmt, ...)                                              \
	kvti_fail(KVT_ESPEC, "tier spec '%s': " fmt, (s)->text, ##__VA_ARGS__)

static int is_mem(const kvt_tier_spec *s)
{
	return s->kind == KVT_TIER_DRAM || s->kind == KVT_TIER_FABRIC;
}

static int spec_option(kvt_tier_spec *s, const char *tok)
{
	const char *kn = s->hostdev ? "hostdev" : kind_names[s->kind];
	const char *eq = strchr(tok, '=');
	int v, dv;

	if (!*tok)
		return 0;
	if (s->kind == KVT_TIER_REMOTE) {
		if (s->path[0])
			return SPEC_FAIL(s, "remote takes one address, "
					 "got a second '%s'", tok);
		kvti_strlcpy(s->path, tok, sizeof(s->path));
		return 0;
	}
	if (isdigit((unsigned char)*tok)) {
		uint64_t b;
		int err = kvt_size_parse(tok, &b);

		if (err)
			return SPEC_FAIL(s, "bad size '%s' (e.g. 512M, "
					 "8G, 1T)", tok);
		if (s->bytes)
			return SPEC_FAIL(s, "two sizes ('%s')", tok);
		if (!b)
			return SPEC_FAIL(s, "size '%s' is zero", tok);
		s->bytes = b;
		return 0;
	}
	/* a path: absolute, ./ or ../, or for ssd any token with a '/' and
	 * no '=' (a relative directory such as run/t1/ssd) */
	if (*tok == '/' || *tok == '.' ||
	    (s->kind == KVT_TIER_SSD && !eq && strchr(tok, '/'))) {
		if (s->kind == KVT_TIER_SSD) {
			if (s->path[0])
				return SPEC_FAIL(s, "two directories "
						 "('%s')", tok);
			if (kvti_strlcpy(s->path, tok, sizeof(s->path)))
				return SPEC_FAIL(s, "path too long");
			return 0;
		}
		if (s->kind == KVT_TIER_FABRIC) {
			if (strncmp(tok, "/dev/dax", 8))
				return SPEC_FAIL(s, "'%s': a fabric path "
						 "must be a devdax device "
						 "(/dev/daxX.Y); use file=PATH "
						 "for a file", tok);
			if (s->backing != KVT_BACK_NONE)
				return SPEC_FAIL(s, "'%s': fabric "
						 "already has a backing", tok);
			s->backing = KVT_BACK_DEVDAX;
			kvti_strlcpy(s->path, tok, sizeof(s->path));
			return 0;
		}
		return SPEC_FAIL(s, "'%s': %s takes no path", tok, kn);
	}
	if (eq) {
		size_t kl = (size_t)(eq - tok);
		const char *val = eq + 1;

		if (kl == 4 && !strncmp(tok, "numa", 4)) {
			if (!is_mem(s))
				goto wrong_tier;
			if (parse_int(val, 0, KVT_MAX_NODES - 1, &v))
				return SPEC_FAIL(s, "bad NUMA node '%s'",
						 val);
			if (s->kind == KVT_TIER_FABRIC) {
				if (s->backing != KVT_BACK_NONE)
					return SPEC_FAIL(s, "'%s': "
							 "fabric already has a "
							 "backing", tok);
			}
			s->backing = KVT_BACK_NUMA;
			s->numa_node = v;
			return 0;
		}
		if (kl == 4 && !strncmp(tok, "file", 4)) {
			if (s->kind != KVT_TIER_FABRIC)
				goto wrong_tier;
			if (s->backing != KVT_BACK_NONE)
				return SPEC_FAIL(s, "'%s': fabric "
						 "already has a backing", tok);
			if (!*val || kvti_strlcpy(s->path, val, sizeof(s->path)))
				return SPEC_FAIL(s, "bad file path '%s'",
						 val);
			s->backing = KVT_BACK_FILE;
			return 0;
		}
		if (kl == 5 && !strncmp(tok, "files", 5)) {
			if (s->kind != KVT_TIER_SSD)
				goto wrong_tier;
			if (parse_int(val, 1, 4096, &v))
				return SPEC_FAIL(s, "bad file count '%s' "
						 "(1..4096)", val);
			s->files = (uint32_t)v;
			return 0;
		}
		if (kl == 6 && !strncmp(tok, "device", 6)) {
			if (s->kind != KVT_TIER_HBM || s->hostdev)
				goto wrong_tier;
			if (parse_int(val, 0, KVT_MAX_GPUS - 1, &v) == 0) {
				s->device = v;
				return 0;
			}
			if (strncmp(val, "emu", 3) || kvt_device_parse(val, &dv))
				return SPEC_FAIL(s, "bad device '%s' (0..%d, "
						 "cuda:N, emu or emu:N)", val,
						 KVT_MAX_GPUS - 1);
			s->device = dv;
			return 0;
		}
		if (kl == 6 && !strncmp(tok, "layout", 6)) {
			kvt_layout_kind k;

			if (s->kind != KVT_TIER_HBM)
				goto wrong_tier;
			if (kvt_layout_parse(val, &k) || k == KVT_LAYOUT_PAGE_FIRST)
				return SPEC_FAIL(s, "bad layout '%s' "
						 "(vllm or sglang)", val);
			s->layout = (int)k;
			return 0;
		}
		if (kl == 4 && !strncmp(tok, "huge", 4)) {
			if (!is_mem(s))
				goto wrong_tier;
			for (int h = 0; h < 4; h++)
				if (!strcmp(val, huge_names[h])) {
					s->huge = h;
					return 0;
				}
			return SPEC_FAIL(s, "bad huge mode '%s' (auto, "
					 "explicit, thp, none)", val);
		}
		return SPEC_FAIL(s, "unknown option '%s'", tok);
	}
	if (!strcmp(tok, "hugepages") || !strcmp(tok, "thp") ||
	    !strcmp(tok, "nohuge")) {
		if (!is_mem(s))
			goto wrong_tier;
		s->huge = tok[0] == 'h' ? KVT_HUGE_EXPLICIT :
			  tok[0] == 't' ? KVT_HUGE_THP : KVT_HUGE_NONE;
		return 0;
	}
	if (!strcmp(tok, "mlock") || !strcmp(tok, "populate") ||
	    !strcmp(tok, "pin")) {
		/* hostdev is host memory too: it can be locked and faulted
		 * in, but not registered as a GPU's host memory */
		if (!is_mem(s) && !(s->hostdev && tok[1] != 'i'))
			goto wrong_tier;
		if (tok[0] == 'm')
			s->mlock = 1;
		else if (tok[1] == 'o')
			s->populate = 1;
		else
			s->pin = 1;
		return 0;
	}
	if (!strcmp(tok, "allow-cpus")) {
		if (s->kind != KVT_TIER_FABRIC)
			goto wrong_tier;
		s->allow_cpus = 1;
		return 0;
	}
	if (!strcmp(tok, "memfd")) {
		if (s->kind != KVT_TIER_FABRIC)
			goto wrong_tier;
		if (s->backing != KVT_BACK_NONE)
			return SPEC_FAIL(s, "'memfd': fabric already has "
					 "a backing");
		s->backing = KVT_BACK_MEMFD;
		return 0;
	}
	if (!strcmp(tok, "persist")) {
		if (s->kind != KVT_TIER_SSD)
			goto wrong_tier;
		s->persist = 1;
		return 0;
	}
	if (!strcmp(tok, "temp") || !strcmp(tok, "fresh")) {
		if (s->kind != KVT_TIER_SSD && s->kind != KVT_TIER_FABRIC)
			goto wrong_tier;
		if (tok[0] == 't')
			s->temp = 1;
		else if (s->kind == KVT_TIER_SSD)
			s->fresh = 1;
		else
			goto wrong_tier;
		return 0;
	}
	return SPEC_FAIL(s, "unknown option '%s'", tok);
wrong_tier:
	return SPEC_FAIL(s, "option '%s' does not apply to %s", tok,
			 kn);
}

static int spec_check(kvt_tier_spec *s)
{
	switch (s->kind) {
	case KVT_TIER_FABRIC:
		if (s->backing == KVT_BACK_NONE)
			return SPEC_FAIL(s, "fabric needs a backing: "
					 "/dev/daxX.Y, numa=N, file=PATH or memfd");
		if (s->backing != KVT_BACK_DEVDAX && !s->bytes)
			return SPEC_FAIL(s, "missing size (e.g. 4G)");
		if (s->allow_cpus && s->backing != KVT_BACK_NUMA)
			return SPEC_FAIL(s, "allow-cpus applies to "
					 "numa=N only");
		if (s->temp && s->backing != KVT_BACK_FILE)
			return SPEC_FAIL(s, "temp applies to file= only");
		if ((s->backing == KVT_BACK_FILE || s->backing == KVT_BACK_MEMFD ||
		     s->backing == KVT_BACK_DEVDAX) && s->huge != KVT_HUGE_AUTO &&
		    s->huge != KVT_HUGE_NONE)
			return SPEC_FAIL(s, "hugepage options apply to "
					 "anonymous (numa=) fabric memory only");
		break;
	case KVT_TIER_SSD:
		if (!s->path[0])
			return SPEC_FAIL(s, "missing directory "
					 "(ssd:/path,SIZE)");
		if (!s->bytes)
			return SPEC_FAIL(s, "missing size (e.g. 100G)");
		if (s->persist && s->temp)
			return SPEC_FAIL(s, "'persist' keeps the pages for the "
					 "next run, 'temp' removes them at "
					 "close: choose one");
		break;
	case KVT_TIER_REMOTE:
		if (!s->path[0])
			return SPEC_FAIL(s, "missing address "
					 "(remote:redis://host:port)");
		break;
	default:
		if (!s->bytes)
			return SPEC_FAIL(s, "missing size (e.g. 8G)");
		break;
	}
	return 0;
}

int kvt_tier_spec_parse(const char *str, kvt_tier_spec *specs, size_t max,
			size_t *n)
{
	char buf[4096], *tok, *save = NULL;
	kvt_tier_spec cur;
	size_t count = 0;
	int have = 0, err;

	*n = 0;
	if (!str || !*str)
		return kvti_fail(KVT_ESPEC, "empty tier spec");
	if (kvti_strlcpy(buf, str, sizeof(buf)))
		return kvti_fail(KVT_ESPEC, "tier spec longer than %zu bytes",
				 sizeof(buf) - 1);
	for (tok = strtok_r(buf, ",; \t\n", &save); tok;
	     tok = strtok_r(NULL, ",; \t\n", &save)) {
		kvt_tier_kind kind;
		const char *rest;
		int hostdev;

		if (tok_kind(tok, &kind, &hostdev, &rest)) {
			if (have) {
				if ((err = spec_check(&cur)))
					return err;
				if (count == max)
					return kvti_fail(-E2BIG, "more than %zu "
							 "tiers", max);
				specs[count++] = cur;
			}
			spec_init(&cur, kind, hostdev);
			have = 1;
			kvti_strlcpy(cur.text, tok, sizeof(cur.text));
			tok = (char *)rest;
		} else if (!have) {
			return kvti_fail(KVT_ESPEC, "tier spec '%s': '%s' does "
					 "not start with a tier (hbm, hostdev, "
					 "fabric, dram, ssd, remote followed by "
					 "':')", str, tok);
		} else {
			/* cur.text collects this tier's tokens for messages */
			size_t l = strlen(cur.text);
			snprintf(cur.text + l, sizeof(cur.text) - l, ",%s", tok);
		}
		if ((err = spec_option(&cur, tok)))
			return err;
	}
	if (!have)
		return kvti_fail(KVT_ESPEC, "empty tier spec");
	if ((err = spec_check(&cur)))
		return err;
	if (count == max)
		return kvti_fail(-E2BIG, "more than %zu tiers", max);
	specs[count++] = cur;
	*n = count;
	return 0;
}

char *kvt_tier_spec_format(const kvt_tier_spec *s, char *buf, size_t len)
{
	char size[32] = "";
	size_t k;

	k = (size_t)snprintf(buf, len, "%s:", s->hostdev ? "hostdev" :
			     kvt_tier_kind_name(s->kind));
#define ADD(...)                                                            \
	do {                                                                \
		if (k < len)                                                \
			k += (size_t)snprintf(buf + k, len - k, __VA_ARGS__); \
	} while (0)
	switch (s->backing) {
	case KVT_BACK_DEVDAX:
	case KVT_BACK_DIR:
		ADD("%s,", s->path);
		break;
	case KVT_BACK_FILE:
		ADD("file=%s,", s->path);
		break;
	case KVT_BACK_MEMFD:
		ADD("memfd,");
		break;
	case KVT_BACK_NUMA:
		ADD("numa=%d,", s->numa_node);
		break;
	case KVT_BACK_NONE:
		if (s->kind == KVT_TIER_REMOTE)
			ADD("%s,", s->path);
		break;
	default:
		break;
	}
	if (s->bytes) {
		uint64_t b = s->bytes;
		const char *u = "";
		if (!(b & ((1ull << 40) - 1))) b >>= 40, u = "T";
		else if (!(b & ((1ull << 30) - 1))) b >>= 30, u = "G";
		else if (!(b & ((1ull << 20) - 1))) b >>= 20, u = "M";
		else if (!(b & ((1ull << 10) - 1))) b >>= 10, u = "K";
		snprintf(size, sizeof(size), "%llu%s", (unsigned long long)b, u);
		ADD("%s,", size);
	}
	if (s->huge != KVT_HUGE_AUTO)
		ADD("huge=%s,", huge_names[s->huge]);
	if (s->mlock) ADD("mlock,");
	if (s->populate) ADD("populate,");
	if (s->pin) ADD("pin,");
	if (s->allow_cpus) ADD("allow-cpus,");
	if (s->temp) ADD("temp,");
	if (s->fresh) ADD("fresh,");
	if (s->persist) ADD("persist,");
	if (s->kind == KVT_TIER_SSD && s->files != 1) ADD("files=%u,", s->files);
	if (s->kind == KVT_TIER_HBM && !s->hostdev && s->device) {
		char dn[16];

		if (s->device >= KVT_DEVICE_EMU)
			ADD("device=%s,", kvt_device_format(s->device, dn,
							     sizeof(dn)));
		else
			ADD("device=%d,", s->device);
	}
	if (s->kind == KVT_TIER_HBM && s->layout != KVT_LAYOUT_VLLM)
		ADD("layout=%s,", kvt_layout_name((kvt_layout_kind)s->layout));
#undef ADD
	k = strlen(buf);
	if (k && buf[k - 1] == ',')
		buf[k - 1] = '\0';
	return buf;
}
