/* filters.c: the seccomp filters the zygote keeps, one per distinct deny list.
 *
 * Building a filter with libseccomp costs more than the rest of a run's set-up, so the zygote
 * builds each distinct one once (FILTERS_MAX kept, the oldest replaced) and, before it starts a
 * program, copies the run's back into seccomp.c's state, where child_run() loads it.
 */
#include "zygote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FILTERS_MAX 16          /* distinct seccomp filters kept */

struct filter {
	char *key;
	void *state;
};

static struct filter filters[FILTERS_MAX];
static size_t nfilters, next_filter;
static struct filter *loaded;   /* the one in seccomp.c's state now */

/* What seccomp_prepare() builds from: the sockets and pipes rules and the names, in order. */
static char *filter_key(const struct plan *p, int sockets)
{
	size_t i, len = 6;
	char *k, *e;

	for (i = 0; i < p->ndeny_syscall; i++)
		len += strlen(p->deny_syscall[i]) + 1;
	k = malloc(len);
	if (!k)
		return NULL;
	e = k + sprintf(k, "%d%d%d", sockets, p->unix_pairs, p->deny_pipe_growth);
	for (i = 0; i < p->ndeny_syscall; i++)
		e += sprintf(e, " %s", p->deny_syscall[i]);
	return k;
}

/* In the zygote, before the fork of the program: the filter of this plan in seccomp.c's state,
 * built once. */
void filters_load(const struct zygote *z, const struct plan *p, int own_net)
{
	struct launch L;
	struct filter *f;
	char *key;
	size_t i;

	launch_init(&L);
	L.plan = p;
	L.netns = z->ns.net_got || own_net;
	L.net_shared = z->ns.net_got && !own_net;    /* the others share the zygote's */
	key = filter_key(p, p->deny_sockets == 1 ||
				(p->deny_sockets == 2 && (!L.netns || L.net_shared)));
	for (i = 0; key && i < nfilters; i++) {
		if (strcmp(filters[i].key, key) == 0) {
			if (loaded != &filters[i])
				seccomp_state_load(filters[i].state);
			loaded = &filters[i];
			free(key);
			return;
		}
	}
	seccomp_prepare(&L);
	loaded = NULL;
	if (!key)
		return;
	f = &filters[next_filter];
	next_filter = (next_filter + 1) % FILTERS_MAX;
	if (f->key) {
		free(f->key);
		free(f->state);
	} else {
		nfilters++;
	}
	f->key = key;
	f->state = malloc(seccomp_state_size());
	if (f->state) {
		seccomp_state_save(f->state);
		loaded = f;
	} else {
		free(f->key);
		f->key = NULL;
		nfilters--;
	}
}
