/* test_keys.c -- CURVE key files and the allowlist (net/keys.h): what
 * `reelctl keys new` writes (0600, exclusive, readable back), what a key
 * file reader refuses (every malformed field, modes that leak a secret, a
 * FIFO that would block), the allowlist (whole or nothing, duplicates,
 * lookups) and the keys a peer resolves from flags or the environment;
 * then a real CURVE handshake over ipc with the resolved keys. */
#include "net/keys.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "base/error.h"
#include "tests/support.h"

static char dir[64];

static void dir_up(void) {
    ts_mkdtemp(dir, sizeof dir, "keys");
    unsetenv("REEL_KEY");
    unsetenv("REEL_BROKER_KEY");
}

static void dir_down(void) {
    ck_assert_int_eq(ts_rmtree(dir), 0);
}

static const char *path_of(const char *name) {
    static char p[4][128];
    static int i;
    i = (i + 1) % 4;
    snprintf(p[i], sizeof p[i], "%s/%s", dir, name);
    return p[i];
}

static void write_file(const char *name, const char *text, mode_t mode) {
    const char *p = path_of(name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    ck_assert_int_eq(chmod(p, mode), 0);
}

static mode_t mode_of(const char *name) {
    struct stat sb;
    ck_assert_int_eq(stat(path_of(name), &sb), 0);
    return sb.st_mode & 0777;
}

START_TEST(test_keys_new_writes_a_pair_0600_that_reads_back_and_never_overwrites) {
    reel_key_t k, sec, pub;
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_TRAINER, "alice", &k), 0);
    ck_assert(reel_key_z85_valid(k.public_key));
    ck_assert(reel_key_z85_valid(k.secret_key));
    ck_assert_int_eq(mode_of("alice.key"), 0600);
    ck_assert_int_eq(mode_of("alice.pub"), 0600);
    ck_assert_int_eq(reel_key_read(path_of("alice.key"), true, &sec), 0);
    ck_assert_int_eq(reel_key_read(path_of("alice.pub"), false, &pub), 0);
    ck_assert_int_eq(sec.role, REEL_ROLE_TRAINER);
    ck_assert_str_eq(sec.name, "alice");
    ck_assert_str_eq(sec.public_key, k.public_key);
    ck_assert_str_eq(sec.secret_key, k.secret_key);
    ck_assert_str_eq(pub.public_key, k.public_key);
    ck_assert_str_eq(pub.secret_key, "");
    /* A second pair under the name fails and leaves the first intact. */
    reel_key_t again;
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_TRAINER, "alice", &again), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "alice.key exists"));
    ck_assert_int_eq(reel_err_code(), REEL_E_STATE); /* reelctl: exit 2, naming --force */
    ck_assert_int_eq(reel_key_read(path_of("alice.key"), true, &sec), 0);
    ck_assert_str_eq(sec.secret_key, k.secret_key);
    /* Bad names never make a file. */
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_CLIENT, "../evil", &again), -1);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_CLIENT, "", &again), -1);
}
END_TEST

/* `reelctl keys new --force`: both files replaced by a pair that reads
 * back, 0600, no temporary left; the old .pub alone (its .key lost) is
 * replaced too, and without it refused as existing. */
