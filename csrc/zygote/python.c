/* python.c: the embedded interpreter (CPython 3.11, libpython3.11).
 *
 * In Z, py_start() initialises it exactly as `python3 -I FILE` started by the launcher would
 * be (isolated mode, buffered stdio, sys.path, sys.prefix, sys.executable, sys.flags, the
 * locale, UTF-8 mode and the encodings of the same start-up environment), imports the preloaded
 * modules, runs the compiler once, and freezes everything it made (gc.freeze(): the collector of
 * a run never walks, and so never writes to, the zygote's objects, which the runs share with Z
 * until they write to them).
 *
 * In C, py_run_program() replaces the launcher's execve: the process is made what execve would
 * have made it (exec.c), the fds above 2 are closed (the report fd and the pipe to the
 * supervisor too, which then reports the pid as after an execve), the interpreter is told it was
 * forked (PyOS_AfterFork_Child: its locks, its threads, and the os.register_at_fork handlers,
 * random's reseeding among them), Python's own signal dispositions come back, the environment,
 * sys.argv, sys.orig_argv, the standard streams and a fresh __main__ become the run's, and the
 * program runs as python3's main (Modules/main.c) runs it, ending as it ends (see end()).
 *
 * What the runs still share with Z, and so with each other: the modules imported in Z (by
 * design; none holds a run's data, and a module that keeps random state without reseeding at
 * fork, as numpy.random's global generator does, would give every run the same numbers: do not
 * preload one), and the hash seed of str and bytes (hash randomisation is chosen once, at
 * start-up). A run can learn the seed (from the order of a set), but nothing it learns reaches
 * another run: their inputs come from the host, their outputs go to it, and a run cannot feed
 * another run's dictionaries. Restarting the zygote picks a new seed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>

#include "zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

/* Exported by libpython3.11 from its internal headers (pycore_pylifecycle.h): how python3's own
 * main ends a run. */
extern int _Py_UnhandledKeyboardInterrupt;
int _Py_HandleSystemExit(int *exitcode_p);

/* The locale variables Python's start-up reads (setlocale(LC_CTYPE, "")); a run must have the
 * values the zygote started with. Under -I no PYTHON* variable is read. */
static const char *const locale_vars[] = { "LC_ALL", "LC_CTYPE", "LANG" };

/* A run's standard stream, made as Python/pylifecycle.c's create_stdio() makes it without -u
 * (buffered; line-buffered when a terminal, and stderr always), when the fd is not of the kind
 * the zygote's own stream was made for (see std_kind). */
static const char stream_src[] =
	"import io as _io, os as _os, sys as _sys\n"
	"def stream(fd, write, name, encoding, errors):\n"
	"    try:\n"
	"        _os.fstat(fd)\n"
	"    except OSError:\n"
	"        return None\n"
	"    buf = _io.open(fd, 'wb' if write else 'rb', -1, None, None, None, False)\n"
	"    raw = buf.raw\n"
	"    raw.name = name\n"
	"    line = raw.isatty() or fd == 2\n"
	"    s = _io.TextIOWrapper(buf, encoding, errors, '\\n', line, False)\n"
	"    s.mode = 'w' if write else 'r'\n"
	"    return s\n"
	/* numpy.random's global generator is seeded once, at import: C reseeds it, once, after
	 * the fork (random reseeds its own in its at-fork handler). Not an at-fork handler: the
	 * program's own forks must not reseed it, as python3's do not. */
	"def reseed():\n"
	"    m = _sys.modules.get('numpy.random')\n"
	"    if m is not None:\n"
	"        m.seed()\n";

/* What a standard stream caches from its fd when it is made: whether it can seek (FileIO,
 * TextIOWrapper) and the block size (the size of stdin's buffer). */
struct std_kind {
	int valid;
	int seekable;
	long blksize;
};

static void std_kind_of(int fd, struct std_kind *k)
{
	struct stat st;

	k->valid = fstat(fd, &st) == 0;
	k->blksize = k->valid ? (long)st.st_blksize : 0;
	k->seekable = k->valid && lseek(fd, 0, SEEK_CUR) >= 0;
}

static int std_kind_same(const struct std_kind *a, const struct std_kind *b)
{
	return a->valid && b->valid && a->seekable == b->seekable && a->blksize == b->blksize;
}

/* Set in Z, inherited by every C. */
static struct {
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
	int standard_hooks;             /* sys.path_hooks: zipimport's and FileFinder's alone */
} py;

/* ---- Z: start-up ---- */

static int fail(char *err, size_t errlen, const char *what)
{
	PyObject *type, *value, *tb, *s = NULL;
	const char *msg = NULL;

	PyErr_Fetch(&type, &value, &tb);
	if (value)
		s = PyObject_Str(value);
	if (s)
		msg = PyUnicode_AsUTF8(s);
	PyErr_Clear();
	snprintf(err, errlen, "%s: %s%s%s", what,
		 type ? ((PyTypeObject *)type)->tp_name : "error", msg ? ": " : "", msg ? msg : "");
	Py_XDECREF(s);
	Py_XDECREF(type);
	Py_XDECREF(value);
	Py_XDECREF(tb);
	return -1;
}

