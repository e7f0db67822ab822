/*
 * cmd_demo_file.c — `kvtier demo --out FILE`: the JSON result kept on disk
 * while a long run goes, so a run cut short (a cap, ^C, a kill) keeps every
 * pass it finished.
 *
 * Before the first pass and after every pass, the whole document so far is
 * written to FILE.tmp, fsync'ed and renamed over FILE (then the directory
 * is fsync'ed): FILE is always one whole document, never half-written, and
 * a signal at any moment leaves the last one. A run still going writes
 * "complete": false with "passes_done", "passes_total" and "repeats_done"
 * (the derived results, throughput at equal TTFT and the goals, come from
 * the repeats every pass of which finished: null until one has); the last
 * write is the document --json prints plus "complete": true.
 *
 * FILE is checked before any pass runs (kvti_cd_out_open(): FILE.tmp is
 * created and removed), so a bad path fails at once.
 *
 * SIGINT and SIGTERM (with or without --out) stop the run cleanly: the
 * handler sets kvti_cd_stop, which the library reads (kvt_demo_config.stop)
 * at every turn of the pass's loop; the pass ends, its tiers close and its
 * temporary files (gigabytes of ssd tier by default) go; the cut pass is
 * not written; then kvti_cd_stopped() ends the process by the same signal
 * (exit status 128 + N). A second signal a second or more later ends it
 * at once. The format is in docs/FORMATS.md.
 */
#include "cmd_demo.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char out_path[PATH_MAX], out_tmp[PATH_MAX + 8];
static int out_failed;
static pid_t main_pid;
volatile sig_atomic_t kvti_cd_stop;

/* SIGINT/SIGTERM: the run stops at the pass's next loop turn and cleans up
 * (kvt_demo_config.stop). A second signal a second or more after the first
 * has the default action; one sooner is the same signal again (timeout(1)
 * sends SIGTERM to its child and to its process group: twice at once) and
 * is ignored. A forked child (the demo's daemons) takes the default action
 * at once, as before. */
static void on_signal(int sig)
{
	static struct timespec first;
	struct timespec now;
	int saved = errno;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (getpid() != main_pid ||
	    (kvti_cd_stop && (now.tv_sec - first.tv_sec) * 1000000000LL +
			     (now.tv_nsec - first.tv_nsec) >= 1000000000LL)) {
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	if (!kvti_cd_stop) {
		first = now;
		kvti_cd_stop = sig;
	}
	errno = saved;
}

void kvti_cd_signals(void)
{
	struct sigaction sa;

	main_pid = getpid();
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

void kvti_cd_stopped(void)
{
	int sig = kvti_cd_stop;

	if (!sig)
		return;
	if (out_path[0]) {
		unlink(out_tmp);
		fprintf(stderr, "\nkvtier demo: stopped by signal %d; '%s' holds "
			"the passes finished before it\n", sig, out_path);
	} else {
		fprintf(stderr, "\nkvtier demo: stopped by signal %d\n", sig);
	}
	fflush(NULL);
	signal(sig, SIG_DFL);
	raise(sig);
}

int kvti_cd_out_open(const char *path)
{
	struct stat st;
	int fd;

	if (!path[0] || strlen(path) >= sizeof(out_path)) {
		fprintf(stderr, "kvtier demo: --out: bad file name '%s'\n", path);
		return -1;
	}
	if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
		fprintf(stderr, "kvtier demo: --out: '%s' is a directory\n",
			path);
		return -1;
	}
	snprintf(out_path, sizeof(out_path), "%s", path);
	snprintf(out_tmp, sizeof(out_tmp), "%s.tmp", path);
	fd = open(out_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "kvtier demo: --out: cannot write '%s': %s "
			"(its directory must exist and be writable)\n", out_tmp,
			strerror(errno));
		return -1;
	}
	close(fd);
	unlink(out_tmp);
	return 0;
}