START_TEST(test_key_replace_writes_a_new_pair_over_the_old_one_and_leaves_no_temporary) {
    reel_key_t old, k, sec, pub;
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_WORKER, "w1", &old), 0);
    ck_assert_int_eq(reel_key_replace(dir, REEL_ROLE_WORKER, "w1", &k), 0);
    ck_assert_str_ne(k.secret_key, old.secret_key);
    ck_assert_int_eq(reel_key_read(path_of("w1.key"), true, &sec), 0);
    ck_assert_int_eq(reel_key_read(path_of("w1.pub"), false, &pub), 0);
    ck_assert_str_eq(sec.secret_key, k.secret_key);
    ck_assert_str_eq(pub.public_key, k.public_key);
    ck_assert_int_eq(mode_of("w1.key"), 0600);
    ck_assert_int_eq(mode_of("w1.pub"), 0600);
    ck_assert_int_eq(access(path_of("w1.key.new"), F_OK), -1);
    ck_assert_int_eq(access(path_of("w1.pub.new"), F_OK), -1);
    /* a .pub whose .key is gone: new refuses it, replace writes both */
    ck_assert_int_eq(unlink(path_of("w1.key")), 0);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_WORKER, "w1", &old), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_STATE);
    ck_assert_int_eq(access(path_of("w1.key"), F_OK), -1); /* nothing half written */
    ck_assert_int_eq(reel_key_replace(dir, REEL_ROLE_WORKER, "w1", &k), 0);
    ck_assert_int_eq(reel_key_read(path_of("w1.key"), true, &sec), 0);
    ck_assert_int_eq(reel_key_read(path_of("w1.pub"), false, &pub), 0);
    ck_assert_str_eq(pub.public_key, sec.public_key);
    /* a bad name is refused before anything is touched */
    ck_assert_int_eq(reel_key_replace(dir, REEL_ROLE_WORKER, "../w1", &k), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
}
END_TEST

START_TEST(test_key_files_that_leak_or_lie_are_refused_with_the_reason) {
    reel_key_t k;
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_WORKER, "w1", &k), 0);
    /* A secret key others may read is not used (as ssh refuses). */
    ck_assert_int_eq(chmod(path_of("w1.key"), 0640), 0);
    ck_assert_int_eq(reel_key_read(path_of("w1.key"), true, &k), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "chmod 600"));
    ck_assert_int_eq(chmod(path_of("w1.key"), 0600), 0);
    /* A public key file others may write could be swapped. */
    ck_assert_int_eq(chmod(path_of("w1.pub"), 0666), 0);
    ck_assert_int_eq(reel_key_read(path_of("w1.pub"), false, &k), -1);
    ck_assert_int_eq(chmod(path_of("w1.pub"), 0644), 0);
    ck_assert_int_eq(reel_key_read(path_of("w1.pub"), false, &k), 0);
    /* The secret file where the public one is asked for, and back. */
    ck_assert_int_eq(reel_key_read(path_of("w1.key"), false, &k), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "NAME.pub"));
    ck_assert_int_eq(reel_key_read(path_of("w1.pub"), true, &k), -1);

    char pk[41], sk[41], pk2[41], sk2[41], text[512];
    zmq_curve_keypair(pk, sk);
    zmq_curve_keypair(pk2, sk2);
    const struct { const char *text, *why; } bad[] = {
        { "role = worker\nname = x\n", "public-key" },
        { "role = king\nname = x\npublic-key = %s\n", "role" },
        { "role = worker\nname = a/b\npublic-key = %s\n", "name" },
        { "role = worker\nname = x\npublic-key = tooshort\n", "z85" },
        { "role = worker\nrole = worker\nname = x\npublic-key = %s\n", "twice" },
        { "role = worker\nname = x\npublic-key = %s\ncolor = red\n", "unknown field" },
        { "role worker\n", "field = value" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, bad[i].text, pk);
        write_file("bad.pub", text, 0600);
        ck_assert_msg(reel_key_read(path_of("bad.pub"), false, &k) == -1, "case %zu read", i);
        ck_assert_msg(strstr(reel_err_text(), bad[i].why), "case %zu: '%s' lacks '%s'", i, reel_err_text(), bad[i].why);
    }
    /* A secret key whose public half is another key's. */
    snprintf(text, sizeof text, "role = worker\nname = x\npublic-key = %s\nsecret-key = %s\n", pk2, sk);
    write_file("lie.key", text, 0600);
    ck_assert_int_eq(reel_key_read(path_of("lie.key"), true, &k), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "not its secret key"));
    /* zcert's quoted values and comments read. */
    snprintf(text, sizeof text, "# a comment\n  role = \"client\"\nname=\"bob\"\npublic-key = \"%s\"\n", pk);
    write_file("bob.pub", text, 0600);
    ck_assert_int_eq(reel_key_read(path_of("bob.pub"), false, &k), 0);
    ck_assert_str_eq(k.name, "bob");
    ck_assert_str_eq(k.public_key, pk);
}
END_TEST

