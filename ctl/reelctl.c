/* reelctl.c -- the Reel operator and client CLI: subcommand dispatch. */
#include "ctl.h"
#include "base/error.h"
#include "schema/wire.h"
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: reelctl <command> [options]\n"
    "\n"
    "commands:\n"
    "  weights init --config tiny|small|wan2.1-1.3b|wan2.1-14b|FILE.json --seed N --out W.safetensors\n"
    "                              write deterministic random weights\n"
    "  weights init-t5 --config t5-tiny|t5-small|umt5-xxl --seed N [--dtype f32|bf16] --out T5.safetensors\n"
    "                              random umT5 text-encoder weights under the release's names\n"
    "  weights inspect PATH [--json]  a checkpoint's layout, config, parameters, dtypes, bytes,\n"
    "                              files and the sha256 a sync announces; PATH: a Reel file, a\n"
    "                              Wan2.1 release file or folder, a sharded index or its folder,\n"
    "                              a diffusers transformer folder or pipeline root (info: the\n"
    "                              same); run --weights, reel-worker and syncs take any of them;\n"
    "                              a PEFT LoRA folder: its rank, alpha, scale and targets\n"
    "  weights export PATH --out DIR [--dtype f32|bf16|f16]\n"
    "                              PATH in the layout a Wan2.1 release ships: DIR holds\n"
    "                              diffusion_pytorch_model.safetensors and Wan's config.json\n"
    "  run --weights W --latent IN.safetensors --context C.safetensors [--uncond U.safetensors]\n"
    "      --steps N --shift S [--cfg G] [--solver euler|unipc|dpm++] [--sde --eta A] [--seed K]\n"
    "      [--backend cpu|cuda]\n"
    "      [--dtype f32|bf16] [--graphs on|off] [--warmup N] [--lora DIR] --out OUT.safetensors\n"
    "                              one denoising loop in this process (no broker); --lora: a\n"
    "                              PEFT LoRA adapter merged into the weights (W + s*B*A)\n"
    "      (--size FxHxW --seed K draws the initial latent instead of --latent; --sde with --solver\n"
    "      unipc|dpm++: Flow-GRPO's SDE steps on that solver's sigmas and int timesteps)\n"
    "  run --weights DIR --prompt TEXT [--negative-prompt TEXT] --size FxHxW [--seed K] -o OUT.mp4\n"
    "      [--solver S --steps N --shift S --cfg G]: not given, Wan2.1's text-to-video defaults\n"
    "      (unipc, 50, 5, 5: generate.py's; --cfg 1 turns guidance and the negative prompt off;\n"
    "      a diffusers pipeline's scheduler/scheduler_config.json gives its solver and shift first,\n"
    "      saying where Reel steps otherwise than diffusers: DPM++ and Euler on Wan's own sigmas)\n"
    "                              a prompt to a video: DIR a Wan2.1 release folder (its text\n"
    "                              encoder, tokenizer and VAE are found by their release names;\n"
    "                              or --t5 FILE --tokenizer PATH --vae FILE); --size 832*480\n"
    "                              --frame_num 81 (the default) as Wan's generate.py takes it;\n"
    "                              OUT.mp4 and the latent beside it (OUT.mp4.safetensors), or\n"
    "                              OUT.safetensors: the latent alone\n"
    "      generate.py's spellings are taken too: --sample_solver, --sample_steps, --sample_shift,\n"
    "      --sample_guide_scale, --base_seed (not -1: give a seed), --negative_prompt (run and gen)\n"
    "  encode --t5 T5 --tokenizer PATH --prompt TEXT [--text-len N] -o OUT.safetensors\n"
    "                              a prompt as Wan's T5EncoderModel encodes it: context [L, dim] F32,\n"
    "                              L its real length (at most --text-len, 512); T5: the release's\n"
    "                              .pth, a safetensors copy or diffusers' text_encoder/ (UMT5);\n"
    "                              PATH: spiece.model or its folder\n"
    "  encode --t5 T5 --ids 5,17,1 [--pad-to N] [--backend cpu|cuda] [--dtype f32|bf16]\n"
    "      -o OUT.safetensors      token ids through the umT5 encoder: OUT holds context [n, dim] F32\n"
    "  weights init-vae --config wan2.1|vae-tiny [--dim D] [--z-dim Z] --seed N --out V.safetensors\n"
    "                              random weights of Wan2.1's VAE decoder (release names)\n"
    "  decode --vae VAE LATENT.safetensors -o OUT.safetensors|OUT.mp4 [--backend cpu|cuda]\n"
    "      [--quiet]               latent [z,F,H,W] to video [3,1+4(F-1),8H,8W] in [-1,1], or an\n"
    "                              H.264 MP4 at 16 fps; VAE: Wan2.1_VAE.pth, a safetensors copy or\n"
    "                              diffusers' vae/ (AutoencoderKLWan)\n"
    "                              through the VAE decoder, one latent frame at a time\n"
    "  kernels [--json]            list the registered kernels\n"
    "  artifacts list|verify|report DIR [--enable ID,..] [--timing off|sync|shadow] [--json]\n"
    "                              kernel bundles under DIR (docs/ARTIFACTS.md); report\n"
    "                              runs a loop native, then with them, and measures\n"
    "  artifacts report --catalog PATH [--json]  what workers reported to the catalog\n"
    "  tensor rand --name N --shape A,B,.. --seed K --out F.safetensors\n"
    "                              a tensor of N(0,1) values (inputs for run)\n"
    "  tensor info F.safetensors   shape and statistics of every tensor\n"
    "  tensor diff A B [--name N]  bitwise comparison (exit 0 equal, 1 different)\n"
    "  tokenize --tokenizer PATH --prompt TEXT [--max-len N]\n"
    "                              the ids Wan's tokenizer gives a prompt (cleaned, eos last, at\n"
    "                              most N: 512), comma separated: what encode feeds the encoder\n"
    "  tokenize --clean --prompt TEXT   the prompt as Wan's cleaning (ftfy, html, spaces) leaves it\n"
    "  plan --config NAME|FILE.json --size FxHxW [--text L] [--cfg] [--gpu h200|h100|a100]\n"
    "      [--attention fused|decomposed]\n"
    "                              one step on paper: each op group's FLOPs, bytes and time\n"
    "                              at the GPU's published peaks; last line the step total\n"
    "  video probe FILE [--json]   a video's decoded frame count, size, frame rate and codec\n"
    "\n"
    "  against a running broker (default tcp://127.0.0.1:5555, --broker EP; --broker A,B:\n"
    "  a standby pair, whichever is active):\n"
    "  gen --model NAME --context C.safetensors [--uncond U.safetensors --cfg G]\n"
    "      (--latent L.safetensors | --size FxHxW --seed K [--channels C]) --steps N [--shift S]\n"
    "      (--size W*H [--frame_num N]: Wan's pixel form, as run takes it; 81 frames by default)\n"
    "      [--solver euler|unipc|dpm++] [--sde --eta A] [--weights-version V] [--timeout-ms T]\n"
    "      [--deadline-ms D] [--quiet] --out OUT.safetensors\n"
    "      [--n G] [--seeds S1,S2,..]: a group of G samples of the prompt in batched steps\n"
    "      (seeds S1.. or K, K+1, ..): OUT holds latent [G,C,F,H,W], sample i bitwise a\n"
    "      single gen with its seed (trajectory.i, means.i, log_probs [G,N])\n"
    "      [--trajectory] [--log-probs] [--means]: rollout outputs into OUT too (the last\n"
    "      two for --sde; with the weight version of each step as metadata version_runs)\n"
    "      --prompt TEXT [--negative-prompt TEXT] in place of --context/--uncond: the worker\n"
    "      encodes them (an empty or absent negative prompt: Wan's default); with a prompt,\n"
    "      --solver, --steps, --shift and --cfg not given are Wan2.1's text-to-video defaults\n"
    "      (unipc, 50, 5, 5; --cfg 1 turns guidance and the negative prompt off); --out X.mp4 (or --output\n"
    "      video: written to OUT.mp4) asks the worker for the video, --output frames for\n"
    "      uint8 frames (written to OUT.frames.npy)\n"
    "  sync --version V (--weights W.safetensors | --upload W.safetensors) [--component C]\n"
    "      [--deadline-ms D] [--timeout-ms T]\n"
    "                              --upload: by value, the bytes through the broker (its\n"
    "                              --weights-dir), for workers on hosts without the file\n"
    "                              publish a weight sync; waits for every worker (exit 1\n"
    "                              unless all applied it; each failure's reason printed)\n"
    "  sync --version V --base B (--lora DIR | --lora-upload DIR | --lora none --weights BASE)\n"
    "                              a LoRA adapter (PEFT folder) merged by workers run with\n"
    "                              --lora into their base B, every graph kept; none: B again\n"
    "  status [--json]             live workers (lagging ones with why), queue, versions\n"
    "  top [--interval-ms 1000] [--count N]\n"
    "                              a live view: queue, versions, requests/s, graph hit rate,\n"
    "                              workers; redraws in place on a terminal, plain lines piped\n"
    "  (each takes --key NAME.key --broker-key broker.pub, else $REEL_KEY and\n"
    "   $REEL_BROKER_KEY: CURVE, for a broker started with --keys)\n"
    "\n"
    "  keys new --role client|trainer|worker|broker [--name N] [--force] --out DIR\n"
    "                              a CURVE key pair: DIR/N.key (secret) and DIR/N.pub, 0600;\n"
    "                              the broker admits the peers whose N.pub is in its --keys DIR\n"
    "\n"
    "  reading the catalog (--catalog PATH, default reel.db or $REEL_CATALOG; --json, why too):\n"
    "  stats | keys | evictions | versions [--all] | workers | requests\n"
    "  report --html OUT.html | --json [--since T|-SECONDS]\n"
    "                              one self-contained HTML page: hit rate over time with the\n"
    "                              syncs marked, captures and evictions per sync, declines,\n"
    "                              workers, keys, the slowest requests (SVG, no network);\n"
    "                              --json: the same data on stdout\n"
    "  metrics [--broker EP]       the stats counters in the Prometheus text format (with\n"
    "                              --broker, the broker's live counters too: peers, catalog)\n"
    "  why ID [--worker NAME]      why request ID (as `requests` shows it; the newest with it)\n"
    "                              took its time: its steps (captured, replayed, eager and why),\n"
    "                              its capture key's captures and evictions on its worker up to\n"
    "                              its end, its key's other requests' median, and a verdict\n"
    "\n"
    "exit codes: 0 ok, 1 runtime failure, 2 bad usage or input\n";

