/* mounts.c: the init's mount namespace, which comes with the PID namespace.
 *
 * mounts_apply() is the flat list of the init's mount steps, before the init forks the program:
 *   1. make every mount private, so nothing below propagates back to the host (refused: none of
 *      the steps below is taken, the program sees the host's /proc and /tmp);
 *   2. a fresh /proc for this PID namespace;
 *   3. open each --ro-bind directory (O_PATH), while the host's tree is still in sight;
 *   4. a fresh tmpfs at each --tmpfs PATH: mode 1777, nosuid, nodev, size-limited;
 *   5. when one of them was mounted, each --ro-bind directory mounted back at its path,
 *      read-only, from its O_PATH fd (a tmpfs on /tmp would hide the run's code dir);
 *   6. with --work-tmpfs, the work dir: a tmpfs, mode 0700, owned by the program's ids, at
 *      --work-at when it is given and its parent lies inside a --tmpfs mounted in step 4 (the
 *      directories along it are made there, never on the host's filesystem), else on --chdir.
 * Refusals are reported and the run goes on; a failed --ro-bind is fatal, because the program
 * would run without its code. Where the work dir stayed on --chdir, the program's --env values
 * that name --work-at name --chdir instead (mounts_settle), so HOME and TMPDIR still hold.
 *
 * Each tmpfs is also given nr_inodes = BYTES / 16 KiB, at least 1024 and at most 16384: an
 * inode and its dentry cost about 1 KiB of kernel memory that the size does not count (hard
 * links and xattrs count against nr_inodes too), so a full mount's files cost at most 1/16 of
 * its size more; and the kernel frees them one by one when the namespace goes, 3 to 5 us each on
 * the development VM, after the run's last process and before its launcher's exit completes: at
 * most 16384 files a mount keep that under 0.1 s whatever the size. The default policy's mounts
 * hold 11,264 files in all (40 ms), where one inode per KiB let them hold 161,792 (0.5 to 0.75
 * s). Everything mounted here goes away with the namespace.
 */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#define refuse report_refused_at

void mounts_refuse(const struct plan *p, int err, const char *why)
{
	if (p->ntmpfs)
		refuse("private-tmp", err, why, "the program shares the host's directories");
	if (p->work_tmpfs)
		refuse("work-tmpfs", err, why, "the program works in the host's --chdir directory");
	if (p->work_at)
		refuse("work-at", err, why, "the work dir stays on --chdir");
}

/* What the init mounted (L->mounts) as a string, for corral-zygote's program: 'P' or '-' for
 * /proc, 'W' or '-' for --work-at, then 'T' or '-' for each --tmpfs. */
void mounts_state(const struct launch *L, char *buf, size_t len)
{
	size_t i;

	if (len < MOUNTS_STATE_LEN)
		return;
	buf[0] = L->mounts.proc_made ? 'P' : '-';
	buf[1] = L->mounts.work_at ? 'W' : '-';
	for (i = 0; i < PLAN_MOUNTS_MAX; i++)
		buf[2 + i] = L->mounts.tmpfs_made[i] ? 'T' : '-';
	buf[2 + i] = '\0';
}

void mounts_state_set(struct launch *L, const char *s)
{
	size_t i;

	L->mounts.proc_made = s[0] == 'P';
	L->mounts.work_at = s[0] && s[1] == 'W';
	for (i = 0; i < PLAN_MOUNTS_MAX && s[0] && s[1] && s[2 + i]; i++)
		L->mounts.tmpfs_made[i] = s[2 + i] == 'T';
}

const char *mounts_work_dir(const struct launch *L)
{
	return L->mounts.work_at ? L->plan->work_at : L->plan->chdir;
}

char **mounts_env(const struct launch *L)
{
	return L->mounts.env ? L->mounts.env : L->plan->env;
}

/* The length of the value v when it is path or a path beneath it (what follows is kept), else 0. */
static size_t names_path(const char *v, const char *path)
{
	size_t n = strlen(path);

	return strncmp(v, path, n) == 0 && (v[n] == '\0' || v[n] == '/') ? n : 0;
}

