/* keys.c -- CURVE key files, the allowlist and a peer's keys (see keys.h).
 * Every file is read through one descriptor opened without blocking (a
 * FIFO named as a key file is refused, not waited on) and checked with
 * fstat before a byte is read. */
#include "net/keys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "base/error.h"
#include "base/names.h"

#define KEYRING_MAX 65536 /* keys one allowlist may hold */

static const char *const role_names[] = {
    [REEL_ROLE_NONE] = "none",       [REEL_ROLE_CLIENT] = "client", [REEL_ROLE_TRAINER] = "trainer",
    [REEL_ROLE_WORKER] = "worker",   [REEL_ROLE_BROKER] = "broker",
};

const char *reel_role_name(reel_role_t r) {
    return (unsigned)r < sizeof role_names / sizeof role_names[0] ? role_names[r] : "?";
}

int reel_role_parse(const char *s, reel_role_t *out) {
    for (int r = REEL_ROLE_CLIENT; r <= REEL_ROLE_BROKER; r++)
        if (s && !strcmp(s, role_names[r])) {
            *out = (reel_role_t)r;
            return 0;
        }
    return reel_fail(REEL_E_INVALID, "unknown role '%.32s' (client, trainer, worker or broker)", s ? s : "");
}

bool reel_key_z85_valid(const char *s) {
    uint8_t bin[32];
    return s && strlen(s) == 40 && zmq_z85_decode(bin, s) != NULL;
}

/* ---- key files ------------------------------------------------------------ */

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = '\0';
    return s;
}

/* Parses the text of a key file into *k. -1 with a message naming path
 * and line. */
static int parse_key(const char *path, char *text, reel_key_t *k) {
    bool seen[4] = { false, false, false, false };
    static const char *const fields[4] = { "role", "name", "public-key", "secret-key" };
    int line = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        char *s = trim(l);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) return reel_fail(REEL_E_INVALID, "%s: line %d: expected 'field = value'", path, line);
        *eq = '\0';
        char *f = trim(s), *v = trim(eq + 1);
        size_t vn = strlen(v);
        if (vn >= 2 && v[0] == '"' && v[vn - 1] == '"') { /* CZMQ's zcert quotes its values */
            v[vn - 1] = '\0';
            v++;
        }
        int i = 0;
        while (i < 4 && strcmp(f, fields[i])) i++;
        if (i == 4) return reel_fail(REEL_E_INVALID, "%s: line %d: unknown field '%.32s'", path, line, f);
        if (seen[i]) return reel_fail(REEL_E_INVALID, "%s: line %d: '%s' given twice", path, line, f);
        seen[i] = true;
        switch (i) {
        case 0:
            if (reel_role_parse(v, &k->role) != 0) return reel_fail(REEL_E_INVALID, "%s: line %d: unknown role '%.32s'", path, line, v);
            break;
        case 1:
            if (!reel_name_valid(v, REEL_KEY_NAME_MAX))
                return reel_fail(REEL_E_INVALID, "%s: line %d: a name is 1..%d characters of [A-Za-z0-9_.:+-]", path, line,
                                 REEL_KEY_NAME_MAX - 1);
            snprintf(k->name, sizeof k->name, "%s", v);
            break;
        default:
            if (!reel_key_z85_valid(v)) return reel_fail(REEL_E_INVALID, "%s: line %d: '%s' is not a z85 CURVE key (40 characters)", path, line, f);
            snprintf(i == 2 ? k->public_key : k->secret_key, REEL_KEY_Z85, "%s", v);
            break;
        }
    }
    for (int i = 0; i < 3; i++)
        if (!seen[i]) return reel_fail(REEL_E_INVALID, "%s: no '%s' field", path, fields[i]);
    return 0;
}

