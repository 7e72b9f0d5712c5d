/* landlock.c: Landlock for the program (--landlock, --fs-ro, --fs-rw, --deny-tcp, --scope).
 *
 * Two halves, both called from child_run() (child.c), so only async-signal-safe calls and stack
 * buffers here:
 *   landlock_prepare()  before the program changes its uid: asks the kernel's ABI, makes the
 *                       ruleset and adds one rule per listed path, opened O_PATH as the launcher's
 *                       user (who can open every path it was given; the program's uid may not);
 *   landlock_enforce()  after PR_SET_NO_NEW_PRIVS (without CAP_SYS_ADMIN the kernel wants it):
 *                       landlock_restrict_self, then the applied lines.
 *
 * The ruleset handles every filesystem right the ABI knows, so whatever is not granted beneath a
 * listed path is denied: --fs-ro grants read and execute, --fs-rw every handled right (on a file
 * only the rights that apply to files: the kernel rejects directory rights there). --deny-tcp
 * handles TCP bind and connect with no rule (ABI 4), --scope scopes abstract unix sockets and
 * signals to the run (ABI 6).
 *
 * --landlock auto: what the kernel lacks is reported refused and the run goes on;
 * --landlock require: any part asked for that the kernel lacks is fatal (nothing runs). A listed
 * path that cannot be opened is reported refused either way: nothing is granted there. In a
 * network namespace shared with other runs (--net-join, ns.c) the scope of abstract unix sockets
 * is what keeps the runs apart: without it the run is ended, whatever --landlock says.
 */
#include "launch.h"

#include <errno.h>
#include <string.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Debian 12's <linux/landlock.h> stops at ABI 2: the later constants, from the kernel's uapi. */
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)               /* ABI 3 */
#endif
#ifndef LANDLOCK_ACCESS_FS_IOCTL_DEV
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL << 15)              /* ABI 5 */
#endif
#ifndef LANDLOCK_ACCESS_NET_BIND_TCP
#define LANDLOCK_ACCESS_NET_BIND_TCP (1ULL << 0)               /* ABI 4 */
#endif
#ifndef LANDLOCK_ACCESS_NET_CONNECT_TCP
#define LANDLOCK_ACCESS_NET_CONNECT_TCP (1ULL << 1)            /* ABI 4 */
#endif
#ifndef LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
#define LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)        /* ABI 6 */
#endif
#ifndef LANDLOCK_SCOPE_SIGNAL
#define LANDLOCK_SCOPE_SIGNAL (1ULL << 1)                      /* ABI 6 */
#endif

/* The newest ABI whose rights this file knows (7 added only audit-log flags). A newer kernel is
 * used as this one: rights added after it are not handled, hence not denied. */
#define LL_ABI_KNOWN 7
#define LL_ABI_NET 4
#define LL_ABI_SCOPE 6

/* The kernel's struct landlock_ruleset_attr as of ABI 6; an older kernel accepts it as long as
 * the fields it does not know are zero. */
struct ll_ruleset_attr {
	__u64 handled_access_fs;
	__u64 handled_access_net;
	__u64 scoped;
};

/* Rights that apply to a file (not only to a directory). */
#define LL_FILE_RIGHTS (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | \
			LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_TRUNCATE | \
			LANDLOCK_ACCESS_FS_IOCTL_DEV)
#define LL_RO_RIGHTS (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | \
		      LANDLOCK_ACCESS_FS_READ_DIR)

#ifdef SYS_landlock_create_ruleset
static int ll_create_ruleset(const struct ll_ruleset_attr *attr, size_t size, unsigned flags)
{
	return (int)syscall(SYS_landlock_create_ruleset, attr, size, flags);
}

static int ll_add_rule(int fd, const struct landlock_path_beneath_attr *rule)
{
	return (int)syscall(SYS_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, rule, 0U);
}

static int ll_restrict_self(int fd)
{
	return (int)syscall(SYS_landlock_restrict_self, fd, 0U);
}
#else
static int ll_create_ruleset(const struct ll_ruleset_attr *attr, size_t size, unsigned flags)
{
	(void)attr, (void)size, (void)flags;
	errno = ENOSYS;
	return -1;
}

static int ll_add_rule(int fd, const struct landlock_path_beneath_attr *rule)
{
	(void)fd, (void)rule;
	errno = ENOSYS;
	return -1;
}

static int ll_restrict_self(int fd)
{
	(void)fd;
	errno = ENOSYS;
	return -1;
}
#endif

int landlock_abi(void)
{
	int abi = ll_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);

	return abi >= 0 ? abi : -errno;
}

