/* seccomp.c: the program's seccomp filter (--seccomp, --deny-syscall, --deny-sockets).
 *
 * The filter is built with libseccomp by A, once, before any fork (seccomp_prepare): libseccomp
 * allocates, which C must not do between fork and execve. A exports the BPF program into a static
 * buffer that B and C inherit with their memory; C loads it with the seccomp() system call as its
 * very last step before execve (seccomp_apply), so nothing the launcher does is filtered, and that
 * step is async-signal-safe like the rest of child.c.
 *
 * The filter (native architecture only):
 *   default                       allow
 *   each --deny-syscall NAME      EPERM (names this architecture does not have are reported)
 *   with unshare or setns denied  clone() with any CLONE_NEW* flag: EPERM; clone3(): ENOSYS, so
 *                                 glibc falls back to clone() (clone3's flags are in memory, which
 *                                 a filter cannot read)
 *   --deny-sockets                socket() and socketpair() of any family but AF_UNIX: EPERM
 *   another ABI (i386, x32)       the process is killed (SIGSYS): its numbers are not checked
 */
#include "launch.h"

#include <errno.h>
#include <linux/filter.h>
#include <sched.h>
#include <seccomp.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif

/* What A prepared for C; inherited through fork. */
static struct {
	int ready;                              /* 1: seccomp_prepare() ran for a filter */
	int sockets;                            /* the filter refuses socket() but AF_UNIX */
	int err;                                /* 0, or why the filter could not be built */
	unsigned denied;                        /* distinct --deny-syscall names in the filter */
	unsigned short len;                     /* instructions in insns */
	struct sock_filter insns[BPF_MAXINSNS]; /* the kernel's limit for one filter */
	struct line unknown;                    /* "refused seccomp-unknown ...", len 0: none */
	int unknown_cut;                        /* 1: names were left off, " ..." added */
} filt;

/* The namespace flags clone() takes. CLONE_NEWTIME (0x80) is left out: in clone()'s flags that
 * bit is part of the exit signal; only clone3() and unshare() can ask for a time namespace. */
static const unsigned long clone_new[] = {
	CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
	CLONE_NEWNET,
};

static int has_nr(const int *nrs, unsigned n, int nr)
{
	unsigned i;

	for (i = 0; i < n; i++)
		if (nrs[i] == nr)
			return 1;
	return 0;
}

/* "refused seccomp-unknown ENOSYS a b ...": as many names as fit in a report line, then "...". */
static void add_unknown(const char *name)
{
	struct line *l = &filt.unknown;
	size_t room = sizeof l->buf - 1 - 4;    /* line_send's '\n', and " ..." */

	if (filt.unknown_cut)
		return;
	if (l->len == 0)
		line_start(l, "refused seccomp-unknown ENOSYS");
	if (l->len + 1 + strlen(name) > room) {
		line_add(l, " ...");
		filt.unknown_cut = 1;
		return;
	}
	line_add(l, " ");
	line_add(l, name);
}

/* Adds the rules for names, deny_sockets to ctx. Returns 0 or a negative errno (libseccomp's). */
static int add_rules(scmp_filter_ctx ctx, const char *const *names, size_t n, int deny_sockets)
{
	int nrs[PLAN_SYSCALLS_MAX];
	unsigned count = 0;
	size_t i;
	int rc;

	for (i = 0; i < n && i < PLAN_SYSCALLS_MAX; i++) {
		/* Negative: unknown, or a pseudo-number for a call of another architecture. */
		int nr = seccomp_syscall_resolve_name(names[i]);

		if (nr < 0) {
			add_unknown(names[i]);
			continue;
		}
		if (has_nr(nrs, count, nr))
			continue;
		rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
		if (rc < 0)
			return rc;
		nrs[count++] = nr;
	}
	filt.denied = count;

	if (has_nr(nrs, count, SCMP_SYS(unshare)) || has_nr(nrs, count, SCMP_SYS(setns))) {
		/* One rule per flag: several rules on one call are OR-ed, and a masked compare can
		 * only test (arg & mask) == value. */
		if (!has_nr(nrs, count, SCMP_SYS(clone)))
			for (i = 0; i < sizeof clone_new / sizeof clone_new[0]; i++) {
				rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
						      SCMP_A0_64(SCMP_CMP_MASKED_EQ, clone_new[i],
								 clone_new[i]));
				if (rc < 0)
					return rc;
			}
		if (!has_nr(nrs, count, SCMP_SYS(clone3))) {
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
			if (rc < 0)
				return rc;
		}
	}

	if (deny_sockets) {
		/* The family is an int; libseccomp compares all 64 bits of the register, so a value
		 * with high bits set is refused too (fails closed). */
		if (!has_nr(nrs, count, SCMP_SYS(socket))) {
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1,
					      SCMP_A0_64(SCMP_CMP_NE, AF_UNIX));
			if (rc < 0)
				return rc;
		}
		/* Only AF_UNIX (and TIPC) implement socketpair; keep it to AF_UNIX. */
		if (!has_nr(nrs, count, SCMP_SYS(socketpair))) {
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socketpair), 1,
					      SCMP_A0_64(SCMP_CMP_NE, AF_UNIX));
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