int reel_key_read(const char *path, bool secret, reel_key_t *out) {
    memset(out, 0, sizeof *out);
    char text[REEL_KEY_FILE_MAX + 1];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return reel_fail(REEL_E_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    ssize_t n = -1;
    int rc = -1;
    if (fstat(fd, &sb) != 0) reel_fail(REEL_E_IO, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) reel_fail(REEL_E_INVALID, "%s: not a regular file", path);
    else if (sb.st_size > REEL_KEY_FILE_MAX) reel_fail(REEL_E_LIMIT, "%s: larger than a key file (%d bytes)", path, REEL_KEY_FILE_MAX);
    else if (sb.st_mode & 022) reel_fail(REEL_E_INVALID, "%s: group or others may write it (chmod 600)", path);
    else if (secret && (sb.st_mode & 077)) reel_fail(REEL_E_INVALID, "%s: a secret key its group or others may read (chmod 600)", path);
    else if ((n = read(fd, text, REEL_KEY_FILE_MAX)) < 0) reel_fail(REEL_E_IO, "%s: %s", path, strerror(errno));
    else rc = 0;
    close(fd);
    if (rc != 0) return -1;
    text[n] = '\0';
    if (memchr(text, '\0', (size_t)n)) return reel_fail(REEL_E_INVALID, "%s: not a key file (a NUL byte)", path);
    if (parse_key(path, text, out) != 0) return -1;
    if (secret && !out->secret_key[0]) return reel_fail(REEL_E_INVALID, "%s: no 'secret-key' field: a public key file?", path);
    if (!secret && out->secret_key[0])
        return reel_fail(REEL_E_INVALID, "%s: holds a secret key: give the NAME.pub file, not NAME.key", path);
    if (secret) {
        char pub[REEL_KEY_Z85];
        if (zmq_curve_public(pub, out->secret_key) != 0 || strcmp(pub, out->public_key))
            return reel_fail(REEL_E_INVALID, "%s: its public key is not its secret key's", path);
    }
    return 0;
}

/* Writes text to path exclusively, 0600, synced. -1 with a message
 * (nothing left behind): REEL_E_STATE when path exists. */
static int write_new(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == EEXIST) return reel_fail(REEL_E_STATE, "%s exists", path);
    if (fd < 0) return reel_fail(REEL_E_IO, "%s: %s", path, strerror(errno));
    size_t len = strlen(text);
    bool ok = fchmod(fd, 0600) == 0 && write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
    int e = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        unlink(path);
        return reel_fail(REEL_E_IO, "%s: %s", path, strerror(e));
    }
    return 0;
}

/* The pair's two files: written exclusively (replace false), or, with
 * replace, to temporary files beside them renamed over them, the .pub
 * first: a failure between the two renames leaves the old secret key. */