void mounts_settle(struct launch *L)
{
	const struct plan *p = L->plan;
	size_t i, extra = 0, clen;
	char **env, *area;

	if (L->mounts.settled)
		return;
	L->mounts.settled = 1;
	if (!p->work_at || L->mounts.work_at || !p->chdir)
		return;
	clen = strlen(p->chdir);
	for (i = 0; i < p->nenv; i++) {
		const char *v = strchr(p->env[i], '=') + 1;

		if (names_path(v, p->work_at))
			extra += strlen(p->env[i]) + clen + 1;
	}
	if (!extra)
		return;
	/* one allocation, the process's until its execve or exit: the vector, then the values */
	env = malloc((p->nenv + 1) * sizeof *env + extra);
	if (!env)
		return;
	area = (char *)(env + p->nenv + 1);
	for (i = 0; i < p->nenv; i++) {
		const char *e = p->env[i], *v = strchr(e, '=') + 1;
		size_t n = names_path(v, p->work_at);

		env[i] = p->env[i];
		if (!n)
			continue;
		env[i] = area;
		memcpy(area, e, (size_t)(v - e));
		area += v - e;
		memcpy(area, p->chdir, clen);
		area += clen;
		strcpy(area, v + n);
		area += strlen(v + n) + 1;
	}
	env[p->nenv] = NULL;
	L->mounts.env = env;
}

/* The path of --tmpfs i, NUL-terminated (plan.c checked its length). */
static const char *tmpfs_path(const struct plan *p, size_t i, char *buf)
{
	memcpy(buf, p->tmpfs[i].path, p->tmpfs[i].path_len);
	buf[p->tmpfs[i].path_len] = '\0';
	return buf;
}

/* mkdir -p, mode 0755 whatever the umask, for what does not exist yet. Used only where nothing
 * but the init can have written: inside a tmpfs mounted here, or along a path the host made. */
static int mkdir_p(const char *path)
{
	char buf[PATH_MAX];
	size_t len = strlen(path), i;

	if (len >= sizeof buf) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(buf, path, len + 1);
	for (i = 1; i <= len; i++) {
		if (buf[i] != '/' && buf[i] != '\0')
			continue;
		buf[i] = '\0';
		if (mkdir(buf, 0755) == 0) {
			if (chmod(buf, 0755) != 0)
				return -1;
		} else if (errno != EEXIST) {
			return -1;
		}
		buf[i] = path[i];
	}
	return 0;
}

#define BYTES_PER_INODE (16 * 1024)
#define INODES_MIN 1024
#define INODES_MAX 16384

static unsigned long long inodes_for(unsigned long long size)
{
	unsigned long long n = size / BYTES_PER_INODE;

	return n < INODES_MIN ? INODES_MIN : n > INODES_MAX ? INODES_MAX : n;
}

/* ---- steps ---- */

/* 1. */
static int step_private(void)
{
	if (mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0)
		return 0;
	return -1;
}

/* 2. The controller's /proc/PID/environ and the host's process list go out of sight. */
static void step_proc(struct mounts_state *m)
{
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0) {
		m->proc_made = 1;
		report_applied("private-proc");
	}
	else
		report_refused("private-proc", errno,
			       errno == EPERM ? "mounting proc was refused (in a container, masked /proc paths forbid it); the program sees the host's /proc"
					      : "cannot mount proc; the program sees the host's /proc");
}

