/* protocol.h: the words of corral-zygote's protocol, shared by both ends (csrc/zygote, and the
 * host's csrc/core/zygote.c). Every message is a sequence of NUL-terminated strings, one
 * SOCK_SEQPACKET message each; the first string is one of these words. The full description is
 * in docs/internals.md, section "Protocol".
 *
 * On the control socket, between the host and the zygote:
 *   zygote -> host  ready LINE...       once, when the interpreter is warm ...
 *                   failed MESSAGE      ... or why it is not (then it exits)
 *   host -> zygote  run ID ARG...       + SCM_RIGHTS: the run's stdin, stdout, stderr, report
 *   zygote -> host  pid ID PID          the run's process started (+ a direct run's pidfd)
 *                   ended ID STATUS     a direct run's program ended; its init exits next
 *                   exit ID STATUS      the run's process was reaped (a raw wait status)
 *                   error ID MESSAGE    the request could not be started
 *
 * On a run's own socket, on the spawner path, between the run's init and the zygote:
 *   init -> zygote  fork MASK RFD CG MOUNTS ID ARG...   + SCM_RIGHTS (program.c)
 *   zygote -> init  forked PID          the program's pid in the run's PID namespace ...
 *                   failed ERRNO        ... or why it could not be forked
 */
#ifndef CORRAL_ZYGOTE_PROTOCOL_H
#define CORRAL_ZYGOTE_PROTOCOL_H

#define ZP_READY  "ready"
#define ZP_FAILED "failed"
#define ZP_RUN    "run"
#define ZP_PID    "pid"
#define ZP_ENDED  "ended"
#define ZP_EXIT   "exit"
#define ZP_ERROR  "error"
#define ZP_FORK   "fork"
#define ZP_FORKED "forked"

#endif