static int key_pair_write(const char *dir, reel_role_t role, const char *name, bool replace, reel_key_t *out) {
    memset(out, 0, sizeof *out);
    if (role <= REEL_ROLE_NONE || role > REEL_ROLE_BROKER) return reel_fail(REEL_E_INVALID, "no such role");
    if (!reel_name_valid(name, REEL_KEY_NAME_MAX))
        return reel_fail(REEL_E_INVALID, "key name '%.80s': 1..%d characters of [A-Za-z0-9_.:+-]", name, REEL_KEY_NAME_MAX - 1);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return reel_fail(REEL_E_IO, "%s: %s", dir, strerror(errno));
    if (zmq_curve_keypair(out->public_key, out->secret_key) != 0)
        return reel_fail(REEL_E_IO, "zmq_curve_keypair: %s (libzmq without CURVE?)", zmq_strerror(zmq_errno()));
    out->role = role;
    snprintf(out->name, sizeof out->name, "%s", name);

    char key_path[4096], pub_path[4096], text[512];
    if ((size_t)snprintf(key_path, sizeof key_path, "%s/%s.key", dir, name) >= sizeof key_path ||
        (size_t)snprintf(pub_path, sizeof pub_path, "%s/%s.pub", dir, name) >= sizeof pub_path)
        return reel_fail(REEL_E_LIMIT, "%s: path too long", dir);
    snprintf(text, sizeof text,
             "# Reel CURVE key pair (reelctl keys new): the SECRET key of %s %s.\n"
             "# Keep it private; give the broker %s.pub.\n"
             "role = %s\nname = %s\npublic-key = %s\nsecret-key = %s\n",
             reel_role_name(role), name, name, reel_role_name(role), name, out->public_key, out->secret_key);
    char pub_text[512];
    snprintf(pub_text, sizeof pub_text,
             "# Reel CURVE public key (reelctl keys new) of %s %s.\n"
             "role = %s\nname = %s\npublic-key = %s\n",
             reel_role_name(role), name, reel_role_name(role), name, out->public_key);
    int rc = -1;
    if (!replace) {
        if (write_new(key_path, text) == 0 && (rc = write_new(pub_path, pub_text)) != 0) unlink(key_path);
        explicit_bzero(text, sizeof text);
        return rc;
    }
    char key_tmp[4200], pub_tmp[4200];
    snprintf(key_tmp, sizeof key_tmp, "%s.new", key_path);
    snprintf(pub_tmp, sizeof pub_tmp, "%s.new", pub_path);
    /* a .new left by a run that died is ours to replace too */
    unlink(key_tmp);
    unlink(pub_tmp);
    if (write_new(key_tmp, text) != 0) goto out;
    if (write_new(pub_tmp, pub_text) != 0) goto out;
    if (rename(pub_tmp, pub_path) != 0) {
        reel_fail(REEL_E_IO, "%s: %s (the old pair is kept)", pub_path, strerror(errno));
        goto out;
    }
    if (rename(key_tmp, key_path) != 0) {
        reel_fail(REEL_E_IO, "%s: %s (%s is already the new one's: replace the pair again)", key_path,
                  strerror(errno), pub_path);
        goto out;
    }
    rc = 0;
out:
    explicit_bzero(text, sizeof text);
    if (rc != 0) {
        unlink(key_tmp);
        unlink(pub_tmp);
    }
    return rc;
}

int reel_key_new(const char *dir, reel_role_t role, const char *name, reel_key_t *out) {
    return key_pair_write(dir, role, name, false, out);
}

int reel_key_replace(const char *dir, reel_role_t role, const char *name, reel_key_t *out) {
    return key_pair_write(dir, role, name, true, out);
}

/* ---- the allowlist --------------------------------------------------------- */

struct reel_keyring {
    reel_key_t *k;     /* sorted by public key */
    size_t n;
};

static int cmp_key(const void *a, const void *b) {
    return strcmp(((const reel_key_t *)a)->public_key, ((const reel_key_t *)b)->public_key);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n > m && !strcmp(s + n - m, suffix);
}

