/* relay.c: corral-launch --relay -- PROGRAM [ARGS...]
 *
 * For a wrapper that turns its program's death by a signal into an exit status 128+N, as
 * bubblewrap's monitor does (so that a program's SIGSEGV and its exit(139) look the same to
 * whoever waits for the wrapper): run inside the wrapper, the relay starts PROGRAM as its child
 * and waits for it. An exit is passed on as the relay's own exit status. A death by signal N is
 * passed on as that signal to the relay's parent, the wrapper, which then dies of it itself
 * (a fatal signal pending on a process ends it before it runs any more of its own code), so the
 * wrapper's waiter sees the signal; then the relay exits 128+N, as the wrapper would have.
 * Every catchable signal is blocked in the relay (not in PROGRAM), so that the program's
 * kill(0, ...) to its process group does not end the relay first.
 */
#include "launch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int relay_run(const struct plan *p)
{
	sigset_t all, old;
	pid_t pid, parent = getppid();
	int st;

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
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (parent > 1 && getppid() == parent)
		kill(parent, WTERMSIG(st));
	return 128 + WTERMSIG(st);
}
