/* workspace.c: the program's files, in before its first instruction and out after its last process.
 *
 * --files-in FILE: records PATH \0 MODE \0 SIZE \0 and SIZE bytes, back to back (the host wrote and
 * checked them: relative paths, no "." or ".." segment, each path once). The supervisor unpacks
 * them into the work dir (mounts_work_dir: --work-at or --chdir, the run's own tmpfs when there
 * is one) after the mounts and before the program starts.
 *
 * --collect-to FILE with --collect GLOB... or --collect-all: once every process of the run is dead
 * (nothing can change a file while it is read), the supervisor walks the work dir and writes
 * records KIND \0 PATH \0 SIZE \0 MODE \0 STORED \0 and STORED bytes, then "end" \0 SEEN \0 FLAGS \0
 * (records.h). KIND: "f" a regular file (the first STORED of its SIZE bytes), "s" a regular file
 * that holds the SIZE bytes it was given at the same path (none stored: the host has them), "l"
 * a symbolic link (its target, never followed), "e" a file that could not be read (the errno
 * name). FLAGS: what a cap cut, comma separated: "files" (--collect-max N), "bytes" (the total),
 * "scan" (entries looked at, or glob match steps), "depth", "name" (a path longer than PATH_MAX),
 * "write" (FILE could not take more). A FILE without the end record was cut short: the
 * supervisor was killed while it wrote.
 *
 * Both run with the program's file-system ids (setfsuid) when it has its own: what is unpacked is
 * the program's, and the walk reads nothing the program could not. Both stay on the work dir's own
 * filesystem and open every name with O_NOFOLLOW from its directory's fd: a link the program made
 * is reported as a link, a fifo, socket or device is skipped unopened.
 *
 * A file costs the few system calls that the tmpfs's own work (an inode, its pages) needs: in,
 * openat, one write and close (the fd of its directory is kept for the files after it in the same
 * one, and its mode is given to openat with the umask cleared); out, openat, fstat, one read into
 * the records' buffer and close. A file collected with the bytes it was given is compared with
 * them (--files-in is kept open for it) and not copied: 1 MB less to write, and for the host to
 * read, when 100 files of 10 KB go in and come back unchanged.
 */
#include "launch.h"
#include "records.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define CHUNK 65536
#define SCAN_MAX 100000         /* directory entries looked at, in all */
#define DEPTH_MAX 64            /* directories below the work dir */
/* Steps of glob matching, in all: a "**" tries every split of the path, so a name's cost grows
 * with its depth times the globs; the caller picks the globs and the program the tree. */
#define MATCH_MAX (1UL << 24)

/* Scratch of the one supervisor process that does either step (never a vfork child's); what a
 * run keeps is in struct launch (ws). */
static char chunk[CHUNK];
static char given_chunk[CHUNK];         /* --files-in's bytes, beside a collected file's in chunk */

