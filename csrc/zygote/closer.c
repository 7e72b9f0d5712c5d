/* closer.c: the closer, the small process that closes the runs' mount namespaces for the zygote.
 *
 * The zygote holds each run's mount namespace file until the run's end is sent (request.c), so that
 * no process of the run waits for the namespace's teardown. Whoever drops the last reference then
 * frees the namespace's mounts in that call, before it returns (the kernel's task work): the run's
 * tmpfs mounts, one inode and dentry at a time, a few microseconds each (0.75 s for the 160,000
 * files the mounts once allowed). In the zygote's only thread that stalled every other run. So the
 * zygote hands each file to the closer, which closes it: the zygote's send takes microseconds
 * whatever the mounts hold, and the closer pays the teardown alone, off every run's path. Nothing
 * of the run is left by then (its init has exited, which the kernel completes only once its PID
 * namespace is empty): what the closer frees is memory no process can reach.
 *
 * The closer is forked at start-up, before the interpreter, as the spawner is; it dies with the
 * zygote and holds nothing but its socket and the files in flight. The zygote sends without ever
 * blocking: what the socket cannot take now waits in the zygote's queue, sent once the socket is
 * writable (request_poll). Without the closer (it could not start, or died), the zygote closes the
 * files itself, as before.
 */
#include "zygote.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define CLOSER_QUEUE_MAX 64     /* files the closer could not take yet, at most */

static int *queue;              /* files the closer could not take yet */
static size_t nqueue, capqueue;

/* The closer: closes every file that comes, until EOF (the zygote closed its end, or is gone). */
static NORETURN void closer_main(const struct zygote *z, int sock)
{
	char byte;
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(MSG_FDS_MAX * sizeof(int))];
	} cm;

	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	if (getppid() != z->self)
		_exit(0);
	close_fds(3, sock - 1);
	close_fds(sock + 1, -1);
	for (;;) {
		struct iovec iov = { &byte, 1 };
		struct msghdr m;
		struct cmsghdr *c;
		ssize_t n;

		memset(&m, 0, sizeof m);
		m.msg_iov = &iov;
		m.msg_iovlen = 1;
		m.msg_control = cm.buf;
		m.msg_controllen = sizeof cm.buf;
		n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			_exit(0);
		for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			int *fd = (int *)CMSG_DATA(c);
			size_t i, k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			for (i = 0; i < k; i++)
				close(fd[i]);   /* the teardown, here */
		}
	}
}

int closer_start(struct zygote *z)
{
	z->closer = -1;
	return helper_fork(z, closer_main, &z->closer, &z->closer_pid);
}

/* Sends what is queued, as much as the socket takes now. */
void closer_flush(struct zygote *z)
{
	while (nqueue > 0 && z->closer >= 0) {
		size_t k = nqueue < MSG_FDS_MAX ? nqueue : MSG_FDS_MAX, i;
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(MSG_FDS_MAX * sizeof(int))];
		} cm;
		char byte = 0;
		struct iovec iov = { &byte, 1 };
		struct msghdr m;
		struct cmsghdr *c;

		memset(&cm, 0, sizeof cm);
		memset(&m, 0, sizeof m);
		m.msg_iov = &iov;
		m.msg_iovlen = 1;
		m.msg_control = cm.buf;
		m.msg_controllen = CMSG_SPACE(k * sizeof(int));
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(k * sizeof(int));
		memcpy(CMSG_DATA(c), queue + nqueue - k, k * sizeof(int));
		if (sendmsg(z->closer, &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
			if (errno == EINTR)
				continue;
			/* full (EAGAIN; or ETOOMANYREFS: too many files in flight for our uid):
			 * later, at POLLOUT. Gone: we close them ourselves. */
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETOOMANYREFS)
				return;
			close(z->closer);
			z->closer = -1;
			break;
		}
		for (i = nqueue - k; i < nqueue; i++)
			close(queue[i]);        /* the closer has its own reference now */
		nqueue -= k;
	}
	if (z->closer < 0)
		while (nqueue > 0)
			close(queue[--nqueue]);
}

void closer_give(struct zygote *z, int fd)
{
	if (fd < 0)
		return;
	/* Without the closer, or with the closer that many files behind (each a run's mounts, and
	 * an fd of the zygote's own): the old way, in this thread. The stall is bounded by the
	 * mounts' inode caps, and the zygote's fd table and the memory the queued mounts hold stay
	 * bounded whatever the closer's pace. */
	if (z->closer < 0 || nqueue >= CLOSER_QUEUE_MAX) {
		close(fd);
		return;
	}
	if (nqueue == capqueue) {
		size_t cap = capqueue ? 2 * capqueue : 64;
		int *q = realloc(queue, cap * sizeof *q);

		if (!q) {
			close(fd);      /* no memory: the old way, in our thread */
			return;
		}
		queue = q;
		capqueue = cap;
	}
	queue[nqueue++] = fd;
	closer_flush(z);
}

int closer_waiting(const struct zygote *z)
{
	return nqueue > 0 && z->closer >= 0;
}

/* The closer exited (reaped by request_reap): the files are ours to close from now on. */
void closer_gone(struct zygote *z)
{
	z->closer_pid = 0;
	if (z->closer >= 0)
		close(z->closer);
	z->closer = -1;
	closer_flush(z);
}

/* At the zygote's end: the queued files to the closer, then EOF; the closer closes them and exits,
 * and the zygote waits for it, so that nothing of the zygote outlives it. */
void closer_stop(struct zygote *z)
{
	int st;

	while (closer_waiting(z)) {
		struct pollfd pf = { z->closer, POLLOUT, 0 };

		if (poll(&pf, 1, 1000) <= 0 || (pf.revents & (POLLERR | POLLHUP))) {
			close(z->closer);
			z->closer = -1;
		}
		closer_flush(z);
	}
	if (z->closer >= 0)
		close(z->closer);
	z->closer = -1;
	while (z->closer_pid > 0 && waitpid(z->closer_pid, &st, 0) < 0 && errno == EINTR)
		;
	z->closer_pid = 0;
}