/* 3. fds[i] for --ro-bind i; fatal when one cannot be opened. */
static int step_open_ro_binds(const struct plan *p, int *fds)
{
	size_t i;

	for (i = 0; i < p->nro_bind; i++) {
		fds[i] = open(p->ro_bind[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (fds[i] < 0) {
			report_fatal(W_ROBIND, errno, p->ro_bind[i]);
			while (i > 0)
				close(fds[--i]);
			return -1;
		}
	}
	return 0;
}

static const char *tmpfs_why(int err)
{
	switch (err) {
	case ENOENT:
		return "the mount point does not exist (a --tmpfs PATH must exist)";
	case ENOTDIR:
		return "the mount point is not a directory";
	case EPERM:
		return "mounting a tmpfs was refused (no CAP_SYS_ADMIN over this mount namespace?)";
	case EINVAL:
		return "the kernel rejected the tmpfs options";
	case ENOMEM:
		return "out of memory";
	}
	return "mount failed";
}

/* 4. The number of tmpfs mounted; "applied private-tmp" when every one was. */
static size_t step_tmpfs(struct launch *L)
{
	const struct plan *p = L->plan;
	char path[PATH_MAX], opts[128];
	size_t i, mounted = 0;
	int err = 0;
	struct line l;

	for (i = 0; i < p->ntmpfs; i++) {
		tmpfs_path(p, i, path);
		snprintf(opts, sizeof opts, "mode=1777,size=%llu,nr_inodes=%llu", p->tmpfs[i].size,
			 inodes_for(p->tmpfs[i].size));
		if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0) {
			L->mounts.tmpfs_made[i] = 1;
			held_watch_mount(L, path);
			mounted++;
			continue;
		}
		if (err)
			continue;       /* the first refusal is reported */
		err = errno;
		line_start(&l, "refused private-tmp ");
		line_errname(&l, err);
		line_add(&l, " ");
		line_add(&l, path);
		line_add(&l, ": ");
		line_add(&l, tmpfs_why(err));
		line_add(&l, "; the program shares the host's ");
		line_add(&l, path);
		line_send(&l, report_get_fd());
	}
	if (p->ntmpfs && !err)
		report_applied("private-tmp");
	return mounted;
}

/* The flags a read-only remount of the bind mount at path must keep: in a user namespace, the
 * flags of a mount inherited from the host are locked (noexec, the atime mode...), and a remount
 * that would clear one is refused with EPERM. */
static unsigned long locked_flags(const char *path)
{
	struct statvfs sv;
	unsigned long f = 0;

	if (statvfs(path, &sv) != 0)
		return 0;
	if (sv.f_flag & ST_NOEXEC)
		f |= MS_NOEXEC;
	if (sv.f_flag & ST_NOATIME)
		f |= MS_NOATIME;
	if (sv.f_flag & ST_NODIRATIME)
		f |= MS_NODIRATIME;
	if (sv.f_flag & ST_RELATIME)
		f |= MS_RELATIME;
	if (!(sv.f_flag & (ST_NOATIME | ST_RELATIME)))
		f |= MS_STRICTATIME;
	return f;
}

/* 5. Each --ro-bind directory back at its path, read-only, from its fd. */
static int step_ro_binds(const struct plan *p, const int *fds)
{
	char src[64];
	size_t i;

	for (i = 0; i < p->nro_bind; i++) {
		const char *path = p->ro_bind[i];

		snprintf(src, sizeof src, "/proc/self/fd/%d", fds[i]);
		if (mkdir_p(path) != 0 ||
		    mount(src, path, "none", MS_BIND | MS_REC, NULL) != 0 ||
		    mount("none", path, "none",
			  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | locked_flags(path),
			  NULL) != 0) {
			report_fatal(W_ROBIND, errno, path);
			return -1;
		}
	}
	return 0;
}

/* The --tmpfs that --work-at lies inside, when it was mounted: its index, or -1. */
static int work_at_parent(const struct launch *L)
{
	const struct plan *p = L->plan;
	size_t i, n = strlen(p->work_at);

	for (i = 0; i < p->ntmpfs; i++) {
		size_t k = p->tmpfs[i].path_len;

		if (L->mounts.tmpfs_made[i] && n > k + 1 && p->work_at[k] == '/' &&
		    memcmp(p->work_at, p->tmpfs[i].path, k) == 0)
			return (int)i;
	}
	return -1;
}

/* 6a. The work tmpfs at --work-at: 0, or -1 after a refused line (it goes on --chdir then). The
 * directories along the path are made below the --tmpfs it lies in, which only the init has
 * written to yet; nothing is made on the host's filesystem. */
static int step_work_at(struct launch *L, const char *opts)
{
	const struct plan *p = L->plan;
	int err;

	if (work_at_parent(L) < 0) {
		refuse("work-at", ENOENT, "its parent lies in no --tmpfs the run mounted (the launcher "
		       "makes no directory on the host's filesystem)", "the work dir stays on --chdir");
		return -1;
	}
	if (mkdir_p(p->work_at) != 0) {
		refuse("work-at", errno, "cannot make the directory", "the work dir stays on --chdir");
		return -1;
	}
	if (mount("tmpfs", p->work_at, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) {
		err = errno;
		refuse("work-at", err, tmpfs_why(err), "the work dir stays on --chdir");
		return -1;
	}
	L->mounts.work_at = 1;
	held_watch_mount(L, p->work_at);
	report_applied("work-tmpfs");
	return 0;
}

/* 6. The program's work dir in memory: private to the run, bounded, gone with it. */
static void step_work_tmpfs(struct launch *L)
{
	const struct plan *p = L->plan;
	char opts[160];
	unsigned uid = (unsigned)(p->has_ids ? p->uid : L->euid);
	unsigned gid = (unsigned)(p->has_ids ? p->gid : L->egid);

	if (!p->work_tmpfs)
		return;
	snprintf(opts, sizeof opts, "mode=0700,uid=%u,gid=%u,size=%llu,nr_inodes=%llu", uid, gid,
		 p->work_tmpfs, inodes_for(p->work_tmpfs));
	if (p->work_at && step_work_at(L, opts) == 0)
		return;
	if (mkdir_p(p->chdir) != 0) {
		refuse("work-tmpfs", errno, "cannot make the --chdir directory",
		       "the program works in the host's --chdir directory");
		return;
	}
	if (mount("tmpfs", p->chdir, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) {
		int err = errno;

		refuse("work-tmpfs", err, tmpfs_why(err),
		       "the program works in the host's --chdir directory");
		return;
	}
	held_watch_mount(L, p->chdir);
	report_applied("work-tmpfs");
}

int mounts_apply(struct launch *L)
{
	const struct plan *p = L->plan;
	int fds[PLAN_MOUNTS_MAX];
	size_t i;
	int r = 0;

	held_ipc(L);            /* the init is in the run's IPC namespace: bound it, count it */
	if (step_private() != 0) {                              /* 1 */
		int err = errno;

		held_watch_net(L);      /* its unix sockets, with the host's /proc */
		report_refused("private-proc", err,
			       "cannot make the new mount namespace private; the program sees the host's /proc");
		mounts_refuse(p, err, "cannot make the new mount namespace private (mounts would "
			      "reach the host)");
		mounts_settle(L);
		return 0;
	}
	step_proc(&L->mounts);                                  /* 2 */
	if (step_open_ro_binds(p, fds) != 0)                    /* 3 */
		return -1;
	if (step_tmpfs(L) > 0)                                  /* 4 */
		r = step_ro_binds(p, fds);                      /* 5 */
	for (i = 0; i < p->nro_bind; i++)
		close(fds[i]);
	if (r == 0)
		step_work_tmpfs(L);                             /* 6 */
	held_watch_net(L);      /* its unix sockets: by its own /proc's fd tables, if need be */
	mounts_settle(L);
	return r;
}

/* ---- after the run: the largest file ---- */

#define SCAN_ENTRIES 1024       /* entries looked at in all: a run that leaves more is said less
				 * of */
#define SCAN_DEPTH 4            /* directories below each top */

/* The largest regular file under the directory dfd, depth levels down; *left counts the entries
 * still allowed. Links are not followed, and other filesystems (bind mounts: the code, a source
 * tree) are not entered: only the run's own files count. */
static void largest_in(int dfd, dev_t dev, int depth, size_t *left, unsigned long long *max)
{
	char buf[2048];

	for (;;) {
		long n = syscall(SYS_getdents64, dfd, buf, sizeof buf), off;

		if (n <= 0)
			return;
		for (off = 0; off < n;) {
			struct dirent64 *d = (struct dirent64 *)(void *)(buf + off);
			const char *name = d->d_name;
			struct stat st;
			int sub;

			off += d->d_reclen;
			if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2])))
				continue;
			if (*left == 0)
				return;
			(*left)--;
			if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != dev)
				continue;       /* another filesystem: a bind mount (the code, a tree) */
			if (S_ISREG(st.st_mode) && (unsigned long long)st.st_size > *max)
				*max = (unsigned long long)st.st_size;
			if (!S_ISDIR(st.st_mode) || depth == 0)
				continue;
			sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0)
				continue;
			largest_in(sub, dev, depth - 1, left, max);
			close(sub);
		}
	}
}

static void largest_at(const char *path, size_t *left, unsigned long long *max)
{
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct stat st;

	if (dfd < 0)
		return;
	if (fstat(dfd, &st) == 0)
		largest_in(dfd, st.st_dev, SCAN_DEPTH, left, max);
	close(dfd);
}

/* A file the kernel stopped at RLIMIT_FSIZE is exactly at the limit (write() writes up to it,
 * then fails with EFBIG and SIGXFSZ): the supervisor looks for one where the program could write,
 * in its work dir and its private tmpfs mounts (never the host's /tmp: without a mount namespace
 * only --chdir is the run's own). */
unsigned long long mounts_largest_file(const struct launch *L)
{
	const struct plan *p = L->plan;
	char path[PATH_MAX];
	size_t i, left = SCAN_ENTRIES;
	unsigned long long max = 0;

	if (mounts_work_dir(L))
		largest_at(mounts_work_dir(L), &left, &max);
	for (i = 0; i < p->ntmpfs; i++)
		if (L->mounts.tmpfs_made[i])
			largest_at(tmpfs_path(p, i, path), &left, &max);
	return max;
}
