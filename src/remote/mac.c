/*
 * mac.c — the remote values' authentication (docs/REMOTE.md "Trust"): key
 * files, the MAC keys derived from them, per-tenant keys, the MAC itself.
 *
 *   key file (>= 32 bytes, mode 600) --BLAKE2b--> master
 *   master --keyed BLAKE2b("kvtier remote value mac v2", ns)--> MAC key
 *
 *   the spec's key=FILE   -> r->fmt.key: every tenant's values
 *   kvt_remote_tenant_key(r, T, FILE)
 *                         -> r->tkeys[]: tenant T's values (get_as /
 *                            set_as with T), from FILE by the same
 *                            derivation: tenants naming one file share a
 *                            key (and the namespace's, when it is the
 *                            spec's file); a node without T's file can
 *                            neither forge T's values nor verify them
 *
 *   a value: Poly1305 tag over header, sums, page and a fresh nonce under
 *   a one-time key = keyed BLAKE2b(header, nonce) under the MAC key.
 *
 * Locking: r->tkeys[] is written by kvt_remote_tenant_key() and read by
 * every call under r->mu.
 */
#include "remote/remote_impl.h"

#include <errno.h>
#include <sodium.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>

void kvti_remote_fmt_key(struct kvti_rfmt *f, const void *secret, size_t len,
			 const char *ns)
{
	static const char dom[] = "kvtier remote value mac v2";
	uint8_t master[32];
	crypto_generichash_state st;

	/* the secret (any length) to 32 bytes, then one key per namespace */
	crypto_generichash(master, sizeof(master), secret, len, NULL, 0);
	crypto_generichash_init(&st, master, sizeof(master), sizeof(f->key));
	crypto_generichash_update(&st, (const uint8_t *)dom, sizeof(dom));
	crypto_generichash_update(&st, (const uint8_t *)ns, strlen(ns) + 1);
	crypto_generichash_final(&st, f->key, sizeof(f->key));
	sodium_memzero(master, sizeof(master));
	f->mac = 1;
}

/* The value's one-time Poly1305 key: keyed BLAKE2b of its header and its
 * nonce (a nonce is never reused, so neither is a one-time key). */
static void mac_otk(const struct kvti_rfmt *f, const uint8_t *v,
		    const uint8_t *nonce, uint8_t *otk)
{
	crypto_generichash_state st;

	crypto_generichash_init(&st, f->key, sizeof(f->key),
				crypto_onetimeauth_KEYBYTES);
	crypto_generichash_update(&st, v, KVT_REMOTE_HDR);
	crypto_generichash_update(&st, nonce, KVTI_RMAC_NONCE);
	crypto_generichash_final(&st, otk, crypto_onetimeauth_KEYBYTES);
}

void kvti_remote_mac_write(const struct kvti_rfmt *f, uint8_t *v)
{
	uint64_t body = kvti_remote_head_bytes(f) + f->page_bytes;
	uint8_t otk[crypto_onetimeauth_KEYBYTES];

	randombytes_buf(v + body, KVTI_RMAC_NONCE);
	mac_otk(f, v, v + body, otk);
	/* everything before the tag: header, sums, page, nonce */
	crypto_onetimeauth(v + body + KVTI_RMAC_NONCE, v,
			   body + KVTI_RMAC_NONCE, otk);
	sodium_memzero(otk, sizeof(otk));
}

int kvti_remote_mac_check(const struct kvti_rfmt *f, const void *value)
{
	const uint8_t *v = value;
	uint64_t body = kvti_remote_head_bytes(f) + f->page_bytes;
	uint8_t otk[crypto_onetimeauth_KEYBYTES];
	int bad;

	mac_otk(f, v, v + body, otk);
	bad = crypto_onetimeauth_verify(v + body + KVTI_RMAC_NONCE, v,
					body + KVTI_RMAC_NONCE, otk);
	sodium_memzero(otk, sizeof(otk));
	return bad ? KVT_ECORRUPT : 0;
}

/* XXH3-64 of the header's first 56 bytes and the sums. */
/* Read key file @path (at least 32 bytes no one but the owner may
 * read) and derive the MAC key of namespace @ns into @f. */
