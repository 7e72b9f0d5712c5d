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
 *             kernel's header of each message (qnum);
 *   SysV sem  every semaphore of every set (nsems in /proc/sysvipc/sem), at the kernel's size of
 *             one (a cache line: the defaults allow a billion of them).
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
 * A tick reads three small files and fstatfs()es a few fds: no allocation, stack buffers only.
 *
 * Where it can, B also bounds the IPC namespace itself (held_ipc): its sysctls belong to the
 * root of the user namespace that owns it, which B is as root (in no user namespace, or one that
 * maps 0). Then a segment, the sum of segments, the message queues (at the worst, 1 MiB each:
 * 16384 one-byte messages of 64 bytes in the kernel) and the semaphores each fit in the budget,
 * and the program is refused past it. Without root (the caller's uid mapped to itself) the
 * kernel refuses the write ("refused ipc-limits EACCES"), and the counting above stands alone.
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define HELD_MOUNTS (PLAN_MOUNTS_MAX + 1)       /* every --tmpfs and the work tmpfs */
#define MSG_HEADER 64           /* the kernel's struct msg_msg, per message, rounded up */
#define SEM_SIZE 64             /* struct sem: cache-line aligned */
#define MSGMNB 16384            /* the kernel's default bytes (and messages) per queue */

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

/* Writes a number to /proc/sys/NAME: 0 or an errno. */
static int sysctl_set(const char *name, unsigned long long v)
{
	char path[64];
	struct line l;
	ssize_t n;
	int fd, err = 0;

	snprintf(path, sizeof path, "/proc/sys/%s", name);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return errno;
	line_start(&l, "");
	line_num(&l, v);
	do
		n = write(fd, l.buf, l.len);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)l.len)
		err = n < 0 ? errno : EIO;
	close(fd);
	return err;
}

/* The IPC namespace's limits, from the budget (see the top of the file): 0 or an errno. */
static int bound_ipc(unsigned long long kb)
{
	unsigned long long bytes = kb * 1024, queues = kb / 1024, sems = bytes / SEM_SIZE;
	long page = sysconf(_SC_PAGESIZE);
	char sem[96];
	int fd, err;
	ssize_t n;

	if ((err = sysctl_set("kernel/shmmax", bytes)) ||
	    (err = sysctl_set("kernel/shmall", bytes / (unsigned long long)(page > 0 ? page : 4096))) ||
	    (err = sysctl_set("kernel/msgmnb", MSGMNB)) ||
	    (err = sysctl_set("kernel/msgmni", queues ? queues : 1)))
		return err;
	/* kernel/sem: SEMMSL SEMMNS SEMOPM SEMMNI; only SEMMNS, the total, changes */
	snprintf(sem, sizeof sem, "32000 %llu 500 32000", sems < 32000 ? 32000 : sems);
	fd = open("/proc/sys/kernel/sem", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return errno;
	do
		n = write(fd, sem, strlen(sem));
	while (n < 0 && errno == EINTR);
	err = n == (ssize_t)strlen(sem) ? 0 : n < 0 ? errno : EIO;
	close(fd);
	return err;
}

void held_ipc(const struct plan *p)
{
	int err;

	if (!p->budget_memory_kb)
		return;
	held.ipc = 1;
	err = bound_ipc(p->budget_memory_kb);
	if (!err)
		report_applied("ipc-limits");
	else
		report_refused("ipc-limits", err,
			       "the IPC namespace's sysctls belong to the root of its user namespace, "
			       "which does not map 0: the budget counts SysV IPC as it polls");
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

/* key semid perms nsems ... */
static unsigned long long sem_line(const char *l)
{
	return field(l, 4) * SEM_SIZE;
}

unsigned long long held_kb(void)
{
	unsigned long long kb = tmpfs_kb();

	if (held.ipc)
		kb += (sum_lines("/proc/sysvipc/shm", shm_line) +
		       sum_lines("/proc/sysvipc/msg", msg_line) +
		       sum_lines("/proc/sysvipc/sem", sem_line)) / 1024;
	return kb;
}
