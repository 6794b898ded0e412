/* notify.h -- the systemd notification protocol (sd_notify), written out:
 * a datagram to the unix socket named by $NOTIFY_SOCKET. The daemons send
 * READY=1 once serving, STOPPING=1 on shutdown and WATCHDOG=1 on their
 * heartbeat, so deploy/systemd units can use Type=notify and WatchdogSec.
 * Without $NOTIFY_SOCKET every call does nothing. */
#ifndef REEL_BASE_NOTIFY_H
#define REEL_BASE_NOTIFY_H

#ifdef __cplusplus
extern "C" {
#endif

/* Sends `state` (e.g. "READY=1\nSTATUS=serving"). Returns 1 when sent, 0
 * when no manager listens ($NOTIFY_SOCKET unset), -1 on a send failure
 * (errno set); never blocks. */
int reel_notify(const char *state);

#ifdef __cplusplus
}
#endif
#endif
