/* notify.c -- sd_notify without libsystemd (see notify.h). */
#include "notify.h"
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int reel_notify(const char *state) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path) return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@')) {
        errno = EINVAL;
        return -1;
    }
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@') sa.sun_path[0] = '\0'; /* abstract namespace */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, len);
    int e = errno;
    close(fd);
    errno = e;
    return w < 0 ? -1 : 1;
}
