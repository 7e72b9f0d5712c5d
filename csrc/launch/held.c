/* held.c: memory the kernel holds for a run outside its processes' pages, which the polled
 * memory budget (budget.c) charges besides their resident pages.
 *
 * A process's resident size counts the pages it maps. These it can fill, let go of, and the
 * kernel keeps them for the run, in the run's own scratch mounts and IPC namespace:
 *   tmpfs     each --tmpfs and the --work-tmpfs that B mounted: the blocks in use, by fstatfs()
 *             of the mount's root (an O_PATH fd opened right after the mount): a file's pages
 *             whether mapped or not, unlinked-but-open and O_TMPFILE files included;
 *   SysV shm  the segments no process has attached (nattch 0 in /proc/sysvipc/shm): their
 *             resident and swapped bytes. An attached segment's pages are in the resident size
 *             of whoever touched them through it;
 *   SysV msg  the bytes queued in every message queue (cbytes in /proc/sysvipc/msg), plus the
 *             kernel's header of each message (qnum).
 * /proc/sysvipc lists the IPC namespace of the process that reads it: held_watch_ipc() is called
 * by B (or corral-init) once it is in the run's namespaces, never by A, whose IPC namespace is
 * the host's. A tmpfs page that a process maps counts twice (in its resident size and in the
 * mount's blocks): an overcount, never an undercount.
 *
 * Not counted here: POSIX message queues (charged at mq_open to RLIMIT_MSGQUEUE, which the
 * policy sets), memfds (refused by the policy's seccomp list: one passed through a unix socket
 * and closed by its sender is in no process and no mount), pipe and socket buffers (nothing
 * shows them to another process; see THREAT-MODEL.md).
 *
 * A tick reads two small files and fstatfs()es a few fds: no allocation, stack buffers only.
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define HELD_MOUNTS (PLAN_MOUNTS_MAX + 1)       /* every --tmpfs and the work tmpfs */
#define MSG_HEADER 64           /* the kernel's struct msg_msg, per message, rounded up */

static struct {
	int ipc;                        /* 1: /proc/sysvipc is the run's */
	size_t n;
	int fd[HELD_MOUNTS];            /* O_PATH roots of the run's tmpfs mounts */
} held;

void held_watch_mount(const struct plan *p, const char *path)
{
	int fd;

	if (!p->budget_memory_kb || held.n == HELD_MOUNTS)
		return;
	fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0)
		held.fd[held.n++] = fd;
}

void held_watch_ipc(const struct plan *p)
{
	held.ipc = p->budget_memory_kb != 0;
}

/* KiB in use in the tmpfs mounts. */
static unsigned long long tmpfs_kb(void)
{
	unsigned long long kb = 0;
	size_t i;

	for (i = 0; i < held.n; i++) {
		struct statfs sf;

		if (fstatfs(held.fd[i], &sf) != 0 || sf.f_type != TMPFS_MAGIC || sf.f_bfree > sf.f_blocks)
			continue;
		kb += (unsigned long long)(sf.f_blocks - sf.f_bfree) * (unsigned long long)sf.f_bsize /
		      1024;
	}
	return kb;
}

/* Field `n` (from 1) of a line of /proc/sysvipc/ *: a decimal number, or 0. */
static unsigned long long field(const char *line, int n)
{
	const char *p = line;
	unsigned long long v = 0;
	int i;

	for (i = 1;; i++) {
		while (*p == ' ')
			p++;
		if (!*p || *p == '\n')
			return 0;
		if (i == n)
			break;
		while (*p && *p != ' ' && *p != '\n')
			p++;
	}
	for (; *p >= '0' && *p <= '9'; p++)
		v = v * 10 + (unsigned long long)(*p - '0');
	return v;
}

/* Bytes a /proc/sysvipc file's lines add up to, by line(), after its header line; the file is
 * read in pieces, a line never split. */
static unsigned long long sum_lines(const char *path, unsigned long long (*line)(const char *))
{
	char buf[8192];
	size_t have = 0;
	unsigned long long sum = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), first = 1;

	if (fd < 0)
		return 0;
	for (;;) {
		ssize_t n;
		char *p, *nl;

		do
			n = read(fd, buf + have, sizeof buf - 1 - have);
		while (n < 0 && errno == EINTR);
		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = '\0';
		for (p = buf; (nl = strchr(p, '\n')) != NULL; p = nl + 1) {
			*nl = '\0';
			if (!first)
				sum += line(p);
			first = 0;
		}
		have -= (size_t)(p - buf);
		if (have == sizeof buf - 1)
			have = 0;       /* no line is this long: drop it */
		memmove(buf, p, have);
	}
	close(fd);
	return sum;
}

/* key shmid perms size cpid lpid nattch uid gid cuid cgid atime dtime ctime rss swap */
static unsigned long long shm_line(const char *l)
{
	return field(l, 7) ? 0 : field(l, 15) + field(l, 16);
}

/* key msqid perms cbytes qnum ... */
static unsigned long long msg_line(const char *l)
{
	return field(l, 4) + field(l, 5) * MSG_HEADER;
}

unsigned long long held_kb(void)
{
	unsigned long long kb = tmpfs_kb();

	if (held.ipc)
		kb += (sum_lines("/proc/sysvipc/shm", shm_line) +
		       sum_lines("/proc/sysvipc/msg", msg_line)) / 1024;
	return kb;
}