/* "ModuleNotFoundError: No module named 'x'": the pending exception, on one line. */
static void exception_line(char *buf, size_t len)
{
	PyObject *type, *value, *tb, *s = NULL;
	const char *msg = NULL;
	char *c;

	PyErr_Fetch(&type, &value, &tb);
	PyErr_NormalizeException(&type, &value, &tb);
	if (value)
		s = PyObject_Str(value);
	if (s)
		msg = PyUnicode_AsUTF8(s);
	PyErr_Clear();
	snprintf(buf, len, "%s%s%s", type ? ((PyTypeObject *)type)->tp_name : "error",
		 msg && *msg ? ": " : "", msg ? msg : "");
	for (c = buf; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = ' ';
	Py_XDECREF(s);
	Py_XDECREF(type);
	Py_XDECREF(value);
	Py_XDECREF(tb);
}

static const char *env_get(char *const *env, const char *name)
{
	size_t n = strlen(name);

	for (; env && *env; env++)
		if (strncmp(*env, name, n) == 0 && (*env)[n] == '=')
			return *env + n + 1;
	return NULL;
}

/* environ is exactly --env: what Python's start-up reads from it must be what a run's own
 * python3 would read (the locale). */
static int set_environment(const struct zygote *z)
{
	size_t i;

	if (clearenv() != 0)
		return -1;
	for (i = 0; i < z->nenv; i++)
		if (putenv(z->env[i]) != 0)
			return -1;
	return 0;
}

static int in_env(const struct zygote *z, const char *entry)
{
	size_t i;

	for (i = 0; i < z->nenv; i++)
		if (strcmp(z->env[i], entry) == 0)
			return 1;
	return 0;
}

/* What Python's start-up set in environ (the C locale coerced: LC_CTYPE=C.UTF-8), for each run
 * to set the same way. */
static PyObject *start_up_env(const struct zygote *z)
{
	PyObject *list = PyList_New(0);
	char **e;

	for (e = environ; list && e && *e; e++) {
		const char *eq = strchr(*e, '=');
		PyObject *item;

		if (!eq || in_env(z, *e))
			continue;
		item = Py_BuildValue("(y#y)", *e, (Py_ssize_t)(eq - *e), eq + 1);
		if (!item || PyList_Append(list, item) != 0)
			Py_CLEAR(list);
		Py_XDECREF(item);
	}
	return list;
}

/* Python makes its standard streams for fds 0-2 at start-up, and a run uses them as they are
 * when its own fds are of the same kind (the common case: stdin /dev/null, stdout and stderr
 * pipes or sockets), so that it does not pay for making three streams. The zygote's own fds are
 * put back afterwards (the streams write to them until a run begins). */
static int canonical_std(int saved[3])
{
	int p[2], null, fd;

	for (fd = 0; fd < 3; fd++)
		saved[fd] = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (null < 0 || pipe2(p, O_CLOEXEC) != 0)
		return -1;
	close(p[0]);    /* a write would fail with EPIPE, not block */
	if (dup2(null, 0) < 0 || dup2(p[1], 1) < 0 || dup2(p[1], 2) < 0)
		return -1;
	close(null);
	close(p[1]);
	for (fd = 0; fd < 3; fd++)
		std_kind_of(fd, &py.kind[fd]);
	return 0;
}

static void restore_std(const int saved[3])
{
	int fd;

	for (fd = 0; fd < 3; fd++) {
		if (saved[fd] < 0)
			continue;
		dup2(saved[fd], fd);
		close(saved[fd]);
	}
}

static int init_interpreter(const struct zygote *z, char *err, size_t errlen)
{
	/* The command line of a run's python3, but -c pass: nothing runs. */
	char *argv[] = { (char *)z->python, "-I", "-c", "pass", NULL };
	PyConfig config;
	PyStatus st;
	int saved[3];

	if (canonical_std(saved) != 0) {
		snprintf(err, errlen, "cannot make the start-up fds: %s", strerror(errno));
		return -1;
	}
	PyConfig_InitPythonConfig(&config);
	st = PyConfig_SetBytesArgv(&config, 4, argv);
	if (!PyStatus_Exception(st))
		st = Py_InitializeFromConfig(&config);
	PyConfig_Clear(&config);
	restore_std(saved);
	if (PyStatus_Exception(st)) {
		snprintf(err, errlen, "the interpreter did not start: %s%s%s",
			 st.func ? st.func : "", st.func ? ": " : "",
			 st.err_msg ? st.err_msg : "error");
		return -1;
	}
	return 0;
}

/* --preload: each module imported; a failure is reported and the next one is tried. */
static int preload(const struct zygote *z, struct strv *lines)
{
	char name[256], why[512], line[1024];
	const char *s = z->preload;

	while (s && *s) {
		size_t n = strcspn(s, ",");
		PyObject *m;

		if (n > 0 && n < sizeof name) {
			memcpy(name, s, n);
			name[n] = '\0';
			m = PyImport_ImportModule(name);
			if (m) {
				Py_DECREF(m);
			} else {
				exception_line(why, sizeof why);
				snprintf(line, sizeof line, "preload-failed %s %s", name, why);
				if (strv_add(lines, line) != 0)
					return -1;
			}
		}
		s += n;
		if (*s == ',')
			s++;
	}
	return 0;
}

static PyObject *attr_of(const char *module, const char *name)
{
	PyObject *m = PyImport_ImportModule(module), *a;

	if (!m)
		return NULL;
	a = PyObject_GetAttrString(m, name);
	Py_DECREF(m);
	return a;
}

/* sys.path_hooks as Python's start-up leaves it, unchanged by the preloaded modules. */
static int standard_hooks(void)
{
	PyObject *hooks = PySys_GetObject("path_hooks"), *zip, *name;
	int r;

	if (!hooks || !PyList_Check(hooks) || PyList_GET_SIZE(hooks) != 2)
		return 0;
	zip = attr_of("zipimport", "zipimporter");
	name = PyObject_GetAttrString(PyList_GET_ITEM(hooks, 1), "__qualname__");
	r = zip && PyList_GET_ITEM(hooks, 0) == zip && name && PyUnicode_Check(name) &&
	    PyUnicode_CompareWithASCIIString(name,
		"FileFinder.path_hook.<locals>.path_hook_for_FileFinder") == 0;
	Py_XDECREF(zip);
	Py_XDECREF(name);
	PyErr_Clear();
	return r;
}

/* What each run uses, found once here. */
static int prepare_run_state(const struct zygote *z)
{
	static const char *const names[3] = { "stdin", "stdout", "stderr" };
	PyObject *code, *globals, *time, *name;
	int i;

	code = Py_CompileString(stream_src, "<corral-zygote>", Py_file_input);
	globals = PyDict_New();
	if (!code || !globals || PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()))
		return -1;
	Py_XDECREF(PyEval_EvalCode(code, globals, globals));
	Py_DECREF(code);
	py.stream = PyDict_GetItemString(globals, "stream");
	Py_XINCREF(py.stream);
	py.reseed = PyDict_GetItemString(globals, "reseed");
	Py_XINCREF(py.reseed);
	Py_DECREF(globals);
	if (!py.stream || !py.reseed)
		return -1;
	/* The start-up fds were valid (canonical_std): all three streams exist. */
	for (i = 0; i < 3; i++) {
		PyObject *s = PySys_GetObject(names[i]);

		if (!s || s == Py_None)
			return -1;
		Py_INCREF(s);
		py.std[i] = s;
		py.encodings[i][0] = PyObject_GetAttrString(s, "encoding");
		py.encodings[i][1] = PyObject_GetAttrString(s, "errors");
		if (!py.encodings[i][0] || !py.encodings[i][1])
			return -1;
	}
	py.environ = attr_of("posix", "environ");
	py.extra_env = start_up_env(z);
	py.tz = env_get(z->env, "TZ");
	name = PyUnicode_FromString("time");
	time = name ? PyImport_GetModule(name) : NULL;  /* imported by a preloaded module */
	Py_XDECREF(name);
	if (time) {
		py.tzset = PyObject_GetAttrString(time, "tzset");
		Py_DECREF(time);
	}
	py.builtins = PyImport_ImportModule("builtins");
	py.builtin_importer = attr_of("_frozen_importlib", "BuiltinImporter");
	py.source_loader = attr_of("_frozen_importlib_external", "SourceFileLoader");
	py.sourceless_loader = attr_of("_frozen_importlib_external", "SourcelessFileLoader");
	py.threading = PyUnicode_InternFromString("threading");
	py.exitfuncs = attr_of("atexit", "_run_exitfuncs");
	py.thread_count = attr_of("_thread", "_count");
	py.get_objects = attr_of("gc", "get_objects");
	py.standard_hooks = standard_hooks();
	if (!py.environ || !PyDict_Check(py.environ) || !py.extra_env || !py.builtins ||
	    !py.builtin_importer ||
	    !py.source_loader || !py.sourceless_loader || !py.threading || !py.exitfuncs ||
	    !py.thread_count || !py.get_objects)
		return -1;
	PyErr_Clear();
	return 0;
}

