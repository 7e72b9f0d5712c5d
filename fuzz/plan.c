/* fuzz/plan.c: plan_parse() (csrc/launch/plan.c), the launcher's command line.
 *
 * The input is split on NUL bytes into argv[1..] (argv[0] is "corral-launch"; a trailing NUL
 * does not add an empty argument, two NULs in a row do; an argument that is the single byte
 * 0xFF stands for a NULL pointer, which execve never passes but plan_parse() must refuse). Each
 * argument is its own heap block of exactly its size and argv has exactly argc entries (no NULL
 * after the last: plan.h says it need not have one), so a read one byte too far is an
 * AddressSanitizer report. After the call every invariant of struct plan is checked, on success
 * and on failure (then a message of one printable line); LeakSanitizer (libFuzzer's
 * -detect_leaks, on by default) catches a failure that leaves its vectors allocated.
 */
#include "fuzz.h"
#include "../csrc/launch/plan.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERRLEN 256              /* the launcher's own buffer (csrc/launch/main.c) */

struct args {
	int argc;
	char **argv;
	size_t *len;            /* strlen of each, 0 for NULL */
};

static void split(struct args *a, const uint8_t *data, size_t size)
{
	size_t i, start, n = 1;
	int k;

	for (i = 0; i < size; i++)
		if (data[i] == 0)
			n++;
	if (size > 0 && data[size - 1] == 0)
		n--;            /* a trailing NUL ends the last argument, adds none */
	if (size == 0)
		n = 0;
	a->argc = (int)n + 1;
	a->argv = malloc((size_t)a->argc * sizeof *a->argv);
	a->len = malloc((size_t)a->argc * sizeof *a->len);
	if (!a->argv || !a->len)
		abort();
	a->len[0] = strlen("corral-launch");
	a->argv[0] = strdup("corral-launch");
	if (!a->argv[0])
		abort();
	for (k = 1, start = 0; k < a->argc; k++) {
		size_t end = start;

		while (end < size && data[end] != 0)
			end++;
		if (end - start == 1 && data[start] == 0xFF) {
			a->argv[k] = NULL;
			a->len[k] = 0;
		} else {
			a->argv[k] = malloc(end - start + 1);
			if (!a->argv[k])
				abort();
			memcpy(a->argv[k], data + start, end - start);
			a->argv[k][end - start] = '\0';
			a->len[k] = end - start;
		}
		start = end + 1;
	}
}

static void release(struct args *a)
{
	int k;

	for (k = 0; k < a->argc; k++)
		free(a->argv[k]);
	free(a->argv);
	free(a->len);
}

/* The index of the argument s points into (its first byte or any byte up to its NUL), or -1. */
static int arg_of(const struct args *a, const char *s)
{
	int k;

	for (k = 0; k < a->argc; k++)
		if (a->argv[k] && s >= a->argv[k] && s <= a->argv[k] + a->len[k])
			return k;
	return -1;
}

/* s is an option's value: a whole argument, or what follows "=" in --opt=VALUE. */
static void check_value(const struct args *a, const char *s, const char *what)
{
	int k = arg_of(a, s);

	FUZZ_CHECK(k >= 1, "%s does not point into argv[1..]", what);
	FUZZ_CHECK(s == a->argv[k] || s[-1] == '=', "%s starts inside an argument", what);
}

static void check_abs_path(const struct args *a, const char *s, int allow_root, const char *what)
{
	size_t len;

	check_value(a, s, what);
	len = strlen(s);
	FUZZ_CHECK(len >= 1 && s[0] == '/', "%s '%s' is not absolute", what, s);
	FUZZ_CHECK(allow_root || len >= 2, "%s is '/'", what);
	FUZZ_CHECK(len < PATH_MAX, "%s is %zu bytes", what, len);
}

