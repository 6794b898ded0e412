/* reelctl.c -- the Reel operator and client CLI: subcommand dispatch and
 * the one place a failure is printed (the usage text is usage.c's). */
#include "ctl.h"
#include "base/error.h"
#include "schema/wire.h"
#include <stdio.h>
#include <string.h>

/* The command argv names: its return (ctl.h: 0, CTL_NO or -1 with the
 * error value set). */
static int dispatch(int argc, char **argv) {
    const char *cmd = argv[1];
    /* `reelctl CMD [SUB] ... --help` (or -h): that command's usage, on stdout, 0 */
    for (int i = 2; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (ctl_usage_help(argc, argv, stdout)) return 0;
            ctl_usage_all(stderr);
            return reel_fail(REEL_E_INVALID, "unknown command '%s'", cmd);
        }
    /* `sync --upload` sends 4 MiB chunks: the daemons' malloc settings keep
     * ZeroMQ's buffers for the next chunk instead of fresh mmaps */
    if (!strcmp(cmd, "sync")) wire_tune_malloc();
    if (!strcmp(cmd, "weights")) return cmd_weights(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "encode")) return cmd_encode(argc - 1, argv + 1);
    if (!strcmp(cmd, "kernels")) return cmd_kernels(argc - 1, argv + 1);
    if (!strcmp(cmd, "decode")) return cmd_decode(argc - 1, argv + 1);
    if (!strcmp(cmd, "artifacts")) return cmd_artifacts(argc - 1, argv + 1);
    if (!strcmp(cmd, "tensor")) return cmd_tensor(argc - 1, argv + 1);
    if (!strcmp(cmd, "video")) return cmd_video(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "gen")) return cmd_gen(argc - 1, argv + 1);
    if (!strcmp(cmd, "sync")) return cmd_sync(argc - 1, argv + 1);
    if (!strcmp(cmd, "status")) return cmd_status(argc - 1, argv + 1);
    if (!strcmp(cmd, "top")) return cmd_top(argc - 1, argv + 1);
    if (!strcmp(cmd, "report")) return cmd_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "why")) return cmd_why(argc - 1, argv + 1);
    if (!strcmp(cmd, "keys") && argc > 2 && !strcmp(argv[2], "new")) return cmd_keys(argc - 2, argv + 2);
    if (!strcmp(cmd, "stats") || !strcmp(cmd, "keys") || !strcmp(cmd, "evictions") ||
        !strcmp(cmd, "versions") || !strcmp(cmd, "workers") || !strcmp(cmd, "requests") ||
        !strcmp(cmd, "metrics"))
        return cmd_catalog(argc - 1, argv + 1);
    ctl_usage_all(stderr);
    return reel_fail(REEL_E_INVALID, "unknown command '%s'", cmd);
}

/* The one place a failure is printed and becomes an exit status. */
int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        ctl_usage_all(argc < 2 ? stderr : stdout);
        return argc < 2 ? reel_exit_status(REEL_E_INVALID) : 0;
    }
    int rc = dispatch(argc, argv);
    if (rc >= 0) return rc;
    if (reel_err_code() == REEL_OK) /* a bug: never exit 0 for a failure */
        reel_fail(REEL_E_INTERNAL, "%s failed without saying why", argv[1]);
    /* a command line the command could not read: its usage, then the error
     * last, where the eye lands */
    if (ctl_usage_wanted()) ctl_usage_print(ctl_usage_wanted(), stderr);
    fprintf(stderr, "reelctl: %s\n", reel_err_text());
    return reel_exit_status(reel_err_code());
}
