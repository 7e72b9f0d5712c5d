/* exec.c: what execve() would have done to the program, which runs the program without one.
 *
 * The launcher's program becomes python3 by execve(); the zygote's program stays the process it was
 * forked as. So that the program finds itself in the same process state, the program does here what
 * execve does to a process that runs a plain (not set-id, no file capabilities) binary:
 *   - capabilities: a process that is not root (in its user namespace) keeps only its ambient set
 *     (as permitted and effective). Without root, the zygote's runs are in a user namespace of
 *     their own, where the program held every capability: it must not take them into the program;
 *   - /proc/self/cmdline and /proc/self/environ: the run's argv and --env block, in a fresh
 *     anonymous mapping, through PR_SET_MM_MAP (no privilege needed; the zygote read its own
 *     memory layout at start-up). ps and the host's scans then see python3 and the code's path;
 *   - the name (comm): the program's basename;
 *   - dumpable again (execve of a readable binary by the same uid): /proc/self is the run's
 *     uid's, not root's.
 * /proc/self/exe and /proc/self/maps still show corral-zygote and libpython3.11 (changing exe
 * needs CAP_SYS_ADMIN).
 */
#include "zygote.h"

#include <errno.h>
#include <linux/capability.h>
#include <linux/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_IS_SET 1
#endif

/* The zygote's memory layout (/proc/self/stat), which the program shares. */
static struct {
	int known;
	unsigned long start_code, end_code, start_stack, start_data, end_data, start_brk;
} layout;

void exec_prepare(void)
{
	unsigned long f[53];
	char buf[2048], *p, *tok;
	FILE *s = fopen("/proc/self/stat", "re");
	int field = 3;

	if (!s)
		return;
	p = fgets(buf, sizeof buf, s) ? strrchr(buf, ')') : NULL;
	fclose(s);
	if (!p || p[1] != ' ')
		return;
	memset(f, 0, sizeof f);
	for (tok = strtok(p + 2, " "); tok && field < 53; tok = strtok(NULL, " "))
		f[field++] = strtoul(tok, NULL, 10);
	if (field < 48)
		return;         /* before Linux 3.5 */
	layout.start_code = f[26];
	layout.end_code = f[27];
	layout.start_stack = f[28];
	layout.start_data = f[45];
	layout.end_data = f[46];
	layout.start_brk = f[47];
	layout.known = 1;
}

/* Not root: permitted and effective become the ambient set, as execve() makes them. */
static int step_capabilities(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	unsigned possible[2];
	int cap;

	if (getuid() == 0 || geteuid() == 0)
		return 0;       /* root keeps its set through execve */
	if (syscall(SYS_capget, &h, d) != 0)
		return -1;
	/* An ambient capability is always permitted and inheritable too: ask about those only
	 * (none, as a rule: entering a user namespace empties the inheritable set, and a change to
	 * a uid other than 0 the permitted one). */
	possible[0] = d[0].permitted & d[0].inheritable;
	possible[1] = d[1].permitted & d[1].inheritable;
	if (d[0].permitted == 0 && d[1].permitted == 0)
		return 0;       /* nothing permitted, so nothing effective */
	d[0].permitted = d[1].permitted = 0;
	for (cap = 0; cap < 64; cap++)
		if ((possible[cap / 32] & (1U << (cap % 32))) &&
		    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1)
			d[cap / 32].permitted |= 1U << (cap % 32);
	d[0].effective = d[0].permitted;
	d[1].effective = d[1].permitted;
	return syscall(SYS_capset, &h, d) == 0 ? 0 : -1;
}

/* The strings of v, each NUL-terminated, at dst; returns the end. */
static char *put_strings(char *dst, char *const *v, size_t n)
{
	size_t i, l;

	for (i = 0; i < n; i++) {
		l = strlen(v[i]) + 1;
		memcpy(dst, v[i], l);
		dst += l;
	}
	return dst;
}

/* /proc/self/cmdline and environ: the run's. Best effort (PR_SET_MM_MAP needs
 * CONFIG_CHECKPOINT_RESTORE). */
static void step_cmdline(const struct plan *p)
{
	struct prctl_mm_map m;
	size_t i, len = 0;
	char *area, *env;

	if (!layout.known)
		return;
	for (i = 0; i < p->nargs; i++)
		len += strlen(p->args[i]) + 1;
	for (i = 0; i < p->nenv; i++)
		len += strlen(p->env[i]) + 1;
	/* anonymous: /proc reads these areas only from anonymous memory */
	area = mmap(NULL, len + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (area == MAP_FAILED)
		return;
	env = put_strings(area, p->args, p->nargs);
	memset(&m, 0, sizeof m);
	m.start_code = layout.start_code;
	m.end_code = layout.end_code;
	m.start_stack = layout.start_stack;
	m.start_data = layout.start_data;
	m.end_data = layout.end_data;
	m.start_brk = layout.start_brk;
	m.brk = (unsigned long)syscall(SYS_brk, 0);
	m.arg_start = (unsigned long)area;
	m.arg_end = (unsigned long)env;
	m.env_start = (unsigned long)env;
	m.env_end = (unsigned long)put_strings(env, p->env, p->nenv);
	m.exe_fd = (__u32)-1;
	if (prctl(PR_SET_MM, PR_SET_MM_MAP, &m, sizeof m, 0) != 0)
		munmap(area, len + 1);
}

static void step_name(const char *program)
{
	const char *base = strrchr(program, '/');

	prctl(PR_SET_NAME, base ? base + 1 : program, 0, 0, 0);
}

int exec_like(const struct plan *p)
{
	if (step_capabilities() != 0)
		return -1;
	step_cmdline(p);
	step_name(p->program);
	return 0;
}

void exec_dumpable(void)
{
	prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
}

/* The kernel drops the rseq registration of a CLONE_VM child (the joiner, or a direct run's direct
 * init), and the program inherits it: glibc, which registered it in the zygote, would read a stale
 * CPU number forever (sched_getcpu). Again. */
void exec_rseq_again(void)
{
#ifdef RSEQ_SIG
	if (__rseq_size > 0) {
		struct rseq *r = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);

		r->cpu_id = RSEQ_CPU_ID_UNINITIALIZED;
		syscall(SYS_rseq, r, __rseq_size < 32 ? 32U : __rseq_size, 0, RSEQ_SIG);
	}
#endif
}
