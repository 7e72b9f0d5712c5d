/* python.h: private header joining the files of the embedded interpreter (CPython 3.11):
 *
 *   pystart.c  the zygote: start-up, preloads, the state every program inherits
 *   pycheck.c  the launcher (spawner path) and the zygote (direct path): whether the interpreter
 *              can run what a run asks for
 *   pyrun.c    the program: the run's state, then the program as python3's main runs it
 *   pyend.c    the program: its end, as Py_RunMain() ends python3
 *   pygc.c     whether the run froze objects (its one use of CPython's internal headers)
 *   pyflush.c  the program: the flush handlers (SIGXCPU, FLUSH_SIGNAL), set in the zygote
 *
 * What the runs still share with the zygote, and so with each other: the modules imported in it
 * (by design; none holds a run's data, and a module that keeps random state without reseeding at
 * fork, as numpy.random's global generator does, would give every run the same numbers: the
 * program reseeds numpy's), and the hash seed of str and bytes (hash randomisation is chosen
 * once, at start-up). A run can learn the seed (from the order of a set), but nothing it learns
 * reaches another run: their inputs come from the host, their outputs go to it, and a run cannot
 * feed another run's dictionaries. Restarting the zygote picks a new seed.
 */
#ifndef CORRAL_PYTHON_H
#define CORRAL_PYTHON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zygote.h"

/* What a standard stream caches from its fd when it is made: whether it can seek (FileIO,
 * TextIOWrapper) and the block size (the size of stdin's buffer). */
struct std_kind {
	int valid;
	int seekable;
	long blksize;
};

static inline void std_kind_of(int fd, struct std_kind *k)
{
	struct stat st;

	k->valid = fstat(fd, &st) == 0;
	k->blksize = k->valid ? (long)st.st_blksize : 0;
	k->seekable = k->valid && lseek(fd, 0, SEEK_CUR) >= 0;
}

static inline int std_kind_same(const struct std_kind *a, const struct std_kind *b)
{
	return a->valid && b->valid && a->seekable == b->seekable && a->blksize == b->blksize;
}


/* Set in the zygote, inherited by every program; run_std set in the program. */
struct py_state {
	struct sigaction sig[NSIG];     /* the dispositions Python's start-up left */
	PyObject *std[3];               /* the zygote's sys.stdin, stdout, stderr ... */
	struct std_kind kind[3];        /* ... made for fds of these kinds */
	PyObject *stream;               /* stream_src's stream() */
	PyObject *reseed;               /* stream_src's reseed() */
	PyObject *encodings[3][2];      /* each stream's encoding and errors */
	PyObject *environ;              /* posix.environ: os.environ._data, os.environb._data */
	PyObject *extra_env;            /* [(name, value)] bytes: what the start-up set in environ */
	const char *tz;                 /* TZ at start-up (NULL: unset) ... */
	PyObject *tzset;                /* ... and time.tzset when time was imported */
	PyObject *main_dict;            /* the run's __main__.__dict__ (setup_main) */
	PyObject *builtins;             /* the builtins module */
	PyObject *builtin_importer;     /* importlib's BuiltinImporter */
	PyObject *source_loader;        /* importlib's SourceFileLoader */
	PyObject *sourceless_loader;    /* SourcelessFileLoader */
	PyObject *threading;            /* "threading" */
	PyObject *exitfuncs;            /* atexit._run_exitfuncs */
	PyObject *thread_count;         /* _thread._count */
	PyObject *get_objects;          /* gc.get_objects */
	const char *command;            /* --command's text ... */
	PyObject *command_code;         /* ... compiled as run_command() would */
	int standard_hooks;             /* sys.path_hooks: zipimport's and FileFinder's alone */
	/* In the program: the objects of the run's streams, which finalizing writes nothing to
	 * (py_end() flushes them) */
	PyObject *run_std[9];
};

extern struct py_state py;

/* pystart.c */
PyObject *py_attr_of(const char *module, const char *name);    /* a new reference, or NULL */
const char *py_env_get(char *const *env, const char *name);    /* NAME=VALUE's VALUE, or NULL */

/* pyflush.c: the flush handlers set in Python's table (--flush-handlers); -1 with an exception. */
int py_flush_handlers(void);

/* pyend.c: ends the program as python3 ends (exit code code unless the end changes it). */
NORETURN void py_end(int code);

#endif
