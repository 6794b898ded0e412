/* usage.c -- reelctl's usage text: `reelctl --help` is the overview of
 * every command (their entries below, in order, with the section lines
 * between them); `reelctl CMD [SUB] --help` is the entries of that command
 * and its own part: each option with its default. One table, so the
 * overview and a command's help can not say different things. */
#include "ctl.h"
#include "base/error.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One piece of the usage. cmd: the command(s) it belongs to, alternatives
 * separated by '|' ("weights inspect|weights info"); NULL: a line of the
 * overview only (a heading). text: its lines in the overview (NULL: none;
 * a catalog report is one word of a shared line). opts: its options with
 * their defaults, which its own --help adds; NULL for an entry that adds
 * none (the command's other entry lists them). about: what its --help
 * says before the options, where text does not (a catalog report's
 * synopsis); NULL: nothing. */
typedef struct {
    const char *cmd;
    const char *text;
    const char *opts;
    const char *about;
} usage_t;

#define CATALOG_OPTS                                                                                        \
    "  --catalog PATH          the catalog (default $REEL_CATALOG, else reel.db); up to 4 of\n"              \
    "                          them: their union, each request once (a standby pair's two)\n"
#define TABLE_OPTS "  --json                  the rows as JSON on one line instead of a table\n"
#define BROKER_OPTS                                                                                         \
    "  --broker EP             the broker (default tcp://127.0.0.1:5555); A,B: a standby pair,\n"             \
    "                          whichever is active\n"                                                          \
    "  --key NAME.key          this client's CURVE key (default $REEL_KEY; none: no CURVE)\n"                 \
    "  --broker-key B.pub      the broker's public key (default $REEL_BROKER_KEY), for a broker\n"            \
    "                          started with --keys\n"

static const usage_t usages[] = {
    { NULL, "usage: reelctl <command> [options]\n\ncommands:\n", NULL, NULL },
    { "weights init",
      "  weights init --config tiny|small|wan2.1-1.3b|wan2.1-14b|FILE.json --seed N --out W.safetensors\n"
      "                              write deterministic random weights\n",
      "  --config NAME|FILE.json a built-in config (tiny, small, wan2.1-1.3b, wan2.1-14b) or a\n"
      "                          JSON file of one: name, dim, heads, layers, ffn_dim,\n"
      "                          in_channels, text_dim, freq_dim[, text_len] (required)\n"
      "  --seed N                the seed of the values (default 0)\n"
      "  --out W.safetensors     the file written (required)\n", NULL },
    { "weights init-t5",
      "  weights init-t5 --config t5-tiny|t5-small|umt5-xxl --seed N [--dtype f32|bf16] --out T5.safetensors\n"
      "                              random umT5 text-encoder weights under the release's names\n",
      "  --config NAME           t5-tiny, t5-small or umt5-xxl (Wan2.1's encoder) (required)\n"
      "  --seed N                the seed of the values (default 0)\n"
      "  --dtype f32|bf16        the weights' dtype (default f32)\n"
      "  --out T5.safetensors    the file written (required)\n", NULL },
    { "weights inspect|weights info",
      "  weights inspect PATH [--json]  a checkpoint's layout, config, parameters, dtypes, bytes,\n"
      "                              files and the sha256 a sync announces; PATH: a Reel file, a\n"
      "                              Wan2.1 release file or folder, a sharded index or its folder,\n"
      "                              a diffusers transformer folder or pipeline root (info: the\n"
      "                              same); run --weights, reel-worker and syncs take any of them;\n"
      "                              a PEFT LoRA folder: its rank, alpha, scale and targets\n",
      "  PATH                    the checkpoint or adapter (required)\n"
      "  --json                  one JSON object instead of the text (default: text)\n", NULL },
    { "weights export",
      "  weights export PATH --out DIR [--dtype f32|bf16|f16]\n"
      "                              PATH in the layout a Wan2.1 release ships: DIR holds\n"
      "                              diffusion_pytorch_model.safetensors and Wan's config.json\n",
      "  PATH                    the checkpoint, in any layout inspect reads (required)\n"
      "  --out DIR               the folder written (made when missing) (required)\n"
      "  --dtype f32|bf16|f16    the exported weights' dtype (default f32)\n", NULL },
    { "run",
      "  run --weights W --latent IN.safetensors --context C.safetensors [--uncond U.safetensors]\n"
      "      --steps N --shift S [--cfg G] [--solver euler|unipc|dpm++] [--sde --eta A] [--seed K]\n"
      "      [--backend cpu|cuda]\n"
      "      [--dtype f32|bf16] [--graphs on|off] [--warmup N] [--lora DIR] --out OUT.safetensors\n"
      "                              one denoising loop in this process (no broker); --lora: a\n"
      "                              PEFT LoRA adapter merged into the weights (W + s*B*A)\n"
      "      (--size FxHxW --seed K draws the initial latent instead of --latent; --sde with --solver\n"
      "      unipc|dpm++: Flow-GRPO's SDE steps on that solver's sigmas and int timesteps)\n",
      NULL, NULL },
    { "run",
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
      "      --sample_guide_scale, --base_seed (not -1: give a seed), --negative_prompt (run and gen)\n",
      "  --weights W|DIR         the transformer: a file or folder in any layout weights inspect\n"
      "                          reads; with --prompt, a release folder gives the other parts (required)\n"
      "  --context C.safetensors tensor context [L,T] (required unless --prompt)\n"
      "  --uncond U.safetensors  the unconditional context: turns guidance on (needs --cfg)\n"
      "  --prompt TEXT           text, encoded here, instead of --context and --uncond; not empty\n"
      "                          (an empty prompt's context: encode it, see reelctl encode --help)\n"
      "  --negative-prompt TEXT  with --prompt and guidance (default: Wan2.1's; '' the same)\n"
      "  --t5 T5 --tokenizer PATH --vae VAE\n"
      "                          the parts a prompt run uses (default: the release folder's)\n"
      "  --latent L.safetensors  tensor latent [C,F,H,W]: the initial noise\n"
      "  --size FxHxW|W*H        draw the initial latent from --seed instead (W*H: Wan's pixels,\n"
      "                          with --frame_num N frames, default 81)\n"
      "  --seed K                the seed of the drawn latent and the SDE noise (default 0)\n"
      "  --steps N               denoising steps, 1..10000 (required; with --prompt default 50)\n"
      "  --shift S               the sigma shift (default 1; with --prompt 5)\n"
      "  --cfg G                 the guidance scale (with --uncond; with --prompt default 5;\n"
      "                          1: no guidance)\n"
      "  --solver euler|unipc|dpm++  (default euler; with --prompt unipc)\n"
      "  --sde                   SDE steps (Flow-GRPO's) instead of the ODE (default off)\n"
      "  --eta A                 the SDE noise level (default 0.7)\n"
      "  --backend cpu|cuda      where it runs (default cpu; cuda falls back to the CPU, said)\n"
      "  --no-fallback           an unusable CUDA is an error instead of a CPU run\n"
      "  --dtype f32|bf16        the weights' dtype on the device (default f32)\n"
      "  --graphs on|off         through the capture cache (on, default) or eagerly\n"
      "  --warmup N              eager steps of a key before its capture, 0..1000 (default 2)\n"
      "  --lora DIR              a PEFT LoRA adapter merged into the weights (default none)\n"
      "  --out OUT, -o OUT       OUT.safetensors (tensor latent), or with --prompt OUT.mp4 (required)\n", NULL },
    { "encode",
      "  encode --t5 T5 --tokenizer PATH --prompt TEXT [--text-len N] -o OUT.safetensors\n"
      "                              a prompt as Wan's T5EncoderModel encodes it: context [L, dim] F32,\n"
      "                              L its real length (at most --text-len, 512); T5: the release's\n"
      "                              .pth, a safetensors copy or diffusers' text_encoder/ (UMT5);\n"
      "                              PATH: spiece.model or its folder\n",
      NULL, NULL },
    { "encode",
      "  encode --t5 T5 --ids 5,17,1 [--pad-to N] [--backend cpu|cuda] [--dtype f32|bf16]\n"
      "      -o OUT.safetensors      token ids through the umT5 encoder: OUT holds context [n, dim] F32\n",
      "  --t5 T5                 the text encoder (required)\n"
      "  --tokenizer PATH --prompt TEXT\n"
      "                          the prompt and its tokenizer (or --ids); --prompt '' is the\n"
      "                          end-of-sequence token alone, Wan's empty prompt: give its OUT as\n"
      "                          --context to run or gen, which take no empty --prompt\n"
      "  --ids A,B,..            token ids instead of a prompt\n"
      "  --text-len N            the most tokens of a prompt (default 512, Wan2.1's)\n"
      "  --pad-to N              pad the ids to N rows (default: no padding)\n"
      "  --backend cpu|cuda      (default cpu)\n"
      "  --dtype f32|bf16        the encoder's dtype (default f32)\n"
      "  --out OUT, -o OUT       the file written: tensor context (required)\n", NULL },
    { "weights init-vae",
      "  weights init-vae --config wan2.1|vae-tiny [--dim D] [--z-dim Z] --seed N --out V.safetensors\n"
      "                              random weights of Wan2.1's VAE decoder (release names)\n",
      "  --config NAME           wan2.1 (the release's sizes) or vae-tiny (required)\n"
      "  --dim D                 the base width, 1..4096 (default: the config's)\n"
      "  --z-dim Z               the latent channels, 1..64 (default: the config's)\n"
      "  --seed N                the seed of the values (default 0)\n"
      "  --out V.safetensors     the file written (required)\n", NULL },
    { "decode",
      "  decode --vae VAE LATENT.safetensors -o OUT.safetensors|OUT.mp4 [--backend cpu|cuda]\n"
      "      [--quiet]               latent [z,F,H,W] to video [3,1+4(F-1),8H,8W] in [-1,1], or an\n"
      "                              H.264 MP4 at 16 fps; VAE: Wan2.1_VAE.pth, a safetensors copy or\n"
      "                              diffusers' vae/ (AutoencoderKLWan)\n"
      "                              through the VAE decoder, one latent frame at a time\n",
      "  --vae VAE               the VAE decoder's weights (required)\n"
      "  LATENT.safetensors      tensor latent [z,F,H,W] (required)\n"
      "  --out OUT, -o OUT       OUT.safetensors (tensor video) or OUT.mp4 (required)\n"
      "  --backend cpu|cuda      (default cpu)\n"
      "  --quiet                 no progress line per latent frame\n", NULL },
    { "kernels", "  kernels [--json]            list the registered kernels\n",
      "  --json                  one JSON array instead of the table\n", NULL },
    { "artifacts|artifacts list|artifacts verify|artifacts report",
      "  artifacts list|verify|report DIR [--enable ID,..] [--timing off|sync|shadow] [--json]\n"
      "                              kernel bundles under DIR (docs/ARTIFACTS.md); report\n"
      "                              runs a loop native, then with them, and measures\n",
      NULL, NULL },
    { "artifacts|artifacts list|artifacts verify|artifacts report",
      "  artifacts report --catalog PATH [--json]  what workers reported to the catalog\n",
      "  list DIR                every bundle: verified or refused, and why\n"
      "  verify DIR              the same, then loads the enabled ones (exit 1 when any is\n"
      "                          refused or fails to load)\n"
      "  report DIR              a loop native, then with the artifacts: calls, parity, speedup\n"
      "  --enable ID,..          the bundles enabled (default: every verified one)\n"
      "  --timing off|sync|shadow  how report times them (default shadow)\n"
      "  --config NAME           report's model (default tiny)\n"
      "  --size FxHxW            report's latent (default 2x8x8)\n"
      "  --steps N               report's steps, 1..1000 (default 6)\n"
      "  --graphs on|off         report through the capture cache (default on)\n"
      "  --catalog PATH          report what workers sent the catalog instead (no DIR)\n"
      "  --json                  JSON instead of text\n", NULL },
    { "tensor rand",
      "  tensor rand --name N --shape A,B,.. --seed K --out F.safetensors\n"
      "                              a tensor of N(0,1) values (inputs for run)\n",
      "  --name N                the tensor's name: latent, context, ... (required)\n"
      "  --shape A,B,..          up to 8 dimensions, each 1..2^24 (required)\n"
      "  --seed K                the seed of the values (default 0)\n"
      "  --out F.safetensors     the file written (required)\n", NULL },
    { "tensor info", "  tensor info F.safetensors   shape and statistics of every tensor\n",
      "  F.safetensors           the file read (required); no options\n", NULL },
    { "tensor diff", "  tensor diff A B [--name N]  bitwise comparison (exit 0 equal, 1 different)\n",
      "  A B                     the two safetensors files (required)\n"
      "  --name N                the tensor compared (default latent)\n", NULL },
    { "tokenize",
      "  tokenize --tokenizer PATH --prompt TEXT [--max-len N]\n"
      "                              the ids Wan's tokenizer gives a prompt (cleaned, eos last, at\n"
      "                              most N: 512), comma separated: what encode feeds the encoder\n",
      NULL, NULL },
    { "tokenize", "  tokenize --clean --prompt TEXT   the prompt as Wan's cleaning (ftfy, html, spaces) leaves it\n",
      "  --tokenizer PATH        spiece.model or its folder (required without --clean)\n"
      "  --prompt TEXT           the text (required)\n"
      "  --max-len N             the most ids, 1..1048576 (default 512)\n"
      "  --clean                 print the cleaned prompt instead of ids (no --tokenizer)\n", NULL },
    { "plan",
      "  plan --config NAME|FILE.json --size FxHxW [--text L] [--cfg] [--gpu h200|h100|a100]\n"
      "      [--attention fused|decomposed]\n"
      "                              one step on paper: each op group's FLOPs, bytes and time\n"
      "                              at the GPU's published peaks; last line the step total\n",
      "  --config NAME|FILE.json the model (required)\n"
      "  --size FxHxW            the latent, H and W even (required)\n"
      "  --text L                the context rows, 1..65536 (default: the config's text_len,\n"
      "                          else 512)\n"
      "  --cfg                   with guidance: two rows per step (default off)\n"
      "  --gpu h200|h100|a100    whose peaks (default h200)\n"
      "  --attention fused|decomposed  (default fused where a head is at most 128 wide and a\n"
      "                          multiple of 8, else decomposed)\n", NULL },
    { "video probe", "  video probe FILE [--json]   a video's decoded frame count, size, frame rate and codec\n",
      "  FILE                    the video (required)\n"
      "  --json                  one JSON object instead of the text\n", NULL },
    { NULL,
      "\n"
      "  against a running broker (default tcp://127.0.0.1:5555, --broker EP; --broker A,B:\n"
      "  a standby pair, whichever is active):\n",
      NULL, NULL },
    { "gen",
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
      "      --prompts FILE --out-dir DIR [--window W] [--skip-existing]: one request a line\n"
      "      of FILE, in one round on one connection (W in flight, default 16), the other\n"
      "      options shared; line N's output is DIR/NNNN.safetensors (--output video:\n"
      "      DIR/NNNN.mp4, its latent beside it) written as it comes, its seed --seed K + N - 1;\n"
      "      a line is a prompt, or a JSON object {\"prompt\": .., \"seed\": .., \"negative_prompt\": ..};\n"
      "      blank lines are skipped; a bad line stops it before anything is sent (exit 2);\n"
      "      lines that fail are said with their number, the others go on (exit 1 unless every\n"
      "      line's output was written); an output that cannot be written (a full disk) stops\n"
      "      the round; --skip-existing runs only the lines whose output is not in DIR yet (a\n"
      "      round cut short, run again)\n",
      "  --model NAME            the model the workers serve (--config: the same) (required)\n"
      "  --context C.safetensors tensor context [L,T] (required unless --prompt or --prompts)\n"
      "  --uncond U.safetensors  the unconditional context: turns guidance on (needs --cfg)\n"
      "  --prompt TEXT           text the worker encodes, instead of --context; not empty (a GEN\n"
      "                          reads '' as no prompt; an empty prompt's context: encode it,\n"
      "                          see reelctl encode --help)\n"
      "  --negative-prompt TEXT  with --prompt and guidance (default: Wan2.1's; '' the same)\n"
      "  --latent L.safetensors  tensor latent [C,F,H,W] ([G,C,F,H,W] for a group)\n"
      "  --size FxHxW|W*H        draw the latent from the seed instead (W*H: with --frame_num N,\n"
      "                          default 81)\n"
      "  --channels C            the latent's channels with --size (default: the built-in model's)\n"
      "  --seed K                (default 0)\n"
      "  --steps N               1..10000 (required; with --prompt or --prompts default 50)\n"
      "  --shift S               (default 1; with --prompt or --prompts 5)\n"
      "  --cfg G                 the guidance scale (default 1: none; with --prompt 5)\n"
      "  --solver euler|unipc|dpm++  (default euler; with --prompt unipc)\n"
      "  --sde, --eta A          SDE steps and their noise level (default off, 0.7)\n"
      "  --weights-version V     the oldest weights it may run on (default 0: the current)\n"
      "  --deadline-ms D         the broker's deadline for it (default 0: the broker's own)\n"
      "  --timeout-ms T          how long reelctl waits (default 120000; at least D + 2000)\n"
      "  --n G, --seeds S1,..    a group of G samples, 1..64 (default 1)\n"
      "  --trajectory, --log-probs, --means  rollout outputs into OUT (default none)\n"
      "  --output latent|frames|video  what the worker returns (default latent; --out X.mp4: video)\n"
      "  --quiet                 no progress bar and no note of the defaults taken\n"
      "  --out OUT, -o OUT       the file written (required, but with --prompts)\n"
      "  --prompts FILE          one request a line (a prompt, or JSON with prompt, seed,\n"
      "                          negative_prompt), instead of --prompt/--context and --out\n"
      "  --out-dir DIR           with --prompts: where line N's output goes, DIR/NNNN.* (made\n"
      "                          when missing; its parent must exist)\n"
      "  --window W              with --prompts: requests in flight at once, 1..1024 (default 16);\n"
      "                          --timeout-ms is then each request's, from its own send\n"
      "  --skip-existing         with --prompts: a line whose output is in DIR already is not\n"
      "                          run again (its latent file, written last, whole or not at all)\n" BROKER_OPTS, NULL },
    { "sync",
      "  sync --version V (--weights W.safetensors | --upload W.safetensors) [--component C]\n"
      "      [--deadline-ms D] [--timeout-ms T]\n"
      "                              --upload: by value, the bytes through the broker (its\n"
      "                              --weights-dir), for workers on hosts without the file\n"
      "                              publish a weight sync; waits for every worker (exit 1\n"
      "                              unless all applied it; each failure's reason printed)\n",
      NULL, NULL },
    { "sync",
      "  sync --version V --base B (--lora DIR | --lora-upload DIR | --lora none --weights BASE)\n"
      "                              a LoRA adapter (PEFT folder) merged by workers run with\n"
      "                              --lora into their base B, every graph kept; none: B again\n",
      "  --version V             the version published (required)\n"
      "  --weights W             a path the workers read (any layout weights inspect reads)\n"
      "  --upload W              the file sent by value through the broker instead\n"
      "  --component C           (default transformer)\n"
      "  --base B                the full version a LoRA adapter applies to (below V)\n"
      "  --lora DIR|none, --lora-upload DIR  the adapter, by path or by value\n"
      "  --deadline-ms D         how long workers have to apply it (default 60000)\n"
      "  --timeout-ms T          how long reelctl waits (default 120000)\n" BROKER_OPTS, NULL },
    { "status", "  status [--json]             live workers (lagging ones with why), queue, versions\n",
      "  --json                  the STATUS_REPLY as one JSON object\n" BROKER_OPTS, NULL },
    { "top",
      "  top [--interval-ms 1000] [--count N]\n"
      "                              a live view: queue, versions, requests/s, graph hit rate,\n"
      "                              workers; redraws in place on a terminal, plain lines piped\n",
      "  --interval-ms T         between views, 100..3600000 (default 1000)\n"
      "  --count N               stop after N views (default 0: until ^C)\n" BROKER_OPTS, NULL },
    { NULL,
      "  (each takes --key NAME.key --broker-key broker.pub, else $REEL_KEY and\n"
      "   $REEL_BROKER_KEY: CURVE, for a broker started with --keys)\n"
      "\n",
      NULL, NULL },
    { "keys new",
      "  keys new --role client|trainer|worker|broker [--name N] [--force] --out DIR\n"
      "                              a CURVE key pair: DIR/N.key (secret) and DIR/N.pub, 0600;\n"
      "                              the broker admits the peers whose N.pub is in its --keys DIR\n",
      "  --role R                client, trainer, worker or broker (required)\n"
      "  --name N                the pair's name (default: the role)\n"
      "  --out DIR               the folder (made 0700 when missing) (required)\n"
      "  --force                 replace an existing N.key and N.pub (default: refused, exit 2;\n"
      "                          the peers and the broker then need the new files)\n", NULL },
    { NULL,
      "\n"
      "  reading the catalog (--catalog PATH, default reel.db or $REEL_CATALOG; --json, why too):\n",
      NULL, NULL },
    { NULL, "  stats | keys | evictions | versions [--all] | workers | requests\n", NULL, NULL },
    { "stats", NULL, CATALOG_OPTS TABLE_OPTS,
      "  stats [--catalog PATH]... [--json]\n"
      "                              per worker: requests, captures, replays, hit rate, eager\n"
      "                              breaks, declines and evictions by reason\n" },
    { "keys", NULL, CATALOG_OPTS TABLE_OPTS,
      "  keys [--catalog PATH]... [--json]\n"
      "                              capture keys: their workers, captures, replays, declines,\n"
      "                              last replay and key text\n" },
    { "evictions", NULL, CATALOG_OPTS TABLE_OPTS,
      "  evictions [--catalog PATH]... [--json]\n"
      "                              graphs evicted: when, on which worker and stream, why, the\n"
      "                              sync's component and versions, the key\n" },
    { "versions", NULL,
      CATALOG_OPTS TABLE_OPTS "  --all                   every version (default: the 10 newest of each component)\n",
      "  versions [--all] [--catalog PATH]... [--json]\n"
      "                              weight versions published: state, time, sha256, the workers\n"
      "                              that applied them or failed, source, LoRA base and adapter\n" },
    { "workers", NULL, CATALOG_OPTS TABLE_OPTS,
      "  workers [--catalog PATH]... [--json]\n"
      "                              workers seen: device, arch, streams, budget, last seen, gone\n"
      "                              and why, versions, lagging components\n" },
    { "requests", NULL, CATALOG_OPTS TABLE_OPTS,
      "  requests [--catalog PATH]... [--json]\n"
      "                              the recent requests, newest first: time, id (the client's)\n"
      "                              and broker_id (the broker's, the one a worker's log names;\n"
      "                              - in rows before schema 17), worker, version, steps as\n"
      "                              captured, replayed and eager, batching, seconds, status and\n"
      "                              keys; reelctl why takes either id\n" },
    { "report",
      "  report --html OUT.html | --json [--since T|-SECONDS]\n"
      "                              one self-contained HTML page: hit rate over time with the\n"
      "                              syncs marked, captures and evictions per sync, declines,\n"
      "                              workers, keys, the slowest requests (SVG, no network);\n"
      "                              --json: the same data on stdout\n",
      "  --html OUT.html         the page written (or --json)\n"
      "  --json                  the page's data as JSON on stdout (or --html)\n"
      "  --since T|-SECONDS      from UNIX time T, or the last SECONDS (default: everything)\n"
      CATALOG_OPTS, NULL },
    { "metrics",
      "  metrics [--broker EP]       the stats counters in the Prometheus text format (with\n"
      "                              --broker, the broker's live counters too: peers, catalog)\n",
      "  --broker EP             the broker's live counters too (default: the catalog's alone;\n"
      "                          with no catalog at PATH, the broker's alone)\n"
      CATALOG_OPTS, NULL },
    { "why",
      "  why ID [--worker NAME]      why request ID (as `requests` shows it; the newest with it)\n"
      "                              took its time: its steps (captured, replayed, eager and why),\n"
      "                              its capture key's captures and evictions on its worker up to\n"
      "                              its end, its key's other requests' median, and a verdict\n",
      "  ID                      the client's id (requests' id), or the broker's (requests'\n"
      "                          broker_id, the one a worker's log names) (required)\n"
      "  --worker NAME           the row of that worker (default: the newest with the id)\n" CATALOG_OPTS
      "  --json                  one JSON object instead of the text\n", NULL },
    { NULL,
      "\n"
      "exit codes: 0 ok, 1 runtime failure, 2 bad usage or input\n"
      "reelctl COMMAND --help: that command's options and their defaults\n",
      NULL, NULL },
};
#define N_USAGES (sizeof usages / sizeof usages[0])

/* Whether the alternatives of cmd ("a b|c") hold want exactly, or, with
 * prefix, one that begins with want and a space ("weights" of "weights
 * init"). */
static bool names(const char *cmd, const char *want, bool prefix) {
    size_t n = strlen(want);
    for (const char *a = cmd; a;) {
        const char *bar = strchr(a, '|');
        size_t len = bar ? (size_t)(bar - a) : strlen(a);
        if ((len == n || (prefix && len > n && a[n] == ' ')) && !strncmp(a, want, n)) return true;
        a = bar ? bar + 1 : NULL;
    }
    return false;
}

/* Entry i is of the command key itself (exact), or of one of its
 * subcommands (key a group: "weights", "tensor"; "keys" is both). */
static bool is_of(size_t i, const char *key) { return usages[i].cmd && names(usages[i].cmd, key, false); }
static bool is_sub(size_t i, const char *key) {
    return usages[i].cmd && !names(usages[i].cmd, key, false) && names(usages[i].cmd, key, true);
}

void ctl_usage_all(FILE *out) {
    for (size_t i = 0; i < N_USAGES; i++)
        if (usages[i].text) fputs(usages[i].text, out);
}

bool ctl_usage_print(const char *key, FILE *out) {
    bool of = false, sub = false;
    for (size_t i = 0; i < N_USAGES; i++) {
        of |= is_of(i, key);
        sub |= is_sub(i, key);
    }
    if (!of && !sub) return false;
    fprintf(out, "usage: reelctl %s%s [options]\n\n", key, of ? "" : " SUBCOMMAND");
    bool said = false; /* a blank line between the overview's lines and the about */
    for (size_t i = 0; i < N_USAGES; i++)
        if (is_of(i, key) && usages[i].text) {
            fputs(usages[i].text, out);
            said = true;
        }
    for (size_t i = 0; i < N_USAGES; i++)
        if (is_of(i, key) && usages[i].about) fprintf(out, "%s%s", said ? "\n" : "", usages[i].about);
    for (size_t i = 0; i < N_USAGES; i++)
        if (is_of(i, key) && usages[i].opts) fprintf(out, "\noptions:\n%s", usages[i].opts);
    if (!sub) return true;
    fputs(of ? "\nsubcommands:\n" : "", out);
    for (size_t i = 0; i < N_USAGES; i++)
        if (is_sub(i, key) && usages[i].text) fputs(usages[i].text, out);
    fprintf(out, "\nreelctl %s SUBCOMMAND --help: its options and their defaults\n", key);
    return true;
}

bool ctl_usage_help(int argc, char **argv, FILE *out) {
    char two[128];
    /* `weights init-t5`, `keys new`: the subcommand's own, where it has one */
    if (argc > 2 && argv[2][0] != '-' && snprintf(two, sizeof two, "%s %s", argv[1], argv[2]) < (int)sizeof two)
        for (size_t i = 0; i < N_USAGES; i++)
            if (is_of(i, two)) return ctl_usage_print(two, out);
    return ctl_usage_print(argv[1], out);
}

/* The command whose usage main prints before the error (ctl_fail_usage);
 * reelctl runs one command, on its main thread. */
static char wanted[64];

int ctl_fail_usage(const char *cmd, const char *fmt, ...) {
    char msg[REEL_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(wanted, sizeof wanted, "%s", cmd);
    return reel_fail(REEL_E_INVALID, "%s", msg);
}

const char *ctl_usage_wanted(void) { return wanted[0] ? wanted : NULL; }