/* Everything made so far goes to the collector's permanent generation. */
static int freeze(void)
{
	PyObject *r;

	r = PyObject_CallMethod(PyImport_AddModule("gc"), "collect", NULL);
	Py_XDECREF(r);
	if (!r)
		return -1;
	r = PyObject_CallMethod(PyImport_AddModule("gc"), "freeze", NULL);
	Py_XDECREF(r);
	if (!r)
		return -1;
	return py_frozen_mark();
}

int py_start(const struct zygote *z, struct strv *lines, char *err, size_t errlen)
{
	PyObject *warm, *gc;
	int s;

	if (set_environment(z) != 0) {
		snprintf(err, errlen, "cannot set the environment: %s", strerror(errno));
		return -1;
	}
	if (init_interpreter(z, err, errlen) != 0)
		return -1;
	/* As a fresh python3 leaves them (main.c reset them all first). */
	for (s = 1; s < NSIG; s++)
		sigaction(s, NULL, &py.sig[s]);
	gc = PyImport_ImportModule("gc");
	if (!gc)
		return fail(err, errlen, "gc");
	Py_DECREF(gc);
	if (preload(z, lines) != 0) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	/* The parser and compiler's first use is slow: pay it here. */
	warm = Py_CompileString("def f(a, *b, **c):\n    return [x for x in b if x]\n",
				"<warm>", Py_file_input);
	if (!warm)
		return fail(err, errlen, "compile");
	Py_DECREF(warm);
	if (prepare_run_state(z) != 0)
		return fail(err, errlen, "the run state");
	if (freeze() != 0)
		return fail(err, errlen, "gc.freeze");
	return 0;
}

/* ---- A: the run's arguments ---- */

int py_check_run(const struct zygote *z, const struct plan *p, char *err, size_t errlen)
{
	size_t i;

	if (strcmp(p->program, z->python) != 0) {
		snprintf(err, errlen, "the run asks for PROGRAM %.200s but this zygote's interpreter "
			 "is %.200s", p->program, z->python);
		return -1;
	}
	/* python3 -I FILE [ARGS...] or python3 -I -c COMMAND [ARGS...] */
	if (p->nargs < 3 || strcmp(p->args[1], "-I") != 0 ||
	    (p->args[2][0] == '-' && strcmp(p->args[2], "-c") != 0) ||
	    (strcmp(p->args[2], "-c") == 0 && p->nargs < 4)) {
		snprintf(err, errlen, "the interpreter's options %.60s %.60s are not supported: "
			 "the zygote runs only `%.200s -I FILE [ARGS...]` and `... -I -c COMMAND "
			 "[ARGS...]` (run other options with corral-launch)",
			 p->nargs > 1 ? p->args[1] : "", p->nargs > 2 ? p->args[2] : "", z->python);
		return -1;
	}
	for (i = 0; i < sizeof locale_vars / sizeof locale_vars[0]; i++) {
		const char *want = env_get(z->env, locale_vars[i]);
		const char *got = env_get(p->env, locale_vars[i]);

		if ((want || got) && (!want || !got || strcmp(want, got) != 0)) {
			snprintf(err, errlen, "the run's %s is %s%.100s%s but the interpreter started "
				 "with %s%.100s%s (Python reads it at start-up): start the zygote with "
				 "the same --env %s", locale_vars[i], got ? "'" : "", got ? got : "unset",
				 got ? "'" : "", want ? "'" : "", want ? want : "unset", want ? "'" : "",
				 locale_vars[i]);
			return -1;
		}
	}
	return 0;
}

/* ---- C: the program ---- */

/* CPython's flush_std_files() (Python/pylifecycle.c): -1 when a flush failed (exit 120). */
static int file_is_closed(PyObject *f)
{
	PyObject *c = PyObject_GetAttrString(f, "closed");
	int r;

	if (!c) {
		PyErr_Clear();
		return 0;
	}
	r = PyObject_IsTrue(c);
	Py_DECREF(c);
	if (r < 0)
		PyErr_Clear();
	return r > 0;
}

static int flush_std_files(void)
{
	PyObject *out = PySys_GetObject("stdout"), *err = PySys_GetObject("stderr"), *r;
	int status = 0;

	if (out && out != Py_None && !file_is_closed(out)) {
		r = PyObject_CallMethod(out, "flush", NULL);
		if (!r) {
			PyErr_WriteUnraisable(out);
			status = -1;
		}
		Py_XDECREF(r);
	}
	if (err && err != Py_None && !file_is_closed(err)) {
		r = PyObject_CallMethod(err, "flush", NULL);
		if (!r) {
			PyErr_Clear();
			status = -1;
		}
		Py_XDECREF(r);
	}
	return status;
}

