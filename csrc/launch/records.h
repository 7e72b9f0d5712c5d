/* records.h: the words of the records a run's collection is written in (docs/files.md), shared by
 * their writer, the supervisor (csrc/launch/workspace.c), and their reader in the host
 * (csrc/core/records.c). A session's kernel writes the same records (lua/corral/kernel.lua).
 *
 * A record: KIND \0 PATH \0 SIZE \0 MODE \0 STORED \0 and STORED bytes (SIZE and STORED in
 * decimal, MODE in octal); the last: REC_END \0 SEEN \0 FLAGS \0.
 */
#ifndef CORRAL_RECORDS_H
#define CORRAL_RECORDS_H

#define REC_FILE "f"            /* a regular file: the first STORED of its SIZE bytes */
#define REC_LINK "l"            /* a symbolic link: its target, never followed */
#define REC_ERROR "e"           /* a file that could not be read: the errno name */
#define REC_GIVEN "s"           /* a regular file with the bytes it was given (--files-in at the
				 * same path): SIZE bytes, none stored (STORED is 0) */
#define REC_END "end"           /* the end: entries looked at, what cut the list short */

#endif
