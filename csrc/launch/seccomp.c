/* seccomp.c: the program's seccomp filter (--seccomp, --deny-syscall, --deny-sockets,
 * --unix-pairs-only).
 *
 * The filter is built with libseccomp by the launcher, once, before any fork (seccomp_prepare):
 * libseccomp allocates, which the program must not do between fork and execve. The launcher exports
 * the BPF program into a static buffer that the init and program inherit with their memory; the
 * program loads it with the seccomp() system call as its very last step before execve
 * (seccomp_apply), so nothing the launcher does is filtered, and that step is async-signal-safe
 * like the rest of child.c. Or the init loads it on itself before it starts the program
 * (seccomp_load_early), when the filter denies nothing the init and program still call: the program
 * inherits it.
 *
 * The filter (native architecture only):
 *   default                       allow
 *   each --deny-syscall NAME      EPERM (names this architecture does not have are reported)
 *   with unshare or setns denied  clone() with any CLONE_NEW* flag: EPERM; clone3(): ENOSYS, so
 *                                 glibc falls back to clone() (clone3's flags are in memory, which
 *                                 a filter cannot read)
 *   --deny-sockets                socket() and socketpair() of any family but AF_UNIX, bind():
 *                                 EPERM
 *   --unix-pairs-only             socket(AF_UNIX), socketpair(AF_UNIX) of any type but stream
 *                                 and seqpacket: EPERM
 *   either of the two             io_uring_setup(): EPERM (its SOCKET and BIND operations are
 *                                 not system calls the filter sees)
 *   --deny-pipe-growth            fcntl(F_SETPIPE_SZ) above 64 KiB (a pipe's default): EPERM
 *   always                        kill(), tkill(), tgkill(), rt_sigqueueinfo(),
 *                                 rt_tgsigqueueinfo() and pidfd_open() of pid 1; clone() whose
 *                                 exit signal is SIGKILL or SIGSTOP; fcntl(F_SETSIG) of either:
 *                                 EPERM (the supervising init, below)
 *   another ABI (i386, x32)       the process is killed (SIGSYS): its numbers are not checked
 *
 * --seccomp-cache DIR: libseccomp builds the same program for the same plan every run (about
 * 0.3 ms: it probes the kernel's seccomp API with a dozen system calls first). With a cache, the launcher
 * keeps the program in DIR/seccomp-HASH (HASH of the deny list and the socket rule) and on the next
 * run with the same key reads it back and skips libseccomp. The key is every input of the build:
 * the deny list in order, whether sockets are refused, the architecture, the kernel (libseccomp
 * adapts the program to its API level), libseccomp's version and this launcher's own file (a
 * rebuild changes it). The file holds the whole key, which must match byte for byte (the HASH only
 * names the file), the instructions, the count of names denied and the line of unknown names,
 * behind a magic number, exact lengths and a checksum: a file that is short, long, corrupt or for
 * another key is ignored and the filter built again (and the file replaced, atomically: written
 * under a temporary name, then renamed). A cached program never replaces a filter: when in doubt,
 * build.
 *
 * Who may write DIR: it must be owned by the launcher's euid with no group or other write, or
 * it is not used. The host passes its private lock directory (lua/corral/host.lua: 0700, under
 * /run/corral or /tmp). The sandboxed programs do not reach it: as root they run as another uid;
 * otherwise Landlock lets a program write only its work dir, its private tmpfs mounts and the
 * policy's fs_write, and the run's own tmpfs on /tmp and /run hide the directory from it. A
 * policy that turns Landlock and the mount namespace off trusts its programs with every file of
 * the controller's uid, this cache and the interpreter roots beside it included.
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif

/* What the launcher prepared for the program; inherited through fork. */
static struct {
	int ready;                              /* 1: seccomp_prepare() ran for a filter */
	int sockets;                            /* the filter refuses socket() but AF_UNIX */
	int unix_pairs;                         /* and unix sockets but connected pairs */
	int pipes;                              /* ... and pipes larger than their default */
	int err;                                /* 0, or why the filter could not be built */
	unsigned denied;                        /* distinct --deny-syscall names in the filter */
	unsigned short len;                     /* instructions in insns */
	struct sock_filter insns[BPF_MAXINSNS]; /* the kernel's limit for one filter */
	struct line unknown;                    /* "refused seccomp-unknown ...", len 0: none */
	int unknown_cut;                        /* 1: names were left off, " ..." added */
	int loaded;                             /* 1: the init loaded it (seccomp_load_early) */
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

/* The socket rules: sockets (--deny-sockets) and unix_pairs (--unix-pairs-only) for ctx, each
 * call left alone when the deny list (nrs) already refuses it. Returns 0 or a negative errno.
 *
 * The family and the type are ints: the kernel drops a register's high 32 bits. So a rule that
 * refuses one value compares the low 32 bits alone (MASKED_EQ: 0x100000001 is AF_UNIX to the
 * kernel), and a rule that refuses all values but one compares all 64 (NE: a value with high
 * bits set is refused, failing closed).
 *
 * What --unix-pairs-only leaves the program, checked against net/unix/af_unix.c: sockets of a
 * connected stream or seqpacket pair. Their connect() fails (EISCONN: the state is checked after
 * the lookup, and only the lookup happens), a stream's sendto()/sendmsg() with an address too
 * (EISCONN), a seqpacket's drops the address and goes to the peer (unix_seqpacket_sendmsg), and
 * listen() needs an unconnected socket (EINVAL): such a socket reaches its peer alone. A datagram
 * pair is refused: a datagram socket may sendto() or connect() any name. A connected pair may
 * still be named: bind() (refused with --deny-sockets, in a namespace other runs share), and
 * autobind (an abstract name of 5 hex digits the kernel picks, when SO_PASSCRED is set), which
 * no other socket of a run can address. */
/* socketpair() types refused with --unix-pairs-only: (type & mask) == value */
static const struct {
	unsigned long long mask, value;
} pair_refused[] = {
	{ 0x2, 0x2 },   /* DGRAM 2, RAW 3 (a datagram socket to the kernel), 6, 7, 10, 11, 14, 15 */
	{ 0x8, 0x8 },   /* 8, 9, 12, 13 */
	{ 0xb, 0x0 },   /* 0, RDM 4 */
};

/* setsockopt(SOL_SOCKET, ...) options refused with --deny-sockets: they make the kernel name
 * a socket (SO_PASSPIDFD is 76 where the headers are older than the kernel) */
static const int passcred[] = { SO_PASSCRED, 76 };

static int add_socket_rules(scmp_filter_ctx ctx, const int *nrs, unsigned count, int sockets,
			    int unix_pairs)
{
	unsigned t;
	int rc = 0;

	if (!has_nr(nrs, count, SCMP_SYS(socket))) {
		if (sockets && unix_pairs)
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 0);
		else if (sockets)
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1,
					      SCMP_A0_64(SCMP_CMP_NE, AF_UNIX));
		else
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1,
					      SCMP_A0_64(SCMP_CMP_MASKED_EQ, 0xffffffffULL, AF_UNIX));
		if (rc < 0)
			return rc;
	}
	if (!has_nr(nrs, count, SCMP_SYS(socketpair))) {
		/* Only AF_UNIX (and TIPC) implement socketpair; keep it to AF_UNIX. */
		if (sockets) {
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socketpair), 1,
					      SCMP_A0_64(SCMP_CMP_NE, AF_UNIX));
			if (rc < 0)
				return rc;
		}
		/* Every type but the two, in the low 4 bits the kernel reads it from
		 * (SOCK_TYPE_MASK; SOCK_CLOEXEC and SOCK_NONBLOCK are above), so that a type a
		 * later kernel adds is refused too. STREAM (0001) and SEQPACKET (0101) alone have
		 * neither bit 1 nor bit 3 set and bit 0 set: three masked compares cover the other
		 * fourteen. Two comparisons in one rule are AND-ed. */
		for (t = 0; unix_pairs && t < sizeof pair_refused / sizeof pair_refused[0]; t++) {
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socketpair), 2,
					      SCMP_A0_64(SCMP_CMP_MASKED_EQ, 0xffffffffULL, AF_UNIX),
					      SCMP_A1_64(SCMP_CMP_MASKED_EQ, pair_refused[t].mask,
							 pair_refused[t].value));
			if (rc < 0)
				return rc;
		}
	}
	/* With --deny-sockets the program's sockets are unix ones alone: no name for them, in a
	 * namespace where other runs would see it in /proc/net/unix or need it. Neither one it
	 * binds, nor one the kernel gives a socket that passes credentials (unix_may_passcred:
	 * SO_PASSCRED or SO_PASSPIDFD) at its first send or connect, the autobind. */
	if (sockets && !has_nr(nrs, count, SCMP_SYS(bind))) {
		rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(bind), 0);
		if (rc < 0)
			return rc;
	}
	for (t = 0; sockets && !has_nr(nrs, count, SCMP_SYS(setsockopt)) &&
		    t < sizeof passcred / sizeof passcred[0]; t++) {
		rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setsockopt), 2,
				      SCMP_A1_64(SCMP_CMP_MASKED_EQ, 0xffffffffULL, SOL_SOCKET),
				      SCMP_A2_64(SCMP_CMP_MASKED_EQ, 0xffffffffULL, passcred[t]));
		if (rc < 0)
			return rc;
	}
	if (!has_nr(nrs, count, SCMP_SYS(io_uring_setup)))
		rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(io_uring_setup), 0);
	return rc;
}

