/* held->c: memory the kernel holds for a run outside its processes' pages, which the polled
 * memory budget (budget.c) charges besides their resident pages.
 *
 * A process's resident size counts the pages it maps. These it can fill, let go of, and the
 * kernel keeps them for the run, in the run's own scratch mounts and IPC namespace:
 *   tmpfs     each --tmpfs and the --work-tmpfs that the init mounted: the blocks in use, by fstatfs()
 *             of the mount's root (an O_PATH fd opened right after the mount): a file's pages
 *             whether mapped or not, unlinked-but-open and O_TMPFILE files included;
 *   SysV shm  the segments no process has attached (nattch 0 in /proc/sysvipc/shm, read only
 *             when shmctl(SHM_INFO) counts a segment at all): their resident and swapped bytes.
 *             An attached segment's pages are in the resident size of whoever touched them
 *             through it;
 *   SysV msg  the bytes queued in all message queues, plus the kernel's header of each message
 *             (msgctl(MSG_INFO): msgtql bytes, msgmap messages);
 *   SysV sem  every semaphore of every set (semctl(SEM_INFO): semaem), at the kernel's size of
 *             one (a cache line: the defaults allow a billion of them);
 *   unix      the buffers of the run's unix sockets (socketpairs: the only ones a filtered run
 *             may make): what each has sent and its peer not yet read (sk_wmem_alloc, by the
 *             kernel's size of each buffer), plus a socket's own size, from a sock_diag dump of
 *             the run's network namespace (a socket passed in a message and closed by all is
 *             still there). Which sockets are the run's: all, in a network namespace of its
 *             own; in a shared one, those of its uid when it has one of its own (--uid); else
 *             (no root, network = "shared": other runs have the same uid) those of its uid while
 *             they hold little (at most a sixteenth of the budget, a neighbour's included), and
 *             past that only those in its processes' fd tables (its own /proc lists them alone):
 *             then a socket held only in flight (sent in a message, closed by all) is missed,
 *             at most RLIMIT_NOFILE of them (the kernel's bound on fds in flight per user).
 * /proc/sysvipc and the *_INFO calls see the IPC namespace of their caller: held_ipc() is called by
 * the init (or corral-init) once it is in the run's namespaces, never by the launcher, whose IPC
 * namespace is the host's. A tmpfs page that a process maps counts twice (in its resident size and
 * in the mount's blocks): an overcount, never an undercount.
 *
 * Not counted here: POSIX message queues (charged at mq_open to RLIMIT_MSGQUEUE, which the
 * policy sets), memfds (refused by the policy's seccomp list: one passed through a unix socket
 * and closed by its sender is in no process and no mount), pipe buffers (nothing shows them to
 * another process; the kernel bounds them per uid: see THREAT-MODEL.md).
 *
 * A tick: three *_INFO calls (and a file when a segment exists), an fstatfs() per mount and a
 * sock_diag dump: no allocation, stack buffers only.
 *
 * Where it can, the init also bounds the IPC namespace itself (held_ipc): its sysctls belong to the
 * root of the user namespace that owns it, which the init is as root (in no user namespace, or one
 * that maps 0). Then a segment, the sum of segments, the message queues (at the worst, 1 MiB each:
 * 16384 one-byte messages of 64 bytes in the kernel) and the semaphores each fit in the budget, and
 * the program is refused past it. Without root (the caller's uid mapped to itself) the kernel
 * refuses the write ("refused ipc-limits EACCES"), and the counting above stands alone.
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/socket.h>

#if __has_include(<linux/netlink.h>)
#include <linux/netlink.h>
#else   /* musl, for corral-init: the few netlink definitions used here (the kernel's ABI) */
struct nlmsghdr {
	unsigned int nlmsg_len;
	unsigned short nlmsg_type, nlmsg_flags;
	unsigned int nlmsg_seq, nlmsg_pid;
};
struct sockaddr_nl {
	sa_family_t nl_family;
	unsigned short nl_pad;
	unsigned int nl_pid, nl_groups;
};
#define NLM_F_REQUEST 0x01
#define NLM_F_DUMP 0x300
#define NLMSG_ERROR 0x2
#define NLMSG_DONE 0x3
#define NLMSG_ALIGN(len) (((len) + 3U) & ~3U)
#define NLMSG_HDRLEN ((int)NLMSG_ALIGN(sizeof(struct nlmsghdr)))
#define NLMSG_LENGTH(len) ((len) + NLMSG_HDRLEN)
#define NLMSG_DATA(nlh) ((void *)((char *)(nlh) + NLMSG_HDRLEN))
#define NLMSG_NEXT(nlh, len) ((len) -= NLMSG_ALIGN((nlh)->nlmsg_len), \
	(struct nlmsghdr *)(void *)((char *)(nlh) + NLMSG_ALIGN((nlh)->nlmsg_len)))
#define NLMSG_OK(nlh, len) ((len) >= (int)sizeof(struct nlmsghdr) && \
	(nlh)->nlmsg_len >= sizeof(struct nlmsghdr) && (nlh)->nlmsg_len <= (unsigned)(len))