static int key_from_file(struct kvti_rfmt *f, const char *path,
			 const char *ns)
{
	char *buf = NULL;
	struct stat st;
	size_t len = 0;
	int err;

	if (sodium_init() < 0)
		return kvti_fail(-ENOSYS, "remote: libsodium would not start");
	if (stat(path, &st))
		return kvti_fail(KVT_ECONFIG, "remote: key file %s: %s", path,
				 strerror(errno));
	if (st.st_mode & 077)
		return kvti_fail(KVT_ECONFIG, "remote: key file %s is readable "
				 "or writable by others (mode %03o): chmod 600 "
				 "it", path, (unsigned)(st.st_mode & 0777));
	if ((err = kvti_read_file(path, 4096, &buf, &len)))
		return kvti_fail(KVT_ECONFIG, "remote: key file %s: %s", path,
				 kvti_file_strerror(err));
	if (len < 32) {
		sodium_memzero(buf, len);
		kvt_free(buf);
		return kvti_fail(KVT_ECONFIG, "remote: key file %s has %zu "
				 "bytes, at least 32 are needed (e.g. head -c 32 "
				 "/dev/urandom)", path, len);
	}
	kvti_remote_fmt_key(f, buf, len, ns);
	sodium_memzero(buf, len);
	kvt_free(buf);
	return 0;
}

int kvti_remote_load_key(kvt_remote *r)
{
	if (sodium_init() < 0)
		return kvti_fail(-ENOSYS, "remote: libsodium would not start");
	if (!r->spec.keyfile[0]) {
		kvti_warn("remote: %s:%d: no key= in the remote spec: values "
			  "are not authenticated, so anyone who can write to "
			  "this Redis can make this node serve forged KV pages "
			  "(docs/REMOTE.md, \"Trust\")", r->spec.seeds[0].host,
			  r->spec.seeds[0].port);
		return 0;
	}
	return key_from_file(&r->fmt, r->spec.keyfile, r->spec.ns);
}

int kvt_remote_tenant_key(kvt_remote *r, uint32_t tenant, const char *path)
{
	struct kvti_rfmt f;
	int err;

	kvti_errclear();
	if (!r || !path || !*path || tenant == KVT_REMOTE_ANY_TENANT)
		return kvti_fail(-EINVAL, "kvt_remote_tenant_key: bad argument");
	f = r->fmt;
	if ((err = key_from_file(&f, path, r->spec.ns)))
		return err;
	pthread_mutex_lock(&r->mu);
	for (size_t i = 0; i < r->ntkeys; i++)
		if (r->tkeys[i].tenant == tenant) {
			memcpy(r->tkeys[i].key, f.key, sizeof(f.key));
			goto out;
		}
	if (r->ntkeys == KVTI_RTKEYS_MAX) {
		err = kvti_fail(KVT_EFULL, "kvt_remote_tenant_key: %d tenant "
				"keys already", KVTI_RTKEYS_MAX);
		goto out;
	}
	if (r->ntkeys == r->captkeys) {
		size_t cap = r->captkeys ? 2 * r->captkeys : 8;
		struct kvti_rtkey *t = kvt_malloc(cap * sizeof(*t));

		if (!t) {
			err = -ENOMEM;
			goto out;
		}
		if (r->ntkeys)
			memcpy(t, r->tkeys, r->ntkeys * sizeof(*t));
		kvti_remote_tkeys_free(r);
		r->tkeys = t;
		r->captkeys = cap;
	}
	r->tkeys[r->ntkeys].tenant = tenant;
	memcpy(r->tkeys[r->ntkeys].key, f.key, sizeof(f.key));
	r->ntkeys++;
out:
	pthread_mutex_unlock(&r->mu);
	sodium_memzero(f.key, sizeof(f.key));
	return err;
}

void kvti_remote_fmt_for(const kvt_remote *r, uint32_t tenant,
			 struct kvti_rfmt *f)
{
	*f = r->fmt;
	for (size_t i = 0; tenant != KVT_REMOTE_ANY_TENANT && i < r->ntkeys;
	     i++)
		if (r->tkeys[i].tenant == tenant) {
			memcpy(f->key, r->tkeys[i].key, sizeof(f->key));
			f->mac = 1;
			return;
		}
}

void kvti_remote_tkeys_free(kvt_remote *r)
{
	if (r->tkeys)
		sodium_memzero(r->tkeys, r->captkeys * sizeof(*r->tkeys));
	kvt_free(r->tkeys);
	r->tkeys = NULL;
	r->ntkeys = r->captkeys = 0;
}