/* The pipe pages of every pipe a uid holds count against one limit of the whole uid
 * (fs.pipe-user-pages-soft, per user_struct, not per user namespace): over it, every new pipe of
 * that uid, another run's or the controller's, gets 2 pages instead of 16. A pipe is made with
 * 16 pages (64 KiB); only F_SETPIPE_SZ grows it, to fs.pipe-max-size (1 MiB: 16 times more).
 * Refused above the default, a run holds at most 16 pages per pipe it keeps open, which its
 * open-files and processes limits bound. The kernel reads cmd and the size as 32-bit ints: the
 * rule compares the low 32 bits, so high bits set change nothing. */
#define PIPE_DEFAULT_BYTES 65536

static int add_pipe_rule(scmp_filter_ctx ctx)
{
	return seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(fcntl), 2,
				SCMP_A1_32(SCMP_CMP_EQ, F_SETPIPE_SZ),
				SCMP_A2_32(SCMP_CMP_GT, PIPE_DEFAULT_BYTES));
}

/* Pid 1 of the run's PID namespace is its supervising init. Linux drops a signal to a namespace's
 * init from inside it unless the init has a handler for it, SIGKILL and SIGSTOP included; gVisor
 * delivers them: the program's kill(1, SIGKILL) killed the init (and the run with it), its
 * SIGSTOP left the run without its budgets until the timeout. The init blocks every signal it
 * can (init_block_signals); these rules refuse the two it cannot, by every call that names pid 1
 * (kill(-1) never reaches an init), or that makes the kernel send one to whoever: the exit signal
 * of a child that the init may adopt, a file's I/O signal (whose owner may be the init). Without
 * a PID namespace pid 1 is the host's or the container's init, which no run has reason to signal
 * either. pid and signal are ints: the low 32 bits are compared. */