/* CPython's flush_io() (Python/pythonrun.c), after the main code. */
static void flush_io(void)
{
	PyObject *type, *value, *tb, *f, *r;
	const char *names[2] = { "stderr", "stdout" };
	int i;

	PyErr_Fetch(&type, &value, &tb);
	for (i = 0; i < 2; i++) {
		f = PySys_GetObject(names[i]);
		if (!f)
			continue;
		r = PyObject_CallMethod(f, "flush", NULL);
		if (r)
			Py_DECREF(r);
		else
			PyErr_Clear();
	}
	PyErr_Restore(type, value, tb);
}

/* pymain_err_print() (Modules/main.c): 1 and the code for a SystemExit, else the traceback. */
static int err_print(int *exitcode)
{
	int code;

	if (_Py_HandleSystemExit(&code)) {
		*exitcode = code;
		return 1;
	}
	PyErr_Print();
	return 0;
}

static int exit_err_print(void)
{
	int code = 1;

	err_print(&code);
	return code;
}

/* A run's result: the exit code, and whether a SystemExit ended it inside the code (python3 then
 * ends from PyErr_Print() through Py_Exit(), before the code's epilogue). */
struct result {
	int code;
	int sysexit;
};

/* After the program raised: a SystemExit's code, or the traceback and 1. */
static void raised(struct result *res)
{
	if (PyErr_ExceptionMatches(PyExc_SystemExit)) {
		res->sysexit = 1;
		if (!_Py_HandleSystemExit(&res->code))
			res->code = 1;
		return;
	}
	PyErr_Print();
	res->code = 1;
}

/* set_main_loader() (Python/pythonrun.c). */
static int set_main_loader(PyObject *d, PyObject *filename, PyObject *type)
{
	PyObject *loader = PyObject_CallFunction(type, "sO", "__main__", filename);
	int r;

	if (!loader)
		return -1;
	r = PyDict_SetItemString(d, "__loader__", loader);
	Py_DECREF(loader);
	return r;
}

/* maybe_pyc_file() (Python/pythonrun.c): a .pyc name, or the magic number's first half. */
static int maybe_pyc_file(FILE *fp, const char *path)
{
	size_t n = strlen(path);
	unsigned int halfmagic = (unsigned int)PyImport_GetMagicNumber() & 0xFFFF;
	unsigned char buf[2];
	int ispyc = 0;

	if (n >= 4 && strcmp(path + n - 4, ".pyc") == 0)
		return 1;
	if (ftell(fp) == 0) {
		if (fread(buf, 1, 2, fp) == 2 && ((unsigned int)buf[1] << 8 | buf[0]) == halfmagic)
			ispyc = 1;
		rewind(fp);
	}
	return ispyc;
}

/* run_pyc_file() (Python/pythonrun.c); closes fp. */
static PyObject *run_pyc_file(FILE *fp, PyObject *d)
{
	PyObject *co, *v;
	long magic = PyMarshal_ReadLongFromFile(fp);

	if (magic != PyImport_GetMagicNumber()) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_RuntimeError, "Bad magic number in .pyc file");
		fclose(fp);
		return NULL;
	}
	(void)PyMarshal_ReadLongFromFile(fp);
	(void)PyMarshal_ReadLongFromFile(fp);
	(void)PyMarshal_ReadLongFromFile(fp);
	if (PyErr_Occurred()) {
		fclose(fp);
		return NULL;
	}
	co = PyMarshal_ReadLastObjectFromFile(fp);
	fclose(fp);
	if (!co || !PyCode_Check(co)) {
		Py_XDECREF(co);
		PyErr_SetString(PyExc_RuntimeError, "Bad code object in .pyc file");
		return NULL;
	}
	_Py_UnhandledKeyboardInterrupt = 0;
	v = PyEval_EvalCode(co, d, d);
	if (!v && PyErr_Occurred() == PyExc_KeyboardInterrupt)
		_Py_UnhandledKeyboardInterrupt = 1;
	Py_DECREF(co);
	return v;
}

/* pymain_run_file_obj() (Modules/main.c) and _PyRun_SimpleFileObject() (Python/pythonrun.c). */
static void run_file(PyObject *program_name, PyObject *filename, const char *path,
		     struct result *res)
{
	PyCompilerFlags cf = _PyCompilerFlags_INIT;
	PyObject *d, *v;
	struct stat st;
	FILE *fp;
	int err;

	res->code = 0;
	if (PySys_Audit("cpython.run_file", "O", filename) < 0) {
		res->code = exit_err_print();
		return;
	}
	fp = fopen(path, "rbe");
	if (!fp) {
		err = errno;
		PySys_FormatStderr("%S: can't open file %R: [Errno %d] %s\n", program_name,
				   filename, err, strerror(err));
		res->code = 2;
		return;
	}
	if (fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
		PySys_FormatStderr("%S: %R is a directory, cannot continue\n", program_name,
				   filename);
		fclose(fp);
		res->code = 1;
		return;
	}
	if (Py_MakePendingCalls() == -1) {
		fclose(fp);
		res->code = exit_err_print();
		return;
	}
	d = py.main_dict;
	if (PyDict_SetItemString(d, "__file__", filename) < 0 ||
	    PyDict_SetItemString(d, "__cached__", Py_None) < 0) {
		fclose(fp);
		res->code = exit_err_print();
		return;
	}
	if (maybe_pyc_file(fp, path)) {
		fclose(fp);
		fp = fopen(path, "rbe");
		if (!fp) {
			fprintf(stderr, "python: Can't reopen .pyc file\n");
			res->code = 1;
			goto done;
		}
		if (set_main_loader(d, filename, py.sourceless_loader) < 0) {
			fprintf(stderr, "python: failed to set __main__.__loader__\n");
			fclose(fp);
			res->code = 1;
			goto done;
		}
		v = run_pyc_file(fp, d);
	} else {
		if (set_main_loader(d, filename, py.source_loader) < 0) {
			fprintf(stderr, "python: failed to set __main__.__loader__\n");
			fclose(fp);
			res->code = 1;
			goto done;
		}
		v = PyRun_FileExFlags(fp, path, Py_file_input, d, d, 1, &cf);
	}
	flush_io();
	if (!v) {
		raised(res);
		if (res->sysexit)
			return;         /* python3 exits from inside PyErr_Print() */
	} else {
		Py_DECREF(v);
	}
done:
	if (PyDict_DelItemString(d, "__file__"))
		PyErr_Clear();
	if (PyDict_DelItemString(d, "__cached__"))
		PyErr_Clear();
}

