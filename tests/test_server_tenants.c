/*
 * test_server_tenants — who may act as a tenant, and what HELLO and
 * REGISTER give away (issue 21, finding 10):
 *
 *   - gid= matches supplementary groups too (it matched only the primary
 *     group: a user in the tenant's group by membership was refused);
 *   - HELLO for a tenant that exists but is not open to the peer and for
 *     one that does not exist are refused alike (-EACCES), and the reply
 *     names no tenant (it said "tenant bob does not allow ...", and
 *     KVT_ENOTFOUND for ids that do not exist: anyone could map ids to
 *     names);
 *   - STATS shows a tenant its own figures only; root (and a tenant
 *     marked admin) every tenant's (any monitor saw them all);
 *   - REGISTER counts memory against the tenant's mem= (it mapped any
 *     size: a sparse memfd of a terabyte was taken), and maps a segment
 *     only as far as it says.
 *
 * The uid and group parts run as root (a child drops to unused ids);
 * without root they are skipped.
 */
#include "server_util.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>

#define UID_A 61031
#define GID_PRIMARY 61032
#define GID_SUPP 61033

static char sock[108];
static const char *model;

/* In a child as UID_A, primary group GID_PRIMARY, member of GID_SUPP:
 * connect as @tenant; exit 0 if the result is @want (and, for -EACCES,
 * the detail names no tenant). */
static int as_other(uint32_t tenant, int want)
{
	pid_t pid = fork();
	int st = 0;

	if (pid == 0) {
		gid_t supp = GID_SUPP;
		kvt_client *cl = NULL;
		int err;

		if (setgroups(1, &supp) ||
		    setresgid(GID_PRIMARY, GID_PRIMARY, GID_PRIMARY) ||
		    setresuid(UID_A, UID_A, UID_A))
			_exit(3);
		err = srv_connect(&cl, sock, model, tenant, 1, 0);
		if (err != want) {
			fprintf(stderr, "tenant %u: %s (%s), want %s\n", tenant,
				kvt_strerror(err), kvt_errdetail(),
				kvt_strerror(want));
			_exit(1);
		}
		if (err == -EACCES && (strstr(kvt_errdetail(), "alpha") ||
				       strstr(kvt_errdetail(), "beta"))) {
			fprintf(stderr, "tenant %u: the refusal names a tenant: "
				"%s\n", tenant, kvt_errdetail());
			_exit(1);
		}
		kvt_client_close(cl);
		_exit(0);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The tenant names in a STATS reply, comma-joined into @out. */
static void stats_names(kvt_client *cl, char *out, size_t len)
{
	char *js = NULL;
	cJSON *root, *t;

	out[0] = 0;
	if (kvt_client_stats(cl, &js))
		return;
	root = cJSON_Parse(js);
	cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tenants")) {
		cJSON *n = cJSON_GetObjectItem(t, "name");

		if (cJSON_IsString(n) && n->valuestring[0])
			snprintf(out + strlen(out), len - strlen(out), "%s,",
				 n->valuestring);
	}
	cJSON_Delete(root);
	free(js);
}

/* A monitor as the other uid sees only alpha; root sees every tenant. */
static void test_stats_scope(void)
{
	kvt_client_config mc = KVT_CLIENT_CONFIG_INIT;
	kvt_client *mon = NULL;
	char names[256];
	pid_t pid;
	int st = 0;

	mc.socket = sock;
	CHECK_OK(kvt_client_connect(&mon, &mc));
	if (mon) {
		stats_names(mon, names, sizeof(names));
		CHECK(strstr(names, "alpha") && strstr(names, "beta") &&
		      strstr(names, "small"));
	}
	kvt_client_close(mon);
	if (getuid() != 0)
		return;
	pid = fork();
	if (pid == 0) {
		gid_t supp = GID_SUPP;

		if (setgroups(1, &supp) ||
		    setresgid(GID_PRIMARY, GID_PRIMARY, GID_PRIMARY) ||
		    setresuid(UID_A, UID_A, UID_A) ||
		    kvt_client_connect(&mon, &mc))
			_exit(3);
		stats_names(mon, names, sizeof(names));
		kvt_client_close(mon);
		if (strcmp(names, "alpha,")) {
			fprintf(stderr, "tenant alpha's STATS show: %s\n",
				names);
			_exit(1);
		}
		_exit(0);
	}
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_ids(void)
{
	if (getuid() != 0) {
		fprintf(stderr, "not root: no other uid or groups to try\n");
		return;
	}
	/* tenant 1 is open to GID_SUPP, a supplementary group only */
	CHECK_EQ(as_other(1, 0), 0);
	/* tenant 2 exists, not open to us; tenant 99 does not exist */
	CHECK_EQ(as_other(2, -EACCES), 0);
	CHECK_EQ(as_other(99, -EACCES), 0);
}

static int register_size(kvt_client *cl, uint64_t file_bytes, uint64_t nb)
{
	const kvt_geom *g = kvt_client_geom(cl);
	uint64_t chunk = kvt_geom_chunk_bytes(g), layer = 2 * nb * chunk;
	uint64_t off[SRV_L];
	kvt_client_mem *m = NULL;
	int fd = memfd_create("kvtier-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int err;

	CHECK(fd >= 0 && ftruncate(fd, (off_t)file_bytes) == 0 &&
	      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	for (uint32_t l = 0; l < SRV_L; l++)
		off[l] = l * layer;
	err = kvt_client_register_fd(cl, fd, off, SRV_L, nb, chunk, nb * chunk,
				     2 * 64 * 2, -1, &m);
	kvt_client_mem_free(m);
	close(fd);
	return err;
}

static void test_register_cap(void)
{
	kvt_client *cl = NULL;
	uint64_t nb = 8, need = 2 * nb * SRV_P * 2 * 64 * 2 * SRV_L;

	/* tenant 3 may register 1 MiB: the layout needs 256 KiB */
	CHECK_OK(srv_connect(&cl, sock, model, 3, 1, 0));
	if (!cl)
		return;
	CHECK_OK(register_size(cl, need, nb));
	CHECK_ERR(register_size(cl, 2ull << 20, nb), KVT_EFULL);
	/* a sparse memfd of 1 TiB: refused, not mapped */
	CHECK_ERR(register_size(cl, 1ull << 40, nb), KVT_EFULL);
	CHECK_OK(register_size(cl, need, nb)); /* the cap was given back */
	kvt_client_close(cl);
	/* a tenant without mem=: the machine's memory */
	CHECK_OK(srv_connect(&cl, sock, model, 0, 1, 0));
	if (cl)
		CHECK_ERR(register_size(cl, 1ull << 40, nb), KVT_EFULL);
	kvt_client_close(cl);
}

int main(void)
{
	kvtd_config cfg = { 0 };
	char tenants[256];
	pid_t d;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-ten-%d.sock", (int)getpid());
	model = srv_model();
	snprintf(tenants, sizeof(tenants), "default:0;alpha:1,gid=%u;"
		 "beta:2,uid=1;small:3,mem=1M", GID_SUPP);
	cfg.socket = sock;
	cfg.socket_mode = 0666;
	cfg.tiers = "dram:2M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.tenants = tenants;
	d = srv_start(&cfg);
	CHECK(d > 0);
	if (d > 0) {
		test_ids();
		test_register_cap();
		test_stats_scope();
		CHECK_EQ(srv_stop(d), 0);
	}
	unlink(model);
	TEST_DONE();
}
