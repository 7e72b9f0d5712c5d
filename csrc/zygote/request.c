/* request.c: run requests.
 *
 * `run\0ID\0ARG...` with exactly four fds (stdin, stdout, stderr, report): the zygote checks the
 * message, makes the run's own socket and hands both to the spawner (spawner.c), which starts the
 * launcher, a child of the zygote that follows the launcher's flow; the zygote says `pid\0ID\0PID`
 * and goes on with the next message. On the run's socket the init later asks for the program, which
 * the zygote forks from the warm interpreter into the run's namespaces (program.c) with the run's
 * seccomp filter (kept per distinct filter: building one with libseccomp costs more than the rest
 * of a run's set-up). When the launcher has been reaped, the zygote says `exit\0ID\0STATUS` (the
 * launcher's raw wait status): the program was the init's child, and the init was reaped by the
 * launcher. A request that cannot start gets `error\0ID\0WHY` and nothing else.
 *
 * A direct run (direct.c) is the direct init, the init of its namespaces: its pid message carries
 * the direct init's pidfd, and once the direct init has written the program's outcome (its last act
 * before its exit), the zygote says `ended\0ID\0STATUS` at once. `ended` alone does not say the run
 * is over: the host waits for the direct init's exit on the pidfd (an init's exit completes only
 * once the kernel has killed and reaped the rest of its PID namespace, which with a budget
 * corral-init did already), instead of for the zygote's reaping and message. `exit` follows at the
 * direct init's reaping, as for every run.
 *
 * The launcher checks what only the zygote forbids (a network or user namespace other than the
 * zygote's, no PID namespace, another interpreter, other interpreter options, another locale) and
 * writes a usage error to the run's stderr as the launcher writes its own ("corral-zygote: ...",
 * exit 2).
 */
#include "zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define STOP_MS 2000            /* at the end, how long the runs get to end after SIGTERM (the
				 * launcher's own init gets 1 s: INIT_STOP_MS) */

/* ---- the runs going on ---- */

struct run {
	pid_t pid;              /* the launcher */
	int sock;               /* the zygote's end of the run's socket (the init's request); -1:
				 * closed */
	int mntns;              /* the run's mount namespace, held (see run_remove); -1: none */
	int outr;               /* a direct run (direct.c): its outcome pipe; -1: not direct, or
				 * read */
	int early;              /* its pid message had the direct init's pidfd: `ended` when outr is
				 * readable */
	int ended;              /* `ended` is sent: the status is known */
	int status;             /* ... this one */
	uint64_t digest;        /* program_digest() of the request's ID and ARGS */
	char id[24];
};

static struct run *runs;
static size_t nruns, caprun;

static int runs_add(pid_t pid, const char *id, int sock, uint64_t digest)
{
	if (nruns == caprun) {
		size_t cap = caprun ? 2 * caprun : 64;
		struct run *r = realloc(runs, cap * sizeof *r);

		if (!r)
			return -1;
		runs = r;
		caprun = cap;
	}
	memset(&runs[nruns], 0, sizeof runs[nruns]);
	runs[nruns].pid = pid;
	runs[nruns].sock = sock;
	runs[nruns].mntns = -1;
	runs[nruns].outr = -1;
	runs[nruns].digest = digest;
	snprintf(runs[nruns].id, sizeof runs[nruns].id, "%s", id);
	nruns++;
	return 0;
}

/* ---- the zygote ---- */

static void send3(const struct zygote *z, const char *a, const char *b, const char *c)
{
	const char *f[3] = { a, b, c };

	ctl_send(z->ctl, f, 3);         /* a gone host: the loop sees EOF */
}