/* pymain_run_command() (Modules/main.c), PyRun_SimpleStringFlags() (Python/pythonrun.c). */
static void run_command(const char *command, struct result *res)
{
	PyCompilerFlags cf = _PyCompilerFlags_INIT;
	PyObject *u, *bytes, *d, *v;

	res->code = 0;
	u = PyUnicode_DecodeFSDefault(command);
	if (!u)
		goto undecodable;
	if (PySys_Audit("cpython.run_command", "O", u) < 0) {
		Py_DECREF(u);
		res->code = exit_err_print();
		return;
	}
	bytes = PyUnicode_AsUTF8String(u);
	Py_DECREF(u);
	if (!bytes)
		goto undecodable;
	cf.cf_flags |= PyCF_IGNORE_COOKIE;
	d = py.main_dict;
	v = PyRun_StringFlags(PyBytes_AsString(bytes), Py_file_input, d, d, &cf);
	Py_DECREF(bytes);
	if (v)
		Py_DECREF(v);
	else
		raised(res);
	return;
undecodable:
	PySys_WriteStderr("Unable to decode the command from the command line:\n");
	res->code = exit_err_print();
}

/* pymain_run_module("__main__") (Modules/main.c): FILE is a zip file or a directory. */
static void run_main_module(PyObject *path0, struct result *res)
{
	PyObject *sys_path = PySys_GetObject("path"), *run, *r;

	res->code = 0;
	if (!sys_path || PyList_Insert(sys_path, 0, path0) < 0) {
		res->code = exit_err_print();
		return;
	}
	if (PySys_Audit("cpython.run_module", "s", "__main__") < 0) {
		res->code = exit_err_print();
		return;
	}
	run = attr_of("runpy", "_run_module_as_main");
	if (!run) {
		fprintf(stderr, "Could not import runpy module\n");
		res->code = exit_err_print();
		return;
	}
	_Py_UnhandledKeyboardInterrupt = 0;
	r = PyObject_CallFunction(run, "sO", "__main__", Py_False);
	if (!r && PyErr_Occurred() == PyExc_KeyboardInterrupt)
		_Py_UnhandledKeyboardInterrupt = 1;
	Py_DECREF(run);
	if (r)
		Py_DECREF(r);
	else
		res->code = exit_err_print();
}

/* 1 when path is a regular file without zipimport's end-of-central-directory record ("PK\5\6")
 * in its last 64 KiB + 22 bytes, where zipimport looks for it. */
static int plain_file(const char *path)
{
	static char buf[65535 + 22];
	struct stat st;
	off_t from;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return 0;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		from = st.st_size > (off_t)sizeof buf ? st.st_size - (off_t)sizeof buf : 0;
		n = pread(fd, buf, sizeof buf, from);
		r = n >= 0 && n == st.st_size - from && !memmem(buf, (size_t)n, "PK\5\6", 4);
	}
	close(fd);
	return r;
}

/* PyImport_GetImporter(FILE) asks sys.path_hooks: zipimport's for a zip archive, importlib's
 * FileFinder for a directory; anything else gets None, which it caches in
 * sys.path_importer_cache. With only those two hooks (py.standard_hooks), a plain file gets the
 * same answer and the same cache entry here, without their Python code (zipimport reads the end
 * of the file in Python: a quarter of a hello-world run's time). */
static PyObject *get_importer(PyObject *filename, const char *path)
{
	PyObject *cache, *cached;

	if (py.standard_hooks && plain_file(path)) {
		cache = PySys_GetObject("path_importer_cache");
		if (cache && PyDict_Check(cache)) {
			cached = PyDict_GetItemWithError(cache, filename);
			if (cached) {
				Py_INCREF(cached);
				return cached;
			}
			if (!PyErr_Occurred() && PyDict_SetItem(cache, filename, Py_None) == 0)
				Py_RETURN_NONE;
		}
		PyErr_Clear();
	}
	return PyImport_GetImporter(filename);
}

/* pymain_run_python() (Modules/main.c) for `-I FILE` and `-I -c COMMAND`. */
static void run_main(const struct plan *p, struct result *res)
{
	PyObject *program_name, *filename, *importer;

	if (strcmp(p->args[2], "-c") == 0) {
		run_command(p->args[3], res);
		return;
	}
	program_name = PyUnicode_DecodeFSDefault(p->args[0]);
	filename = PyUnicode_DecodeFSDefault(p->args[2]);
	if (!program_name || !filename) {
		res->code = exit_err_print();
		return;
	}
	/* pymain_get_importer(): a zip file or a directory runs its __main__ */
	importer = get_importer(filename, p->args[2]);
	if (!importer) {
		PySys_WriteStderr("Failed checking if argv[0] is an import path entry\n");
		if (err_print(&res->code)) {
			res->sysexit = 1;
			return;
		}
	} else if (importer != Py_None) {
		Py_DECREF(importer);
		run_main_module(filename, res);
		return;
	}
	Py_XDECREF(importer);
	run_file(program_name, filename, p->args[2], res);
}

/* os.environ (its dict, posix.environ, which os.environb shares) and environ: exactly the plan's
 * --env entries (the first of a name wins, as posix.environ and getenv() have it), then what the
 * start-up set (in place, as setenv() does). The same as os.environ.clear() and an assignment per
 * name, without their Python code. */
static int setup_environ(const struct plan *p)
{
	PyObject *d = py.environ, *k, *v;
	Py_ssize_t i;
	size_t n;

	PyDict_Clear(d);
	for (n = 0; n < p->nenv; n++) {
		const char *e = p->env[n], *eq = strchr(e, '=');

		k = PyBytes_FromStringAndSize(e, eq - e);
		v = k ? PyBytes_FromString(eq + 1) : NULL;
		if (!v || (PyDict_Contains(d, k) == 0 && PyDict_SetItem(d, k, v) < 0)) {
			Py_XDECREF(k);
			Py_XDECREF(v);
			return -1;
		}
		Py_DECREF(k);
		Py_DECREF(v);
	}
	for (i = 0; i < PyList_GET_SIZE(py.extra_env); i++) {
		PyObject *kv = PyList_GET_ITEM(py.extra_env, i);

		if (PyDict_SetItem(d, PyTuple_GET_ITEM(kv, 0), PyTuple_GET_ITEM(kv, 1)) < 0)
			return -1;
	}
	if (clearenv() != 0)
		return -1;
	i = 0;
	while (PyDict_Next(d, &i, &k, &v))
		if (setenv(PyBytes_AS_STRING(k), PyBytes_AS_STRING(v), 1) != 0)
			return -1;
	return 0;
}