/* Every filesystem right ABI abi knows. */
static __u64 fs_rights(int abi)
{
	__u64 r = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE |
		  LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR |
		  LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
		  LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR |
		  LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK |
		  LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		  LANDLOCK_ACCESS_FS_MAKE_SYM;

	if (abi >= 2)
		r |= LANDLOCK_ACCESS_FS_REFER;
	if (abi >= 3)
		r |= LANDLOCK_ACCESS_FS_TRUNCATE;
	if (abi >= 5)
		r |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
	return r;
}

/* ---- refusals ---- */

/* What is lost without each part, after "Landlock ABI A < N: " or "no Landlock: ". */
static const char lost_net[] =
	"TCP bind and connect are not denied; only a network namespace (--net new) keeps the "
	"program off the network";
static const char lost_signals[] =
	"the program can signal processes of its uid outside the run; give it its own uid (--uid) "
	"or a PID namespace (--pidns)";
static const char lost_abstract[] =
	"the program can connect to abstract unix sockets outside the run; a network namespace "
	"(--net new) hides the host's";

/* "refused NAME ERRNO Landlock ABI A < N: LOST" (abi > 0), else "... no Landlock: LOST" */
static void refuse_part(const char *name, int err, int abi, int need, const char *lost)
{
	struct line l;

	line_start(&l, "refused ");
	line_add(&l, name);
	line_add(&l, " ");
	line_errname(&l, err);
	if (abi > 0) {
		line_add(&l, " Landlock ABI ");
		line_num(&l, (unsigned)abi);
		line_add(&l, " < ");
		line_num(&l, (unsigned)need);
		line_add(&l, ": ");
	} else {
		line_add(&l, " no Landlock: ");
	}
	line_add(&l, lost);
	line_send(&l, report_get_fd());
}

/* Landlock as a whole is unavailable (no ABI, no ruleset, or restrict_self refused), under auto:
 * a refused line for the filesystem and for each other part not already refused. */
static void refuse_all(int err, int net, int scope)
{
	report_refused("filesystem", err, explain(W_LANDLOCK, err));
	if (net)
		refuse_part("landlock-net", err, 0, 0, lost_net);
	if (scope) {
		refuse_part("scoped-signals", err, 0, 0, lost_signals);
		refuse_part("scoped-abstract-unix", err, 0, 0, lost_abstract);
	}
}

static int fail(struct landlock *ll, enum what w, int err)
{
	if (ll->fd >= 0)
		close(ll->fd);
	ll->fd = -1;
	ll->what = w;
	ll->err = err;
	return -1;
}

/* Under require, or without the scope a shared network namespace needs: fatal (-1). Under
 * auto: the refusals, and no Landlock at all (0). net, scope: those parts were still to be
 * applied. */
static int unavailable(const struct plan *p, struct landlock *ll, int err, int net, int scope)
{
	if (scope && ll->net_shared)
		return fail(ll, W_SHARED_NET, err);
	if (p->landlock == PLAN_MECH_REQUIRE)
		return fail(ll, W_LANDLOCK, err);
	refuse_all(err, net, scope);
	if (ll->fd >= 0)
		close(ll->fd);
	ll->fd = -1;
	ll->net = ll->scope = 0;
	return 0;
}

/* ---- rules ---- */

static const char *open_why(int err)
{
	switch (err) {
	case ENOENT:
		return "does not exist; nothing is granted there";
	case EACCES:
		return "the launcher's user cannot reach it; nothing is granted there";
	case ENOTDIR:
	case ELOOP:
	case ENAMETOOLONG:
		return "bad path; nothing is granted there";
	default:
		return "cannot open it; nothing is granted there";
	}
}

/* One rule: rights beneath a directory, or their file subset on anything else. */
static void add_path(const struct landlock *ll, const char *path, __u64 rights)
{
	struct landlock_path_beneath_attr rule;
	struct stat st;
	int fd = open(path, O_PATH | O_CLOEXEC);
	int err = errno;

	if (fd < 0) {
		report_refused_at("fs-path", err, path, open_why(err));
		return;
	}
	if (fstat(fd, &st) != 0) {
		err = errno;
		report_refused_at("fs-path", err, path, "cannot stat it; nothing is granted there");
		close(fd);
		return;
	}
	if (!S_ISDIR(st.st_mode))
		rights &= LL_FILE_RIGHTS;
	rule.allowed_access = rights & ll->handled_fs;
	rule.parent_fd = fd;
	if (ll_add_rule(ll->fd, &rule) != 0) {
		err = errno;
		report_refused_at("fs-path", err, path,
				  "landlock_add_rule refused it; nothing is granted there");
	}
	close(fd);
}

/* ---- the two halves ---- */

