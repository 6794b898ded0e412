/* keys.h -- the CURVE keys of Reel's peers (docs/SECURITY.md): key files,
 * the broker's allowlist, and the keys a peer's socket connects with.
 *
 * A key file is text, at most 4 KiB, one "field = value" per line, '#'
 * starting a comment:
 *
 *   role = trainer          client | trainer | worker | broker
 *   name = alice            [A-Za-z0-9_.:+-], 1..63 characters
 *   public-key = <40 z85 characters>
 *   secret-key = <40 z85 characters>   (NAME.key only)
 *
 * `reelctl keys new` writes a pair as NAME.key (both keys: the peer's
 * secret) and NAME.pub (the public key: what the broker's allowlist
 * holds), mode 0600, never over an existing file. A file with an unknown
 * field, a field twice, a bad value or a missing field is refused whole;
 * so is a secret key file that its group or others may read (as ssh
 * does), and any key file they may write.
 *
 * Nothing here allocates per key read; the keyring is one array. Every
 * function returns 0 / a pointer on success and -1 / NULL with a message
 * in an error value (base/error.h) on failure. The z85 text and zmq_curve_keypair are
 * libzmq's (built with libsodium: zmq_has("curve")). */
#ifndef REEL_NET_KEYS_H
#define REEL_NET_KEYS_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REEL_KEY_Z85 41          /* 40 z85 characters of a 32-byte key, and a NUL */
#define REEL_KEY_NAME_MAX 64     /* names: 1..63 characters */
#define REEL_KEY_FILE_MAX 4096   /* bytes in a key file */

typedef enum {
    REEL_ROLE_NONE = 0,          /* no keys: an insecure broker's peers */
    REEL_ROLE_CLIENT,            /* client socket: GEN, STATUS */
    REEL_ROLE_TRAINER,           /* client socket: GEN, STATUS, SYNC (weight uploads) */
    REEL_ROLE_WORKER,            /* worker socket */
    REEL_ROLE_BROKER,            /* the broker's own pair */
} reel_role_t;

/* "client", "trainer", "worker", "broker"; "none" for REEL_ROLE_NONE. */
const char *reel_role_name(reel_role_t r);
/* The role named s (not "none"). -1 with a message otherwise. */
int reel_role_parse(const char *s, reel_role_t *out);
/* True when s is 40 characters that z85-decode to a 32-byte key. */
bool reel_key_z85_valid(const char *s);

typedef struct {
    reel_role_t role;
    char name[REEL_KEY_NAME_MAX];
    char public_key[REEL_KEY_Z85];
    char secret_key[REEL_KEY_Z85];   /* "" in a public key file */
} reel_key_t;

/* Reads the key file at path into *out. secret: the file must hold a
 * secret key (a NAME.key), and its group and others must have no access
 * to it; otherwise it may not hold one (a NAME.pub). Its public key must
 * be the secret key's. 0, or -1 with a message naming the path. */
int reel_key_read(const char *path, bool secret, reel_key_t *out);

/* Makes a new pair for (role, name) with zmq_curve_keypair and writes
 * DIR/NAME.key and DIR/NAME.pub, 0600, created exclusively (DIR is made
 * 0700 when missing). *out receives the pair. 0, or -1 with a message
 * (an existing file is REEL_E_STATE, "PATH exists", and both stay as they
 * were; nothing is left half written). */
int reel_key_new(const char *dir, reel_role_t role, const char *name, reel_key_t *out);
/* The same, but an existing DIR/NAME.key and DIR/NAME.pub (either or
 * both) are replaced: the new pair is written to NAME.key.new and
 * NAME.pub.new beside them (0600, synced) and renamed over them, the .pub
 * first, so a failure leaves the old secret key (a failure between the
 * two renames, with a message saying so, leaves the new .pub and the old
 * .key: replace again). Peers holding the old key are refused from then
 * on. 0, or -1 with a message; no .new file is left. */
int reel_key_replace(const char *dir, reel_role_t role, const char *name, reel_key_t *out);

/* ---- the broker's allowlist -------------------------------------------- */

typedef struct reel_keyring reel_keyring_t;

/* Reads every NAME.pub in dir (other files are ignored, and so are the
 * broker's own keys, role broker). Fails whole -- NULL with a message --
 * on a file that cannot be read or parsed, two files with one public key
 * or one name, or a directory others may write. An empty allowlist is
 * valid (every peer is refused). */
reel_keyring_t *reel_keyring_load(const char *dir);
/* Frees *k; NULL-safe; sets *k = NULL. */
void reel_keyring_destroy(reel_keyring_t **k);
/* Keys held. */
size_t reel_keyring_count(const reel_keyring_t *k);
/* The key whose public key (z85) is public_key, or NULL. Owned by k. */
const reel_key_t *reel_keyring_find(const reel_keyring_t *k, const char *public_key);

/* ---- a peer's side -------------------------------------------------------- */

/* What a client or worker socket connects with. */
typedef struct {
    bool on;                          /* false: plain (no keys given) */
    reel_key_t self;                  /* its pair */
    char server_key[REEL_KEY_Z85];    /* the broker's public key */
} reel_curve_t;

/* The keys a peer uses: key_file (its NAME.key) or, when NULL, $REEL_KEY;
 * broker_key (the broker's NAME.pub) or, when NULL, $REEL_BROKER_KEY.
 * Neither given: c->on false, 0. One without the other, an unreadable
 * file, or a key whose role is not one of `roles` (a bit mask of
 * 1 << reel_role_t; 0 takes any): -1 with a message. */
int reel_curve_resolve(const char *key_file, const char *broker_key, unsigned roles, reel_curve_t *c);
/* Sets sock's CURVE client options from c (nothing when c is NULL or off).
 * Call before zmq_connect. 0, or -1 with a message. */
int reel_curve_apply(void *sock, const reel_curve_t *c);

#ifdef __cplusplus
}
#endif
#endif