/* sys.argv (FILE ARGS..., or -c ARGS...: the command itself is not in it) and sys.orig_argv,
 * decoded as Python decodes its command line. */
static int setup_argv(const struct plan *p)
{
	int command = strcmp(p->args[2], "-c") == 0;
	PyObject *argv = PyList_New(0), *orig = PyList_New(0), *a;
	size_t i;
	int r = -1;

	if (!argv || !orig)
		goto out;
	for (i = 0; i < p->nargs; i++) {
		a = PyUnicode_DecodeFSDefault(p->args[i]);
		if (!a || PyList_Append(orig, a) < 0 ||
		    (i >= 2 && !(command && i == 3) && PyList_Append(argv, a) < 0)) {
			Py_XDECREF(a);
			goto out;
		}
		Py_DECREF(a);
	}
	r = PySys_SetObject("argv", argv) < 0 || PySys_SetObject("orig_argv", orig) < 0 ? -1 : 0;
out:
	Py_XDECREF(argv);
	Py_XDECREF(orig);
	return r;
}

/* The objects of the run's streams: finalizing them writes nothing (end() flushes them). */
static PyObject *run_std_objs[9];

/* sys.stdin, stdout, stderr and their __std*__: the zygote's own when the run's fd is of the
 * kind it was made for, else a new one. */
static int setup_streams(void)
{
	static const char *const names[3][2] = {
		{ "stdin", "__stdin__" }, { "stdout", "__stdout__" }, { "stderr", "__stderr__" },
	};
	static const char *const labels[3] = { "<stdin>", "<stdout>", "<stderr>" };
	struct std_kind k;
	PyObject *s;
	int fd, n = 0;

	for (fd = 0; fd < 3; fd++) {
		std_kind_of(fd, &k);
		if (std_kind_same(&k, &py.kind[fd])) {
			s = py.std[fd];
			Py_INCREF(s);
		} else {
			s = PyObject_CallFunction(py.stream, "iOsOO", fd, fd ? Py_True : Py_False,
						  labels[fd], py.encodings[fd][0], py.encodings[fd][1]);
			if (!s)
				return -1;
			if (s != Py_None) {
				PyObject *buf = PyObject_GetAttrString(s, "buffer");
				PyObject *raw = buf ? PyObject_GetAttrString(buf, "raw") : NULL;

				PyErr_Clear();
				run_std_objs[n++] = s;
				if (buf)
					run_std_objs[n++] = buf;
				if (raw)
					run_std_objs[n++] = raw;
			}
		}
		if (PySys_SetObject(names[fd][0], s) < 0 || PySys_SetObject(names[fd][1], s) < 0) {
			Py_DECREF(s);
			return -1;
		}
		Py_DECREF(s);
	}
	return 0;
}

/* A __main__ of the run's own, made as Python's start-up makes it (add_main_module()): the
 * zygote's is frozen, and a reference cycle through a frozen dict is never collected, so what
 * the program leaves in its globals (a class and its instances) would never be finalized. */
static int setup_main(void)
{
	PyObject *m = PyModule_New("__main__"), *d, *ann;
	int r;

	if (!m)
		return -1;
	d = PyModule_GetDict(m);
	ann = PyDict_New();
	r = !ann || PyDict_SetItemString(d, "__annotations__", ann) < 0 ||
	    PyDict_SetItemString(d, "__builtins__", py.builtins) < 0 ||
	    PyDict_SetItemString(d, "__loader__", py.builtin_importer) < 0 ||
	    PyDict_SetItemString(PyImport_GetModuleDict(), "__main__", m) < 0 ? -1 : 0;
	Py_XDECREF(ann);
	py.main_dict = d;       /* held by the module, in sys.modules */
	Py_DECREF(m);
	return r;
}

/* The run's environment, argv, orig_argv, standard streams, __main__ and time zone. */
static int setup_run(const struct plan *p)
{
	const char *tz = NULL;
	size_t i;

	if (setup_environ(p) != 0 || setup_argv(p) != 0 || setup_streams() != 0 ||
	    setup_main() != 0)
		return -1;
	for (i = 0; i < p->nenv; i++)
		if (strncmp(p->env[i], "TZ=", 3) == 0) {
			tz = p->env[i] + 3;
			break;
		}
	/* time read TZ when it was imported: only another TZ changes what it holds */
	if (py.tzset && (!tz != !py.tz || (tz && strcmp(tz, py.tz) != 0))) {
		PyObject *r = PyObject_CallNoArgs(py.tzset);

		Py_XDECREF(r);
		if (!r)
			return -1;
	}
	return 0;
}

/* ---- C: the end ---- */

static int is_run_stdio(PyObject *o)
{
	size_t i;

	for (i = 0; i < sizeof run_std_objs / sizeof run_std_objs[0] && run_std_objs[i]; i++)
		if (run_std_objs[i] == o)
			return 1;
	return 0;
}

static int attr_true(PyObject *o, const char *name)
{
	PyObject *a = PyObject_GetAttrString(o, name);
	int r = a ? PyObject_IsTrue(a) : -1;

	Py_XDECREF(a);
	if (r < 0)
		PyErr_Clear();
	return r;
}

static int attr_none(PyObject *o, const char *name)
{
	PyObject *a = PyObject_GetAttrString(o, name);
	int r = a ? a == Py_None : -1;

	Py_XDECREF(a);
	if (r < 0)
		PyErr_Clear();
	return r;
}

static int type_is(PyObject *o, const char *name)
{
	return strcmp(Py_TYPE(o)->tp_name, name) == 0 &&
	       !(Py_TYPE(o)->tp_flags & Py_TPFLAGS_HEAPTYPE);
}

/* An object of the io module whose finalization (closing it) writes nothing: 1; 0 when it could
 * (an open writer: it flushes), or its class is not one of io's own (whose code would run). */
static int io_quiet(PyObject *o)
{
	PyObject *inner;
	int r;

	if (type_is(o, "_io.FileIO") || type_is(o, "_io.BytesIO") || type_is(o, "_io.StringIO"))
		return 1;       /* unbuffered, or in memory */
	if (type_is(o, "_io.TextIOWrapper")) {
		inner = PyObject_GetAttrString(o, "buffer");
	} else if (type_is(o, "_io.BufferedReader") || type_is(o, "_io.BufferedWriter") ||
		   type_is(o, "_io.BufferedRandom")) {
		inner = PyObject_GetAttrString(o, "raw");
	} else {
		return 0;
	}
	if (!inner) {
		PyErr_Clear();
		return 0;
	}
	r = io_quiet(inner);
	/* a reader, or text over one: nothing to write */
	if (r && (type_is(o, "_io.BufferedReader") || type_is(inner, "_io.BufferedReader"))) {
		Py_DECREF(inner);
		return 1;
	}
	Py_DECREF(inner);
	return r && attr_true(o, "closed") == 1;
}