/* The BPF program of ctx into filt.insns, through a memfd (libseccomp 2.5 exports to an fd).
 * Returns 0 or an errno. */
static int export_bpf(scmp_filter_ctx ctx)
{
	int fd = memfd_create("corral-seccomp", MFD_CLOEXEC);
	size_t got = 0;
	int rc, err = 0;

	if (fd < 0)
		return errno;
	rc = seccomp_export_bpf(ctx, fd);
	if (rc < 0) {
		err = -rc;
	} else {
		for (;;) {
			ssize_t r = pread(fd, (char *)filt.insns + got, sizeof filt.insns - got,
					  (off_t)got);

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				err = errno;
				break;
			}
			if (r == 0)
				break;
			got += (size_t)r;
			if (got == sizeof filt.insns) {
				char c;

				if (pread(fd, &c, 1, (off_t)got) == 1)
					err = E2BIG;    /* longer than the kernel takes */
				break;
			}
		}
		if (!err && (got == 0 || got % sizeof filt.insns[0]))
			err = EINVAL;
	}
	close(fd);
	filt.len = err ? 0 : (unsigned short)(got / sizeof filt.insns[0]);
	return err;
}

/* Builds the filter for these rules into filt. Returns 0 or an errno. */
static int build(const char *const *names, size_t n, int deny_sockets)
{
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	int rc;

	if (!ctx)
		return ENOMEM;
	/* A call of another ABI (int 0x80: i386; x32) has other numbers: kill the whole process.
	 * KILL_PROCESS needs Linux 4.14; before, only the thread. libseccomp's native-only filter
	 * also sends x86_64 calls with the x32 bit to this action. */
	rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
	if (rc < 0)
		rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL);
	if (rc == 0)
		rc = add_rules(ctx, names, n, deny_sockets);
	rc = rc < 0 ? -rc : export_bpf(ctx);
	seccomp_release(ctx);
	return rc;
}

/* The seccomp() system call, or prctl() before Linux 3.17. C must already have no_new_privs (or
 * CAP_SYS_ADMIN). Returns 0 or an errno. */
static int load(void)
{
	struct sock_fprog prog = { filt.len, filt.insns };

	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0U, &prog) == 0)
		return 0;
	if (errno == ENOSYS && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0)
		return 0;
	return errno;
}

void seccomp_prepare(const struct launch *L)
{
	const struct plan *p = L->plan;

	if (p->seccomp == PLAN_MECH_OFF)
		return;
	/* --deny-sockets-without-netns: only when the namespaces step made no network namespace */
	filt.sockets = p->deny_sockets == 1 || (p->deny_sockets == 2 && !L->netns);
	filt.err = build(p->deny_syscall, p->ndeny_syscall, filt.sockets);
	filt.ready = 1;
}

size_t seccomp_state_size(void)
{
	return sizeof filt;
}

void seccomp_state_save(void *buf)
{
	memcpy(buf, &filt, sizeof filt);
}

void seccomp_state_load(const void *buf)
{
	memcpy(&filt, buf, sizeof filt);
}

int seccomp_apply(const struct plan *p)
{
	int err;

	if (p->seccomp == PLAN_MECH_OFF)
		return 0;
	if (filt.unknown.len)
		line_send(&filt.unknown, report_get_fd());
	err = filt.ready ? filt.err : EINVAL;
	if (!err)
		err = load();
	if (!err) {
		/* Filtered from here: the lines and execve are system calls of the program's. */
		report_applied_num("seccomp", filt.denied);
		if (filt.sockets)
			report_applied("deny-sockets");
		return 0;
	}
	if (p->seccomp == PLAN_MECH_REQUIRE) {
		errno = err;
		return -1;
	}
	report_refused("seccomp", err, explain(W_SECCOMP, err));
	if (filt.sockets)
		report_refused("deny-sockets", err, "there is no seccomp filter: the program may "
			       "make sockets of every family");
	return 0;
}

/* In a forked child: build and load a filter that denies personality(), then check that it
 * answers. */
int seccomp_probe(void)
{
	static const char *const names[] = { "personality" };
	int err;

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return errno;
	err = build(names, 1, 1);
	if (!err)
		err = load();
	if (!err && (syscall(SYS_personality, 0xffffffffUL) != -1 || errno != EPERM))
		err = EINVAL;
	return err;
}