reel_keyring_t *reel_keyring_load(const char *dir) {
    reel_keyring_t *k = calloc(1, sizeof *k);
    DIR *d = NULL;
    size_t cap = 0;
    if (!k) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        reel_fail(REEL_E_IO, "keys directory %s: %s", dir, strerror(errno));
        goto err;
    }
    if (!S_ISDIR(sb.st_mode)) {
        reel_fail(REEL_E_INVALID, "keys directory %s: not a directory", dir);
        goto err;
    }
    /* Whoever may add a file here may add a key. */
    if (sb.st_mode & 002) {
        reel_fail(REEL_E_INVALID, "keys directory %s: others may write it (chmod o-w)", dir);
        goto err;
    }
    if (!(d = opendir(dir))) {
        reel_fail(REEL_E_IO, "keys directory %s: %s", dir, strerror(errno));
        goto err;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".pub")) continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) {
            reel_fail(REEL_E_LIMIT, "%s/%s: path too long", dir, e->d_name);
            goto err;
        }
        reel_key_t key;
        if (reel_key_read(path, false, &key) != 0) goto err;
        if (key.role == REEL_ROLE_BROKER) continue; /* the broker's own, for its peers */
        if (k->n == cap) {
            if (cap >= KEYRING_MAX) {
                reel_fail(REEL_E_LIMIT, "keys directory %s: more than %d keys", dir, KEYRING_MAX);
                goto err;
            }
            size_t nc = cap ? cap * 2 : 16;
            reel_key_t *nk = realloc(k->k, nc * sizeof *nk);
            if (!nk) {
                reel_fail(REEL_E_NOMEM, "out of memory");
                goto err;
            }
            k->k = nk;
            cap = nc;
        }
        k->k[k->n++] = key;
    }
    closedir(d);
    d = NULL;
    if (k->n > 1) qsort(k->k, k->n, sizeof *k->k, cmp_key);
    for (size_t i = 0; i + 1 < k->n; i++)
        if (!strcmp(k->k[i].public_key, k->k[i + 1].public_key)) {
            reel_fail(REEL_E_INVALID, "keys directory %s: keys %s and %s are one public key", dir, k->k[i].name, k->k[i + 1].name);
            goto err;
        }
    /* Names are what the catalog's audit records: one key each. */
    for (size_t i = 0; i < k->n; i++)
        for (size_t j = i + 1; j < k->n; j++)
            if (!strcmp(k->k[i].name, k->k[j].name)) {
                reel_fail(REEL_E_INVALID, "keys directory %s: two keys named %s", dir, k->k[i].name);
                goto err;
            }
    return k;
err:
    if (d) closedir(d);
    reel_keyring_destroy(&k);
    return NULL;
}

void reel_keyring_destroy(reel_keyring_t **kp) {
    if (!kp || !*kp) return;
    free((*kp)->k);
    free(*kp);
    *kp = NULL;
}

size_t reel_keyring_count(const reel_keyring_t *k) { return k ? k->n : 0; }

const reel_key_t *reel_keyring_find(const reel_keyring_t *k, const char *public_key) {
    if (!k || !public_key || k->n == 0) return NULL;
    reel_key_t probe;
    snprintf(probe.public_key, sizeof probe.public_key, "%s", public_key);
    return bsearch(&probe, k->k, k->n, sizeof *k->k, cmp_key);
}

/* ---- a peer's keys --------------------------------------------------------------- */

static const char *given(const char *flag, const char *env) {
    if (flag) return flag;
    const char *e = getenv(env);
    return e && *e ? e : NULL;
}

int reel_curve_resolve(const char *key_file, const char *broker_key, unsigned roles, reel_curve_t *c) {
    memset(c, 0, sizeof *c);
    const char *kf = given(key_file, "REEL_KEY"), *bk = given(broker_key, "REEL_BROKER_KEY");
    if (!kf && !bk) return 0;
    if (!kf) return reel_fail(REEL_E_INVALID, "the broker's key is given but not this peer's own (--key FILE or REEL_KEY)");
    if (!bk) return reel_fail(REEL_E_INVALID, "a key is given but not the broker's public key (--broker-key FILE or REEL_BROKER_KEY)");
    reel_key_t server;
    if (reel_key_read(kf, true, &c->self) != 0 || reel_key_read(bk, false, &server) != 0) return -1;
    if (roles && !(roles & (1u << c->self.role)))
        return reel_fail(REEL_E_INVALID, "%s: a %s key cannot be used here", kf, reel_role_name(c->self.role));
    if (server.role != REEL_ROLE_BROKER)
        return reel_fail(REEL_E_INVALID, "%s: a %s key, not the broker's (role broker)", bk, reel_role_name(server.role));
    snprintf(c->server_key, sizeof c->server_key, "%s", server.public_key);
    c->on = true;
    return 0;
}

int reel_curve_apply(void *sock, const reel_curve_t *c) {
    if (!c || !c->on) return 0;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->server_key, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->self.public_key, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->self.secret_key, 40) != 0)
        return reel_fail(REEL_E_IO, "cannot set CURVE keys: %s", zmq_strerror(zmq_errno()));
    return 0;
}