/* A weakref callback that can run nothing of the program's when its referent dies: a C function
 * (the caches of the abc module), the bookkeeping of weakref's containers, or a
 * weakref.finalize once the exit functions have run it (they set finalize._shutdown). */
static int callback_quiet(PyObject *cb)
{
	PyObject *mod;
	int r = 0;

	if (PyCFunction_Check(cb))
		return 1;
	if (PyFunction_Check(cb)) {
		mod = PyFunction_GetModule(cb);
		return mod && PyUnicode_Check(mod) &&
		       (PyUnicode_CompareWithASCIIString(mod, "weakref") == 0 ||
			PyUnicode_CompareWithASCIIString(mod, "_weakrefset") == 0);
	}
	mod = PyObject_GetAttrString((PyObject *)Py_TYPE(cb), "__module__");
	if (mod && PyUnicode_Check(mod) && PyUnicode_CompareWithASCIIString(mod, "weakref") == 0 &&
	    strcmp(Py_TYPE(cb)->tp_name, "finalize") == 0)
		r = attr_true(cb, "_shutdown") == 1;
	Py_XDECREF(mod);
	PyErr_Clear();
	return r;
}

/* Whether finalizing this object, made by the run, could run the program's code or write. */
static int needs_finalizer(PyObject *o)
{
	PyTypeObject *t = Py_TYPE(o);

	if (is_run_stdio(o))
		return 0;
	if (PyType_Check(o)) {
		/* A class with __del__ whose instances the collector does not track (no __dict__,
		 * no __slots__): they are not in get_objects(), so the class itself decides. */
		PyTypeObject *c = (PyTypeObject *)o;

		return (c->tp_flags & Py_TPFLAGS_HEAPTYPE) && !(c->tp_flags & Py_TPFLAGS_HAVE_GC) &&
		       (c->tp_finalize || c->tp_del);
	}
	if (t->tp_del)
		return 1;
	if (PyWeakref_Check(o)) {
		PyWeakReference *w = (PyWeakReference *)o;

		if (w->wr_callback && w->wr_object != Py_None && !callback_quiet(w->wr_callback))
			return 1;
	}
	if (!t->tp_finalize)
		return 0;
	if (PyGen_CheckExact(o))
		return attr_true(o, "gi_suspended") != 0;      /* its finally and with blocks */
	if (PyCoro_CheckExact(o))
		return attr_none(o, "cr_frame") != 1;          /* "never awaited", or finally */
	if (PyAsyncGen_CheckExact(o))
		return attr_none(o, "ag_frame") != 1;
	return !io_quiet(o);    /* io's own, or a __del__ */
}

/* 1 when Py_FinalizeEx() could show more than the fast end: a Python thread still running (a
 * daemon: it runs until the finalization stops it), objects of the run whose finalization would
 * run code (see needs_finalizer), or objects the program froze itself (out of sight). Objects
 * of C types without collector support are not seen: none of the standard library's writes when
 * finalized. */
static int needs_finalize(void)
{
	PyObject *list, *n;
	Py_ssize_t i;
	long threads;
	int r = 0;

	n = PyObject_CallNoArgs(py.thread_count);
	threads = n ? PyLong_AsLong(n) : -1;
	Py_XDECREF(n);
	if (threads != 0 || py_frozen_grew()) {
		PyErr_Clear();
		return 1;
	}
	list = PyObject_CallNoArgs(py.get_objects);
	if (!list) {
		PyErr_Clear();
		return 1;
	}
	for (i = 0; i < PyList_GET_SIZE(list) && !r; i++)
		r = needs_finalizer(PyList_GET_ITEM(list, i));
	Py_DECREF(list);
	PyErr_Clear();
	return r;
}

/* What the finalization's deallocation of the run's standard streams writes: the buffered data
 * of each one still open, whatever sys names now (the program may have replaced or deleted
 * sys.stdout, leaving its output in the old one's buffer). Errors are ignored, as by dealloc. */
static void flush_run_streams(void)
{
	PyObject *objs[3 + sizeof run_std_objs / sizeof run_std_objs[0]], *r;
	size_t i, n = 0;

	for (i = 1; i < 3; i++)
		if (py.std[i])
			objs[n++] = py.std[i];
	for (i = 0; i < sizeof run_std_objs / sizeof run_std_objs[0] && run_std_objs[i]; i++)
		objs[n++] = run_std_objs[i];
	for (i = 0; i < n; i++) {
		if (file_is_closed(objs[i]))
			continue;
		r = PyObject_CallMethod(objs[i], "flush", NULL);
		Py_XDECREF(r);
		PyErr_Clear();
	}
}

/* exit_sigint() (Modules/main.c): an uncaught KeyboardInterrupt ends python3 by SIGINT. */
static NORETURN void exit_sigint(void)
{
	sigset_t set;

	signal(SIGINT, SIG_DFL);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_UNBLOCK, &set, NULL);
	kill(getpid(), SIGINT);
	_exit(SIGINT + 128);
}

/* Ends the run as Py_RunMain() / Py_Exit() end python3: the non-daemon threads joined, the atexit
 * functions, sys.stdout and sys.stderr flushed (exit 120 when that fails); then, when nothing
 * else could happen in the interpreter's finalization, _exit() at once: finalizing would tear
 * down every object the zygote made (a write to each: most of its memory copied into this
 * process) for nothing to see. Otherwise Py_FinalizeEx() itself. */