int landlock_prepare(const struct launch *L, struct landlock *ll)
{
	const struct plan *p = L->plan;
	struct ll_ruleset_attr attr = { 0, 0, 0 };
	int abi;
	size_t i;

	ll->fd = -1;
	ll->abi = 0;
	ll->handled_fs = 0;
	ll->net = 0;
	ll->scope = 0;
	ll->applied = 0;
	ll->net_shared = L->net_shared;
	ll->what = W_LANDLOCK;
	ll->err = 0;
	if (p->landlock == PLAN_MECH_OFF)
		return 0;

	abi = landlock_abi();
	if (abi < 0)            /* ENOSYS: not built; EOPNOTSUPP: not enabled at boot */
		return unavailable(p, ll, -abi, p->deny_tcp, p->scope);
	if (abi > LL_ABI_KNOWN)
		abi = LL_ABI_KNOWN;
	ll->abi = abi;

	if (p->deny_tcp) {
		if (abi >= LL_ABI_NET)
			ll->net = 1;
		else if (p->landlock == PLAN_MECH_REQUIRE)
			return fail(ll, W_LANDLOCK_NET, EOPNOTSUPP);
		else
			refuse_part("landlock-net", EOPNOTSUPP, abi, LL_ABI_NET, lost_net);
	}
	if (p->scope) {
		if (abi >= LL_ABI_SCOPE) {
			ll->scope = 1;
		} else if (ll->net_shared) {
			return fail(ll, W_SHARED_NET, EOPNOTSUPP);
		} else if (p->landlock == PLAN_MECH_REQUIRE) {
			return fail(ll, W_LANDLOCK_SCOPE, EOPNOTSUPP);
		} else {
			refuse_part("scoped-signals", EOPNOTSUPP, abi, LL_ABI_SCOPE, lost_signals);
			refuse_part("scoped-abstract-unix", EOPNOTSUPP, abi, LL_ABI_SCOPE,
				    lost_abstract);
		}
	}

	ll->handled_fs = fs_rights(abi);
	attr.handled_access_fs = ll->handled_fs;
	if (ll->net)
		attr.handled_access_net = LANDLOCK_ACCESS_NET_BIND_TCP |
					  LANDLOCK_ACCESS_NET_CONNECT_TCP;
	if (ll->scope)
		attr.scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL;
	ll->fd = ll_create_ruleset(&attr, sizeof attr, 0);
	if (ll->fd < 0)
		return unavailable(p, ll, errno, ll->net, ll->scope);

	for (i = 0; i < p->nfs_ro; i++) {
		/* The host's /proc shows every process (environ, cmdline, maps of the controller's
		 * uid...): only a /proc of the run's own PID namespace is granted. */
		if (strcmp(p->fs_ro[i], "/proc") == 0 && !L->mounts.proc_made) {
			report_refused_at("fs-path", EPERM, "/proc",
					  "it is the host's /proc (no private one was mounted), so it is "
					  "not granted");
			continue;
		}
		/* Of --code-at and the code dir's own path, only where the program sees its code
		 * (mounts_code_dir): the other is not mounted in the run (a directory of a private
		 * tmpfs, or the host's). */
		if (p->code_at && (strcmp(p->fs_ro[i], p->code_at) == 0 ||
				   strcmp(p->fs_ro[i], p->ro_bind[0]) == 0) &&
		    strcmp(p->fs_ro[i], mounts_code_dir(L)) != 0)
			continue;
		add_path(ll, p->fs_ro[i], LL_RO_RIGHTS);
	}
	for (i = 0; i < p->nfs_rw; i++) {
		/* A --tmpfs path is the run's own only when it was mounted; without the mount it is
		 * the host's directory (/tmp, /dev/shm...), shared with everyone: not granted. */
		int k = plan_tmpfs_index(p, p->fs_rw[i]);

		/* Of --work-at and --chdir, only the program's work dir (mounts_work_dir): the
		 * other one is a path of no use to it, or the host's directory under the work
		 * tmpfs that is mounted elsewhere. */
		if (p->work_at && (strcmp(p->fs_rw[i], p->work_at) == 0 ||
				   (p->chdir && strcmp(p->fs_rw[i], p->chdir) == 0)) &&
		    strcmp(p->fs_rw[i], mounts_work_dir(L)) != 0)
			continue;
		if (k >= 0 && !L->mounts.tmpfs_made[k]) {
			report_refused_at("fs-path", EPERM, p->fs_rw[i],
					  "its private tmpfs was not mounted, so write access to "
					  "the host's directory is not granted");
			continue;
		}
		add_path(ll, p->fs_rw[i], ll->handled_fs);
	}
	return 0;
}

int landlock_enforce(const struct plan *p, struct landlock *ll)
{
	if (ll->fd < 0)
		return 0;
	if (ll_restrict_self(ll->fd) != 0)
		return unavailable(p, ll, errno, ll->net, ll->scope);
	close(ll->fd);
	ll->fd = -1;
	ll->applied = 1;
	report_applied_num("filesystem", (unsigned)ll->abi);
	if (ll->net)
		report_applied("landlock-net");
	if (ll->scope) {
		report_applied("scoped-signals");
		report_applied("scoped-abstract-unix");
	}
	return 0;
}
