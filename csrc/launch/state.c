/* state.c: a run's state, new.
 *
 * Every struct launch is made here: corral-launch's, the launcher's of corral-zygote's spawner,
 * corral-init's, each program's that corral-zygote forks (from memory that earlier runs' direct
 * inits wrote in), and the short-lived ones of the zygote's start-up, of its filters and of
 * --hold-net. What a file keeps for a run is its part of struct launch (launch.h), so this one
 * function makes all of it new. A file of its own: every file that makes a struct launch uses it,
 * and it uses none.
 */
#include "launch.h"

#include <string.h>

void launch_init(struct launch *L)
{
	size_t i;

	memset(L, 0, sizeof *L);
	L->sigfd = -1;
	L->report.fd = -1;
	L->bud.cg_parent = L->bud.cg_dir = L->bud.cg_procs = L->bud.cg_cpu = -1;
	L->bud.cg_events = L->bud.cg_peak = L->bud.cg_kill = -1;
	for (i = 0; i < HELD_MOUNTS; i++)
		L->held.fd[i] = -1;
	L->held.diag = -1;
	L->child.prepared.ll.fd = -1;
	L->child.status_wfd = -1;
	L->ws.in_fd = L->ws.collect_fd = -1;
	L->ws.wait_rfd = L->ws.wait_wfd = -1;
}