static NORETURN void end(int code)
{
	PyObject *m, *r;
	int status, i;

	/* wait_for_thread_shutdown() (Python/pylifecycle.c) */
	m = PyImport_GetModule(py.threading);
	if (m) {
		r = PyObject_CallMethod(m, "_shutdown", NULL);
		if (!r)
			PyErr_WriteUnraisable(m);
		Py_XDECREF(r);
		Py_DECREF(m);
	}
	PyErr_Clear();
	/* _PyAtExit_Call() */
	r = PyObject_CallNoArgs(py.exitfuncs);
	Py_XDECREF(r);
	PyErr_Clear();
	if (needs_finalize()) {
		/* The zygote's own streams, when the run has them, must be sys's alone: the
		 * finalization deallocates them after the last finalizer ran, and their close()
		 * writes out what that finalizer printed into the buffer. */
		for (i = 0; i < 3; i++)
			Py_CLEAR(py.std[i]);
		status = Py_FinalizeEx();
	} else {
		status = flush_std_files();
		flush_run_streams();
		fflush(stdout);
		fflush(stderr);
	}
	if (status < 0)
		code = 120;
	if (_Py_UnhandledKeyboardInterrupt)
		exit_sigint();
	_exit(code & 0xff);
}

/* The generators seeded once in Z that Python's own at-fork handlers leave alone (numpy's):
 * reseeded, or the run does not start (it would draw the numbers every run draws). */
static void reseed(void)
{
	PyObject *r = PyObject_CallNoArgs(py.reseed);

	if (!r) {
		dprintf(STDERR_FILENO, "corral-zygote: a preloaded random generator could not be "
			"reseeded:\n");
		PyErr_Print();
		_exit(1);
	}
	Py_DECREF(r);
}

/* Every fd above 2 closed but keep_a and keep_b (-1: none). */
static void close_fds_but(int keep_a, int keep_b)
{
	int lo = keep_a < keep_b ? keep_a : keep_b, hi = keep_a < keep_b ? keep_b : keep_a;

	if (lo < 3) {
		lo = hi;
		hi = -1;
	}
	if (lo < 3) {
		close_fds(3, -1);
		return;
	}
	if (lo > 3)
		close_fds(3, lo - 1);
	if (hi > lo) {
		if (hi > lo + 1)
			close_fds(lo + 1, hi - 1);
		close_fds(hi + 1, -1);
	} else {
		close_fds(lo + 1, -1);
	}
}

/* --prestart: C was forked ahead of its run, and waits here for it: the host writes one byte on
 * the report socket when the run's code is in place. EOF: the launch was let go; C exits as the
 * launcher does then (125), and nothing runs. */
static void await_run(const struct plan *p)
{
	char b;
	ssize_t n;

	if (!p->prestart)
		return;
	do
		n = read(report_get_fd(), &b, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		_exit(EXIT_SETUP);
}

/* --prestart, while no run waits (its byte is not there yet): the parser and compiler run once on
 * a small program, so that the pages they write are this process's own copies (copied from Z,
 * a fault each) before the run's code comes. A run that already waits goes first: back to back,
 * that work would be on its path. */
/* The way the run's file goes (run_file): a small program read through a FILE, with its
 * __loader__ and the .pyc check, compiled and run in a dictionary of its own (it prints strings
 * to /dev/null: where the policy does not let it open that, it stops there), then the standard
 * streams flushed (nothing is written: their buffers are empty). The program only binds names
 * in that dictionary, which goes with it; what stays is what any first print() with a keyword
 * leaves (the keywords' tuple of its argument parser). A back-to-back run finds its byte there
 * first and skips it (poll). Measured (ftrace, the program from its byte to its exit, two
 * alternating series of 150 after 5 ms pauses): 162-179 us against 266-296 us with the compile
 * alone. */
static void rehearse_file(void)
{
	static const char src[] =
		"x = ' '.join([str(i) for i in range(3)])\n"
		"with open('/dev/null', 'w') as f:\n"
		"    print(x, 'y', file=f)\n";
	FILE *fp = fmemopen((void *)src, sizeof src - 1, "r");
	PyObject *g, *v;

	if (!fp)
		return;
	g = PyDict_New();
	if (!g) {
		fclose(fp);
		PyErr_Clear();
		return;
	}
	/* its __loader__, as set_main_loader() makes the run's, into that dictionary */
	v = PyUnicode_FromString("<prestart>");
	if (v) {
		set_main_loader(g, v, py.source_loader);
		Py_DECREF(v);
	}
	PyErr_Clear();
	(void)maybe_pyc_file(fp, "<prestart>");
	v = PyRun_FileExFlags(fp, "<prestart>", Py_file_input, g, g, 1, NULL);
	Py_XDECREF(v);
	Py_DECREF(g);
	PyErr_Clear();
	flush_io();
}

static void rehearse(void)
{
	struct pollfd pf = { report_get_fd(), POLLIN, 0 };
	PyObject *c;

	if (poll(&pf, 1, 0) != 0)
		return;
	c = Py_CompileString("import sys\nx = [str(i) for i in range(3)]\nprint(x, 'y', file=None, end='')\n",
			     "<prestart>", Py_file_input);
	Py_XDECREF(c);
	PyErr_Clear();
	if (poll(&pf, 1, 0) == 0)
		rehearse_file();
}

NORETURN void py_run_program(const struct launch *L, int errfd)
{
	const struct plan *p = L->plan;
	struct result res = { 0, 0 };
	int s, ready;

	if (L->direct)
		program_rseq_again();   /* P, our parent, shared the zygote's memory */
	/* The process as execve() would leave it (exec.c); a failure is the launcher's exec one. */
	if (exec_like(p) != 0)
		child_die(errfd, W_EXEC, errno);
	/* No fd of the launcher's reaches the program. Before the interpreter's state is made, every
	 * one but the report socket (the run's byte comes on it) and the pipe whose EOF tells the
	 * supervisor the program runs (as after an execve): those two go after the wait. */
	close_fds_but(report_get_fd(), errfd);
	/* The interpreter's state for the run, which does not depend on the code: with --prestart,
	 * before the run comes. */
	PyOS_AfterFork_Child();
	reseed();
	ready = setup_run(p) == 0;
	if (p->prestart)
		rehearse();
	await_run(p);
	close(report_get_fd());
	close(errfd);
	exec_dumpable();        /* after the fds are closed, not before */
	/* Python's own dispositions (SIGINT: KeyboardInterrupt) only now: a signal during the wait
	 * must not reach the run's code. Every one is the default here (child_run reset them all):
	 * only those Python changed are set, two or three calls instead of 62. */
	for (s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP &&
		    (py.sig[s].sa_handler != SIG_DFL || py.sig[s].sa_flags & SA_SIGINFO))
			sigaction(s, &py.sig[s], NULL);
	if (!ready) {
		PyErr_Print();
		_exit(1);
	}
	run_main(p, &res);
	end(res.code);
}
