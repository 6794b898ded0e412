/* sha256.c -- SHA-256 digests in hex (see sha256.h). */
#include "schema/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/error.h"

static void to_hex(const unsigned char d[crypto_hash_sha256_BYTES], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < crypto_hash_sha256_BYTES; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}

/* sodium_init is idempotent and thread-safe; sha256 needs nothing it could
 * fail to set up (no randomness), so its result only picks implementations. */
static void sodium_ready(void) {
    int r = sodium_init();
    (void)r;
}

void reel_sha256_parts(const void *const *p, const size_t *len, int n, char hex[65]) {
    sodium_ready();
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    for (int i = 0; i < n; i++) crypto_hash_sha256_update(&st, p[i], (unsigned long long)len[i]);
    unsigned char d[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&st, d);
    to_hex(d, hex);
}

void reel_sha256_buf(const void *p, size_t len, char hex[65]) { reel_sha256_parts(&p, &len, 1, hex); }

int reel_sha256_fd(int fd, char hex[65]) {
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) return kern_fail("out of memory");
    sodium_ready();
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    for (;;) {
        ssize_t n = read(fd, buf, CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            return kern_fail("read: %s", strerror(e));
        }
        if (n == 0) break;
        crypto_hash_sha256_update(&st, buf, (unsigned long long)n);
    }
    free(buf);
    unsigned char d[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&st, d);
    to_hex(d, hex);
    return 0;
}

int reel_sha256_file(const char *path, char hex[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kern_fail("%s: %s", path, strerror(errno));
    int rc = reel_sha256_fd(fd, hex);
    close(fd);
    if (rc != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", kern_error()); /* kern_fail writes where kern_error reads */
        return kern_fail("%s: %s", path, why);
    }
    return 0;
}

struct reel_sha256 {
    crypto_hash_sha256_state st;
};

reel_sha256_t *reel_sha256_new(void) {
    reel_sha256_t *h = malloc(sizeof *h);
    if (!h) return NULL;
    sodium_ready();
    crypto_hash_sha256_init(&h->st);
    return h;
}

void reel_sha256_update(reel_sha256_t *h, const void *p, size_t len) {
    crypto_hash_sha256_update(&h->st, p, (unsigned long long)len);
}

void reel_sha256_final(reel_sha256_t **h, char hex[65]) {
    unsigned char d[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&(*h)->st, d);
    to_hex(d, hex);
    reel_sha256_free(h);
}

void reel_sha256_free(reel_sha256_t **h) {
    if (!h || !*h) return;
    free(*h);
    *h = NULL;
}