static const int pid1_calls[] = {
	SCMP_SYS(kill), SCMP_SYS(tkill), SCMP_SYS(tgkill), SCMP_SYS(rt_sigqueueinfo),
	SCMP_SYS(rt_tgsigqueueinfo), SCMP_SYS(pidfd_open),
};
static const int unstoppable[] = { SIGKILL, SIGSTOP };

static int add_init_rules(scmp_filter_ctx ctx, const int *nrs, unsigned count)
{
	unsigned i;
	int rc = 0;

	for (i = 0; rc == 0 && i < sizeof pid1_calls / sizeof pid1_calls[0]; i++)
		if (!has_nr(nrs, count, pid1_calls[i]))
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), pid1_calls[i], 1,
					      SCMP_A0_32(SCMP_CMP_EQ, 1));
	for (i = 0; rc == 0 && i < sizeof unstoppable / sizeof unstoppable[0]; i++) {
		if (!has_nr(nrs, count, SCMP_SYS(clone)))
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
					      SCMP_A0_64(SCMP_CMP_MASKED_EQ, 0xff, unstoppable[i]));
		if (rc == 0 && !has_nr(nrs, count, SCMP_SYS(fcntl)))
			rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(fcntl), 2,
					      SCMP_A1_32(SCMP_CMP_EQ, F_SETSIG),
					      SCMP_A2_32(SCMP_CMP_EQ, unstoppable[i]));
	}
	return rc;
}

/* Adds the rules for names, sockets, unix_pairs and pipes, and the init's, to ctx. Returns 0 or
 * a negative errno (libseccomp's). */