#endif
#include <dirent.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define MSG_HEADER 64           /* the kernel's struct msg_msg, per message, rounded up */
#define SEM_SIZE 64             /* struct sem: cache-line aligned */
#define MSGMNB 16384            /* the kernel's default bytes (and messages) per queue */

/* sock_diag for AF_UNIX (linux/sock_diag.h, linux/unix_diag.h: not in every libc's headers) */
#ifndef NETLINK_SOCK_DIAG
#define NETLINK_SOCK_DIAG 4
#endif
#define SOCK_DIAG_BY_FAMILY 20
#define UDIAG_SHOW_MEMINFO 0x20
#define UDIAG_SHOW_UID 0x40
#define UNIX_DIAG_MEMINFO 5
#define UNIX_DIAG_UID 7
#define SK_MEMINFO_WMEM_ALLOC 2
#define SOCK_SIZE 1024          /* a unix socket's own kernel memory, about */
#define INO_SLOTS 8192          /* socket inodes of the run's fds: a power of 2 */

struct unix_diag_req {
	unsigned char family, protocol;
	unsigned short pad;
	unsigned int states, ino, show, cookie[2];
};

struct unix_diag_msg {
	unsigned char family, type, state, pad;
	unsigned int ino, cookie[2];
};

/* The socket inodes of the run's fds, collected afresh by each tick that counts by fds
 * (ino_collect): scratch, kept out of struct launch for its size. */
static struct {
	size_t n;
	unsigned int ino[INO_SLOTS];    /* open addressing; 0: empty */
} inos;

void held_watch_mount(struct launch *L, const char *path)
{
	const struct plan *p = L->plan;
	struct held_state *held = &L->held;
	int fd;

	if (!p->budget_memory_kb || held->n == HELD_MOUNTS)
		return;
	fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0)
		held->fd[held->n++] = fd;
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

void held_watch_net(struct launch *L)
{
	const struct plan *p = L->plan;
	struct held_state *held = &L->held;

	if (!p->budget_memory_kb || !L->netns)
		return;
	held->by_uid = L->net_shared;
	held->by_fd = held->by_uid && !p->has_ids && L->mounts.proc_made;
	held->uid = p->has_ids ? p->uid : geteuid();
	held->budget_kb = p->budget_memory_kb;
	held->diag = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
}

int held_is_init(const struct launch *L)
{
	return L->held.init;
}

void held_ipc(struct launch *L)
{
	const struct plan *p = L->plan;
	struct held_state *held = &L->held;
	int err;

	held->init = 1;
	if (!p->budget_memory_kb)
		return;
	held->ipc = 1;
	err = bound_ipc(p->budget_memory_kb);
	if (!err)
		report_applied("ipc-limits");
	else
		report_refused("ipc-limits", err,
			       "the IPC namespace's sysctls belong to the root of its user namespace, "
			       "which does not map 0: the budget counts SysV IPC as it polls");
}