/* The ID as given when it is a decimal u64, else "0". */
static const char *request_id(const char *s)
{
	size_t n = strlen(s), i;

	if (n == 0 || n > 20 || (n == 20 && strcmp(s, "18446744073709551615") > 0))
		return "0";
	for (i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return "0";
	return s;
}

void request_handle(struct zygote *z, char *msg, size_t len, int *fds, int nfds, int cut)
{
	static char *argv[ARGS_MAX + 1];
	char perr[256], num[24];
	const char *id = "0", *why = NULL;
	size_t nf = 0, off = 0;
	int i, err, sv[2], outr, mntns;
	pid_t pid;

	/* Split into fields: the last one must end the message. */
	if (len == 0 || msg[len - 1] != '\0')
		why = "bad message: not a sequence of NUL-terminated strings";
	while (!why && off < len) {
		if (nf == ARGS_MAX) {
			why = "too many arguments";
			break;
		}
		argv[nf++] = msg + off;
		off += strlen(msg + off) + 1;
	}
	if (!why && strcmp(argv[0], ZP_RUN) != 0)
		why = "unknown request (expected run)";
	if (!why && nf < 2)
		why = "bad run request: no ID";
	if (!why)
		id = request_id(argv[1]);
	if (!why && id != argv[1])
		why = "bad run request: the ID is not a decimal number below 2^64";
	if (!why && cut)
		why = "bad run request: the message or its fds were cut short (too long, or more "
		      "than 4 fds)";
	if (!why && nfds != RUN_NFDS)
		why = "bad run request: it must carry exactly 4 fds (stdin, stdout, stderr, report)";
	if (why) {
		send3(z, ZP_ERROR, id, why);
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		return;
	}

	/* Directly (direct.c), when the run allows it. */
	pid = direct_start(z, msg, len, fds, &outr, &mntns);
	if (pid > 0) {
		const char *f[3] = { ZP_PID, id, num };
		int pidfd;

		for (i = 0; i < nfds; i++)
			close(fds[i]);
		if (runs_add(pid, id, -1, 0) != 0) {
			kill(pid, SIGKILL);
			close(outr);
			closer_give(z, mntns);
			send3(z, ZP_ERROR, id, "out of memory");
			return;
		}
		runs[nruns - 1].outr = outr;
		runs[nruns - 1].mntns = mntns;
		/* The direct init is our child, not yet reaped: its pid names it alone. Without a
		 * pidfd (a kernel before 5.3), the host waits for exit as on the other path. */
		pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
		runs[nruns - 1].early = pidfd >= 0;
		snprintf(num, sizeof num, "%d", (int)pid);
		ctl_send_fd(z->ctl, f, 3, pidfd);       /* a gone host: the loop sees EOF */
		return;
	}

	/* The spawner parses the arguments (as the launcher would) and starts the launcher: our
	 * child, its pid the run's. The run's socket: one end to the init, through the spawner and
	 * launcher; ours for the init's requests. */
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
		pid = -1;
	} else {
		pid = spawner_fork(z, msg, len, fds, sv[1]);
		err = errno;
		if (pid < 0 && (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == EPROTO))
			z->broken = 1;  /* the spawner is gone (or broke the protocol): see
					 * request_idle() */
		close(sv[1]);
		if (pid < 0)
			close(sv[0]);
		errno = err;
	}
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	if (pid < 0) {
		snprintf(perr, sizeof perr, "cannot start the run: %s", strerror(errno));
		send3(z, ZP_ERROR, id, perr);
		return;
	}
	/* "run\0" skipped: the ID and ARGS, as the init sends them back */
	if (runs_add(pid, id, sv[0], program_digest(msg + 4, len - 4)) != 0) {
		/* Untracked, the launcher could not be reported: end it now. */
		kill(pid, SIGKILL);
		close(sv[0]);
		send3(z, ZP_ERROR, id, "out of memory");
		return;
	}
	snprintf(num, sizeof num, "%d", (int)pid);
	send3(z, ZP_PID, id, num);
}

/* After the run's exit message (request_reap): the zygote holds each run's mount namespace from the
 * program's fork on (run_request), so that the namespace ends here, not in the launcher's exit. The
 * launcher, the last of the run to exit, would free it, and the kernel waits for an RCU grace
 * period before it frees the unmounted mounts (namespace_unlock): that wait came between the
 * launcher's exit and its parent's SIGCHLD (195 us median on the development VM, 86-110 us with the
 * namespace held). Then the mounts are freed, file by file, by whoever drops the last reference:
 * the closer does (closer.c), not the zygote, whose every other run would wait meanwhile. */
static void run_remove(struct zygote *z, struct run *r)
{
	if (r->sock >= 0)
		close(r->sock);
	closer_give(z, r->mntns);
	if (r->outr >= 0)
		close(r->outr);
	*r = runs[--nruns];
}

static struct run *find(pid_t pid)
{
	size_t i;

	for (i = 0; i < nruns; i++)
		if (runs[i].pid == pid)
			return &runs[i];
	return NULL;
}

int request_reap(struct zygote *z)
{
	char num[16];
	int st;
	pid_t pid;

	while ((pid = waitpid(-1, &st, WNOHANG)) > 0 || (pid < 0 && errno == EINTR)) {
		struct run *r = pid > 0 ? find(pid) : NULL;

		if (pid > 0 && pid == z->spawner_pid) {
			z->broken = 1;
			z->spawner_pid = 0;
		}
		if (pid > 0 && pid == z->closer_pid)
			closer_gone(z);
		if (!r)
			continue;
		if (r->ended)
			st = r->status;
		else if (r->outr >= 0)
			direct_outcome(r->outr, &st);  /* none: the direct init's own status */
		snprintf(num, sizeof num, "%d", st);
		send3(z, ZP_EXIT, r->id, num);
		run_remove(z, r);
	}
	return pid < 0 && errno == ECHILD ? -1 : 0;
}

