/* fuzz/replay.c: a main() for a fuzz harness without libFuzzer, so the committed corpus and the
 * inputs that once crashed (fuzz/regress/) replay in `make test` with any compiler that has the
 * sanitizers (gcc -fsanitize=address,undefined).
 *
 *   replay FILE|DIR...   runs each file (each regular file of a directory, sorted) once;
 *                        exits 0 when every one returned, 1 when one could not be read (a
 *                        violated invariant aborts, a sanitizer report exits non-zero)
 */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Defined by the harnesses that need it. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = NULL, *copy;
	size_t len = 0, cap = 0, got;

	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	for (;;) {
		if (len == cap) {
			unsigned char *nb;

			cap = cap ? 2 * cap : 4096;
			nb = realloc(buf, cap);
			if (!nb)
				abort();
			buf = nb;
		}
		got = fread(buf + len, 1, cap - len, f);
		if (got == 0)
			break;
		len += got;
	}
	if (ferror(f)) {
		fprintf(stderr, "replay: %s: read error\n", path);
		fclose(f);
		free(buf);
		return -1;
	}
	fclose(f);
	/* an exact-size copy, as libFuzzer passes it: a read past the end is a report */
	copy = malloc(len ? len : 1);
	if (!copy)
		abort();
	if (len)
		memcpy(copy, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(copy, len);
	free(copy);
	return 0;
}

static int cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char **names = NULL;
	size_t n = 0, i;
	int rc = 0;

	if (!d) {
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	while ((e = readdir(d)) != NULL) {
		char **nn;

		if (e->d_name[0] == '.')
			continue;
		nn = realloc(names, (n + 1) * sizeof *names);
		if (!nn)
			abort();
		names = nn;
		names[n] = malloc(strlen(dir) + strlen(e->d_name) + 2);
		if (!names[n])
			abort();
		sprintf(names[n], "%s/%s", dir, e->d_name);
		n++;
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof *names, cmp);
	for (i = 0; i < n; i++) {
		struct stat st;

		if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode) && run_file(names[i]) != 0)
			rc = -1;
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	int i, rc = 0;

	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	for (i = 1; i < argc; i++) {
		struct stat st;

		if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
			rc |= run_dir(argv[i]);
		else
			rc |= run_file(argv[i]);
	}
	return rc ? 1 : 0;
}