/* KiB in use in the tmpfs mounts. */
static unsigned long long tmpfs_kb(const struct held_state *held)
{
	unsigned long long kb = 0;
	size_t i;

	for (i = 0; i < held->n; i++) {
		struct statfs sf;

		if (fstatfs(held->fd[i], &sf) != 0 || sf.f_type != TMPFS_MAGIC || sf.f_bfree > sf.f_blocks)
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

/* Bytes of the IPC namespace's SysV objects (see the top of the file). */
static unsigned long long ipc_bytes(void)
{
	struct shm_info shm;
	struct msginfo msg;
	struct seminfo sem;
	unsigned long long sum = 0;

	if (shmctl(0, SHM_INFO, (struct shmid_ds *)(void *)&shm) >= 0 && shm.used_ids > 0)
		sum += sum_lines("/proc/sysvipc/shm", shm_line);
	if (msgctl(0, MSG_INFO, (struct msqid_ds *)(void *)&msg) >= 0)
		sum += (unsigned long long)msg.msgtql + (unsigned long long)msg.msgmap * MSG_HEADER;
	if (semctl(0, 0, SEM_INFO, &sem) >= 0)
		sum += (unsigned long long)sem.semaem * SEM_SIZE;
	return sum;
}

static size_t ino_hash(unsigned int ino)
{
	return (ino * 2654435761U) & (INO_SLOTS - 1);
}

static int ino_has(unsigned int ino)
{
	size_t h;

	for (h = ino_hash(ino); inos.ino[h]; h = (h + 1) & (INO_SLOTS - 1))
		if (inos.ino[h] == ino)
			return 1;
	return 0;
}

static void ino_add(unsigned int ino)
{
	size_t h;

	if (!ino || inos.n >= INO_SLOTS / 2)
		return;
	for (h = ino_hash(ino); inos.ino[h]; h = (h + 1) & (INO_SLOTS - 1))
		if (inos.ino[h] == ino)
			return;
	inos.ino[h] = ino;
	inos.n++;
}

/* fn(dfd, name) for each entry of the directory dfd whose name starts with a digit (a pid of
 * /proc, an fd of /proc/PID/fd); closes dfd. */
static void each_numbered(int dfd, void (*fn)(int dfd, const char *name))
{
	char buf[4096];

	for (;;) {
		long n = syscall(SYS_getdents64, dfd, buf, sizeof buf), off;

		if (n <= 0)
			break;
		for (off = 0; off < n;) {
			struct dirent64 *d = (struct dirent64 *)(void *)(buf + off);

			off += d->d_reclen;
			if (d->d_name[0] >= '0' && d->d_name[0] <= '9')
				fn(dfd, d->d_name);
		}
	}
	close(dfd);
}

/* A socket's inode, from an fd's link in /proc/PID/fd. */
static void ino_add_fd(int dfd, const char *fd)
{
	char link[64];
	ssize_t len = readlinkat(dfd, fd, link, sizeof link - 1);

	if (len > 9 && memcmp(link, "socket:[", 8) == 0) {
		link[len] = '\0';
		ino_add((unsigned int)strtoul(link + 8, NULL, 10));
	}
}

/* The socket inodes in the fd tables of /proc/PID/fd (PID: a name of the run's own /proc). */
static void ino_add_fds(int proc, const char *pid)
{
	char path[48];
	int dfd;

	(void)proc;
	snprintf(path, sizeof path, "/proc/%.20s/fd", pid);
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0)
		each_numbered(dfd, ino_add_fd);
}

/* Every socket inode the run's processes hold: a walk of the run's own /proc. */
static void ino_collect(void)
{
	int dfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	memset(inos.ino, 0, sizeof inos.ino);
	inos.n = 0;
	if (dfd >= 0)
		each_numbered(dfd, ino_add_fds);
}

/* One socket of the dump: its bytes, or 0 when it is not the run's (by_ino: only the sockets
 * of the run's fds count). */
static unsigned long long unix_one(const struct held_state *held, const struct nlmsghdr *h,
				   int by_ino)
{
	const struct unix_diag_msg *m = NLMSG_DATA(h);
	const char *a = (const char *)(m + 1), *end = (const char *)h + h->nlmsg_len;
	unsigned long long bytes = SOCK_SIZE;
	int uid_seen = 0;

	if (h->nlmsg_len < NLMSG_LENGTH(sizeof *m) || (by_ino && !ino_has(m->ino)))
		return 0;
	while (a + 4 <= end) {
		unsigned short len, type;

		memcpy(&len, a, 2);
		memcpy(&type, a + 2, 2);
		if (len < 4 || a + len > end)
			break;
		if (type == UNIX_DIAG_MEMINFO && len >= 4 + 4 * (SK_MEMINFO_WMEM_ALLOC + 1)) {
			unsigned int w;

			memcpy(&w, a + 4 + 4 * SK_MEMINFO_WMEM_ALLOC, 4);
			bytes += w;
		} else if (type == UNIX_DIAG_UID && len >= 8) {
			unsigned int u;

			memcpy(&u, a + 4, 4);
			uid_seen = u == (unsigned int)held->uid;
		}
		a += (len + 3) & ~3;
	}
	return held->by_uid && !uid_seen ? 0 : bytes;
}

/* Bytes held by the unix sockets of one sock_diag dump (by_ino: see unix_one). */
static unsigned long long unix_dump(const struct held_state *held, int by_ino)
{
	struct {
		struct nlmsghdr h;
		struct unix_diag_req r;
	} req;
	struct sockaddr_nl nl = { .nl_family = AF_NETLINK };
	char buf[16384] __attribute__((aligned(4)));
	unsigned long long sum = 0;

	memset(&req, 0, sizeof req);
	req.h.nlmsg_len = sizeof req;
	req.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	req.r.family = AF_UNIX;
	req.r.states = ~0U;
	req.r.show = UDIAG_SHOW_MEMINFO | UDIAG_SHOW_UID;
	if (sendto(held->diag, &req, sizeof req, 0, (struct sockaddr *)&nl, sizeof nl) < 0)
		return 0;
	for (;;) {
		ssize_t n = recv(held->diag, buf, sizeof buf, 0);
		struct nlmsghdr *h = (struct nlmsghdr *)(void *)buf;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return sum;
		for (; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR)
				return sum;
			sum += unix_one(held, h, by_ino);
		}
	}
}

/* Bytes held by the run's unix sockets (see the top of the file). */
static unsigned long long unix_bytes(const struct held_state *held)
{
	unsigned long long sum = unix_dump(held, 0);

	if (!held->by_fd || sum / 1024 <= held->budget_kb / 16)
		return sum;
	ino_collect();
	return unix_dump(held, 1);
}

unsigned long long held_kb(const struct launch *L)
{
	const struct held_state *held = &L->held;
	unsigned long long kb = tmpfs_kb(held);

	if (held->ipc)
		kb += ipc_bytes() / 1024;
	if (held->diag >= 0)
		kb += unix_bytes(held) / 1024;
	return kb;
}
