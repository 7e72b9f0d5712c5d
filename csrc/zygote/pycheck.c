/* pycheck.c: whether the interpreter can run what a run asks for (its PROGRAM, the
 * interpreter's options, the locale it started with). A usage error otherwise, as the launcher
 * writes its own.
 */
#include "python.h"

#include <stdio.h>
#include <string.h>

/* The locale variables Python's start-up reads (setlocale(LC_CTYPE, "")); a run must have the
 * values the zygote started with. Under -I no PYTHON* variable is read. */
static const char *const locale_vars[] = { "LC_ALL", "LC_CTYPE", "LANG" };

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
		const char *want = py_env_get(z->env, locale_vars[i]);
		const char *got = py_env_get(p->env, locale_vars[i]);

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