int workspace_open(struct launch *L)
{
	const struct plan *p = L->plan;

	if (p->files_in) {
		L->ws.in_fd = open(p->files_in, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (L->ws.in_fd < 0) {
			report_fatal(W_FILES_IN, errno, p->files_in);
			return -1;
		}
	}
	if (p->collect_to) {
		L->ws.collect_fd = open(p->collect_to, O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
		if (L->ws.collect_fd < 0) {
			report_fatal(W_COLLECT, errno, p->collect_to);
			return -1;
		}
	}
	/* Without a mount namespace and Landlock, a program of the launcher's uid reaches the run
	 * directory: no name may lead it to the records the supervisor reads and the host reads
	 * back. No program has run any code yet (a warm one waits for the init's word); from here
	 * on the records are this non-dumpable process's fds and the host's. */
	if (p->unlink_files) {
		if (p->files_in && unlink(p->files_in) != 0) {
			report_fatal(W_FILES_IN, errno, p->files_in);
			return -1;
		}
		if (p->collect_to && unlink(p->collect_to) != 0) {
			report_fatal(W_COLLECT, errno, p->collect_to);
			return -1;
		}
	}
	return 0;
}

/* The program's file-system ids for what follows; the previous ones in *old. */
static void fsids_take(const struct plan *p, uid_t *old_uid, gid_t *old_gid)
{
	*old_uid = (uid_t)-1;
	*old_gid = (gid_t)-1;
	if (!p->has_ids)
		return;
	*old_gid = (gid_t)setfsgid(p->gid);
	*old_uid = (uid_t)setfsuid(p->uid);
}

static void fsids_give(uid_t old_uid, gid_t old_gid)
{
	if (old_uid != (uid_t)-1)
		setfsuid(old_uid);
	if (old_gid != (gid_t)-1)
		setfsgid(old_gid);
}

/* ---- in ---- */

struct reader {
	int fd;
	size_t off, len;        /* what chunk holds of the records: chunk[off..len) */
	unsigned long long base;        /* the offset in the records of chunk[0] */
};

/* At least n (at most CHUNK) bytes of the records at chunk + r->off, what is held moved to the
 * front first when they would not fit: 1, 0 when the records end before, -1 with errno. */
static int rd_want(struct reader *r, size_t n)
{
	while (r->len - r->off < n) {
		ssize_t got;

		if (r->off > 0) {
			memmove(chunk, chunk + r->off, r->len - r->off);
			r->base += r->off;
			r->len -= r->off;
			r->off = 0;
		}
		do
			got = read(r->fd, chunk + r->len, sizeof chunk - r->len);
		while (got < 0 && errno == EINTR);
		if (got < 0)
			return -1;
		if (got == 0)
			return 0;
		r->len += (size_t)got;
	}
	return 1;
}

/* One NUL-terminated field into out (at most cap <= CHUNK bytes with the NUL): 1, 0 at the end of
 * the records (before a field's first byte), -1 with errno. */
static int rd_field(struct reader *r, char *out, size_t cap)
{
	size_t seen = 0;        /* bytes of the field looked at: no NUL among them */

	for (;;) {
		const char *z = memchr(chunk + r->off + seen, '\0', r->len - r->off - seen);
		int f;

		if (z) {
			size_t n = (size_t)(z - (chunk + r->off)) + 1;

			if (n > cap) {
				errno = ENAMETOOLONG;
				return -1;
			}
			memcpy(out, chunk + r->off, n);
			r->off += n;
			return 1;
		}
		seen = r->len - r->off;
		if (seen >= cap) {
			errno = ENAMETOOLONG;
			return -1;
		}
		f = rd_want(r, seen + 1);
		if (f <= 0) {
			if (f == 0 && seen == 0)
				return 0;
			errno = f == 0 ? EPROTO : errno;
			return -1;
		}
	}
}

static int write_all(int fd, const char *b, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, b, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

/* SIZE bytes of the records into fd: in one write when they fit in the buffer. */
static int rd_copy(struct reader *r, int fd, unsigned long long size)
{
	while (size > 0) {
		size_t n = size < CHUNK ? (size_t)size : CHUNK;
		int f = rd_want(r, n);

		if (f <= 0) {
			errno = f == 0 ? EPROTO : errno;
			return -1;
		}
		if (write_all(fd, chunk + r->off, n) != 0)
			return -1;
		r->off += n;
		size -= n;
	}
	return 0;
}

static int number_of(const char *s, int base, unsigned long long *v)
{
	char *end;

	errno = 0;
	*v = strtoull(s, &end, base);
	if (!*s || *end || errno || s[0] == '-') {
		errno = EPROTO;
		return -1;
	}
	return 0;
}

/* A segment that names no new entry: empty, "." or "..". */
static int bad_segment(const char *s)
{
	return !*s || strcmp(s, ".") == 0 || strcmp(s, "..") == 0;
}

/* The directory PATH names below root, made (mode 0755) where missing; with exact, mkdirat's mode
 * is the mode made (workspace_in), else each new one is set with fchmod. An fd, or -1 with errno.
 * PATH is changed while it is walked, and given back as it was. */
static int dir_of(int root, char *path, int exact)
{
	int d = dup(root);
	char *s = path, *slash;

	for (; d >= 0 && *s; s = slash ? slash + 1 : s + strlen(s)) {
		int sub, made;

		slash = strchr(s, '/');
		if (slash)
			*slash = '\0';
		if (bad_segment(s)) {
			if (slash)
				*slash = '/';
			close(d);
			errno = EINVAL;
			return -1;
		}
		made = mkdirat(d, s, 0755) == 0;
		if (!made && errno != EEXIST) {
			int e = errno;

			if (slash)
				*slash = '/';
			close(d);
			errno = e;
			return -1;
		}
		sub = openat(d, s, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub >= 0 && made && !exact)
			fchmod(sub, 0755);
		if (slash)
			*slash = '/';
		close(d);
		d = sub;
	}
	return d;
}

/* The directory of the file unpacked last, kept open for the files after it in the same one (the
 * host sends them in its order: a list of files in one directory costs one walk). */
struct parent {
	int fd;                 /* -1: none */
	size_t len;             /* path[0..len): its path below the work dir */
	char path[PATH_MAX];
};

/* The fd of the directory that holds NAME's last segment (root itself, or the parent kept), its
 * parents made where missing; *last points at the segment. -1 with errno. */
static int parent_of(struct parent *pc, int root, char *name, int exact, char **last)
{
	char *slash = strrchr(name, '/');
	size_t len = slash ? (size_t)(slash - name) : 0;

	*last = slash ? slash + 1 : name;
	if (bad_segment(*last)) {
		errno = EINVAL;
		return -1;
	}
	if (!slash)
		return root;
	if (pc->fd >= 0 && pc->len == len && memcmp(pc->path, name, len) == 0)
		return pc->fd;
	if (pc->fd >= 0)
		close(pc->fd);
	*slash = '\0';
	pc->fd = dir_of(root, name, exact);
	*slash = '/';
	if (pc->fd < 0)
		return -1;
	memcpy(pc->path, name, len);
	pc->len = len;
	return pc->fd;
}

/* Whether the modes given to mkdirat and openat below root are the modes made once the umask is
 * cleared: root has neither a default ACL (which takes the umask's place for what is made in it
 * and is inherited by the directories made there, acl(5)) nor the set-group-ID bit (inherited by
 * directories made in it). The work dir is the run's new tmpfs or a directory the host made 0700:
 * both have neither, but a host's /dev/shm could give one a default ACL. */
static int modes_exact(int root)
{
	struct stat st;

	if (fstat(root, &st) != 0 || (st.st_mode & S_ISGID))
		return 0;
	if (fgetxattr(root, "system.posix_acl_default", NULL, 0) >= 0)
		return 0;
	return errno == ENODATA || errno == EOPNOTSUPP;
}

/* A file unpacked, whose bytes are at off in the records: noted for the collection. Without
 * memory it is not noted: a collected file then goes back with its bytes. */
static int note_given(struct workspace_state *ws, const char *name, unsigned long long off,
		      unsigned long long size)
{
	char *path;

	if (ws->ngiven == ws->given_cap) {
		size_t cap = ws->given_cap ? ws->given_cap * 2 : 64;
		struct workspace_given *g = realloc(ws->given, cap * sizeof *g);

		if (!g)
			return -1;
		ws->given = g;
		ws->given_cap = cap;
	}
	path = strdup(name);
	if (!path)
		return -1;
	ws->given[ws->ngiven].path = path;
	ws->given[ws->ngiven].off = off;
	ws->given[ws->ngiven].size = size;
	ws->given[ws->ngiven].made = 0;
	ws->ngiven++;
	return 0;
}

static int by_path(const void *a, const void *b)
{
	return strcmp(((const struct workspace_given *)a)->path,
		      ((const struct workspace_given *)b)->path);
}

/* One record: 0, or -1 with errno and the path in name. */
static int unpack_one(struct launch *L, struct reader *r, struct parent *pc, int root, int exact,
		      char *name, int *done)
{
	struct workspace_state *ws = &L->ws;
	char field[32], *last;
	unsigned long long mode, size;
	struct stat st;
	int f = rd_field(r, name, PATH_MAX), d, fd, noted;

	*done = f == 0;
	if (f <= 0)
		return f;
	if (rd_field(r, field, sizeof field) <= 0 || number_of(field, 8, &mode) != 0 ||
	    rd_field(r, field, sizeof field) <= 0 || number_of(field, 10, &size) != 0)
		return -1;
	if (name[0] == '/' || mode > 0777) {
		errno = EINVAL;
		return -1;
	}
	d = parent_of(pc, root, name, exact, &last);
	if (d < 0)
		return -1;
	fd = openat(d, last, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
	if (fd < 0)
		return -1;
	noted = ws->collect_fd >= 0 && note_given(ws, name, r->base + r->off, size) == 0;
	/* the mode, ctime and inode to tell an unchanged file from a changed one (--collect-all):
	 * after the last write */
	if (rd_copy(r, fd, size) != 0 || (!exact && fchmod(fd, (mode_t)mode) != 0) ||
	    (L->plan->collect_all && fstat(fd, &st) != 0)) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	if (noted && L->plan->collect_all) {
		struct workspace_given *g = &ws->given[ws->ngiven - 1];

		g->ino = st.st_ino;
		g->ctime = st.st_ctim;
		g->made = 1;
	}
	close(fd);
	return 0;
}

int workspace_in(struct launch *L)
{
	const struct plan *p = L->plan;
	struct reader r = { L->ws.in_fd, 0, 0, 0 };
	struct parent pc;
	char name[PATH_MAX];
	uid_t ou;
	gid_t og;
	mode_t mask = 0;
	int root, exact = 0, done = 0, n = 0, rc = 0, err = 0;

	if (L->ws.in_fd < 0)
		return 0;
	name[0] = '\0';
	pc.fd = -1;
	fsids_take(p, &ou, &og);
	root = open(mounts_work_dir(L), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root < 0) {
		rc = -1;
		err = errno;
	} else {
		exact = modes_exact(root);
		if (exact)
			mask = umask(0);
		while (!done && (rc = unpack_one(L, &r, &pc, root, exact, name, &done)) == 0)
			n += !done;
		err = errno;
		if (exact)
			umask(mask);
		if (pc.fd >= 0)
			close(pc.fd);
		close(root);
	}
	fsids_give(ou, og);
	if (L->ws.ngiven > 1)
		qsort(L->ws.given, L->ws.ngiven, sizeof *L->ws.given, by_path);
	if (L->ws.ngiven == 0 || rc != 0) {
		close(L->ws.in_fd);
		L->ws.in_fd = -1;
	}
	if (rc != 0) {
		report_fatal(W_FILES_IN, err, name[0] ? name : mounts_work_dir(L));
		return -1;
	}
	report_applied_num("files-in", (unsigned long long)n);
	return 0;
}

/* ---- the program's wait ---- */

int workspace_wait_open(struct launch *L)
{
	int fds[2];

	if (L->plan->files_wait_fd < 0 || L->ws.in_fd < 0)
		return 0;
	if (pipe2(fds, O_CLOEXEC) != 0) {
		report_fatal(W_PIPE, errno, NULL);
		return -1;
	}
	L->ws.wait_rfd = fds[0];
	L->ws.wait_wfd = fds[1];
	return 1;
}

void workspace_wait_close(struct launch *L, int go)
{
	static const char byte = WORKSPACE_GO;

	if (L->ws.wait_rfd >= 0)
		close(L->ws.wait_rfd);
	if (L->ws.wait_wfd >= 0) {
		/* one byte into an empty pipe fits; it fails only when the program is gone */
		ssize_t w = go ? write(L->ws.wait_wfd, &byte, 1) : 0;

		(void)w;
		close(L->ws.wait_wfd);
	}
	L->ws.wait_rfd = L->ws.wait_wfd = -1;
}

/* ---- out ---- */

enum { F_FILES = 1, F_BYTES = 2, F_SCAN = 4, F_DEPTH = 8, F_NAME = 16, F_WRITE = 32 };

struct walk {
	const struct plan *p;
	const struct workspace_state *ws;
	int out;
	char wbuf[CHUNK];
	size_t wlen;
	dev_t dev;
	char path[PATH_MAX];
	unsigned long long files_left, bytes_left, seen;
	unsigned long scan_left, match_left;
	unsigned flags;
	int stop;
};

static void w_flush(struct walk *w)
{
	if (w->wlen && !(w->flags & F_WRITE) && write_all(w->out, w->wbuf, w->wlen) != 0)
		w->flags |= F_WRITE;
	w->wlen = 0;
	if (w->flags & F_WRITE)
		w->stop = 1;
}

static void w_put(struct walk *w, const char *b, size_t n)
{
	while (n > 0) {
		size_t k = sizeof w->wbuf - w->wlen;

		if (k == 0) {
			w_flush(w);
			k = sizeof w->wbuf;
		}
		if (k > n)
			k = n;
		memcpy(w->wbuf + w->wlen, b, k);
		w->wlen += k;
		b += k;
		n -= k;
	}
}

static void w_field(struct walk *w, const char *s)
{
	w_put(w, s, strlen(s) + 1);
}

static void w_num(struct walk *w, unsigned long long v, int octal)
{
	char b[32];

	snprintf(b, sizeof b, octal ? "%llo" : "%llu", v);
	w_field(w, b);
}

static void w_head(struct walk *w, const char *kind, unsigned long long size, unsigned mode,
		   unsigned long long stored)
{
	w_field(w, kind);
	w_field(w, w->path);
	w_num(w, size, 0);
	w_num(w, mode & 07777, 1);
	w_num(w, stored, 0);
}

/* Whether PATH matches PAT, segment by segment ("**" matches any number of segments, other
 * segments as fnmatch with FNM_PERIOD); with prefix, whether a path below the directory PATH
 * could. Each call takes a step of *left; with none left, no match (the caller stops). */
static int gmatch(const char *pat, const char *path, int prefix, unsigned long *left)
{
	const char *pe, *se;
	char ps[NAME_MAX + 1], ss[NAME_MAX + 1];
	size_t pl, sl;

	if (*left == 0)
		return 0;
	(*left)--;
	if (!*path) {
		if (prefix)
			return *pat != 0;
		while (strncmp(pat, "**", 2) == 0 && (pat[2] == '\0' || pat[2] == '/'))
			pat += pat[2] ? 3 : 2;
		return *pat == 0;
	}
	if (!*pat)
		return 0;
	pe = strchrnul(pat, '/');
	se = strchrnul(path, '/');
	pl = (size_t)(pe - pat);
	sl = (size_t)(se - path);
	if (pl == 2 && pat[0] == '*' && pat[1] == '*')
		return gmatch(*pe ? pe + 1 : pe, path, prefix, left) ||
		       gmatch(pat, *se ? se + 1 : se, prefix, left);
	if (pl > NAME_MAX || sl > NAME_MAX)
		return 0;
	memcpy(ps, pat, pl);
	ps[pl] = '\0';
	memcpy(ss, path, sl);
	ss[sl] = '\0';
	return fnmatch(ps, ss, FNM_PERIOD) == 0 &&
	       gmatch(*pe ? pe + 1 : pe, *se ? se + 1 : se, prefix, left);
}

/* Whether w->path is wanted; out of match steps, not, and the walk stops as at its scan cap. */
static int wanted(struct walk *w, int dir)
{
	const struct plan *p = w->p;
	size_t i;

	if (p->collect_all)
		return 1;
	for (i = 0; i < p->ncollect; i++)
		if (gmatch(p->collect[i], w->path, dir, &w->match_left))
			return 1;
	if (w->match_left == 0) {
		w->flags |= F_SCAN;
		w->stop = 1;
	}
	return 0;
}

/* Room for one more record; else the count cap is what stops the walk. */
static int take_slot(struct walk *w)
{
	if (w->files_left == 0) {
		w->flags |= F_FILES;
		w->stop = 1;
		return 0;
	}
	w->files_left--;
	return 1;
}

static void emit_error(struct walk *w, const struct stat *st, int err)
{
	const char *e = errno_name(err);

	w_head(w, REC_ERROR, (unsigned long long)st->st_size, st->st_mode, strlen(e));
	w_put(w, e, strlen(e));
}

static void emit_link(struct walk *w, int dfd, const char *name, const struct stat *st)
{
	char target[PATH_MAX];
	ssize_t n = readlinkat(dfd, name, target, sizeof target);

	if (n < 0) {
		emit_error(w, st, errno);
		return;
	}
	w_head(w, REC_LINK, (unsigned long long)n, st->st_mode, (unsigned long long)n);
	w_put(w, target, (size_t)n);
}

/* Whether a[0..n) and b[0..n) are equal: eight bytes at a time (musl's memcmp, which corral-init
 * links, goes a byte at a time: 1 ms for 1 MB). */
static int same_bytes(const char *a, const char *b, size_t n)
{
	uint64_t x, y;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		memcpy(&x, a + i, 8);
		memcpy(&y, b + i, 8);
		if (x != y)
			return 0;
	}
	for (; i < n; i++)
		if (a[i] != b[i])
			return 0;
	return 1;
}

/* The file unpacked at w->path, or NULL. */
static const struct workspace_given *given_at(struct walk *w)
{
	const struct workspace_state *ws = w->ws;
	struct workspace_given key;

	key.path = w->path;
	return ws->ngiven ? bsearch(&key, ws->given, ws->ngiven, sizeof *ws->given, by_path) : NULL;
}

/* Whether the open regular file fd, of st's size, holds g's bytes and no more: 1; 0 when not, the
 * file back at its start; -1 with errno when it cannot be read again. */
static int holds_given(int fd, const struct stat *st, const struct workspace_given *g, int in_fd)
{
	unsigned long long done = 0, size = (unsigned long long)st->st_size;
	int same = g->size == size;

	while (same && done < size) {
		size_t n = size - done < CHUNK ? (size_t)(size - done) : CHUNK;
		ssize_t a = read(fd, chunk, n), b;

		if (a < 0 && errno == EINTR)
			continue;
		b = a > 0 ? pread(in_fd, given_chunk, (size_t)a, (off_t)(g->off + done)) : -1;
		same = a > 0 && b == a && same_bytes(chunk, given_chunk, (size_t)a);
		done += a > 0 ? (unsigned long long)a : 0;
	}
	/* and nothing after them (a file growing since fstat: nothing of the run runs, but still) */
	if (same && read(fd, chunk, 1) != 0)
		same = 0;
	if (!same && lseek(fd, 0, SEEK_SET) != 0)
		return -1;
	return same;
}

/* Whether the open regular file at w->path holds, whole within the caps, the bytes it was given
 * (the caller has them: they need not come back): as holds_given. */
static int as_given(struct walk *w, int fd, const struct stat *st)
{
	const struct workspace_given *g = given_at(w);
	unsigned long long size = (unsigned long long)st->st_size;

	if (!g || size > w->p->collect_file_bytes || size > w->bytes_left)
		return 0;
	return holds_given(fd, st, g, w->ws->in_fd);
}

/* --collect-all: whether the open regular file at w->path is the one unpacked there, left as it
 * was: the same inode and ctime as once made (a directory renamed over keeps both: the path must be
 * the same), and its bytes (a coarse ctime may not have moved since it was made). As
 * holds_given. */
static int left_alone(struct walk *w, int fd, const struct stat *st)
{
	const struct workspace_given *g = given_at(w);

	if (!g || !g->made || g->ino != st->st_ino || g->ctime.tv_sec != st->st_ctim.tv_sec ||
	    g->ctime.tv_nsec != st->st_ctim.tv_nsec)
		return 0;
	return holds_given(fd, st, g, w->ws->in_fd);
}

/* An open regular file's record: its first bytes, within the caps, read straight into the
 * records' buffer, or none when it holds what it was given. fd is closed. */
static void emit_file(struct walk *w, int fd, const struct stat *st)
{
	const struct plan *p = w->p;
	unsigned long long stored, left;

	switch (as_given(w, fd, st)) {
	case 1:
		w->bytes_left -= (unsigned long long)st->st_size;
		w_head(w, REC_GIVEN, (unsigned long long)st->st_size, st->st_mode, 0);
		close(fd);
		return;
	case -1:
		emit_error(w, st, errno);
		close(fd);
		return;
	}

	stored = (unsigned long long)st->st_size;
	if (stored > p->collect_file_bytes)
		stored = p->collect_file_bytes;
	if (stored > w->bytes_left) {
		stored = w->bytes_left;
		w->flags |= F_BYTES;
	}
	w->bytes_left -= stored;
	w_head(w, REC_FILE, (unsigned long long)st->st_size, st->st_mode, stored);
	for (left = stored; left > 0;) {
		size_t room = sizeof w->wbuf - w->wlen;
		ssize_t n;

		/* what fits in the buffer is read in one piece */
		if (room < left && w->wlen > 0) {
			w_flush(w);
			room = sizeof w->wbuf;
		}
		n = read(fd, w->wbuf + w->wlen, left < room ? (size_t)left : room);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			/* shorter than its size said: the record keeps its length, zeros after */
			memset(chunk, 0, CHUNK);
			while (left > 0) {
				size_t k = left < CHUNK ? (size_t)left : CHUNK;

				w_put(w, chunk, k);
				left -= k;
			}
			break;
		}
		w->wlen += (size_t)n;
		left -= (unsigned long long)n;
	}
	close(fd);
}

/* A regular file (what fstatat, or readdir's type, saw), opened: its fd with *st what it is now,
 * or -1 with errno, EAGAIN when it is not what was seen (nothing of the run runs now: but still). */
static int open_file(struct walk *w, int dfd, const char *name, struct stat *st)
{
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_dev != w->dev) {
		close(fd);
		errno = EAGAIN;
		return -1;
	}
	return fd;
}

/* What the walk does with a regular file that fstatat saw: its record, or why not. */
static void visit_file(struct walk *w, int dfd, const char *name, const struct stat *st0)
{
	struct stat st;
	int fd;

	fd = open_file(w, dfd, name, &st);
	if (fd >= 0 && w->p->collect_all) {
		int left = left_alone(w, fd, &st);

		if (left == 1) {
			close(fd);
			return;
		}
		if (left < 0) {
			close(fd);
			fd = -1;
		}
	}
	if (!take_slot(w)) {
		if (fd >= 0)
			close(fd);
		return;
	}
	if (fd < 0)
		emit_error(w, st0, errno);
	else
		emit_file(w, fd, &st);
}

/* A name readdir says is a regular file, wanted: opened first and checked with fstat, one call
 * fewer than fstatat then open. 0 when done with it; -1 when it must go the general way (it
 * cannot be opened, or is not what readdir said: the general way says why). */
static int visit_regular(struct walk *w, int dfd, const char *name)
{
	struct stat st;
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return -1;
	}
	if (w->p->collect_all && st.st_dev == w->dev) {
		int left = left_alone(w, fd, &st);

		if (left != 0) {
			close(fd);
			return left == 1 ? 0 : -1;      /* -1: the general way says why */
		}
	}
	if (st.st_dev != w->dev || !take_slot(w)) {
		close(fd);      /* another filesystem (a bind mount) is skipped, as by fstatat */
		return 0;
	}
	emit_file(w, fd, &st);
	return 0;
}

