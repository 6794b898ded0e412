/* fuzz_files.h -- for the harnesses whose parser reads a folder a user
 * brings (a release, a checkpoint, an adapter): the fuzz input is a small
 * archive of files, written into a fresh folder for each run and removed
 * after it.
 *
 * The archive is plain text around the files' bytes, so seeds read as
 * what they are and mutations keep the shape:
 *
 *     ==> config.json
 *     {"dim": 4, ...}
 *     ==> transformer/diffusion_pytorch_model.safetensors
 *     <bytes>
 *
 * Each file starts at a line "==> NAME" (the first at the input's start)
 * and holds the bytes up to the next "\n==> " (the newline is the
 * separator's, not the file's). NAME is at most three components of
 * [A-Za-z0-9._-] (no "." or ".."), folders made as needed; an entry whose
 * name is not such a name is skipped, as is a second file of the same
 * name. At most FUZZ_FILES_MAX files. Header only: each harness is one
 * .c file (Makefile's fuzz-build). */
#ifndef REEL_TESTS_FUZZ_FILES_H
#define REEL_TESTS_FUZZ_FILES_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_FILES_MAX 16
#define FUZZ_SEP "\n==> "

/* Where each run's folder is made: once per process, under /dev/shm when
 * there is one (no disk I/O), removed at exit. */
static char fuzz_root[64];

static int fuzz_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    (void)remove(p); /* keep going: a run's folder is new each time */
    return 0;
}

static void fuzz_rmtree(const char *dir) { nftw(dir, fuzz_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static void fuzz_root_gone(void) { fuzz_rmtree(fuzz_root); }

static const char *fuzz_root_dir(void) {
    if (fuzz_root[0]) return fuzz_root;
    struct stat sb;
    snprintf(fuzz_root, sizeof fuzz_root, "%s/reel-fuzz-XXXXXX",
             stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp");
    if (!mkdtemp(fuzz_root)) abort();
    atexit(fuzz_root_gone);
    return fuzz_root;
}

/* Whether the n bytes at s are a name the archive may hold. */
static int fuzz_name_ok(const char *s, size_t n) {
    if (n == 0 || n > 200) return 0;
    int parts = 1;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || s[i] == '/') {
            size_t k = i - start;
            if (k == 0 || (k == 1 && s[start] == '.') || (k == 2 && s[start] == '.' && s[start + 1] == '.')) return 0;
            if (i < n && ++parts > 3) return 0;
            start = i + 1;
            continue;
        }
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

/* One file of the archive: its name (NUL-terminated) and bytes. */
typedef struct {
    char name[256];
    const uint8_t *data;
    size_t size;
} fuzz_file_t;

/* The files of the archive in data (at most FUZZ_FILES_MAX into f); their
 * count. */
static int fuzz_files_split(const uint8_t *data, size_t size, fuzz_file_t *f) {
    int n = 0;
    const uint8_t *p = data, *end = data + size;
    if (size < 4 || memcmp(p, "==> ", 4)) return 0;
    p += 4;
    while (p < end && n < FUZZ_FILES_MAX) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *body = nl ? nl + 1 : end;
        const uint8_t *next;
        if (nl && end - body >= 4 && !memcmp(body, "==> ", 4)) next = nl; /* an empty file: the name line's
                                                                              * newline starts the separator */
        else next = body < end ? memmem(body, (size_t)(end - body), FUZZ_SEP, 5) : NULL;
        const uint8_t *stop = next ? next : end;
        size_t nlen = (size_t)((nl ? nl : end) - p);
        int dup = 0;
        for (int i = 0; i < n && !dup; i++) dup = strlen(f[i].name) == nlen && !memcmp(f[i].name, p, nlen);
        if (fuzz_name_ok((const char *)p, nlen) && !dup) {
            memcpy(f[n].name, p, nlen);
            f[n].name[nlen] = '\0';
            f[n].data = body;
            f[n].size = stop > body ? (size_t)(stop - body) : 0;
            n++;
        }
        if (!next) break;
        p = next + 5;
    }
    return n;
}

/* The archive written into a fresh folder (its path, static: valid until
 * fuzz_files_done); the files in *f and *n when f is given. Folders a
 * name needs are made; a file whose folder is a file already is skipped. */
static const char *fuzz_files_write(const uint8_t *data, size_t size, fuzz_file_t *f, int *n) {
    static char dir[128];
    static unsigned long run;
    fuzz_file_t own[FUZZ_FILES_MAX];
    if (!f) f = own;
    int k = fuzz_files_split(data, size, f);
    if (n) *n = k;
    snprintf(dir, sizeof dir, "%s/r%lu", fuzz_root_dir(), run++);
    if (mkdir(dir, 0700) != 0) abort();
    for (int i = 0; i < k; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, f[i].name);
        for (char *s = p + strlen(dir) + 1; (s = strchr(s, '/')); s++) {
            *s = '\0';
            (void)mkdir(p, 0700);
            *s = '/';
        }
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) continue; /* a folder of that name, or under a file */
        for (size_t at = 0; at < f[i].size;) {
            ssize_t w = write(fd, f[i].data + at, f[i].size - at);
            if (w <= 0) abort();
            at += (size_t)w;
        }
        close(fd);
    }
    return dir;
}

static void fuzz_files_done(const char *dir) { fuzz_rmtree(dir); }

#endif
