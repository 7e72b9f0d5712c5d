/* probe.c: --probe, what this host allows. Each probe that would change the launcher runs in a
 * forked child that _exit()s with the errno (0: it worked), so the launcher itself is unchanged. */
#include "launch.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

enum test { T_UNSHARE, T_SETUID, T_NO_NEW_PRIVS, T_CLOSE_RANGE, T_SECCOMP };

static int run_test(enum test t, int arg)
{
	switch (t) {
	case T_UNSHARE:
		return unshare(arg) == 0 ? 0 : errno;
	case T_SETUID: {
		uid_t to = geteuid() == 65534 ? 65533 : 65534;

		return setresuid(to, to, to) == 0 ? 0 : errno;
	}
	case T_NO_NEW_PRIVS:
		return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 ? 0 : errno;
	case T_CLOSE_RANGE:
#ifdef SYS_close_range
		return syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0 ? 0 : errno;
#else
		return ENOSYS;
#endif
	case T_SECCOMP:
		return seccomp_probe();
	}
	return EINVAL;
}

/* 0 when the test worked in a child, else its errno. */
static int in_child(enum test t, int arg)
{
	int st;
	pid_t pid = fork();

	if (pid < 0)
		return errno;
	if (pid == 0)
		_exit(run_test(t, arg) & 0xff);
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return errno;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return EINTR;           /* killed: say no */
}

static void say(const char *name, int err, enum what w)
{
	struct line l;

	line_start(&l, "probe ");
	line_add(&l, name);
	if (!err) {
		line_add(&l, " yes");
	} else {
		line_add(&l, " no ");
		line_errname(&l, err);
		line_add(&l, " ");
		line_add(&l, explain(w, err));
	}
	line_send(&l, STDOUT_FILENO);
}

/* probe rlimit NAME yes [max N]: lowering always works; N is the hard limit when finite,
 * above which a request is refused (raising needs CAP_SYS_RESOURCE). */
static void say_rlimit(const char *name, int resource)
{
	struct rlimit r;
	struct line l;

	line_start(&l, "probe rlimit ");
	line_add(&l, name);
	if (getrlimit(resource, &r) != 0) {
		line_add(&l, " no ");
		line_errname(&l, errno);
		line_add(&l, " getrlimit failed");
	} else {
		line_add(&l, " yes");
		if (r.rlim_max != RLIM_INFINITY) {
			line_add(&l, " max ");
			line_num(&l, r.rlim_max);
		}
	}
	line_send(&l, STDOUT_FILENO);
}

/* probe landlock yes abi N | no ERRNO message. Asking the ABI changes nothing: no child. */
static void say_landlock(void)
{
	int abi = landlock_abi();
	struct line l;

	if (abi < 0) {
		say("landlock", -abi, W_LANDLOCK);
		return;
	}
	line_start(&l, "probe landlock yes abi ");
	line_num(&l, (unsigned)abi);
	line_send(&l, STDOUT_FILENO);
}

int probe_run(void)
{
	struct line l;
	static const struct {
		const char *name;
		int resource;
	} limits[] = {
		{ "cpu", RLIMIT_CPU }, { "as", RLIMIT_AS }, { "fsize", RLIMIT_FSIZE },
		{ "core", RLIMIT_CORE }, { "nofile", RLIMIT_NOFILE }, { "nproc", RLIMIT_NPROC },
	};
	size_t i;

	signal(SIGCHLD, SIG_DFL);
	line_start(&l, "probe euid ");
	line_num(&l, geteuid());
	line_send(&l, STDOUT_FILENO);
	say("user-namespace", in_child(T_UNSHARE, CLONE_NEWUSER), W_USERNS);
	say("network-namespace", in_child(T_UNSHARE, CLONE_NEWNET), W_NETNS);
	say("pid-namespace", in_child(T_UNSHARE, CLONE_NEWPID), W_PIDNS);
	say("userns-network-namespace", in_child(T_UNSHARE, CLONE_NEWUSER | CLONE_NEWNET), W_USERNS);
	say("userns-pid-namespace", in_child(T_UNSHARE, CLONE_NEWUSER | CLONE_NEWPID), W_USERNS);
	say("setuid", in_child(T_SETUID, 0), W_SETUID);
	for (i = 0; i < sizeof limits / sizeof limits[0]; i++)
		say_rlimit(limits[i].name, limits[i].resource);
	say("no-new-privs", in_child(T_NO_NEW_PRIVS, 0), W_NO_NEW_PRIVS);
	say("close-range", in_child(T_CLOSE_RANGE, 0), W_FDS);
	say("seccomp", in_child(T_SECCOMP, 0), W_SECCOMP);
	say_landlock();
	return 0;
}