static void check_success(const struct args *a, const struct plan *p, const char *err)
{
	size_t i;

	FUZZ_CHECK(err[0] == '\0', "success with an error message: %s", err);
	FUZZ_CHECK(p->mode >= PLAN_RUN && p->mode <= PLAN_RELAY, "mode %d", (int)p->mode);
	FUZZ_CHECK(p->net >= PLAN_NET_HOST && p->net <= PLAN_NET_REQUIRE, "net %d", (int)p->net);
	FUZZ_CHECK(p->userns >= PLAN_USERNS_AUTO && p->userns <= PLAN_USERNS_ALWAYS, "userns %d",
		   (int)p->userns);
	FUZZ_CHECK(p->landlock >= PLAN_MECH_OFF && p->landlock <= PLAN_MECH_REQUIRE, "landlock");
	FUZZ_CHECK(p->seccomp >= PLAN_MECH_OFF && p->seccomp <= PLAN_MECH_REQUIRE, "seccomp");
	FUZZ_CHECK(p->report_fd >= -1, "report_fd %d", p->report_fd);
	FUZZ_CHECK(p->status_fd == -1 || (p->status_fd >= 3 && p->status_fd <= 1023 &&
					  p->status_fd != p->report_fd), "status_fd %d", p->status_fd);
	FUZZ_CHECK(p->files_wait_fd == -1 || (p->files_wait_fd >= 3 && p->files_wait_fd <= 1023 &&
					      p->files_wait_fd != p->report_fd && p->status_fd == -1 &&
					      p->files_in != NULL), "files_wait_fd %d", p->files_wait_fd);
	FUZZ_CHECK(p->mode != PLAN_RELAY || (p->status_fd >= 3 && p->report_fd == -1),
		   "relay with status_fd %d, report_fd %d", p->status_fd, p->report_fd);
	FUZZ_CHECK(p->parent_pid >= 0, "parent_pid %d", (int)p->parent_pid);
	FUZZ_CHECK(p->pidns == 0 || p->pidns == 1, "pidns %d", p->pidns);
	FUZZ_CHECK(p->has_ids == 0 || p->has_ids == 1, "has_ids %d", p->has_ids);
	FUZZ_CHECK(p->has_ids || (p->uid == 0 && p->gid == 0), "ids without has_ids");
	FUZZ_CHECK(p->uid != (uid_t)-1 && p->gid != (gid_t)-1, "uid or gid is -1");
	FUZZ_CHECK(p->sweep_uid == 0 || p->sweep_uid == 1, "sweep_uid %d", p->sweep_uid);
	for (i = 0; i < PLAN_RL_COUNT; i++) {
		FUZZ_CHECK(p->rlimit[i].set == 0 || p->rlimit[i].set == 1, "rlimit %zu set", i);
		FUZZ_CHECK(p->rlimit[i].set || p->rlimit[i].value == 0, "rlimit %zu value unset", i);
		FUZZ_CHECK(p->rlimit[i].value <= ~0ULL - 2, "rlimit %zu = %llu", i, p->rlimit[i].value);
	}
	if (p->chdir) {
		check_value(a, p->chdir, "chdir");
		FUZZ_CHECK(p->chdir[0] != '\0', "empty chdir");
	}
	FUZZ_CHECK(p->ntmpfs <= PLAN_MOUNTS_MAX, "ntmpfs %zu", p->ntmpfs);
	for (i = 0; i < p->ntmpfs; i++) {
		const struct plan_tmpfs *t = &p->tmpfs[i];
		int k = arg_of(a, t->path);

		FUZZ_CHECK(k >= 1, "tmpfs %zu path outside argv", i);
		FUZZ_CHECK(t->path_len >= 2 && t->path_len <= PATH_MAX - 1, "tmpfs path_len %zu",
			   t->path_len);
		/* the PATH part of PATH=BYTES lies inside its argument, followed by '=' */
		FUZZ_CHECK(t->path + t->path_len < a->argv[k] + a->len[k], "tmpfs path past its arg");
		FUZZ_CHECK(t->path[0] == '/' && t->path[t->path_len] == '=', "tmpfs path form");
		FUZZ_CHECK(memchr(t->path + t->path_len + 1, '=',
				  strlen(t->path + t->path_len + 1)) == NULL, "tmpfs size holds '='");
		FUZZ_CHECK(t->size >= 1 && t->size <= (1ULL << 62), "tmpfs size %llu", t->size);
	}
	FUZZ_CHECK(p->nro_bind <= PLAN_MOUNTS_MAX, "nro_bind %zu", p->nro_bind);
	for (i = 0; i < p->nro_bind; i++)
		check_abs_path(a, p->ro_bind[i], 0, "ro_bind");
	FUZZ_CHECK(p->work_tmpfs <= (1ULL << 62), "work_tmpfs %llu", p->work_tmpfs);
	FUZZ_CHECK(!p->work_tmpfs || (p->chdir && p->chdir[0] == '/'), "work_tmpfs without chdir");
	FUZZ_CHECK(p->nfs_ro <= PLAN_FS_MAX && p->nfs_rw <= PLAN_FS_MAX, "nfs");
	for (i = 0; i < p->nfs_ro; i++)
		check_abs_path(a, p->fs_ro[i], 1, "fs_ro");
	for (i = 0; i < p->nfs_rw; i++)
		check_abs_path(a, p->fs_rw[i], 1, "fs_rw");
	FUZZ_CHECK(p->landlock != PLAN_MECH_OFF ||
		   (!p->nfs_ro && !p->nfs_rw && !p->deny_tcp && !p->scope), "landlock options without it");
	FUZZ_CHECK(p->ndeny_syscall <= PLAN_SYSCALLS_MAX, "ndeny_syscall %zu", p->ndeny_syscall);
	for (i = 0; i < p->ndeny_syscall; i++) {
		const char *s = p->deny_syscall[i];

		check_value(a, s, "deny_syscall");
		FUZZ_CHECK(strlen(s) >= 1 && strlen(s) <= 64 &&
			   strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789_") == strlen(s),
			   "deny_syscall '%s'", s);
	}
	FUZZ_CHECK(p->seccomp != PLAN_MECH_OFF || (!p->ndeny_syscall && !p->deny_sockets && !p->unix_pairs),
		   "seccomp options without it");
	FUZZ_CHECK(p->budget_cpu_ms <= 604800000ULL, "budget_cpu_ms");
	FUZZ_CHECK(p->budget_memory_kb <= (1ULL << 40), "budget_memory_kb");
	FUZZ_CHECK(p->budget_poll_ms >= 1 && p->budget_poll_ms <= PLAN_POLL_MS_MAX, "budget_poll_ms %u",
		   p->budget_poll_ms);
	if (p->cgroup) {
		check_abs_path(a, p->cgroup, 1, "cgroup");
		FUZZ_CHECK(strlen(p->cgroup) < PATH_MAX - 64, "cgroup too long");
	}
	FUZZ_CHECK(!p->cgroup_require || p->cgroup, "cgroup_require without cgroup");
	FUZZ_CHECK(p->net_join >= 0, "net_join %d", (int)p->net_join);
	FUZZ_CHECK(p->held == 0 || p->held == 1, "held %d", p->held);
	if (p->seccomp_cache) {
		check_abs_path(a, p->seccomp_cache, 1, "seccomp_cache");
		FUZZ_CHECK(strlen(p->seccomp_cache) < PATH_MAX - 64, "seccomp_cache too long");
	}

	if (p->mode == PLAN_HOLD_NET) {
		/* --hold-net with at most --userns, --parent-pid and --held: no program */
		FUZZ_CHECK(p->program == NULL && p->nargs == 0 && p->nenv == 0, "a holder with a program");
		FUZZ_CHECK(a->argc <= 7, "a holder from %d arguments", a->argc);
		return;
	}
	FUZZ_CHECK(!p->held, "held outside --hold-net");

	if (p->mode != PLAN_RUN && p->mode != PLAN_RELAY) {
		/* --probe, --help, --kill-uid U: alone */
		const char *want = p->mode == PLAN_PROBE ? "--probe" :
				   p->mode == PLAN_HELP ? "--help" : "--kill-uid";

		FUZZ_CHECK(a->argc == 2 || (p->mode == PLAN_KILL_UID && a->argc == 3),
			   "mode %d with argc %d", (int)p->mode, a->argc);
		FUZZ_CHECK(strncmp(a->argv[1], want, strlen(want)) == 0, "mode %d from '%s'",
			   (int)p->mode, a->argv[1]);
		FUZZ_CHECK(p->mode != PLAN_KILL_UID ||
			   (p->kill_uid != 0 && p->kill_uid != (uid_t)-1), "kill_uid %u",
			   (unsigned)p->kill_uid);
		FUZZ_CHECK(p->program == NULL && p->nargs == 0 && p->nenv == 0, "a lone mode with a program");
		return;
	}

	FUZZ_CHECK(p->kill_uid == 0, "kill_uid in a run");
	FUZZ_CHECK(!p->net_join || p->net != PLAN_NET_HOST, "net_join with the host network");
	FUZZ_CHECK(!p->seccomp_cache || p->seccomp != PLAN_MECH_OFF, "seccomp_cache without seccomp");
	FUZZ_CHECK(p->vec_ && p->env && p->args, "vectors missing");
	FUZZ_CHECK(p->nenv <= (size_t)a->argc && p->nargs <= (size_t)a->argc, "counts %zu %zu",
		   p->nenv, p->nargs);
	for (i = 0; i < p->nenv; i++) {
		const char *e = p->env[i];

		check_value(a, e, "env");
		FUZZ_CHECK(e[0] != '=' && strchr(e, '=') != NULL, "env '%s'", e);
	}
	FUZZ_CHECK(p->env[p->nenv] == NULL, "env not NULL-terminated");
	FUZZ_CHECK(p->program && p->program[0] != '\0', "no program");
	FUZZ_CHECK(p->nargs >= 1 && p->args[0] == p->program, "args[0] is not program");
	FUZZ_CHECK(p->args[p->nargs] == NULL, "args not NULL-terminated");
	/* ARGS are the tail of argv, in order, the very pointers given */
	for (i = 0; i < p->nargs; i++)
		FUZZ_CHECK(p->args[i] == a->argv[(size_t)a->argc - p->nargs + i], "args[%zu]", i);
	/* a PROGRAM that looks like an option was only taken after "--" */
	if (strncmp(p->program, "--", 2) == 0)
		FUZZ_CHECK(strcmp(a->argv[(size_t)a->argc - p->nargs - 1], "--") == 0,
			   "option '%s' taken as PROGRAM", p->program);
}

