/* relay.c: corral-launch --relay --status-fd N -- PROGRAM [ARGS...]
 *
 * For a wrapper that turns its program's death by a signal into an exit status 128+N, as
 * bubblewrap does (so that a program's SIGSEGV and its exit(139) look the same to whoever waits
 * for the wrapper): run inside the wrapper, the relay starts PROGRAM as its child and waits for
 * it, then writes PROGRAM's wait status (one int) on fd N, the write end of a pipe the launcher
 * gave the wrapper (--status-fd, child.c), whose read end the supervisor keeps (reap.c), and exits
 * as PROGRAM did (128+N for signal N). The supervisor, outside the wrapper, then reports the
 * signal: where it is, nothing stands between it and the wrapper's namespaces.
 *
 * Fd N is close-on-exec here, so PROGRAM never holds it and cannot write a status of its own.
 * The relay is not dumpable (main.c), so PROGRAM, of the same uid, cannot take it either. Every
 * catchable signal is blocked in the relay (not in PROGRAM), so that the program's kill(0, ...)
 * to its process group does not end the relay before it has written: only SIGKILL does.
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int relay_run(const struct plan *p)
{
	sigset_t all, old;
	pid_t pid;
	int st;
	ssize_t n;

	if (fcntl(p->status_fd, F_SETFD, FD_CLOEXEC) != 0) {
		dprintf(STDERR_FILENO, "corral-launch: --relay: --status-fd %d: %s\n", p->status_fd,
			strerror(errno));
		return EXIT_SETUP;
	}
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	pid = fork();
	if (pid < 0) {
		dprintf(STDERR_FILENO, "corral-launch: --relay: cannot fork: %s\n", strerror(errno));
		return EXIT_SETUP;
	}
	if (pid == 0) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		execve(p->program, p->args, environ);
		dprintf(STDERR_FILENO, "corral-launch: --relay: cannot execute %s: %s\n", p->program,
			strerror(errno));
		_exit(errno == ENOENT ? EXIT_NOENT : EXIT_EXEC);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return EXIT_SETUP;
	/* one write of a few bytes to a pipe is atomic */
	do
		n = write(p->status_fd, &st, sizeof st);
	while (n < 0 && errno == EINTR);
	close(p->status_fd);
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}