static int add_rules(scmp_filter_ctx ctx, const char *const *names, size_t n, int sockets,
		     int unix_pairs, int pipes)
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

	if (sockets || unix_pairs) {
		rc = add_socket_rules(ctx, nrs, count, sockets, unix_pairs);
		if (rc < 0)
			return rc;
	}
	if (pipes && !has_nr(nrs, count, SCMP_SYS(fcntl))) {
		rc = add_pipe_rule(ctx);
		if (rc < 0)
			return rc;
	}
	return add_init_rules(ctx, nrs, count);
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
static int build(const char *const *names, size_t n, int sockets, int unix_pairs, int pipes)
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
	/* a binary tree of the system call numbers instead of a list: the kernel emulates the
	 * program for every number when it loads it (its action cache), and runs it for the calls
	 * the cache cannot answer; the tree takes a few comparisons where the list takes one per
	 * rule. libseccomp 2.5+; without it, the list. */
	if (rc == 0)
		seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
	if (rc == 0)
		rc = add_rules(ctx, names, n, sockets, unix_pairs, pipes);
	rc = rc < 0 ? -rc : export_bpf(ctx);
	seccomp_release(ctx);
	return rc;
}

/* ---- the cache (--seccomp-cache) ---- */

#define CACHE_MAGIC "CORRALSC"
#define CACHE_VERSION 2U
#define KEY_MAX (PLAN_SYSCALLS_MAX * 66 + 1024)

/* The file: this header, then key_len bytes of key, unknown_len bytes of the unknown line,
 * insns instructions. sum: FNV-1a over everything after it. */
struct cache_head {
	char magic[8];
	uint32_t version;
	uint32_t key_len;
	uint32_t unknown_len;
	uint32_t unknown_cut;
	uint32_t denied;
	uint32_t insns;
	uint64_t sum;
};

#define CACHE_FILE_MAX (sizeof(struct cache_head) + KEY_MAX + REPORT_LINE_MAX + \
			sizeof filt.insns)

static struct {
	char key[KEY_MAX];
	size_t key_len;
	char name[40];                  /* seccomp-HASH */
	unsigned char file[CACHE_FILE_MAX];
} cache;

static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
	const unsigned char *b = data;
	size_t i;

	for (i = 0; i < len; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h;
}

#define FNV_START 14695981039346656037ULL

/* Appends s to the key; 0, or -1 when it does not fit (then no cache). */
static int key_add(const char *s, size_t len)
{
	if (len > sizeof cache.key - cache.key_len)
		return -1;
	memcpy(cache.key + cache.key_len, s, len);
	cache.key_len += len;
	return 0;
}

static int key_str(const char *s)
{
	return key_add(s, strlen(s) + 1);       /* with its NUL: "ab","c" differs from "a","bc" */
}

/* Every input of build() for this plan; 0, or -1: no cache for this run. */
static int make_key(const struct plan *p, int sockets, int unix_pairs)
{
	struct utsname u;
	struct stat self;
	char buf[160];
	size_t i, plan_off;

	cache.key_len = 0;
	if (uname(&u) != 0 || stat("/proc/self/exe", &self) != 0)
		return -1;
	snprintf(buf, sizeof buf, "corral seccomp %u libseccomp %d.%d.%d launcher %llu:%llu:%lld:%lld.%ld",
		 CACHE_VERSION, SCMP_VER_MAJOR, SCMP_VER_MINOR, SCMP_VER_MICRO,
		 (unsigned long long)self.st_dev, (unsigned long long)self.st_ino,
		 (long long)self.st_size, (long long)self.st_mtim.tv_sec, self.st_mtim.tv_nsec);
	if (key_str(buf) || key_str(u.machine) || key_str(u.release) || key_str(u.version))
		return -1;
	plan_off = cache.key_len;
	if (key_str(sockets ? "sockets" : "no-sockets") ||
	    key_str(unix_pairs ? "unix-pairs" : "unix-any") ||
	    key_str(p->deny_pipe_growth ? "pipes" : "no-pipes"))
		return -1;
	for (i = 0; i < p->ndeny_syscall; i++)
		if (key_str(p->deny_syscall[i]))
			return -1;
	/* the file is named by the plan's part alone: a new launcher or kernel replaces the file
	 * of the same plan instead of adding one */
	snprintf(cache.name, sizeof cache.name, "seccomp-%016llx",
		 (unsigned long long)fnv1a(FNV_START, cache.key + plan_off, cache.key_len - plan_off));
	return 0;
}