static void walk_dir(struct walk *w, int dfd, size_t plen, int depth)
{
	DIR *dir = fdopendir(dfd);
	struct dirent *e;

	if (!dir) {
		close(dfd);
		return;
	}
	while (!w->stop && (e = readdir(dir)) != NULL) {
		const char *name = e->d_name;
		size_t nlen = strlen(name);
		struct stat st;

		if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2])))
			continue;
		if (w->scan_left == 0) {
			w->flags |= F_SCAN;
			w->stop = 1;
			break;
		}
		w->scan_left--;
		w->seen++;
		if (plen + nlen + 2 > sizeof w->path) {
			w->flags |= F_NAME;
			continue;
		}
		if (plen)
			w->path[plen] = '/';
		memcpy(w->path + plen + (plen ? 1 : 0), name, nlen + 1);
		/* a regular file (tmpfs always says): what fstatat would tell, from its open fd */
		if (e->d_type == DT_REG) {
			if (!wanted(w, 0))
				continue;
			if (visit_regular(w, dirfd(dir), name) == 0)
				continue;
		}
		if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != w->dev)
			continue;       /* gone, or another filesystem (a bind mount) */
		if (S_ISDIR(st.st_mode)) {
			int sub;

			if (!wanted(w, 1))
				continue;
			if (depth >= DEPTH_MAX) {
				w->flags |= F_DEPTH;
				continue;
			}
			sub = openat(dirfd(dir), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				walk_dir(w, sub, plen + nlen + (plen ? 1 : 0), depth + 1);
			continue;
		}
		if (!(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) || !wanted(w, 0))
			continue;       /* fifos, sockets, devices: never opened */
		if (S_ISLNK(st.st_mode)) {
			if (take_slot(w))
				emit_link(w, dirfd(dir), name, &st);
		} else {
			visit_file(w, dirfd(dir), name, &st);
		}
		if (w->stop)
			break;
	}
	w->path[plen] = '\0';
	closedir(dir);
}

