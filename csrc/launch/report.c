/* report.c: the report on --report-fd, errno names and actionable messages.
 *
 * Everything here is async-signal-safe (no stdio, no malloc, no locale): the program child uses
 * it between fork and execve. Each line is built in a stack buffer. Lines to the report fd are
 * gathered in the run's buffer of PIPE_BUF bytes (struct report_state, in struct launch) and
 * written together (report_flush), each write atomic on a pipe: a run's thirty-odd lines take a
 * handful of writes, so the host wakes a handful of times instead of once per line. The buffer
 * remembers which process filled it: a child inherits its parent's lines with fork() and must not
 * write them again.
 */
#include "launch.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

_Static_assert(REPORT_LINE_MAX <= PIPE_BUF, "a report line must fit in one atomic write");

/* The report of this process: the one of the struct launch it runs (report_open), which every
 * file writes to from deep in its steps, and the program between fork and execve; NULL: none.
 * A forked process has its parent's struct launch at the same address. */
static struct report_state *rep;

void report_open(struct launch *L, int fd)
{
	rep = L ? &L->report : NULL;
	if (rep)
		rep->fd = fd;
}

int report_get_fd(void)
{
	return rep ? rep->fd : -1;
}

/* ---- line builder ---- */

void line_start(struct line *l, const char *word)
{
	l->len = 0;
	line_add(l, word);
}