/* DIR, opened O_PATH, when it is ours and nobody else may write in it; else -1. */
static int cache_dir(const char *dir)
{
	struct stat st;
	int fd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Reads the cached program for the key into filt; 0 on a hit, -1: build it. */
static int cache_read(int dfd)
{
	struct cache_head h;
	struct stat st;
	size_t len = 0, want;
	const unsigned char *at;
	int fd = openat(dfd, cache.name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    st.st_size < (off_t)sizeof h || st.st_size > (off_t)sizeof cache.file) {
		close(fd);
		return -1;
	}
	while (len < (size_t)st.st_size) {
		ssize_t n = read(fd, cache.file + len, (size_t)st.st_size - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (len != (size_t)st.st_size)
		return -1;
	memcpy(&h, cache.file, sizeof h);
	if (memcmp(h.magic, CACHE_MAGIC, sizeof h.magic) != 0 || h.version != CACHE_VERSION ||
	    h.key_len != cache.key_len || h.unknown_len >= REPORT_LINE_MAX ||
	    h.unknown_cut > 1 || h.denied > PLAN_SYSCALLS_MAX || h.insns == 0 ||
	    h.insns > BPF_MAXINSNS)
		return -1;
	want = sizeof h + h.key_len + h.unknown_len + h.insns * sizeof filt.insns[0];
	if (want != len ||
	    h.sum != fnv1a(FNV_START, cache.file + sizeof h, len - sizeof h))
		return -1;
	at = cache.file + sizeof h;
	if (memcmp(at, cache.key, cache.key_len) != 0)
		return -1;
	at += h.key_len;
	memcpy(filt.unknown.buf, at, h.unknown_len);
	filt.unknown.len = h.unknown_len;
	filt.unknown_cut = (int)h.unknown_cut;
	at += h.unknown_len;
	memcpy(filt.insns, at, h.insns * sizeof filt.insns[0]);
	filt.len = (unsigned short)h.insns;
	filt.denied = h.denied;
	return 0;
}

/* Writes the program just built: under a temporary name, then renamed over the key's file, so
 * a reader sees the old file or the new one, whole. Failures are ignored (the next run builds). */
static void cache_write(int dfd)
{
	struct cache_head h;
	char tmp[64];
	size_t len, off = 0;
	int fd;

	memset(&h, 0, sizeof h);
	memcpy(h.magic, CACHE_MAGIC, sizeof h.magic);
	h.version = CACHE_VERSION;
	h.key_len = (uint32_t)cache.key_len;
	h.unknown_len = (uint32_t)filt.unknown.len;
	h.unknown_cut = (uint32_t)filt.unknown_cut;
	h.denied = filt.denied;
	h.insns = filt.len;
	len = sizeof h;
	memcpy(cache.file + len, cache.key, cache.key_len);
	len += cache.key_len;
	memcpy(cache.file + len, filt.unknown.buf, filt.unknown.len);
	len += filt.unknown.len;
	memcpy(cache.file + len, filt.insns, filt.len * sizeof filt.insns[0]);
	len += filt.len * sizeof filt.insns[0];
	h.sum = fnv1a(FNV_START, cache.file + sizeof h, len - sizeof h);
	memcpy(cache.file, &h, sizeof h);

	snprintf(tmp, sizeof tmp, "%s.tmp-%d", cache.name, (int)getpid());
	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	while (off < len) {
		ssize_t n = write(fd, cache.file + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	if (close(fd) != 0 || off != len || renameat(dfd, tmp, dfd, cache.name) != 0)
		unlinkat(dfd, tmp, 0);
}

/* The seccomp() system call, or prctl() before Linux 3.17. The program must already have
 * no_new_privs (or CAP_SYS_ADMIN). Returns 0 or an errno. */
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
	int dfd = -1;

	if (p->seccomp == PLAN_MECH_OFF)
		return;
	/* --deny-sockets-without-netns: only when the run has no network namespace of its own (a
	 * shared one, ns.c, is not) */
	filt.sockets = p->deny_sockets == 1 ||
		       (p->deny_sockets == 2 && (!L->netns || L->net_shared));
	filt.unix_pairs = p->unix_pairs;
	filt.pipes = p->deny_pipe_growth;
	filt.ready = 1;
	if (p->seccomp_cache && make_key(p, filt.sockets, filt.unix_pairs) == 0)
		dfd = cache_dir(p->seccomp_cache);
	if (dfd >= 0 && cache_read(dfd) == 0) {
		close(dfd);
		return;
	}
	filt.unknown.len = 0;           /* a rejected file may have left its own */
	filt.unknown_cut = 0;
	filt.err = build(p->deny_syscall, p->ndeny_syscall, filt.sockets, filt.unix_pairs,
			 filt.pipes);
	if (dfd >= 0) {
		if (!filt.err)
			cache_write(dfd);
		close(dfd);
	}
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

int seccomp_apply(const struct launch *L)
{
	const struct plan *p = L->plan;
	int err;

	if (p->seccomp == PLAN_MECH_OFF)
		return 0;
	if (filt.unknown.len)
		line_send(&filt.unknown, report_get_fd());
	err = filt.ready ? filt.err : EINVAL;
	if (!err && !filt.loaded)
		err = load();
	if (!err) {
		/* Filtered from here: the lines and execve are system calls of the program's. */
		report_applied_num("seccomp", filt.denied);
		if (filt.sockets)
			report_applied("deny-sockets");
		if (filt.unix_pairs)
			report_applied("unix-pairs-only");
		if (filt.pipes)
			report_applied("deny-pipe-growth");
		return 0;
	}
	if (filt.sockets && L->net_shared) {
		/* the run's inet sockets would reach other runs over the shared loopback */
		report_fatal(W_SHARED_NET, err, "the seccomp socket filter");
		errno = err;
		return -1;
	}
	if (p->seccomp == PLAN_MECH_REQUIRE) {
		errno = err;
		return -1;
	}
	report_refused("seccomp", err, explain(W_SECCOMP, err));
	if (filt.sockets)
		report_refused("deny-sockets", err, "there is no seccomp filter: the program may "
			       "make sockets of every family");
	if (filt.unix_pairs)
		report_refused("unix-pairs-only", err, "there is no seccomp filter: the program may "
			       "make unix sockets that reach the host's by name");
	if (filt.pipes)
		report_refused("deny-pipe-growth", err, "there is no seccomp filter: the program may "
			       "grow its pipes");
	return 0;
}

/* What the init may load on itself before the program exists: a filter whose every denied name is
 * one of these, none of which the init (reaping, budgets, report) or the program (ids, rlimits,
 * Landlock, execve) calls once the filter is loaded; nor do they make sockets, or clone with a
 * CLONE_NEW* flag. The init's PTRACE_DETACH answers a PTRACE_TRACEME, which the filter denies the
 * program's tree when ptrace is named. Any other name, and the program loads the filter as its last
 * step, as before. */
static const char *const early_ok[] = {
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "mount",
	"umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
	"fsmount", "fspick", "mount_setattr", "unshare", "setns", "keyctl", "add_key",
	"request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
	"io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load", "init_module",
	"finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl",
	"syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
	"setdomainname", "vhangup", "iopl", "ioperm", "modify_ldt", "uselib", "ustat", "sysfs",
	"fanotify_init", "lookup_dcookie", "open_by_handle_at", "name_to_handle_at",
	"personality",
};

static int early_allowed(const struct plan *p)
{
	size_t i, j;

	for (i = 0; i < p->ndeny_syscall; i++) {
		for (j = 0; j < sizeof early_ok / sizeof early_ok[0]; j++)
			if (strcmp(p->deny_syscall[i], early_ok[j]) == 0)
				break;
		if (j == sizeof early_ok / sizeof early_ok[0])
			return 0;
	}
	return 1;
}

/* The cost of loading (the kernel checks, translates and compiles the program, and works out which
 * system calls it always allows) is paid while no run waits, with --prestart. The program's steps
 * run filtered from here; they call nothing the filter denies. no_new_privs is the program's own
 * step too (reported there); the init sets it to load without CAP_SYS_ADMIN. */
void seccomp_load_early(const struct plan *p)
{
	if (p->seccomp == PLAN_MECH_OFF || !filt.ready || filt.err || filt.loaded ||
	    !early_allowed(p))
		return;
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return;
	if (load() == 0)
		filt.loaded = 1;
}

/* In a forked child: build and load a filter that denies personality(), then check that it
 * answers. */
int seccomp_probe(void)
{
	static const char *const names[] = { "personality" };
	int err;

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return errno;
	err = build(names, 1, 1, 1, 1);
	if (!err)
		err = load();
	if (!err && (syscall(SYS_personality, 0xffffffffUL) != -1 || errno != EPERM))
		err = EINVAL;
	return err;
}