START_TEST(test_a_fifo_or_a_device_named_as_a_key_file_is_refused_without_blocking) {
    ck_assert_int_eq(mkfifo(path_of("fifo.pub"), 0600), 0);
    reel_key_t k;
    time_t t0 = time(NULL);
    ck_assert_int_eq(reel_key_read(path_of("fifo.pub"), false, &k), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "not a regular file"));
    ck_assert_int_eq(reel_key_read("/dev/zero", false, &k), -1);
    ck_assert_int_le(time(NULL) - t0, 1);
    char big[REEL_KEY_FILE_MAX + 2];
    memset(big, '#', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    write_file("big.pub", big, 0600);
    ck_assert_int_eq(reel_key_read(path_of("big.pub"), false, &k), -1);
}
END_TEST

START_TEST(test_the_allowlist_reads_every_pub_skips_the_brokers_and_fails_whole) {
    reel_key_t a, b, w, brk;
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_TRAINER, "alice", &a), 0);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_CLIENT, "bob", &b), 0);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_WORKER, "w1", &w), 0);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_BROKER, "broker", &brk), 0);
    write_file("notes.txt", "not a key\n", 0600);
    reel_keyring_t *k = reel_keyring_load(dir);
    TS_NEW(k);
    ck_assert_uint_eq(reel_keyring_count(k), 3);
    const reel_key_t *f = reel_keyring_find(k, a.public_key);
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f->name, "alice");
    ck_assert_int_eq(f->role, REEL_ROLE_TRAINER);
    ck_assert_int_eq(reel_keyring_find(k, w.public_key)->role, REEL_ROLE_WORKER);
    ck_assert_ptr_null(reel_keyring_find(k, brk.public_key)); /* the broker is no peer */
    ck_assert_ptr_null(reel_keyring_find(k, "nope"));
    reel_keyring_destroy(&k);
    ck_assert_ptr_null(k);

    /* One bad file: nothing is loaded (a reload keeps the old allowlist). */
    write_file("zz.pub", "role = worker\n", 0600);
    ck_assert_ptr_null(reel_keyring_load(dir));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "zz.pub"));
    unlink(path_of("zz.pub"));
    /* The same public key under two names. */
    char text[256];
    snprintf(text, sizeof text, "role = client\nname = copy\npublic-key = %s\n", a.public_key);
    write_file("copy.pub", text, 0600);
    ck_assert_ptr_null(reel_keyring_load(dir));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "one public key"));
    unlink(path_of("copy.pub"));
    /* A directory anyone may write to. */
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert_ptr_null(reel_keyring_load(dir));
    ck_assert_int_eq(chmod(dir, 0700), 0);
    ck_assert_ptr_nonnull(k = reel_keyring_load(dir));
    reel_keyring_destroy(&k);
}
END_TEST