/* The usage of one command on stdout: every entry of `usage` whose head
 * line (two spaces, then the command) names cmd, with its continuation
 * lines. false (nothing printed) for a command the text does not name. */
static bool command_usage(const char *cmd) {
    size_t n = strlen(cmd);
    bool any = false, in = false;
    for (const char *l = usage; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) + 1 : strlen(l);
        bool head = len > 2 && l[0] == ' ' && l[1] == ' ' && l[2] != ' ';
        if (head) { /* its commands: the first word, and words after " | " ("stats | keys | ...",
                        * past any " [--option]" of the word before) */
            in = false;
            for (const char *w = l + 2;;) {
                size_t wl = strcspn(w, " \n");
                if (wl == n && !strncmp(w, cmd, n)) in = true;
                w += wl;
                while (w[0] == ' ' && w[1] == '[' && strchr(w, ']') && strchr(w, ']') < l + len) w = strchr(w, ']') + 1;
                if (strncmp(w, " | ", 3)) break;
                w += 3;
            }
        } else if (len <= 1 || l[0] != ' ') {
            in = false;
        }
        if (in) {
            if (!any) fputs("usage: reelctl <command> [options]\n\n", stdout);
            fwrite(l, 1, len, stdout);
            any = true;
        }
        l += len;
    }
    return any;
}

/* The command argv names: its return (ctl.h: 0, CTL_NO or -1 with the
 * error value set). */
static int dispatch(int argc, char **argv) {
    const char *cmd = argv[1];
    /* `reelctl CMD ... --help` (or -h): that command's usage, on stdout, 0 */
    for (int i = 2; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (command_usage(cmd)) return 0;
            fputs(usage, stderr);
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
    fputs(usage, stderr);
    return reel_fail(REEL_E_INVALID, "unknown command '%s'", cmd);
}

/* The one place a failure is printed and becomes an exit status. */
int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? reel_exit_status(REEL_E_INVALID) : 0;
    }
    int rc = dispatch(argc, argv);
    if (rc >= 0) return rc;
    if (reel_err_code() == REEL_OK) /* a bug: never exit 0 for a failure */
        reel_fail(REEL_E_INTERNAL, "%s failed without saying why", argv[1]);
    fprintf(stderr, "reelctl: %s\n", reel_err_text());
    return reel_exit_status(reel_err_code());
}
