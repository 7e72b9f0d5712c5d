/* mounts.c: the init's mount namespace, which comes with the PID namespace.
 *
 * mounts_apply() is the flat list of the init's mount steps, before the init forks the program:
 *   1. make every mount private, so nothing below propagates back to the host (refused: none of
 *      the steps below is taken, the program sees the host's /proc and /tmp);
 *   2. a fresh /proc for this PID namespace;
 *   3. open each --ro-bind directory (O_PATH), while the host's tree is still in sight;
 *   4. a fresh tmpfs at each --tmpfs PATH: mode 1777, nosuid, nodev, size-limited;
 *   5. when one of them was mounted, each --ro-bind directory mounted back at its path,
 *      read-only, from its O_PATH fd (a tmpfs on /tmp would hide the run's code dir); the first
 *      (the code dir) at --code-at instead when it is given and its parent lies inside a --tmpfs
 *      mounted in step 4, so that the program's paths to its code say nothing of the host's;
 *   6. with --work-tmpfs, the work dir: a tmpfs, mode 0700, owned by the program's ids, at
 *      --work-at when it is given and its parent lies inside a --tmpfs mounted in step 4 (the
 *      directories along it are made there, never on the host's filesystem), else on --chdir.
 * Refusals are reported and the run goes on; a failed --ro-bind is fatal, because the program
 * would run without its code. Where the work dir stayed on --chdir, the program's --env values
 * that name --work-at name --chdir instead (mounts_settle), so HOME and TMPDIR still hold; where
 * the code dir stayed at its own path, so do the program's arguments that name --code-at.
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
#define CODE_STAYS "the code dir stays at its own path"

void mounts_refuse(const struct plan *p, int err, const char *why)
{
	if (p->ntmpfs)
		refuse("private-tmp", err, why, "the program shares the host's directories");
	if (p->work_tmpfs)
		refuse("work-tmpfs", err, why, "the program works in the host's --chdir directory");
	if (p->work_at)
		refuse("work-at", err, why, "the work dir stays on --chdir");
	if (p->code_at)
		refuse("code-at", err, why, CODE_STAYS);
}

/* What the init mounted (L->mounts) as a string, for corral-zygote's program: 'P' or '-' for
 * /proc, 'W' or '-' for --work-at, 'C' or '-' for --code-at, then 'T' or '-' for each --tmpfs. */
#define STATE_HEAD 3
void mounts_state(const struct launch *L, char *buf, size_t len)
{
	size_t i;

	if (len < MOUNTS_STATE_LEN)
		return;
	buf[0] = L->mounts.proc_made ? 'P' : '-';
	buf[1] = L->mounts.work_at ? 'W' : '-';
	buf[2] = L->mounts.code_at ? 'C' : '-';
	for (i = 0; i < PLAN_MOUNTS_MAX; i++)
		buf[STATE_HEAD + i] = L->mounts.tmpfs_made[i] ? 'T' : '-';
	buf[STATE_HEAD + i] = '\0';
}

void mounts_state_set(struct launch *L, const char *s)
{
	size_t i;

	if (strlen(s) != MOUNTS_STATE_LEN - 1)
		return;         /* nothing is taken as made */
	L->mounts.proc_made = s[0] == 'P';
	L->mounts.work_at = s[1] == 'W';
	L->mounts.code_at = s[2] == 'C';
	for (i = 0; i < PLAN_MOUNTS_MAX; i++)
		L->mounts.tmpfs_made[i] = s[STATE_HEAD + i] == 'T';
}

const char *mounts_work_dir(const struct launch *L)
{
	return L->mounts.work_at ? L->plan->work_at : L->plan->chdir;
}

const char *mounts_code_dir(const struct launch *L)
{
	if (!L->plan->nro_bind)
		return NULL;
	return L->mounts.code_at ? L->plan->code_at : L->plan->ro_bind[0];
}

char **mounts_env(const struct launch *L)
{
	return L->mounts.env ? L->mounts.env : L->plan->env;
}

char **mounts_args(const struct launch *L)
{
	return L->mounts.args ? L->mounts.args : L->plan->args;
}

/* The length of the value v when it is path or a path beneath it (what follows is kept), else 0. */
static size_t names_path(const char *v, const char *path)
{
	size_t n = strlen(path);

	return strncmp(v, path, n) == 0 && (v[n] == '\0' || v[n] == '/') ? n : 0;
}

/* Where the path in a string of vec starts: after the '=' of an --env value, else at 0. */
static const char *path_part(const char *s, int env)
{
	return env ? strchr(s, '=') + 1 : s;
}

/* A copy of the vector vec (n strings and NULL) where every string from index first on whose
 * path part (path_part) is from, or a path beneath it, has to in its place; NULL when none has,
 * or out of memory. One allocation, the process's until its execve or exit: the vector, then the
 * new strings. */