static void check_failure(const struct plan *p, const char *err, size_t errlen)
{
	size_t n = strnlen(err, errlen);
	size_t i;

	FUZZ_CHECK(n < errlen, "err is not NUL-terminated");
	FUZZ_CHECK(n > 0, "failure without a message");
	/* one line, printable: the host reads the "corral-launch: ..." line of stderr */
	for (i = 0; i < n; i++)
		FUZZ_CHECK((unsigned char)err[i] >= 0x20 && err[i] != 0x7f,
			   "control character 0x%02x in err: %s", (unsigned char)err[i], err);
	FUZZ_CHECK(p->vec_ == NULL && p->env == NULL && p->args == NULL, "vectors left on failure");
	FUZZ_CHECK(p->nenv == 0 && p->nargs == 0, "counts left on failure");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int once;
	struct args a;
	struct plan p, q;
	char *err, *small;
	size_t smallen;
	int r, r2;

	if (!once) {
		char buf[8];

		once = 1;
		/* argc 0 (no argv[0] at all) is "no PROGRAM", not a crash */
		FUZZ_CHECK(plan_parse(&p, 0, NULL, buf, sizeof buf) == -1, "argc 0 accepted");
		plan_free(&p);
	}

	split(&a, data, size);
	err = malloc(ERRLEN);
	if (!err)
		abort();
	memset(err, 'X', ERRLEN);
	r = plan_parse(&p, a.argc, a.argv, err, ERRLEN);
	FUZZ_CHECK(r == 0 || r == -1, "returned %d", r);
	if (r == 0)
		check_success(&a, &p, err);
	else
		check_failure(&p, err, ERRLEN);
	plan_free(&p);
	FUZZ_CHECK(p.vec_ == NULL && p.env == NULL && p.args == NULL, "plan_free left vectors");
	plan_free(&p);         /* safe twice */

	/* the same line with a tiny (or no) error buffer: same verdict, nothing written past it */
	smallen = size % 4;
	small = smallen ? malloc(smallen) : NULL;
	r2 = plan_parse(&q, a.argc, a.argv, small, smallen);
	FUZZ_CHECK(r2 == r, "verdict depends on the error buffer: %d then %d", r, r2);
	if (r2 != 0 && smallen)
		FUZZ_CHECK(strnlen(small, smallen) < smallen, "small err is not NUL-terminated");
	plan_free(&q);

	free(small);
	free(err);
	release(&a);
	return 0;
}