START_TEST(test_a_peer_takes_its_keys_from_flags_or_the_environment_both_or_none) {
    reel_key_t t, brk, w;
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_TRAINER, "alice", &t), 0);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_BROKER, "broker", &brk), 0);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_WORKER, "w1", &w), 0);
    reel_curve_t c;
    ck_assert_int_eq(reel_curve_resolve(NULL, NULL, 0, &c), 0);
    ck_assert(!c.on);
    ck_assert_int_eq(reel_curve_resolve(path_of("alice.key"), NULL, 0, &c), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "REEL_BROKER_KEY"));
    ck_assert_int_eq(reel_curve_resolve(NULL, path_of("broker.pub"), 0, &c), -1);
    ck_assert_int_eq(reel_curve_resolve(path_of("alice.key"), path_of("broker.pub"), 0, &c), 0);
    ck_assert(c.on);
    ck_assert_str_eq(c.server_key, brk.public_key);
    ck_assert_str_eq(c.self.secret_key, t.secret_key);
    /* A worker key where a client's is wanted, a peer's key as the broker's. */
    unsigned client_roles = 1u << REEL_ROLE_CLIENT | 1u << REEL_ROLE_TRAINER;
    ck_assert_int_eq(reel_curve_resolve(path_of("w1.key"), path_of("broker.pub"), client_roles, &c), -1);
    ck_assert_int_eq(reel_curve_resolve(path_of("alice.key"), path_of("w1.pub"), 0, &c), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "not the broker's"));
    /* The environment, when no flag is given; a flag wins. */
    setenv("REEL_KEY", path_of("alice.key"), 1);
    setenv("REEL_BROKER_KEY", path_of("broker.pub"), 1);
    ck_assert_int_eq(reel_curve_resolve(NULL, NULL, client_roles, &c), 0);
    ck_assert(c.on);
    ck_assert_str_eq(c.self.name, "alice");
    ck_assert_int_eq(reel_curve_resolve(path_of("w1.key"), NULL, 0, &c), 0);
    ck_assert_str_eq(c.self.name, "w1");
    unsetenv("REEL_KEY");
    unsetenv("REEL_BROKER_KEY");
}
END_TEST

START_TEST(test_resolved_keys_make_a_curve_handshake_and_a_wrong_server_key_does_not) {
    reel_key_t t, brk, other;
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_TRAINER, "alice", &t), 0);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_BROKER, "broker", &brk), 0);
    ck_assert_int_eq(reel_key_new(dir, REEL_ROLE_BROKER, "other", &other), 0);
    void *ctx = zmq_ctx_new();
    void *srv = zmq_socket(ctx, ZMQ_ROUTER);
    int one = 1, tmo = 2000, linger = 0;
    zmq_setsockopt(srv, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(srv, ZMQ_CURVE_SECRETKEY, brk.secret_key, 40);
    zmq_setsockopt(srv, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(srv, ZMQ_LINGER, &linger, sizeof linger);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/s", dir);
    ck_assert_int_eq(zmq_bind(srv, ep), 0);
    for (int wrong = 0; wrong < 2; wrong++) {
        reel_curve_t c;
        ck_assert_int_eq(reel_curve_resolve(path_of("alice.key"), path_of(wrong ? "other.pub" : "broker.pub"), 0, &c), 0);
        void *cl = zmq_socket(ctx, ZMQ_DEALER);
        zmq_setsockopt(cl, ZMQ_LINGER, &linger, sizeof linger);
        ck_assert_int_eq(reel_curve_apply(cl, &c), 0);
        ck_assert_int_eq(zmq_connect(cl, ep), 0);
        ck_assert_int_eq(zmq_send(cl, "hi", 2, 0), 2);
        char id[256], msg[8];
        int n = zmq_recv(srv, id, sizeof id, 0);
        if (wrong) {
            ck_assert_int_eq(n, -1); /* the handshake never completes */
        } else {
            ck_assert_int_gt(n, 0);
            ck_assert_int_eq(zmq_recv(srv, msg, sizeof msg, 0), 2);
        }
        zmq_close(cl);
    }
    zmq_close(srv);
    zmq_ctx_term(ctx);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("keys");
    TCase *tc = tcase_create("keys");
    tcase_add_checked_fixture(tc, dir_up, dir_down);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_keys_new_writes_a_pair_0600_that_reads_back_and_never_overwrites);
    tcase_add_test(tc, test_key_replace_writes_a_new_pair_over_the_old_one_and_leaves_no_temporary);
    tcase_add_test(tc, test_key_files_that_leak_or_lie_are_refused_with_the_reason);
    tcase_add_test(tc, test_a_fifo_or_a_device_named_as_a_key_file_is_refused_without_blocking);
    tcase_add_test(tc, test_the_allowlist_reads_every_pub_skips_the_brokers_and_fails_whole);
    tcase_add_test(tc, test_a_peer_takes_its_keys_from_flags_or_the_environment_both_or_none);
    tcase_add_test(tc, test_resolved_keys_make_a_curve_handshake_and_a_wrong_server_key_does_not);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return ts_run(suite());
}