static char **renamed(char *const *vec, size_t n, size_t first, int env, const char *from,
		      const char *to)
{
	size_t i, extra = 0, tlen = strlen(to);
	char **out, *area;

	for (i = first; i < n; i++)
		if (names_path(path_part(vec[i], env), from))
			extra += strlen(vec[i]) + tlen + 1;
	if (!extra)
		return NULL;
	out = malloc((n + 1) * sizeof *out + extra);
	if (!out)
		return NULL;
	area = (char *)(out + n + 1);
	for (i = 0; i < n; i++) {
		const char *e = vec[i], *v = path_part(e, env);
		size_t k = i < first ? 0 : names_path(v, from);

		out[i] = vec[i];
		if (!k)
			continue;
		out[i] = area;
		memcpy(area, e, (size_t)(v - e));
		area += v - e;
		memcpy(area, to, tlen);
		area += tlen;
		strcpy(area, v + k);
		area += strlen(v + k) + 1;
	}
	out[n] = NULL;
	return out;
}

void mounts_settle(struct launch *L)
{
	const struct plan *p = L->plan;

	if (L->mounts.settled)
		return;
	L->mounts.settled = 1;
	if (p->work_at && !L->mounts.work_at && p->chdir)
		L->mounts.env = renamed(p->env, p->nenv, 0, 1, p->work_at, p->chdir);
	/* the arguments after the program's own name */
	if (p->code_at && !L->mounts.code_at)
		L->mounts.args = renamed(p->args, p->nargs, 1, 0, p->code_at, p->ro_bind[0]);
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

/* The directory fd read-only at path (made first): 0; -1 when the bind failed (nothing is
 * mounted), -2 when the read-only remount did (a writable bind is left). */
static int bind_ro(int fd, const char *path)
{
	char src[64];

	snprintf(src, sizeof src, "/proc/self/fd/%d", fd);
	if (mkdir_p(path) != 0 || mount(src, path, "none", MS_BIND | MS_REC, NULL) != 0)
		return -1;
	if (mount("none", path, "none",
		  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | locked_flags(path),
		  NULL) != 0)
		return -2;
	return 0;
}

/* Whether path lies inside a --tmpfs that was mounted (below it, not the mount point itself). */
static int in_made_tmpfs(const struct launch *L, const char *path)
{
	const struct plan *p = L->plan;
	size_t i, n = strlen(path);

	for (i = 0; i < p->ntmpfs; i++) {
		size_t k = p->tmpfs[i].path_len;

		if (L->mounts.tmpfs_made[i] && n > k + 1 && path[k] == '/' &&
		    memcmp(path, p->tmpfs[i].path, k) == 0)
			return 1;
	}
	return 0;
}

#define NO_PARENT "its parent lies in no --tmpfs the run mounted (the launcher makes no " \
		  "directory on the host's filesystem)"

/* 5a. The code dir (fd) at --code-at: 1 when it is there, 0 after a refused line (it goes at its
 * own path then), -1 after a fatal one. As for --work-at, the directories along the path are made
 * only below a --tmpfs of the run. */
static int step_code_at(struct launch *L, int fd)
{
	const struct plan *p = L->plan;
	int r;

	if (!in_made_tmpfs(L, p->code_at)) {
		refuse("code-at", ENOENT, NO_PARENT, CODE_STAYS);
		return 0;
	}
	r = bind_ro(fd, p->code_at);
	if (r == -1) {
		refuse("code-at", errno, "cannot bind the code dir there", CODE_STAYS);
		return 0;
	}
	if (r == -2) {
		report_fatal(W_ROBIND, errno, p->code_at);
		return -1;
	}
	L->mounts.code_at = 1;
	report_applied("code-at");
	return 1;
}

/* 5. Each --ro-bind directory back at its path, read-only, from its fd; the code dir at
 * --code-at when it can be. */
static int step_ro_binds(struct launch *L, const int *fds)
{
	const struct plan *p = L->plan;
	size_t i;

	for (i = 0; i < p->nro_bind; i++) {
		if (i == 0 && p->code_at) {
			int r = step_code_at(L, fds[0]);

			if (r < 0)
				return -1;
			if (r > 0)
				continue;
		}
		if (bind_ro(fds[i], p->ro_bind[i]) != 0) {
			report_fatal(W_ROBIND, errno, p->ro_bind[i]);
			return -1;
		}
	}
	return 0;
}

/* 6a. The work tmpfs at --work-at: 0, or -1 after a refused line (it goes on --chdir then). The
 * directories along the path are made below the --tmpfs it lies in, which only the init has
 * written to yet; nothing is made on the host's filesystem. */
static int step_work_at(struct launch *L, const char *opts)
{
	const struct plan *p = L->plan;
	int err;

	if (!in_made_tmpfs(L, p->work_at)) {
		refuse("work-at", ENOENT, NO_PARENT, "the work dir stays on --chdir");
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
		r = step_ro_binds(L, fds);                      /* 5 */
	else if (p->code_at)    /* nothing hides the code dir, nothing holds --code-at */
		refuse("code-at", ENOENT, NO_PARENT, CODE_STAYS);
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
