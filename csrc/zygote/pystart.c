/* pystart.c: the interpreter in the zygote.
 *
 * py_start() initialises it exactly as `python3 -I FILE` started by the launcher would be
 * (isolated mode, buffered stdio, sys.path, sys.prefix, sys.executable, sys.flags, the locale,
 * UTF-8 mode and the encodings of the same start-up environment), imports the preloaded modules,
 * runs the compiler once, and freezes everything it made (gc.freeze(): the collector of a run
 * never walks, and so never writes to, the zygote's objects, which the runs share with the
 * zygote until they write to them).
 */
#include "python.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

struct py_state py;

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
	/* numpy.random's global generator is seeded once, at import: the program reseeds it, once,
	 * after the fork (random reseeds its own in its at-fork handler). Not an at-fork handler:
	 * the program's own forks must not reseed it, as python3's do not. */
	"def reseed():\n"
	"    m = _sys.modules.get('numpy.random')\n"
	"    if m is not None:\n"
	"        m.seed()\n";


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

const char *py_env_get(char *const *env, const char *name)
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

PyObject *py_attr_of(const char *module, const char *name)
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
	zip = py_attr_of("zipimport", "zipimporter");
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
	py.environ = py_attr_of("posix", "environ");
	py.extra_env = start_up_env(z);
	py.tz = py_env_get(z->env, "TZ");
	name = PyUnicode_FromString("time");
	time = name ? PyImport_GetModule(name) : NULL;  /* imported by a preloaded module */
	Py_XDECREF(name);
	if (time) {
		py.tzset = PyObject_GetAttrString(time, "tzset");
		Py_DECREF(time);
	}
	py.builtins = PyImport_ImportModule("builtins");
	py.builtin_importer = py_attr_of("_frozen_importlib", "BuiltinImporter");
	py.source_loader = py_attr_of("_frozen_importlib_external", "SourceFileLoader");
	py.sourceless_loader = py_attr_of("_frozen_importlib_external", "SourcelessFileLoader");
	py.threading = PyUnicode_InternFromString("threading");
	py.exitfuncs = py_attr_of("atexit", "_run_exitfuncs");
	py.thread_count = py_attr_of("_thread", "_count");
	py.get_objects = py_attr_of("gc", "get_objects");
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
	if (z->flush_handlers && py_flush_handlers() != 0)
		return fail(err, errlen, "--flush-handlers");
	/* As a fresh python3 leaves them (main.c reset them all first), with the flush handlers:
	 * what each program gets. The zygote's own stay the default. */
	for (s = 1; s < NSIG; s++)
		sigaction(s, NULL, &py.sig[s]);
	if (z->flush_handlers) {
		signal(SIGXCPU, SIG_DFL);
		signal(FLUSH_SIGNAL, SIG_DFL);
	}
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
	/* --command: what run_command() would compile for each run, once (the code object is
	 * immutable; a run only counts references to it) */
	if (z->command) {
		PyCompilerFlags cf = _PyCompilerFlags_INIT;

		cf.cf_flags |= PyCF_IGNORE_COOKIE;
		py.command_code = Py_CompileStringExFlags(z->command, "<string>", Py_file_input, &cf, -1);
		if (!py.command_code)
			return fail(err, errlen, "--command");
		py.command = z->command;
	}
	if (prepare_run_state(z) != 0)
		return fail(err, errlen, "the run state");
	if (freeze() != 0)
		return fail(err, errlen, "gc.freeze");
	return 0;
}