/* @s into FILE.tmp, fsync, rename over FILE, fsync the directory. */
static int write_atomic(const char *s)
{
	size_t len = strlen(s), off = 0;
	char dir[PATH_MAX], *slash;
	int fd, err = 0;

	fd = open(out_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	while (off < len) {
		ssize_t n = write(fd, s + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			err = n < 0 ? -errno : -EIO;
			break;
		}
		off += (size_t)n;
	}
	if (!err && (write(fd, "\n", 1) != 1 || fsync(fd)))
		err = -errno ? -errno : -EIO;
	if (close(fd) && !err)
		err = -errno;
	if (!err && rename(out_tmp, out_path))
		err = -errno;
	if (err) {
		unlink(out_tmp);
		return err;
	}
	snprintf(dir, sizeof(dir), "%s", out_path);
	slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = 0;
	else if (slash)
		*slash = 0;
	else
		snprintf(dir, sizeof(dir), ".");
	if ((fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
		fsync(fd); /* the rename made durable; best effort */
		close(fd);
	}
	return 0;
}

/* Repeats every main pass of which (each policy at each rate) finished:
 * the passes run repeat by repeat (demo.h), so the first n. */
static uint32_t repeats_done(const kvt_demo_result *r)
{
	const kvt_demo_config *c = &r->config;
	uint32_t per = kvti_cd_nrates(c) *
		       (uint32_t)__builtin_popcount(c->policies & KVT_DEMO_ALL);
	uint32_t k = 0;

	for (; k < c->repeat; k++) {
		uint32_t n = 0;

		for (int i = 0; i < r->npasses; i++)
			n += !r->pass[i].variant[0] && r->pass[i].repeat == k;
		if (n < per)
			break;
	}
	return k;
}

/* The document of a run still going: the passes so far; what is derived
 * from the repeats that finished whole. */
static cJSON *partial_json(const kvt_demo_result *r, int err, size_t done,
			   size_t total)
{
	kvt_demo_result v = *r; /* shallow: the same passes */
	uint32_t rd = repeats_done(r);
	cJSON *root, *o;

	v.config.repeat = rd;
	root = kvti_cd_result_json(&v, err);
	if ((o = cJSON_GetObjectItem(root, "config")))
		cJSON_ReplaceItemInObject(o, "repeat",
					  cJSON_CreateNumber(r->config.repeat));
	if (r->config.nrates >= 2) {
		if (!cJSON_HasObjectItem(root, "throughput_at_equal_ttft"))
			cJSON_AddNullToObject(root, "throughput_at_equal_ttft");
		if (!cJSON_HasObjectItem(root, "goals"))
			cJSON_AddNullToObject(root, "goals");
	}
	cJSON_AddBoolToObject(root, "complete", 0);
	cJSON_AddNumberToObject(root, "passes_done", (double)done);
	cJSON_AddNumberToObject(root, "passes_total", (double)total);
	cJSON_AddNumberToObject(root, "repeats_done", rd);
	return root;
}

static void write_doc(cJSON *root)
{
	char *s = root ? cJSON_Print(root) : NULL;
	int e = s ? write_atomic(s) : -ENOMEM;

	if (e && !out_failed)
		fprintf(stderr, "\nkvtier demo: --out: cannot write '%s': %s "
			"(the run goes on)\n", out_path, strerror(-e));
	out_failed |= e != 0;
	cJSON_free(s);
	cJSON_Delete(root);
}

void kvti_cd_out_pass(const kvt_demo_result *r, int err, size_t done,
		      size_t total)
{
	if (kvti_cd_stop)
		return; /* the pass a signal cut short: not one to keep */
	write_doc(partial_json(r, err, done, total));
}

void kvti_cd_out_final(const cJSON *doc)
{
	cJSON *d = cJSON_Duplicate(doc, 1);

	if (d)
		cJSON_AddBoolToObject(d, "complete", 1);
	write_doc(d);
}

int kvti_cd_out_failed(void)
{
	return out_failed;
}