static struct walk walk_state;

void workspace_collect(struct launch *L)
{
	const struct plan *p = L->plan;
	struct walk *w = &walk_state;
	struct stat st;
	char flags[64] = "";
	uid_t ou;
	gid_t og;
	int root;

	if (L->ws.collect_fd < 0)
		return;
	memset(w, 0, sizeof *w);
	w->p = p;
	w->ws = &L->ws;
	w->out = L->ws.collect_fd;
	w->files_left = p->collect_files;
	w->bytes_left = p->collect_bytes;
	w->scan_left = SCAN_MAX;
	w->match_left = MATCH_MAX;
	fsids_take(p, &ou, &og);
	root = open(mounts_work_dir(L), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root >= 0 && fstat(root, &st) == 0) {
		w->dev = st.st_dev;
		walk_dir(w, root, 0, 0);
	} else if (root >= 0) {
		close(root);
	}
	fsids_give(ou, og);
	if (w->flags & F_FILES)
		strcat(flags, ",files");
	if (w->flags & F_BYTES)
		strcat(flags, ",bytes");
	if (w->flags & F_SCAN)
		strcat(flags, ",scan");
	if (w->flags & F_DEPTH)
		strcat(flags, ",depth");
	if (w->flags & F_NAME)
		strcat(flags, ",name");
	w_field(w, REC_END);
	w_num(w, w->seen, 0);
	w_field(w, flags[0] ? flags + 1 : "");
	w_flush(w);
	close(L->ws.collect_fd);
	L->ws.collect_fd = -1;
}