int request_idle(void)
{
	return nruns == 0;
}

size_t request_poll(const struct zygote *z, struct pollfd **pf, size_t *cap, size_t base)
{
	size_t i, n = base;

	if (base + 2 * nruns + 1 > *cap) {
		size_t c = 2 * (base + 2 * nruns + 1);
		struct pollfd *p = realloc(*pf, c * sizeof *p);

		if (!p)
			return base;    /* watched again once memory is found */
		*pf = p;
		*cap = c;
	}
	for (i = 0; i < nruns; i++) {
		int fd[2] = { runs[i].sock, runs[i].early && !runs[i].ended ? runs[i].outr : -1 }, k;

		for (k = 0; k < 2; k++) {
			if (fd[k] < 0)
				continue;
			(*pf)[n].fd = fd[k];
			(*pf)[n].events = POLLIN;
			(*pf)[n].revents = 0;
			n++;
		}
	}
	if (closer_waiting(z)) {        /* the closer's socket was full: the rest when it takes
					 * more */
		(*pf)[n].fd = z->closer;
		(*pf)[n].events = POLLOUT;
		(*pf)[n].revents = 0;
		n++;
	}
	return n;
}

/* A direct run's outcome pipe is readable: corral-init wrote the program's outcome as its last act
 * before its exit. `ended` now; the direct init's exit (which the host waits for on its pidfd) and
 * reaping come next, and `exit` with them. EOF: the direct init ended without an outcome, and its
 * reaping reports its own status. */
static void run_outcome(struct zygote *z, struct run *r)
{
	char num[16];

	if (!direct_outcome(r->outr, &r->status)) {
		close(r->outr);
		r->outr = -1;
		return;
	}
	r->ended = 1;
	snprintf(num, sizeof num, "%d", r->status);
	send3(z, ZP_ENDED, r->id, num);
}

/* The init asks for its program: fork the program (program.c). It asks once: then the socket is
 * closed. */
static void run_request(struct zygote *z, struct run *r, char *buf)
{
	int fds[16], nfds, cut, i;
	ssize_t n = ctl_recv(r->sock, buf, MSG_MAX, fds, 16, &nfds, &cut);
	pid_t pid = -1;

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n > 0) {            /* cut short: refused (EPROTO), not dropped */
		pid = program_fork(z, r->sock, buf, cut ? 0 : (size_t)n, fds, nfds, r->digest,
				   &r->mntns);
	}
	for (i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	/* The program is forked from this memory: nothing of this run's request may stay in it */
	if (n > 0)
		memset(buf, 0, (size_t)n);
	(void)pid;
	close(r->sock);         /* answered (or the init is gone): nothing more from it */
	r->sock = -1;
}

void request_polled(struct zygote *z, const struct pollfd *pf, size_t base, size_t n)
{
	static char *buf;
	size_t i, j;

	if (!buf && !(buf = malloc(MSG_MAX)))
		return;
	for (i = base; i < n; i++) {
		if (!pf[i].revents)
			continue;
		if (pf[i].fd == z->closer) {
			closer_flush(z);
			continue;
		}
		for (j = 0; j < nruns; j++) {
			if (runs[j].sock == pf[i].fd) {
				run_request(z, &runs[j], buf);
				break;
			}
			if (runs[j].outr == pf[i].fd && runs[j].early && !runs[j].ended) {
				run_outcome(z, &runs[j]);
				break;
			}
		}
	}
}

void request_stop_all(struct zygote *z)
{
	long long deadline = now_ms() + STOP_MS;
	size_t i;
	int st;
	pid_t pid;

	for (i = 0; i < nruns; i++)
		kill(runs[i].pid, SIGTERM);     /* the launcher ends its run as a launcher does */
	while (nruns > 0) {
		pid = waitpid(-1, &st, WNOHANG);
		if (pid > 0) {
			struct run *r = find(pid);

			if (r)
				run_remove(z, r);
			continue;
		}
		if (pid < 0 && errno != EINTR)
			break;
		if (now_ms() >= deadline) {
			for (i = 0; i < nruns; i++) {
				kill(-runs[i].pid, SIGKILL);
				kill(runs[i].pid, SIGKILL);
			}
			deadline = now_ms() + STOP_MS;
		}
		usleep(1000);
	}
}
