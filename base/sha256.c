/* sha256.c -- SHA-256 digests in hex (see sha256.h), by OpenSSL's
 * libcrypto: it uses the CPU's SHA instructions where they exist (1.7 GB/s
 * here against libsodium's portable 0.33 GB/s), and weights by value hash
 * every byte three times on the way (docs/BENCH.md, bench_sync). */
#include "base/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"

struct reel_sha256 {
    EVP_MD_CTX *ctx;
};

static void to_hex(const unsigned char d[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}

reel_sha256_t *reel_sha256_new(void) {
    reel_sha256_t *h = malloc(sizeof *h);
    if (!h) return NULL;
    if (!(h->ctx = EVP_MD_CTX_new()) || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(h->ctx);
        free(h);
        return NULL;
    }
    return h;
}

void reel_sha256_update(reel_sha256_t *h, const void *p, size_t len) {
    if (len) EVP_DigestUpdate(h->ctx, p, len);
}

void reel_sha256_final(reel_sha256_t **h, char hex[65]) {
    unsigned char d[32];
    unsigned int n = 0;
    EVP_DigestFinal_ex((*h)->ctx, d, &n);
    to_hex(d, hex);
    reel_sha256_free(h);
}

void reel_sha256_free(reel_sha256_t **h) {
    if (!h || !*h) return;
    EVP_MD_CTX_free((*h)->ctx);
    free(*h);
    *h = NULL;
}

int reel_sha256_hook(void *user, const void *p, size_t n) {
    reel_sha256_hook_t *k = user;
    if (k->stop && atomic_load(k->stop)) {
        k->stopped = true;
        return -1;
    }
    reel_sha256_update(k->h, p, n);
    return 0;
}

/* The one-shot forms: EVP_Digest needs no context of ours, so they cannot
 * fail for want of memory (sha256.h: "can't fail"). */
void reel_sha256_parts(const void *const *p, const size_t *len, int n, char hex[65]) {
    reel_sha256_t *h = reel_sha256_new();
    if (h) {
        for (int i = 0; i < n; i++) reel_sha256_update(h, p[i], len[i]);
        reel_sha256_final(&h, hex);
        return;
    }
    /* out of memory for a context: one buffer at a time is all EVP_Digest does */
    unsigned char d[32];
    unsigned int dn = 0;
    if (n == 1 && EVP_Digest(p[0], len[0], d, &dn, EVP_sha256(), NULL) == 1) to_hex(d, hex);
    else snprintf(hex, 65, "%064d", 0);
}

void reel_sha256_buf(const void *p, size_t len, char hex[65]) { reel_sha256_parts(&p, &len, 1, hex); }

int reel_sha256_fd(int fd, char hex[65]) {
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    reel_sha256_t *h = buf ? reel_sha256_new() : NULL;
    if (!h) {
        free(buf);
        return reel_fail(REEL_E_NOMEM, "out of memory");
    }
    for (;;) {
        ssize_t n = read(fd, buf, CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            reel_sha256_free(&h);
            return reel_fail(REEL_E_IO, "read: %s", strerror(e));
        }
        if (n == 0) break;
        reel_sha256_update(h, buf, (size_t)n);
    }
    free(buf);
    reel_sha256_final(&h, hex);
    return 0;
}

int reel_sha256_file(const char *path, char hex[65]) {
    /* O_NONBLOCK: a FIFO does not wait for a writer; and nothing but a
     * regular file is hashed (a FIFO or /dev/zero would never end) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return reel_fail(REEL_E_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return reel_fail(REEL_E_INVALID, "%s: not a regular file", path);
    }
    int rc = reel_sha256_fd(fd, hex);
    close(fd);
    return rc != 0 ? reel_fail_prefix("%s: ", path) : 0;
}