void line_add(struct line *l, const char *s)
{
	/* Keep room for the final '\n'. */
	for (; s && *s && l->len < sizeof l->buf - 1; s++) {
		unsigned char c = (unsigned char)*s;

		l->buf[l->len++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
}

void line_num(struct line *l, unsigned long long v)
{
	char tmp[24];
	size_t i = sizeof tmp - 1;

	tmp[i] = '\0';
	do {
		tmp[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	line_add(l, tmp + i);
}

void line_errname(struct line *l, int err)
{
	const char *n = errno_name(err);

	if (n) {
		line_add(l, n);
	} else {
		line_add(l, "E");
		line_num(l, (unsigned)err);
	}
}

static void write_all(int fd, const char *buf, size_t len)
{
	size_t off = 0;

	while (off < len) {
		ssize_t n = write(fd, buf + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;          /* EPIPE etc.: the reader is gone, nothing to do */
		off += (size_t)n;
	}
}

void report_flush(void)
{
	if (!rep || rep->len == 0 || rep->owner != getpid())
		return;         /* nothing, or a parent's lines (a vfork child must not touch them) */
	if (rep->fd >= 0)
		write_all(rep->fd, rep->buf, rep->len);
	rep->sent += rep->len;
	rep->len = 0;
}

size_t report_sent(void)
{
	return rep ? rep->sent + rep->len : 0;
}

void line_send(struct line *l, int fd)
{
	if (fd < 0)
		return;
	l->buf[l->len++] = '\n';
	if (rep && fd == rep->fd) {
		pid_t self = getpid();

		if (rep->owner != self) {       /* inherited from a parent: theirs to write */
			rep->owner = self;
			rep->len = 0;
		}
		if (rep->len + l->len > sizeof rep->buf)
			report_flush();
		memcpy(rep->buf + rep->len, l->buf, l->len);
		rep->len += l->len;
	} else {
		write_all(fd, l->buf, l->len);
	}
	l->len--;
}

/* ---- records ---- */

void report_header(void)
{
	struct line l;

	line_start(&l, "corral-launch 1");
	line_send(&l, report_get_fd());
}

void report_applied(const char *name)
{
	struct line l;

	line_start(&l, "applied ");
	line_add(&l, name);
	line_send(&l, report_get_fd());
}

void report_applied_num(const char *name, unsigned long long v)
{
	struct line l;

	line_start(&l, "applied ");
	line_add(&l, name);
	line_add(&l, " ");
	line_num(&l, v);
	line_send(&l, report_get_fd());
}

void report_refused_at(const char *name, int err, const char *what, const char *why)
{
	struct line l;

	line_start(&l, "refused ");
	line_add(&l, name);
	line_add(&l, " ");
	line_errname(&l, err);
	line_add(&l, " ");
	if (what) {
		line_add(&l, what);
		line_add(&l, ": ");
	}
	line_add(&l, why);
	line_send(&l, report_get_fd());
}

void report_refused(const char *name, int err, const char *msg)
{
	report_refused_at(name, err, NULL, msg);
}

void report_fatal(enum what w, int err, const char *detail)
{
	struct line l;

	line_start(&l, "fatal ");
	line_add(&l, what_step(w));
	line_add(&l, " ");
	line_errname(&l, err);
	line_add(&l, " ");
	if (detail) {
		line_add(&l, detail);
		line_add(&l, ": ");
	}
	line_add(&l, explain(w, err));
	line_send(&l, report_get_fd());
	report_flush();         /* an exit follows */
}

void report_pid(pid_t pid)
{
	struct line l;

	line_start(&l, "pid ");
	line_num(&l, (unsigned long long)pid);
	line_send(&l, report_get_fd());
	report_flush();         /* the program runs: the host may see what was applied */
}

void report_status(int wstatus)
{
	struct line l;

	if (WIFSIGNALED(wstatus)) {
		line_start(&l, "status signal ");
		line_num(&l, (unsigned)WTERMSIG(wstatus));
	} else {
		line_start(&l, "status exit ");
		line_num(&l, (unsigned)WEXITSTATUS(wstatus));
	}
	line_send(&l, report_get_fd());
}

static unsigned long long tv_us(const struct timeval *tv)
{
	return (unsigned long long)tv->tv_sec * 1000000ULL + (unsigned long long)tv->tv_usec;
}

void report_usage(const struct rusage *ru)
{
	struct line l;

	line_start(&l, "usage ");
	line_num(&l, tv_us(&ru->ru_utime));
	line_add(&l, " ");
	line_num(&l, tv_us(&ru->ru_stime));
	line_add(&l, " ");
	line_num(&l, ru->ru_maxrss > 0 ? (unsigned long long)ru->ru_maxrss : 0);   /* kB on Linux */
	line_send(&l, report_get_fd());
}

/* ---- errno names ---- */

#define ERRNO_NAMES(X) \
	X(EPERM) X(ENOENT) X(ESRCH) X(EINTR) X(EIO) X(ENXIO) X(E2BIG) X(ENOEXEC) X(EBADF) \
	X(ECHILD) X(EAGAIN) X(ENOMEM) X(EACCES) X(EFAULT) X(EBUSY) X(EEXIST) X(EXDEV) \
	X(ENODEV) X(ENOTDIR) X(EISDIR) X(EINVAL) X(ENFILE) X(EMFILE) X(ENOTTY) X(ETXTBSY) \
	X(EFBIG) X(ENOSPC) X(ESPIPE) X(EROFS) X(EMLINK) X(EPIPE) X(EDOM) X(ERANGE) \
	X(ENAMETOOLONG) X(ENOSYS) X(ELOOP) X(EUSERS) X(EOVERFLOW) X(ELIBBAD) X(EOPNOTSUPP) \
	X(ESTALE) X(EDQUOT) X(ENOMEDIUM) X(ETIMEDOUT) X(EPROTO)

const char *errno_name(int err)
{
	switch (err) {
#define X(e) case e: return #e;
	ERRNO_NAMES(X)
#undef X
	default:
		return NULL;
	}
}

/* ---- messages: say what to change ---- */

static const char *const steps[W_COUNT] = {
	[W_SIGNALS] = "signals",
	[W_SESSION] = "session",
	[W_DEATHSIG] = "die-with-parent",
	[W_PARENT] = "parent-pid",
	[W_USERNS] = "user-namespace",
	[W_NETNS] = "no-network",
	[W_PIDNS] = "pid-namespace",
	[W_IDMAP] = "user-namespace",
	[W_IDMAP_ROOT] = "user-namespace",
	[W_SUBREAPER] = "subreaper",
	[W_PIPE] = "pipe",
	[W_FORK] = "fork",
	[W_RLIMIT] = "rlimit",
	[W_SETGROUPS] = "uid",
	[W_SETGID] = "uid",
	[W_SETUID] = "uid",
	[W_IDS_USERNS] = "uid",
	[W_NO_NEW_PRIVS] = "no-new-privs",
	[W_CHDIR] = "chdir",
	[W_FDS] = "closed-fds",
	[W_EXEC] = "exec",
	[W_ROBIND] = "ro-bind",
	[W_KILL_UID] = "kill-uid",
	[W_LANDLOCK] = "filesystem",
	[W_LANDLOCK_NET] = "landlock-net",
	[W_LANDLOCK_SCOPE] = "landlock-scope",
	[W_SECCOMP] = "seccomp",
	[W_CGROUP] = "cgroup",
	[W_SHARED_NET] = "shared-netns",
	[W_WARM] = "warm",
	[W_FILES_IN] = "files-in",
	[W_COLLECT] = "collect",
	[W_SEPARATE] = "separation",
};

const char *what_step(enum what w)
{
	return (w >= 0 && w < W_COUNT && steps[w]) ? steps[w] : "setup";
}

static const char *generic(int err)
{
	switch (err) {
	case EPERM: return "operation not permitted";
	case EACCES: return "permission denied";
	case ENOENT: return "no such file or directory";
	case ENOMEM: return "out of memory";
	case EAGAIN: return "resource temporarily unavailable (a process or memory limit?)";
	case EINVAL: return "invalid argument (the kernel lacks this feature?)";
	case ENOSYS: return "system call not implemented by this kernel (or blocked by seccomp)";
	case ENOSPC: return "a kernel limit was reached";
	case EMFILE: return "too many open files (RLIMIT_NOFILE)";
	case ENFILE: return "too many open files in the system (fs.file-max)";
	default: return "unexpected error";
	}
}

#define CGROUP_DELEGATE \
	"to delegate, give the launcher's uid a cgroup v2 subtree (systemd: a unit or scope " \
	"with Delegate=yes; by hand: mkdir D; chown UID D D/cgroup.procs D/cgroup.threads " \
	"D/cgroup.subtree_control), run the controller in a leaf of it (D/ctl) and pass a " \
	"sibling (D/runs) with memory and pids enabled in its cgroup.subtree_control as --cgroup"

static const char userns_hint[] =
	"check the sysctls kernel.unprivileged_userns_clone (must be 1) and "
	"user.max_user_namespaces (must be > 0), and kernel.apparmor_restrict_unprivileged_userns "
	"(must be 0) where it exists; or run as root";

const char *explain(enum what w, int err)
{
	switch (w) {
	case W_USERNS:
		if (err == EPERM || err == EACCES)
			return userns_hint;
		if (err == ENOSPC || err == EUSERS)
			return "user namespaces exhausted: raise the sysctl user.max_user_namespaces "
			       "(0 disables them) or nest less than 32 deep";
		if (err == EINVAL)
			return "the kernel has no user namespaces (CONFIG_USER_NS), or the launcher runs "
			       "in a chroot";
		break;
	case W_NETNS:
		if (err == EPERM)
			return "needs root or a user namespace (CAP_SYS_ADMIN)";
		if (err == EINVAL)
			return "the kernel has no network namespaces (CONFIG_NET_NS)";
		if (err == ENOSPC)
			return "network namespaces exhausted: raise the sysctl user.max_net_namespaces";
		break;
	case W_PIDNS:
		if (err == EPERM)
			return "needs root or a user namespace (CAP_SYS_ADMIN)";
		if (err == EINVAL)
			return "the kernel has no PID namespaces (CONFIG_PID_NS)";
		if (err == ENOSPC)
			return "PID namespaces exhausted: raise the sysctl user.max_pid_namespaces, or "
			       "nest less than 32 deep";
		if (err == ENOMEM)
			return "the PID namespace's init has already exited";
		break;
	case W_IDMAP:
		return "writing /proc/self/setgroups, uid_map or gid_map of the new user namespace "
		       "failed; is /proc mounted?";
	case W_IDMAP_ROOT:
		return "the launcher runs as root without CAP_SYS_ADMIN, so it made a user namespace, "
		       "but could not map --uid/--gid into it: writing the uid_map and gid_map lines "
		       "'0 0 1' and 'U U 1' needs CAP_SETUID, CAP_SETGID and CAP_SETFCAP; grant them, "
		       "or CAP_SYS_ADMIN";
	case W_IDS_USERNS:
		return "the program runs in a user namespace made without root, which maps only the "
		       "launcher's own uid and gid and denies setgroups: --uid/--gid need the launcher "
		       "to run as root";
	case W_SESSION:
		if (err == EPERM)
			return "the launcher is already a process-group leader (started by a shell with "
			       "job control?); it keeps the caller's session";
		break;
	case W_DEATHSIG:
		return "prctl(PR_SET_PDEATHSIG) failed";
	case W_PARENT:
		return "getppid() is not --parent-pid: the parent exited before the launcher could tie "
		       "itself to it (or the wrong pid was passed)";
	case W_SUBREAPER:
		if (err == EINVAL)
			return "the kernel has no PR_SET_CHILD_SUBREAPER (older than 3.4); only the "
			       "process group is killed";
		break;
	case W_FORK:
		if (err == EAGAIN)
			return "cannot fork: RLIMIT_NPROC of the launcher's uid, kernel.pid_max, "
			       "kernel.threads-max or the pids cgroup limit was reached";
		if (err == ENOMEM)
			return "cannot fork: out of memory, or the PID namespace's init has exited";
		break;
	case W_PIPE:
		return "cannot make an internal pipe: too many open files?";
	case W_SIGNALS:
		return "cannot block signals or make a signalfd";
	case W_SETGROUPS:
		if (err == EPERM)
			return "setgroups() refused: changing ids needs root (CAP_SETGID) outside a user "
			       "namespace; the policy passes --uid/--gid only when running as root";
		break;
	case W_SETGID:
		if (err == EPERM)
			return "setresgid() refused: needs root (CAP_SETGID)";
		if (err == EINVAL)
			return "setresgid() refused: the gid is not mapped in this user namespace; do "
			       "not combine --gid with a user namespace";
		break;
	case W_SETUID:
		if (err == EPERM)
			return "setresuid() refused: needs root (CAP_SETUID)";
		if (err == EINVAL)
			return "setresuid() refused: the uid is not mapped in this user namespace; do "
			       "not combine --uid with a user namespace";
		if (err == EAGAIN)
			return "setresuid() refused: the uid is over its RLIMIT_NPROC";
		break;
	case W_NO_NEW_PRIVS:
		return "prctl(PR_SET_NO_NEW_PRIVS) failed: kernel older than 3.5?";
	case W_CHDIR:
		if (err == ENOENT)
			return "the --chdir directory does not exist";
		if (err == EACCES)
			return "the program's uid cannot enter the --chdir directory: check the "
			       "permissions along its path (chown the run directory to --uid)";
		if (err == ENOTDIR)
			return "--chdir is not a directory";
		break;
	case W_FDS:
		return "cannot close inherited file descriptors (close_range and /proc/self/fd both "
		       "failed); is /proc mounted?";
	case W_EXEC:
		switch (err) {
		case ENOENT:
			return "PROGRAM (or its #! interpreter or ELF loader) does not exist as the "
			       "program sees the files: there is no PATH search, and a --tmpfs mount "
			       "hides what the host has under it unless --ro-bind brings it back";
		case EACCES:
			return "PROGRAM is not executable by the program's uid, a directory on its path "
			       "is not searchable, it is on a noexec mount, or it (or its #! "
			       "interpreter) is outside the --fs-ro/--fs-rw lists";
		case ENOEXEC:
			return "PROGRAM is not in an executable format (a script without #!?)";
		case ETXTBSY:
			return "PROGRAM is open for writing";
		case E2BIG:
			return "the arguments and environment are too large";
		case EAGAIN:
			return "the uid is over RLIMIT_NPROC: processes of this uid are still running "
			       "(lower the load or pick an unused uid)";
		case ENOMEM:
			return "not enough memory to load PROGRAM: the memory rlimit (as) is too small";
		case EPERM:
			return "refused by a security module or a nosuid mount under no_new_privs";
		case ENOTDIR:
		case ELOOP:
		case ENAMETOOLONG:
			return "bad PROGRAM path";
		case EISDIR:
			return "PROGRAM is a directory";
		}
		break;
	case W_ROBIND:
		if (err == ENOENT)
			return "the --ro-bind directory does not exist; the program cannot run without it";
		if (err == ENOTDIR)
			return "--ro-bind names something that is not a directory";
		if (err == EPERM || err == EACCES)
			return "bind-mounting it back read-only over the tmpfs was refused; the program "
			       "would run without it, so nothing runs";
		return "cannot mount it back over the tmpfs; the program would run without it, so "
		       "nothing runs";
	case W_KILL_UID:
		if (err == EPERM || err == EINVAL)
			return "the helper could not take the uid (setresgid/setresuid): needs root with "
			       "CAP_SETUID and CAP_SETGID";
		if (err == ETIMEDOUT)
			return "the helper that takes the uid was killed or stopped every time, by "
			       "processes of that uid; retry, or use another uid";
		if (err == EAGAIN)
			return "cannot fork the helper: a process limit was reached";
		break;
	case W_LANDLOCK:
		if (err == ENOSYS)
			return "this kernel has no Landlock (it needs Linux 5.13+ built with "
			       "CONFIG_SECURITY_LANDLOCK): files are guarded only by their permissions";
		if (err == EOPNOTSUPP)
			return "Landlock is built into the kernel but not enabled: add landlock to the "
			       "lsm= boot parameter (see /sys/kernel/security/lsm); files are guarded "
			       "only by their permissions";
		if (err == EPERM)
			return "landlock_restrict_self was refused: it needs no_new_privs (see the "
			       "no-new-privs line) or CAP_SYS_ADMIN";
		if (err == E2BIG)
			return "the launcher already runs under 16 nested Landlock domains, the kernel's "
			       "maximum";
		if (err == EMFILE || err == ENFILE)
			return "no fd left for the Landlock ruleset (RLIMIT_NOFILE?)";
		break;
	case W_LANDLOCK_NET:
		if (err == EOPNOTSUPP)
			return "the kernel's Landlock ABI is below 4 (Linux 6.7): it cannot deny TCP bind "
			       "and connect, and --landlock require asked for --deny-tcp; use --net new "
			       "(or --landlock auto to run without it)";
		break;
	case W_LANDLOCK_SCOPE:
		if (err == EOPNOTSUPP)
			return "the kernel's Landlock ABI is below 6 (Linux 6.12): it cannot scope "
			       "signals and abstract unix sockets, and --landlock require asked for "
			       "--scope; use --uid and --pidns (or --landlock auto to run without it)";
		break;
	case W_CGROUP:
		switch (err) {
		case ENOENT:
		case ENOTDIR:
			return "--cgroup must be an existing directory of the cgroup v2 hierarchy; "
			       CGROUP_DELEGATE;
		case EINVAL:
			return "--cgroup is not in a cgroup v2 (cgroup2) file system; on a hybrid "
			       "host it is the one mounted at /sys/fs/cgroup/unified; " CGROUP_DELEGATE;
		case EOPNOTSUPP:
			return "the run cgroup needs the memory and pids controllers: they must be "
			       "available to DIR (in its cgroup.controllers: enabled in its parent's "
			       "cgroup.subtree_control, and not bound to a cgroup v1 hierarchy) and "
			       "enabled for its children with echo +memory +pids > "
			       "DIR/cgroup.subtree_control; " CGROUP_DELEGATE;
		case EACCES:
		case EPERM:
		case EROFS:
			return "the launcher's uid may not make a cgroup in DIR or move a process into "
			       "it: " CGROUP_DELEGATE;
		case EBUSY:
			return "the run cgroup cannot take processes (is DIR a threaded cgroup?); "
			       CGROUP_DELEGATE;
		case EAGAIN:
			return "cgroup.max.descendants or cgroup.max.depth of DIR or an ancestor was "
			       "reached";
		case EEXIST:
			return "every name tried for the run cgroup exists: remove stale empty "
			       "DIR/corral-* cgroups";
		}
		break;
	case W_SECCOMP:
		if (err == EINVAL)
			return "the kernel has no seccomp filters (CONFIG_SECCOMP_FILTER) or rejected "
			       "the filter";
		if (err == EACCES)
			return "loading a filter needs no_new_privs or CAP_SYS_ADMIN, and no-new-privs "
			       "was refused";
		if (err == ENOMEM)
			return "out of memory, or the process's filters together pass the kernel's "
			       "32768 instructions (the launcher already runs under many filters?)";
		if (err == E2BIG)
			return "the filter is longer than the kernel's 4096 instructions: deny fewer "
			       "system calls";
		if (err == ENOSYS)
			return "the kernel has no seccomp (CONFIG_SECCOMP)";
		if (err == EFAULT)
			return "the kernel could not read the filter";
		return "libseccomp could not build the filter";
	case W_SHARED_NET:
		return "the run joined a network namespace shared with other runs, whose loopback "
		       "and abstract unix sockets it may reach only without inet sockets (the seccomp "
		       "filter) and with abstract unix sockets scoped (Landlock): one of them could "
		       "not be applied, so nothing runs";
	case W_WARM:
		if (err == EINVAL)
			return "a warm run needs a PID namespace of its own (--pidns, and a kernel that "
			       "allows it): the zygote forks the program into it; run it with "
			       "corral-launch instead";
		if (err == EPIPE || err == ECONNRESET)
			return "the zygote is gone";
		return "the zygote could not fork the program into the run's namespaces";
	case W_FILES_IN:
		if (err == ENOSPC || err == EDQUOT)
			return "the program's files do not fit in the work dir (the work tmpfs's size "
			       "or inodes)";
		if (err == EEXIST)
			return "a file of --files-in is there already (a path given twice, or through "
			       "a file)";
		if (err == ENOTDIR)
			return "a path of --files-in goes through a file";
		if (err == EPROTO || err == EINVAL)
			return "--files-in is not a list of PATH, MODE, SIZE records";
		return "cannot make the program's files in the work dir";
	case W_COLLECT:
		return "cannot open the --collect-to file (or, with --unlink-files, remove its name)";
	case W_SEPARATE:
		return SEPARATE_LOST;
	case W_RLIMIT:
	case W_COUNT:
		break;
	}
	return generic(err);
}
