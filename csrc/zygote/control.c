/* control.c: the control socket, a SOCK_SEQPACKET unix socket: one message per record, each a
 * sequence of NUL-terminated strings, a run request with its fds as SCM_RIGHTS.
 *
 * The zygote never blocks on the host: a message that does not fit in the socket's buffer now is
 * queued, and sent when poll() says POLLOUT. The queue holds at most three messages per run (pid,
 * ended, exit), so it is bounded by the runs the host started. A message to the host carries at
 * most one fd (a direct run's pid message: the direct init's pidfd), which the queue owns until it
 * is sent; one the kernel refuses to pass (ETOOMANYREFS: too many fds in flight for the uid) goes
 * without it, and the host then ends that run at its exit message.
 */
#include "zygote.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct out {
	struct out *next;
	int fd;                 /* sent with the message (SCM_RIGHTS), then closed; -1: none */
	size_t len;
	char buf[];
};

static struct out *head, *tail;

int strv_add(struct strv *s, const char *str)
{
	char *c;

	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 8;
		char **v = realloc(s->v, cap * sizeof *v);

		if (!v)
			return -1;
		s->v = v;
		s->cap = cap;
	}
	c = strdup(str);
	if (!c)
		return -1;
	s->v[s->n++] = c;
	return 0;
}

void strv_free(struct strv *s)
{
	size_t i;

	for (i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	s->v = NULL;
	s->n = s->cap = 0;
}

/* One send of a whole record, with its fd: 1 sent, 0 the socket is full, -1 error. */
static int send_one(int fd, struct out *o)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = { (void *)o->buf, o->len };
	struct msghdr m;
	ssize_t n;

	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (o->fd >= 0) {
		struct cmsghdr *c;

		m.msg_control = u.buf;
		m.msg_controllen = sizeof u.buf;
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &o->fd, sizeof(int));
	}
	do
		n = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0 && o->fd >= 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS) {
		close(o->fd);   /* the message matters, its fd only speeds the run's end up */
		o->fd = -1;
		return send_one(fd, o);
	}
	if (n >= 0)
		return 1;       /* a record goes whole or not at all */
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)
		return 0;
	return -1;
}

int ctl_flush(int fd)
{
	while (head) {
		struct out *o = head;
		int r = send_one(fd, o);

		if (r < 0)
			return -1;
		if (r == 0)
			return 0;
		head = o->next;
		if (!head)
			tail = NULL;
		if (o->fd >= 0)
			close(o->fd);
		free(o);
	}
	return 0;
}

int ctl_queued(void)
{
	return head != NULL;
}

int ctl_send(int fd, const char *const *fields, size_t n)
{
	return ctl_send_fd(fd, fields, n, -1);
}

int ctl_send_fd(int fd, const char *const *fields, size_t n, int passfd)
{
	struct out *o;
	size_t i, len = 0, off = 0;

	for (i = 0; i < n; i++)
		len += strlen(fields[i]) + 1;
	o = malloc(sizeof *o + len);
	if (!o) {
		if (passfd >= 0)
			close(passfd);
		errno = ENOMEM;
		return -1;
	}
	o->fd = passfd;
	for (i = 0; i < n; i++) {
		size_t l = strlen(fields[i]) + 1;

		memcpy(o->buf + off, fields[i], l);
		off += l;
	}
	o->len = len;
	o->next = NULL;
	/* In order: after what is already queued. */
	if (tail)
		tail->next = o;
	else
		head = o;
	tail = o;
	return ctl_flush(fd);
}

int msg_send(int fd, const void *buf, size_t len, const int *fds, int nfds)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * MSG_FDS_MAX)];
	} u;
	struct iovec iov = { (void *)buf, len };
	struct msghdr m;
	struct cmsghdr *c;
	ssize_t n;

	if (nfds < 0 || nfds > MSG_FDS_MAX) {
		errno = EINVAL;
		return -1;
	}
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (nfds > 0) {
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(fd, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -1 : 0;
}

ssize_t ctl_recv(int fd, char *buf, size_t len, int *fds, int maxfds, int *nfds, int *cut)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * 16)];
	} u;
	struct iovec iov = { buf, len };
	struct msghdr m;
	struct cmsghdr *c;
	ssize_t n;

	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.buf;
	m.msg_controllen = sizeof u.buf;
	*nfds = 0;
	*cut = 0;
	do
		n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -1;
	if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
		*cut = 1;
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		size_t i, k;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (i = 0; i < k; i++) {
			int f;

			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
			if (*nfds < maxfds) {
				fds[(*nfds)++] = f;
			} else {
				close(f);
				*cut = 1;
			}
		}
	}
	return n;
}

/* A helper process of the zygote's (the spawner, closer): forked with a SOCK_SEQPACKET pair, the
 * child runs child_main(z, its end) and never returns; the zygote keeps the other end. 0 (*sock,
 * *pid set), or -1 with errno. */
int helper_fork(struct zygote *z, void (*child_main)(const struct zygote *z, int sock), int *sock,
		pid_t *pid)
{
	int sv[2];
	pid_t p;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
		return -1;
	p = fork();
	if (p == 0) {
		close(sv[0]);
		close(z->ctl);          /* the host's socket is the zygote's alone */
		child_main(z, sv[1]);
		_exit(0);
	}
	close(sv[1]);
	if (p < 0) {
		close(sv[0]);
		return -1;
	}
	*sock = sv[0];
	*pid = p;
	return 0;
}
