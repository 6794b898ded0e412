/* cmd_keys.c -- `reelctl keys new --role R [--name N] [--force] --out
 * DIR`: a CURVE key pair (zmq_curve_keypair) as DIR/N.key (both keys: the
 * peer's secret) and DIR/N.pub (the public key the broker's --keys
 * directory holds), mode 0600. An existing pair is a secret someone may
 * hold: it is refused (exit 2) unless --force, which replaces both files
 * (net/keys.h, docs/SECURITY.md). */
#include "ctl.h"
#include "base/error.h"
#include "net/keys.h"
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int cmd_keys(int argc, char **argv) {
    static const struct option opts[] = {
        { "role", required_argument, 0, 'r' },
        { "name", required_argument, 0, 'n' },
        { "out", required_argument, 0, 'o' },
        { "force", no_argument, 0, 'f' },
        { 0, 0, 0, 0 },
    };
    const char *role_s = NULL, *name = NULL, *out = NULL;
    bool force = false;
    int o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'r': role_s = optarg; break;
        case 'n': name = optarg; break;
        case 'o': out = optarg; break;
        case 'f': force = true; break;
        default: return ctl_fail_usage("keys new", "keys new: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "keys new: unexpected argument '%s'", argv[optind]);
    if (!role_s || !out) return reel_fail(REEL_E_INVALID, "keys new needs --role client|trainer|worker|broker and --out DIR");
    reel_role_t role;
    if (reel_role_parse(role_s, &role) != 0) return ctl_fail_as(REEL_E_INVALID, "keys new: ");
    if (!name) name = role_s; /* one key per role, named after it, unless told */
    struct stat st;
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode))
        return reel_fail(REEL_E_INVALID, "keys new: --out %s is not a folder (the pair is written as %s/%s.key and "
                         ".pub)", out, out, name);
    reel_key_t k;
    if ((force ? reel_key_replace(out, role, name, &k) : reel_key_new(out, role, name, &k)) != 0) {
        if (reel_err_code() == REEL_E_STATE) /* the user's to decide: exit 2, saying how */
            return reel_fail(REEL_E_INVALID, "keys new: %s: a key pair is not replaced (peers may hold it); "
                             "--force replaces %s/%s.key and .pub, or give another --name", reel_err()->msg, out, name);
        /* a bad name is the caller's (exit 2), a file it cannot write not */
        return ctl_fail_as(reel_err_code() == REEL_E_INVALID ? REEL_E_INVALID : REEL_E_IO, "keys new: ");
    }
    printf("%s/%s.key\n%s/%s.pub\n", out, name, out, name);
    fprintf(stderr, "reelctl: %s key %s%s: public key %s (give the broker %s/%s.pub%s)\n", reel_role_name(role), name,
            force ? " (any old pair replaced)" : "", k.public_key, out, name,
            role == REEL_ROLE_BROKER ? "; its peers too, as --broker-key" : "");
    explicit_bzero(&k, sizeof k);
    return 0;
}
