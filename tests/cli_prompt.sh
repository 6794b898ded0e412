#!/bin/sh
# cli_prompt.sh -- prompt in, video out, through real processes (issue 26):
# a release folder found by its release names (the DiT exported, the text
# encoder and the VAE as .pth files torch.save would write, the tokenizer
# under google/umt5-xxl/), `reelctl run --prompt -o X.mp4` on it, and a
# broker with two workers, one with a text encoder and a VAE and one
# without: prompt GENs and decoded outputs go only to the first, the
# video is the decode of the latent, which is bitwise reelctl run's, the
# catalog records the encode and decode seconds, and every refusal says
# why. Every wait is bounded; every process is killed on exit.
# Usage: cli_prompt.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-prompt.XXXXXX)
SUITE=prompt
HERE=$(dirname "$0")
. "$HERE/lib_cli.sh"
PY=/usr/bin/python3
CE="ipc://$D/c"
WE="ipc://$D/w"
DB="$D/reel.db"

# The parts: a DiT with text_len, umT5 (t5-tiny), its tokenizer, a VAE
# (lib_cli.sh), and a plain tiny DiT.
t2v_parts "$D" || finish
"$R" weights init --config tiny --seed 7 --out "$D/plain.safetensors" 2>/dev/null || { bad "weights"; finish; }

echo "== a release folder: its parts found by their release names, .pth files read without unpickling"
REL="$D/Wan2.1-T2V-tiny"
"$R" weights export "$D/dit.safetensors" --out "$REL" >/dev/null 2>&1 &&
    mkdir -p "$REL/google/umt5-xxl" && cp "$D/spiece.model" "$REL/google/umt5-xxl/" &&
    $PY "$HERE/st_to_pth.py" "$D/t5.safetensors" "$REL/models_t5_umt5-xxl-enc-bf16.pth" &&
    $PY "$HERE/st_to_pth.py" "$D/vae.safetensors" "$REL/Wan2.1_VAE.pth" || { bad "the release folder is built"; finish; }
P="a cat on a skateboard"
RUN="$R run --size 2x8x8 --steps 4 --shift 3 --seed 1 --cfg 4"
if $RUN --weights "$REL" --prompt "$P" -o "$D/rel.mp4" 2>"$D/rel.err"; then
    "$R" video probe "$D/rel.mp4" --json >"$D/rel.json" 2>&1
    grep -q '"frames":5,"height":64,"width":64,"fps":16,"codec":"h264"' "$D/rel.json" &&
        ok "reelctl run --weights FOLDER --prompt -o X.mp4: 5 frames of 64x64, H.264 at 16 fps" ||
        { bad "the video of the release folder"; show "$D/rel.json"; }
else bad "reelctl run on the release folder"; show "$D/rel.err"; fi
$RUN --weights "$D/dit.safetensors" --t5 "$D/t5.safetensors" --tokenizer "$D/spiece.model" --vae "$D/vae.safetensors" \
    --prompt "$P" -o "$D/parts.mp4" 2>"$D/parts.err" &&
    "$R" tensor diff "$D/rel.mp4.safetensors" "$D/parts.mp4.safetensors" >/dev/null 2>&1 &&
    ok "the same parts by flag (safetensors copies) give the bitwise same latent as the release's .pth files" ||
    { bad "flags vs release folder"; show "$D/parts.err"; }
echo "== a diffusers pipeline: text_encoder/ (UMT5, 2 shards), tokenizer/ and vae/ (AutoencoderKLWan) as published"
# written by tests/wan_diffusers_parts.py from the published renames; the
# same values, so the same bits as the Wan-named files
PIPE="$D/layouts/pipeline"
$PY "$HERE/wan_layouts.py" "$D/dit.safetensors" "$D/layouts" >/dev/null 2>"$D/lay.err" && rm -rf "$PIPE/vae" &&
    $PY "$HERE/wan_diffusers_parts.py" "$D/t5.safetensors" "$D/vae.safetensors" "$PIPE" 2>>"$D/lay.err" &&
    mkdir -p "$PIPE/tokenizer" && cp "$D/spiece.model" "$PIPE/tokenizer/" || { bad "the pipeline is built"; show "$D/lay.err"; finish; }
"$R" weights inspect "$PIPE" >"$D/pi.txt" 2>&1 && "$R" weights inspect "$PIPE" --json >"$D/pi.json" 2>&1 &&
    grep -q "^text enc    $PIPE/text_encoder$" "$D/pi.txt" && grep -q "^vae         $PIPE/vae$" "$D/pi.txt" &&
    grep -q "^tokenizer   $PIPE/tokenizer$" "$D/pi.txt" &&
    $PY -c 'import json,sys; p=json.load(open(sys.argv[1]))["parts"]; sys.exit(0 if p["vae"].endswith("/vae") and p["text_encoder"].endswith("/text_encoder") else 1)' "$D/pi.json" &&
    ok "weights inspect on the pipeline root lists its text encoder, tokenizer and VAE" ||
    { bad "inspect the pipeline's parts"; show "$D/pi.txt" "$D/pi.json"; }
"$R" encode --t5 "$PIPE/text_encoder" --tokenizer "$PIPE/tokenizer" --prompt "$P" -o "$D/pe.safetensors" 2>"$D/pe.err" &&
    "$R" encode --t5 "$D/t5.safetensors" --tokenizer "$D/spiece.model" --prompt "$P" -o "$D/we.safetensors" 2>>"$D/pe.err" &&
    "$R" tensor diff "$D/pe.safetensors" "$D/we.safetensors" --name context >/dev/null 2>&1 &&
    ok "encode --t5 text_encoder/ (transformers' UMT5, sharded) is bitwise the Wan-named encoder's context" ||
    { bad "encode through text_encoder/"; show "$D/pe.err"; }
$PY -c "
import sys; sys.path.insert(0, sys.argv[1]); import safetensors_np, numpy as np
safetensors_np.save(sys.argv[2], {'latent': np.random.RandomState(3).randn(4, 2, 8, 8).astype(np.float32)})
" "$HERE/crosscheck" "$D/dl.safetensors" &&
    "$R" decode --vae "$PIPE/vae" "$D/dl.safetensors" -o "$D/pd.safetensors" --quiet 2>"$D/pd.err" &&
    "$R" decode --vae "$D/vae.safetensors" "$D/dl.safetensors" -o "$D/wd.safetensors" --quiet 2>>"$D/pd.err" &&
    "$R" tensor diff "$D/pd.safetensors" "$D/wd.safetensors" --name video >/dev/null 2>&1 &&
    ok "decode --vae vae/ (diffusers' AutoencoderKLWan names) is bitwise the Wan-named VAE's video" ||
    { bad "decode through vae/"; show "$D/pd.err"; }
$RUN --weights "$PIPE" --prompt "$P" -o "$D/pipe.mp4" 2>"$D/pipe.err" &&
    $RUN --weights "$PIPE" --t5 "$D/t5.safetensors" --tokenizer "$D/spiece.model" --vae "$D/vae.safetensors" \
        --prompt "$P" -o "$D/pipew.mp4" 2>>"$D/pipe.err" &&
    "$R" tensor diff "$D/pipe.mp4.safetensors" "$D/pipew.mp4.safetensors" >/dev/null 2>&1 &&
    "$R" video probe "$D/pipe.mp4" --json 2>&1 | grep -q '"frames":5,"height":64,"width":64' &&
    ok "run --weights PIPELINE --prompt -o X.mp4 takes its text_encoder/, tokenizer/ and vae/: the latent bitwise the Wan files'" ||
    { bad "run on a diffusers pipeline"; show "$D/pipe.err"; }
rm -rf "$PIPE/vae/diffusion_pytorch_model.safetensors"
$RUN --weights "$PIPE" --prompt "$P" -o "$D/novae.mp4" 2>"$D/novae.err"
[ $? = 2 ] && grep -q "vae: a folder without model.safetensors, diffusion_pytorch_model.safetensors" "$D/novae.err" &&
    ok "a pipeline whose vae/ holds no weights is refused naming it (exit 2), not run without its VAE" ||
    { bad "a pipeline without VAE weights"; show "$D/novae.err"; }
# A pipeline's scheduler/scheduler_config.json gives a prompt run its
# sampler and shift where the flags do not (diffusers' UniPC with flow
# sigmas, FlowMatchEuler, DPM-Solver++), said on stderr with the file;
# where Reel's sampler steps otherwise than diffusers' (a UniPC key Reel
# does not run, DPM++'s and Euler's grids) stderr says how; a scheduler
# Reel has no sampler for keeps Wan's defaults, saying so
sched() { # name json: a copy of the pipeline with that scheduler config
    rm -rf "$D/ps_$1"; cp -r "$PIPE" "$D/ps_$1" && mkdir -p "$D/ps_$1/scheduler" && printf '%s' "$2" >"$D/ps_$1/scheduler/scheduler_config.json"
}
SRUN="$R run --size 2x8x8 --steps 2 --seed 1"
sched unipc '{"_class_name":"UniPCMultistepScheduler","_diffusers_version":"0.33.0.dev0","beta_schedule":"linear","flow_shift":3.0,"prediction_type":"flow_prediction","solver_order":2,"use_flow_sigmas":true}'
$SRUN --prompt "$P" --weights "$D/ps_unipc" -o "$D/su.safetensors" 2>"$D/su.err" &&
    grep -q "run --prompt: defaults for what was not given: --solver unipc --shift 3 from $D/ps_unipc/scheduler/scheduler_config.json; Wan2.1's text-to-video: --cfg 5" "$D/su.err" &&
    ! grep -q "diffusers' stepping" "$D/su.err" &&
    $SRUN --prompt "$P" --weights "$D/ps_unipc" --solver unipc --shift 3 --cfg 5 -o "$D/su2.safetensors" 2>/dev/null &&
    "$R" tensor diff "$D/su.safetensors" "$D/su2.safetensors" >/dev/null 2>&1 &&
    ok "a pipeline's UniPC scheduler (use_flow_sigmas, flow_shift 3, the keys as Reel's unipc runs them): --solver unipc --shift 3, said with its file" ||
    { bad "the pipeline's UniPC scheduler config"; show "$D/su.err"; }
# keys Reel's UniPC does not run: solver_order 3, Karras sigmas, and
# prediction_type left out (diffusers' default is epsilon)
sched unipc3 '{"_class_name":"UniPCMultistepScheduler","flow_shift":3.0,"solver_order":3,"use_karras_sigmas":true,"use_flow_sigmas":true,"solver_type":"midpoint"}'
$SRUN --prompt "$P" --weights "$D/ps_unipc3" -o "$D/su3.safetensors" 2>"$D/su3.err" &&
    grep -q "scheduler_config.json (UniPCMultistepScheduler): --solver unipc is not diffusers' stepping: prediction_type absent, so diffusers' default epsilon (Reel runs flow_prediction), solver_order 3 (Reel runs 2), use_karras_sigmas true (Reel runs false): Reel runs its own UniPC (order 2, bh2, .*) with the file's flow_shift 3$" "$D/su3.err" &&
    ! grep -q "solver_type" "$D/su3.err" &&
    "$R" tensor diff "$D/su3.safetensors" "$D/su2.safetensors" >/dev/null 2>&1 &&
    ok "a UniPC config with keys Reel does not run: stderr names each (midpoint, diffusers' bh2, not), the run is Reel's UniPC with its flow_shift" ||
    { bad "a UniPC config with differing keys"; show "$D/su3.err"; }
sched euler '{"_class_name":"FlowMatchEulerDiscreteScheduler","shift":2.0,"use_dynamic_shifting":false}'
$SRUN --prompt "$P" --weights "$D/ps_euler" -o "$D/se0.safetensors" 2>"$D/se0.err" &&
    grep -q "defaults for what was not given: --solver euler --shift 2 from .*; Wan2.1's text-to-video: --cfg 5$" "$D/se0.err" &&
    grep -q "(FlowMatchEulerDiscreteScheduler): --solver euler is not diffusers' stepping: Reel's euler steps sigma_i = shift(1 - i/N); diffusers' shift(linspace(1, shift(1/1000), N)).*the same Euler step on other sigmas$" "$D/se0.err" &&
    $SRUN --prompt "$P" --weights "$D/ps_euler" --solver euler --shift 2 --cfg 5 -o "$D/se02.safetensors" 2>/dev/null &&
    "$R" tensor diff "$D/se0.safetensors" "$D/se02.safetensors" >/dev/null 2>&1 &&
    ok "FlowMatchEulerDiscreteScheduler: euler with the config's shift (bitwise the flags), and stderr says its grid is not diffusers'" ||
    { bad "the pipeline's Euler scheduler's shift"; show "$D/se0.err"; }
$SRUN --prompt "$P" --weights "$D/ps_euler" --shift 4 -o "$D/se.safetensors" 2>"$D/se.err" &&
    grep -q "defaults for what was not given: --solver euler from .*; Wan2.1's text-to-video: --cfg 5$" "$D/se.err" &&
    $SRUN --prompt "$P" --weights "$D/ps_euler" --solver euler --shift 4 --cfg 5 -o "$D/se2.safetensors" 2>/dev/null &&
    "$R" tensor diff "$D/se.safetensors" "$D/se2.safetensors" >/dev/null 2>&1 &&
    ok "FlowMatchEulerDiscreteScheduler: a --shift given overrides the config's" || { bad "the pipeline's Euler scheduler"; show "$D/se.err"; }
sched dpm '{"_class_name":"DPMSolverMultistepScheduler","algorithm_type":"dpmsolver++","flow_shift":2.5,"use_flow_sigmas":true,"prediction_type":"flow_prediction"}'
$SRUN --prompt "$P" --weights "$D/ps_dpm" -o "$D/sd.safetensors" 2>"$D/sd.err" && grep -q -- "--solver dpm++ --shift 2.5 from" "$D/sd.err" &&
    grep -q "(DPMSolverMultistepScheduler): --solver dpm++ is not diffusers' stepping: Reel's dpm++ is Wan2.1's DPM-Solver++(2M) on sigma_i = shift(1 - i/N), from 1; diffusers' steps shift(0.999\*(1 - i/N)), from shift(0.999): the same solver on other sigmas$" "$D/sd.err" &&
    $SRUN --prompt "$P" --weights "$D/ps_dpm" --solver dpm++ --shift 2.5 --cfg 5 -o "$D/sd2.safetensors" 2>/dev/null &&
    "$R" tensor diff "$D/sd.safetensors" "$D/sd2.safetensors" >/dev/null 2>&1 &&
    ok "DPMSolverMultistepScheduler (dpmsolver++, flow sigmas): --solver dpm++ --shift 2.5 (bitwise the flags), and stderr says its grid is Wan's" ||
    { bad "the pipeline's DPM scheduler"; show "$D/sd.err"; }
sched other '{"_class_name":"EulerAncestralDiscreteScheduler"}'
$SRUN --prompt "$P" --weights "$D/ps_other" -o "$D/so.safetensors" 2>"$D/so.err" &&
    grep -q "scheduler_config.json (EulerAncestralDiscreteScheduler): EulerAncestralDiscreteScheduler is no scheduler Reel maps to a sampler" "$D/so.err" &&
    grep -q "Wan2.1's text-to-video defaults for what was not given: --solver unipc --shift 5 --cfg 5" "$D/so.err" &&
    ok "a scheduler Reel has no sampler for: Wan's defaults, and stderr says why" || { bad "an unknown scheduler"; show "$D/so.err"; }
sched bad '{"_class_name": "UniPCMultistepScheduler",'
$SRUN --prompt "$P" --weights "$D/ps_bad" -o "$D/sb.safetensors" 2>"$D/sb.err"
[ $? = 2 ] && grep -q "$D/ps_bad/scheduler/scheduler_config.json: malformed JSON" "$D/sb.err" && [ ! -e "$D/sb.safetensors" ] &&
    ok "a malformed scheduler_config.json is refused naming the file (exit 2)" || { bad "malformed scheduler config"; show "$D/sb.err"; }
# a file that cannot be read is refused with the reason, not as malformed JSON
rm -rf "$D/ps_dir"; cp -r "$PIPE" "$D/ps_dir" && mkdir -p "$D/ps_dir/scheduler/scheduler_config.json"
$SRUN --prompt "$P" --weights "$D/ps_dir" -o "$D/sdir.safetensors" 2>"$D/sdir.err"
[ $? = 2 ] && grep -q "$D/ps_dir/scheduler/scheduler_config.json: is a directory, not a JSON file" "$D/sdir.err" &&
    ! grep -q "malformed" "$D/sdir.err" &&
    ok "a directory named scheduler_config.json is refused as one (exit 2), not as malformed JSON" ||
    { bad "a scheduler_config.json directory"; show "$D/sdir.err"; }
rm -rf "$D/ps_link"; cp -r "$PIPE" "$D/ps_link" && mkdir -p "$D/ps_link/scheduler" &&
    ln -s "$D/nowhere.json" "$D/ps_link/scheduler/scheduler_config.json"
$SRUN --prompt "$P" --weights "$D/ps_link" -o "$D/slink.safetensors" 2>"$D/slink.err"
[ $? = 2 ] && grep -q "$D/ps_link/scheduler/scheduler_config.json: cannot be read: No such file or directory" "$D/slink.err" &&
    ok "a scheduler_config.json linking to nowhere is refused with strerror's reason (exit 2)" ||
    { bad "a dangling scheduler_config.json"; show "$D/slink.err"; }
# Wan's generate.py form: --size W*H in pixels and --frame_num; 64*64 with 5 frames is the latent 2x8x8
$RUN --weights "$REL" --prompt "$P" --size 64*64 --frame_num 5 -o "$D/px.mp4" 2>"$D/px.err" &&
    "$R" tensor diff "$D/px.mp4.safetensors" "$D/rel.mp4.safetensors" >/dev/null 2>&1 &&
    ok "--size 64*64 --frame_num 5 (Wan's pixel form) is the latent size 2x8x8" || { bad "pixel --size"; show "$D/px.err"; }
$RUN --weights "$REL" --prompt "$P" --size 72*64 --frame_num 5 -o "$D/px72.mp4" 2>"$D/px72.err"
[ $? = 2 ] && grep -q "width and height must be multiples of 16" "$D/px72.err" &&
    ok "--size 72*64 is refused saying why (multiples of 16), not as a malformed size" || { bad "72*64"; show "$D/px72.err"; }
$RUN --weights "$REL" --prompt "$P" --size 64*64 --frame_num 5 -o "$D/px.avi" 2>"$D/pxavi.err"
[ $? = 2 ] && grep -q "a prompt run writes OUT.mp4" "$D/pxavi.err" && [ ! -e "$D/px.avi" ] &&
    ok "run --prompt -o X.avi is refused (exit 2): it writes X.mp4 or X.safetensors, not a latent named .avi" ||
    { bad "run --prompt -o X.avi"; show "$D/pxavi.err"; }
# Where the outputs cannot go is found before anything runs (exit 2), as
# gen does: a missing folder (named, not a temporary file in it), an
# output or the latent beside it standing as a folder or a symlink (never
# replaced, as the latent's writer already held; the video's and the
# frames' writer replaced a symlink), and no half of the outputs written.
$RUN --weights "$REL" --prompt "$P" -o "$D/nowhere/x.mp4" 2>"$D/onf.err"
[ $? = 2 ] && grep -q -- "--out $D/nowhere/x.mp4: $D/nowhere is not a folder" "$D/onf.err" && ! grep -q "\.tmp" "$D/onf.err" &&
    ! grep -q "steps" "$D/onf.err" &&
    ok "run -o MISSING/x.mp4 is refused before it runs (exit 2), naming the folder, not a temporary file" ||
    { bad "run -o into a missing folder"; show "$D/onf.err"; }
mkdir -p "$D/odir.mp4" "$D/oside.mp4.safetensors"
echo keep >"$D/otarget"
ln -sf "$D/otarget" "$D/olink.mp4"
ln -sf "$D/otarget" "$D/olink2.mp4.safetensors"
outs_ok=yes
for o in odir.mp4 oside.mp4 olink.mp4 olink2.mp4; do
    $RUN --weights "$REL" --prompt "$P" -o "$D/$o" 2>"$D/oo.err"
    rc=$?
    if [ $rc != 2 ] || ! grep -q "exists and is not a regular file" "$D/oo.err" || grep -q "steps" "$D/oo.err"; then
        outs_ok="-o $o: exit $rc"; break
    fi
done
[ "$outs_ok" = yes ] && [ ! -e "$D/oside.mp4" ] && [ ! -e "$D/olink2.mp4" ] && [ -L "$D/olink.mp4" ] &&
    [ "$(cat "$D/otarget")" = keep ] &&
    ok "run -o X.mp4 where X.mp4 or X.mp4.safetensors is a folder or a symlink: refused before it runs (exit 2), nothing written" ||
    { bad "run's outputs that are not regular files ($outs_ok)"; show "$D/oo.err"; }
$RUN --weights "$REL" --prompt "$P" --size 2x8 -o "$D/px28.mp4" 2>"$D/px28.err"
[ $? = 2 ] && grep -q "neither a latent FxHxW .* nor Wan's pixel W\*H" "$D/px28.err" &&
    ok "--size 2x8 names both forms a size may take" || { bad "2x8"; show "$D/px28.err"; }
$RUN --weights "$REL" --prompt "$P" --size 64*64 --frame_num 6 -o "$D/px6.mp4" 2>"$D/px6.err"
[ $? = 2 ] && grep -q "1 + 4k frames" "$D/px6.err" && ok "--frame_num 6 is refused: Wan's VAE makes 1 + 4k frames" ||
    { bad "frame_num 6 refused"; show "$D/px6.err"; }
# An empty negative prompt is none: Wan's default, as Wan's generate
# (n_prompt == "") and a GEN read it; a negative prompt without guidance
# would do nothing, so it is refused rather than ignored.
$RUN --weights "$REL" --prompt "$P" --negative-prompt "" -o "$D/neg0.safetensors" 2>"$D/neg0.err" &&
    "$R" tensor diff "$D/neg0.safetensors" "$D/rel.mp4.safetensors" >/dev/null 2>&1 &&
    ok "run --negative-prompt '' is Wan's default negative prompt (bitwise no --negative-prompt)" ||
    { bad "run with an empty negative prompt"; show "$D/neg0.err"; }
"$R" run --weights "$REL" --prompt "$P" --negative-prompt "blurry" --size 2x8x8 --steps 2 --cfg 1 -o "$D/x.safetensors" \
    2>"$D/negnocfg.err"
[ $? = 2 ] && grep -q "used only with guidance" "$D/negnocfg.err" && [ ! -e "$D/x.safetensors" ] &&
    ok "run --negative-prompt with --cfg 1 (no guidance) is refused (exit 2), not ignored" || { bad "neg without cfg"; show "$D/negnocfg.err"; }
# A prompt alone samples as Wan2.1's generate.py: the flags not given are
# its text-to-video defaults, and reelctl says which it took
"$R" run --weights "$REL" --prompt "$P" --size 2x8x8 --seed 1 -o "$D/wd.safetensors" 2>"$D/wd.err" &&
    grep -q "Wan2.1's text-to-video defaults for what was not given: --solver unipc --steps 50 --shift 5 --cfg 5" "$D/wd.err" &&
    "$R" run --weights "$REL" --prompt "$P" --size 2x8x8 --seed 1 --solver unipc --steps 50 --shift 5 --cfg 5 \
        -o "$D/wx.safetensors" 2>"$D/wx.err" && ! grep -q "defaults for what was not given" "$D/wx.err" &&
    "$R" tensor diff "$D/wd.safetensors" "$D/wx.safetensors" >/dev/null 2>&1 &&
    ok "run --prompt alone: --solver unipc --steps 50 --shift 5 --cfg 5 (said on stderr), bitwise those flags given" ||
    { bad "run --prompt's defaults"; show "$D/wd.err" "$D/wx.err"; }
# Wan2.1's generate.py spellings are aliases of the same flags; its random
# seed (-1) and the flags with no alias are refused naming Reel's
WANF="--sample_solver dpm++ --sample_steps 3 --sample_shift 4 --sample_guide_scale 6 --base_seed 7 --negative_prompt blurry"
REELF="--solver dpm++ --steps 3 --shift 4 --cfg 6 --seed 7 --negative-prompt blurry"
"$R" run --weights "$REL" --prompt "$P" --size 2x8x8 $WANF -o "$D/gpy.safetensors" 2>"$D/gpy.err" &&
    "$R" run --weights "$REL" --prompt "$P" --size 2x8x8 $REELF -o "$D/rpy.safetensors" 2>>"$D/gpy.err" &&
    ! grep -q "defaults for what was not given" "$D/gpy.err" &&
    "$R" tensor diff "$D/gpy.safetensors" "$D/rpy.safetensors" >/dev/null 2>&1 &&
    ok "run takes generate.py's --sample_solver/_steps/_shift/_guide_scale, --base_seed, --negative_prompt: bitwise Reel's flags" ||
    { bad "run with generate.py's flag spellings"; show "$D/gpy.err"; }
# an alias takes exactly what its flag takes: for each value the same
# exit, and where both run the same latent; a negative count is refused,
# not taken as "not given" (Wan's 50)
same_alias=yes
for pair in "steps sample_steps" "shift sample_shift" "cfg sample_guide_scale" "solver sample_solver" "seed base_seed"; do
    set -- $pair
    for v in -3 -1 0 1 2.5 abc 10001 1e400; do
        [ "$1 $v" = "seed -1" ] && continue # --base_seed -1 is generate.py's random seed, refused on its own
        rm -f "$D/al1.safetensors" "$D/al2.safetensors"
        "$R" run --weights "$REL" --prompt "$P" --size 2x8x8 --steps 1 --"$1" "$v" -o "$D/al1.safetensors" >/dev/null 2>"$D/al1.err"; r1=$?
        "$R" run --weights "$REL" --prompt "$P" --size 2x8x8 --steps 1 --"$2" "$v" -o "$D/al2.safetensors" >/dev/null 2>"$D/al2.err"; r2=$?
        if [ $r1 != $r2 ] || { [ $r1 = 0 ] && ! "$R" tensor diff "$D/al1.safetensors" "$D/al2.safetensors" >/dev/null 2>&1; }; then
            same_alias="--$1 $v: $r1 / --$2 $v: $r2"; break 2
        fi
    done
done
[ "$same_alias" = yes ] && ok "run: --sample_steps, --sample_shift, --sample_guide_scale, --sample_solver and --base_seed take exactly what --steps, --shift, --cfg, --solver and --seed take" ||
    { bad "an alias and its flag differ ($same_alias)"; show "$D/al1.err" "$D/al2.err"; }
"$R" run --weights "$REL" --prompt "$P" --size 2x8x8 --steps -3 -o "$D/neg.safetensors" 2>"$D/neg.err"
[ $? = 2 ] && grep -q -- "--steps: '-3' is a bad value: expected a number of steps (1..10000)" "$D/neg.err" && [ ! -e "$D/neg.safetensors" ] &&
    ok "run --prompt --steps -3 is refused (exit 2), not run with Wan's 50 steps" || { bad "--steps -3"; show "$D/neg.err"; }
"$R" run --weights "$REL" --prompt "$P" --size 2x8x8 --steps 2 --base_seed -1 -o "$D/x.safetensors" 2>"$D/bs.err"
[ $? = 2 ] && grep -q -- "--base_seed -1 is generate.py's random seed.*give --seed K" "$D/bs.err" &&
    ok "run --base_seed -1 (generate.py's random seed) is refused naming --seed" || { bad "--base_seed -1"; show "$D/bs.err"; }
"$R" run --ckpt_dir "$REL" --prompt "$P" --size 2x8x8 --steps 2 -o "$D/x.safetensors" 2>"$D/ck.err"
[ $? = 2 ] && grep -q -- "--ckpt_dir is Wan's generate.py flag, not taken here: give --weights DIR" "$D/ck.err" &&
    ok "run --ckpt_dir is refused naming --weights" || { bad "--ckpt_dir"; show "$D/ck.err"; }
"$R" run --weights "$REL" --prompt "$P" --size 2x8x8 --seed 1 --steps 3 -o "$D/w3.safetensors" 2>"$D/w3.err" &&
    grep -q "not given: --solver unipc --shift 5 --cfg 5$" "$D/w3.err" &&
    ok "a flag given is kept, the others defaulted (--steps 3: --solver, --shift, --cfg named)" ||
    { bad "run --prompt --steps 3"; show "$D/w3.err"; }
"$R" run --weights "$D/dit.safetensors" --prompt "$P" --size 2x8x8 --steps 2 -o "$D/x.mp4" 2>"$D/np.err"
[ $? = 2 ] && grep -q "needs a text encoder and its tokenizer" "$D/np.err" &&
    ok "a prompt without a text encoder is a usage error naming what to give" || { bad "prompt without t5"; show "$D/np.err"; }
# a folder missing the tokenizer: the message names where it looked and
# the file it expected; a pipeline's tokenizer/ with tokenizer.json alone
# says Reel reads the spiece.model google/umt5-xxl ships
cp -r "$REL" "$D/notok_run" && rm -r "$D/notok_run/google"
"$R" run --weights "$D/notok_run" --prompt "$P" --size 2x8x8 --steps 2 -o "$D/x.mp4" 2>"$D/nt.err"
[ $? = 2 ] && grep -q "no tokenizer: $D/notok_run/google/umt5-xxl/ has no spiece.model (or give --tokenizer PATH)" "$D/nt.err" &&
    ok "a release folder without google/umt5-xxl/: the message names that folder and spiece.model" || { bad "release without tokenizer"; show "$D/nt.err"; }
# without a text encoder: the message names each name find_t5 takes
# (a models_t5_*.safetensors as well as a .pth)
cp -r "$REL" "$D/not5_run" && rm "$D/not5_run/models_t5_umt5-xxl-enc-bf16.pth"
"$R" run --weights "$D/not5_run" --prompt "$P" --size 2x8x8 --steps 2 -o "$D/x.mp4" 2>"$D/n5.err"
[ $? = 2 ] && grep -q "no text encoder: $D/not5_run/ has no models_t5_umt5-xxl-enc-bf16.pth (nor another models_t5_\*.pth or models_t5_\*.safetensors) (or give --t5 FILE)" "$D/n5.err" &&
    ok "a release folder without its T5: the message names the .pth and .safetensors names it looked for" || { bad "release without T5"; show "$D/n5.err"; }
cp "$D/t5.safetensors" "$D/not5_run/models_t5_other.safetensors"
"$R" run --weights "$D/not5_run" --prompt "$P" --size 2x8x8 --steps 2 --cfg 4 --shift 3 --seed 1 -o "$D/n5.safetensors" 2>"$D/n5b.err" &&
    ok "...and a models_t5_*.safetensors there is taken, as the message says" || { bad "a models_t5_*.safetensors"; show "$D/n5b.err"; }
cp -r "$PIPE" "$D/pipe_not5" && rm -r "$D/pipe_not5/text_encoder"
"$R" run --weights "$D/pipe_not5" --prompt "$P" --size 2x8x8 --steps 2 -o "$D/x.mp4" 2>"$D/pn5.err"
[ $? = 2 ] && grep -q "no text encoder: $D/pipe_not5/ has no models_t5_umt5-xxl-enc-bf16.pth (nor another models_t5_\*.pth or models_t5_\*.safetensors) and no text_encoder/ (or give --t5 FILE)" "$D/pn5.err" &&
    ok "a pipeline without text_encoder/: the message names it and the release names" || { bad "pipeline without text_encoder"; show "$D/pn5.err"; }
cp -r "$PIPE" "$D/pipe_json" && rm "$D/pipe_json/tokenizer/spiece.model" && echo '{"version":"1.0"}' >"$D/pipe_json/tokenizer/tokenizer.json"
"$R" run --weights "$D/pipe_json" --prompt "$P" --size 2x8x8 --steps 2 -o "$D/x.mp4" 2>"$D/pj.err"
[ $? = 2 ] && grep -q "no tokenizer: $D/pipe_json/tokenizer/ has no spiece.model" "$D/pj.err" &&
    grep -q "it holds tokenizer.json: Reel reads the SentencePiece spiece.model that google/umt5-xxl ships" "$D/pj.err" &&
    ok "a pipeline whose tokenizer/ holds only tokenizer.json: named, saying Reel reads google/umt5-xxl's spiece.model" ||
    { bad "pipeline with tokenizer.json only"; show "$D/pj.err"; }
"$R" encode --t5 "$D/t5.safetensors" --tokenizer "$D/pipe_json/tokenizer" --prompt "$P" -o "$D/x.safetensors" 2>"$D/pje.err"
[ $? = 2 ] && grep -q "a folder without spiece.model (it holds tokenizer.json: Reel reads the SentencePiece spiece.model" "$D/pje.err" &&
    ok "--tokenizer on such a folder says the same" || { bad "--tokenizer on a tokenizer.json folder"; show "$D/pje.err"; }
"$R" run --weights "$D/plain.safetensors" --t5 "$D/t5.safetensors" --tokenizer "$D/spiece.model" --prompt "$P" \
    --size 2x8x8 --steps 2 -o "$D/x.safetensors" 2>"$D/tl.err"
[ $? = 2 ] && grep -q "has no text_len" "$D/tl.err" && ok "a model without text_len takes no prompt (exit 2)" ||
    { bad "prompt to a model without text_len"; show "$D/tl.err"; }
printf 'not a checkpoint' >"$D/junk.pth"
"$R" encode --t5 "$D/junk.pth" --tokenizer "$D/spiece.model" --prompt "$P" -o "$D/x.safetensors" 2>"$D/junk.err"
[ $? != 0 ] && grep -q "junk.pth" "$D/junk.err" && ok "a corrupt checkpoint is refused, naming the file" ||
    { bad "corrupt .pth refused"; show "$D/junk.err"; }

echo "== a cluster: prompts and decoded outputs go only to the worker that can do them"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 || { bad "broker"; finish; }
cli_worker wt "$D/broker.log" "$D/wt.log" --broker "$WE" --weights "$REL" --heartbeat-ms 200 || bad "wt starts"
TW=$WORKER
# wp: the same DiT exported alone (a release folder's model is named by its
# config: "tiny" here, as the exported config matches that built-in's sizes)
"$R" weights export "$D/dit.safetensors" --out "$D/dit-only" >/dev/null 2>&1
cli_worker wp "$D/broker.log" "$D/wp.log" --broker "$WE" --weights "$D/dit-only" --heartbeat-ms 200 || bad "wp starts"
grep -q "text encoder t5-tiny" "$D/wt.log" && grep -q "VAE vae-tiny" "$D/wt.log" &&
    ok "the worker found the release folder's text encoder and VAE" || { bad "worker release parts"; show "$D/wt.log"; }
# the broker's STATUS says which workers take prompts and give videos
"$R" status --broker "$CE" --json >"$D/st.json" 2>&1
"$R" status --broker "$CE" >"$D/st.txt" 2>&1
$PY -c '
import json, sys
w = {x["name"]: x for x in json.load(open(sys.argv[1]))["workers"]}
sys.exit(0 if (w["wt"]["text_encoder"], w["wt"]["vae"], w["wp"]["text_encoder"], w["wp"]["vae"]) ==
         ("t5-tiny", "vae-tiny", "", "") else 1)' "$D/st.json" &&
    grep -q "^wt .*\[text t5-tiny, vae vae-tiny\]" "$D/st.txt" && ! grep -q "^wp .*\[text" "$D/st.txt" &&
    ok "status names each worker's text encoder and VAE (wt: t5-tiny, vae-tiny; wp: none)" ||
    { bad "status text_encoder/vae"; show "$D/st.json" "$D/st.txt"; }
# either half of the text encoder from the folder, the other by flag; a
# folder missing one half says so; a flag without its other half is a
# usage error (exit 2)
cp -r "$REL" "$D/notok" && rm -r "$D/notok/google"
cli_worker wn "$D/broker.log" "$D/wn.log" --broker "$WE" --weights "$D/notok" --heartbeat-ms 200 &&
    grep -q "models_t5_umt5-xxl-enc-bf16.pth but no tokenizer (google/umt5-xxl/spiece.model, or a pipeline.s tokenizer/spiece.model): no text encoder" "$D/wn.log" &&
    grep -q "no tokenizer: $D/notok/google/umt5-xxl/ has no spiece.model" "$D/wn.log" &&
    ! grep -q "prompts accepted" "$D/wn.log" &&
    ok "a release folder with the T5 but no tokenizer: the worker serves, saying it has no text encoder and why" ||
    { bad "folder without a tokenizer"; show "$D/wn.log"; }
stop_proc "$WORKER" || bad "wn stops"
cli_worker wk "$D/broker.log" "$D/wk.log" --broker "$WE" --weights "$D/notok" --tokenizer "$REL/google/umt5-xxl" \
    --heartbeat-ms 200 && grep -q "text encoder t5-tiny .*prompts accepted" "$D/wk.log" &&
    ok "... and with --tokenizer alone the folder's T5 and the flag's tokenizer make the text encoder" ||
    { bad "--tokenizer with a release folder's T5"; show "$D/wk.log"; }
stop_proc "$WORKER" || bad "wk stops"
# a release folder without its VAE: the worker serves prompts and says
# why it gives no frames or videos (as it does for the text encoder)
cp -r "$REL" "$D/novae_w" && rm "$D/novae_w/Wan2.1_VAE.pth"
# (given as "DIR/", as README.md writes it: the paths it names read DIR/NAME)
cli_worker wv "$D/broker.log" "$D/wv.log" --broker "$WE" --weights "$D/novae_w/" --heartbeat-ms 200 &&
    grep -q "text encoder t5-tiny .*prompts accepted" "$D/wv.log" &&
    grep -q "no VAE: $D/novae_w/ has no Wan2.1_VAE.pth (nor Wan2.1_VAE.safetensors) (give --vae FILE): GENs asking for frames or a video are not routed here" "$D/wv.log" &&
    ok "a release folder without Wan2.1_VAE.pth: the worker serves prompts, saying it has no VAE and why" ||
    { bad "folder without a VAE"; show "$D/wv.log"; }
grep -qF "text encoder t5-tiny ($D/novae_w/models_t5_umt5-xxl-enc-bf16.pth, tokenizer $D/novae_w/google/umt5-xxl)" \
    "$D/wv.log" && ! grep -q "novae_w//" "$D/wv.log" &&
    ok "--weights DIR/: the parts it found are named DIR/NAME, not DIR//NAME" || { bad "DIR/ paths"; show "$D/wv.log"; }
stop_proc "$WORKER" || bad "wv stops"
timeout 60 "$B/reel-worker" --name wx --broker "$WE" --weights "$D/plain.safetensors" \
    --t5 "$REL/models_t5_umt5-xxl-enc-bf16.pth" >"$D/wx.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q -- "--t5 needs its tokenizer" "$D/wx.log" &&
    ok "--t5 without a tokenizer anywhere: exit 2, naming --tokenizer" || { bad "--t5 alone (exit $rc)"; show "$D/wx.log"; }
GEN="$R gen --broker $CE --model tiny --channels 4 --size 2x8x8 --steps 4 --shift 3 --seed 1 --cfg 4 --timeout-ms 60000 --quiet"
$GEN --prompt "$P" --out "$D/g.mp4" 2>"$D/g.err" &&
    "$R" tensor diff "$D/g.mp4.safetensors" "$D/rel.mp4.safetensors" >/dev/null 2>&1 &&
    ok "gen --prompt -o X.mp4: the latent is bitwise reelctl run --prompt's" || { bad "gen --prompt"; show "$D/g.err"; }
"$R" video probe "$D/g.mp4" --json 2>/dev/null | grep -q '"frames":5,"height":64,"width":64' &&
    ok "and the video came back as an MP4 of 5 frames" || bad "gen's video"
"$R" gen --broker "$CE" --model tiny --size 2x8x8 --timeout-ms 60000 --quiet --prompt "$P" $WANF \
    --out "$D/ggpy.safetensors" 2>"$D/ggpy.err" &&
    "$R" tensor diff "$D/ggpy.safetensors" "$D/rpy.safetensors" >/dev/null 2>&1 &&
    ok "gen takes generate.py's flag spellings too: bitwise run with Reel's" || { bad "gen with generate.py's flags"; show "$D/ggpy.err"; }
$GEN --prompt "$P" --base_seed -1 --out "$D/x.safetensors" 2>"$D/gbs.err"
[ $? = 2 ] && grep -q -- "give --seed K" "$D/gbs.err" && ok "gen --base_seed -1 is refused naming --seed" ||
    { bad "gen --base_seed -1"; show "$D/gbs.err"; }
# one --size parser for run and gen (ctl_size_parse_any): Wan's pixel W*H
# with --frame_num is the same latent through the cluster as in process
"$R" gen --broker "$CE" --model tiny --size 64*64 --frame_num 5 --steps 4 --shift 3 --seed 1 --cfg 4 --timeout-ms 60000 \
    --quiet --prompt "$P" --out "$D/gpx.safetensors" 2>"$D/gpx.err" &&
    "$R" tensor diff "$D/gpx.safetensors" "$D/rel.mp4.safetensors" >/dev/null 2>&1 &&
    ok "gen --size 64*64 --frame_num 5 (Wan's pixel form, as run takes it) is the latent 2x8x8: bitwise run's" ||
    { bad "gen with a pixel --size"; show "$D/gpx.err"; }
for sz in "72*64" "2x8" "0*16" "8*16"; do
    $RUN --weights "$REL" --prompt "$P" --size "$sz" -o "$D/szr.mp4" 2>"$D/szr.err"
    rr=$?
    $GEN --prompt "$P" --size "$sz" --out "$D/szg.mp4" 2>"$D/szg.err"
    rg=$?
    [ "$rr" = 2 ] && [ "$rg" = 2 ] && [ "$(sed 's/^reelctl: \(run: \)\{0,1\}//' "$D/szr.err" | grep -v defaults)" = "$(sed 's/^reelctl: \(gen: \)\{0,1\}//' "$D/szg.err" | grep -v defaults)" ] &&
        { [ "${sz#[08]\*}" = "$sz" ] || grep -q "out of range \[16, 524288\]" "$D/szr.err"; } &&
        ok "run and gen refuse --size $sz alike (exit 2, one message)" ||
        { bad "--size $sz: run exit $rr, gen exit $rg"; show "$D/szr.err" "$D/szg.err"; }
done
"$R" gen --broker "$CE" --model tiny --channels 4 --size 2x8x8 --seed 1 --timeout-ms 60000 --prompt "$P" \
    --out "$D/gd.safetensors" 2>"$D/gd.err" &&
    grep -q "gen --prompt: Wan2.1's text-to-video defaults for what was not given: --solver unipc --steps 50 --shift 5 --cfg 5" "$D/gd.err" &&
    "$R" tensor diff "$D/gd.safetensors" "$D/wd.safetensors" >/dev/null 2>&1 &&
    ok "gen --prompt alone takes the same defaults: bitwise run --prompt alone" || { bad "gen --prompt's defaults"; show "$D/gd.err"; }
# One text rule for run, gen and the wire (msg_text_ok): bytes that are not
# UTF-8, and control characters but tab, newline and CR, are refused by
# both commands (exit 2, nothing sent or written); gen never alters them.
for bad_text in "$(printf 'bad \377\376 bytes')" "$(printf 'surrogate \355\240\200')" \
    "$(printf 'escape \033[31m')" "$(printf 'del \177')" "$(printf 'next line \302\205')"; do
    $RUN --weights "$REL" --prompt "$bad_text" -o "$D/bt.safetensors" 2>"$D/bt_run.err"
    rr=$?
    $GEN --prompt "$bad_text" --out "$D/bt.mp4" 2>"$D/bt_gen.err"
    rg=$?
    if [ "$rr" = 2 ] && [ "$rg" = 2 ] && [ ! -e "$D/bt.safetensors" ] && [ ! -e "$D/bt.mp4" ] &&
        grep -q "not UTF-8 text or holds a control character" "$D/bt_run.err" &&
        grep -q "not UTF-8 text or holds a control character" "$D/bt_gen.err"; then
        ok "run and gen both refuse the prompt $(printf '%s' "$bad_text" | od -An -c | tr -s ' ' | head -c 60)"
    else
        bad "prompt $(printf '%s' "$bad_text" | od -An -c | head -c 60): run exit $rr, gen exit $rg"
        show "$D/bt_run.err" "$D/bt_gen.err"
    fi
done
# and one length rule: past the wire's longest string (4096 bytes) both
# refuse it here (exit 2), where run took it and gen met the broker's
# too_large (exit 1)
long=$(head -c 4097 /dev/zero | tr '\0' 'a')
$RUN --weights "$REL" --prompt "$long" -o "$D/lp.safetensors" 2>"$D/lp_run.err"
rr=$?
$GEN --prompt "$long" --out "$D/lp.mp4" 2>"$D/lp_gen.err"
rg=$?
[ "$rr" = 2 ] && [ "$rg" = 2 ] && [ ! -e "$D/lp.safetensors" ] && [ ! -e "$D/lp.mp4" ] &&
    grep -q "4097 bytes: at most 4096" "$D/lp_run.err" && grep -q "4097 bytes: at most 4096" "$D/lp_gen.err" &&
    ok "run and gen both refuse a prompt of 4097 bytes (exit 2)" ||
    { bad "a long prompt: run exit $rr, gen exit $rg"; show "$D/lp_run.err" "$D/lp_gen.err"; }
$GEN --prompt "$P" --negative-prompt "" --output latent --out "$D/gneg0.safetensors" 2>"$D/gneg0.err" &&
    "$R" tensor diff "$D/gneg0.safetensors" "$D/neg0.safetensors" >/dev/null 2>&1 &&
    ok "gen --negative-prompt '' is bitwise run --negative-prompt ''" || { bad "gen empty negative prompt"; show "$D/gneg0.err"; }
"$R" gen --broker "$CE" --model tiny --channels 4 --size 2x8x8 --steps 2 --cfg 1 --prompt "$P" --negative-prompt "blurry" \
    --timeout-ms 60000 --quiet --out "$D/gx.safetensors" 2>"$D/gnegnocfg.err"
[ $? = 2 ] && grep -q "used only with guidance" "$D/gnegnocfg.err" && [ ! -e "$D/gx.safetensors" ] &&
    ok "gen --negative-prompt with --cfg 1 (no guidance) is refused (exit 2), nothing sent" || { bad "gen neg without cfg"; show "$D/gnegnocfg.err"; }
# An empty prompt: a GEN reads "" as none, so run and gen (and the Python
# client, test_client.py) refuse it alike, where run once encoded Wan's
# "" (the eos alone); the message's recipe for that context runs, and gen
# of it is bitwise run of it.
$RUN --weights "$REL" --prompt "" -o "$D/empty_run.mp4" 2>"$D/empty_run.err"
rr=$?
$GEN --prompt "" --out "$D/empty.mp4" 2>"$D/empty.err"
rg=$?
[ "$rr" = 2 ] && [ "$rg" = 2 ] && [ ! -e "$D/empty_run.mp4" ] && [ ! -e "$D/empty.mp4" ] &&
    grep -q -- "--prompt is empty: a GEN reads an empty prompt as none .* reelctl encode --t5 T5 --tokenizer PATH --prompt '' -o C.safetensors and give --context C.safetensors$" "$D/empty_run.err" &&
    [ "$(tail -1 "$D/empty_run.err")" = "$(tail -1 "$D/empty.err")" ] &&
    ok "run and gen both refuse --prompt '' (exit 2, nothing written), one message naming encode --prompt ''" ||
    { bad "an empty prompt: run exit $rr, gen exit $rg"; show "$D/empty_run.err" "$D/empty.err"; }
"$R" encode --t5 "$D/t5.safetensors" --tokenizer "$D/spiece.model" --prompt "" -o "$D/ectx.safetensors" 2>"$D/ectx.err" &&
    "$R" tensor info "$D/ectx.safetensors" 2>&1 | grep -q "^context  *F32\[1,32\] " &&
    "$R" run --weights "$REL" --context "$D/ectx.safetensors" --size 2x8x8 --steps 4 --shift 3 --seed 1 \
        -o "$D/erun.safetensors" 2>"$D/erun.err" &&
    "$R" gen --broker "$CE" --model tiny --channels 4 --size 2x8x8 --steps 4 --shift 3 --seed 1 --timeout-ms 60000 \
        --quiet --context "$D/ectx.safetensors" --out "$D/egen.safetensors" 2>"$D/egen.err" &&
    "$R" tensor diff "$D/erun.safetensors" "$D/egen.safetensors" >/dev/null 2>&1 &&
    ok "the message's recipe: encode --prompt '' is the eos alone ([1, 32]); run and gen on it, bitwise equal" ||
    { bad "the empty prompt's context"; show "$D/ectx.err" "$D/erun.err" "$D/egen.err"; }
allwt=yes
for i in 1 2 3 4 5 6; do
    $GEN --prompt "prompt number $i" --output frames --out "$D/f$i.safetensors" 2>"$D/f$i.err" || allwt=no
    grep -q "worker wt," "$D/f$i.err" || allwt=no
done
[ "$allwt" = yes ] && ok "6 prompt GENs with decoded frames all ran on wt (wp has neither)" ||
    { bad "prompts routed to the capable worker"; show "$D/f1.err"; }
$PY -c "
import numpy as np, sys
a = np.load(sys.argv[1])
sys.exit(0 if a.shape == (5, 64, 64, 3) and a.dtype == np.uint8 else 1)" "$D/f1.safetensors.frames.npy" &&
    ok "--output frames: uint8 [5,64,64,3] in OUT.frames.npy" || bad "frames file"
$GEN --prompt "prompt number 1" --output video --out "$D/vid.bin" 2>"$D/vid.err" &&
    "$R" video probe "$D/vid.bin.mp4" 2>/dev/null | grep -q "frames 5" &&
    "$R" tensor info "$D/vid.bin" 2>/dev/null | grep -q "latent" && grep -q "the video -> $D/vid.bin.mp4" "$D/vid.err" &&
    ok "--output video with --out OUT (not .mp4): the video in OUT.mp4, the latent in OUT" ||
    { bad "--output video to a non-.mp4 --out"; show "$D/vid.err"; ls -la "$D"/vid* 2>&1 | show; }
# gen's outputs by run's rule, before the GEN is sent: the video or the
# frames over a symlink or a folder are refused (exit 2), not written
# through (the latent's writer already refused them, after the run)
ln -sf "$D/otarget" "$D/glink.mp4"
ln -sf "$D/otarget" "$D/gfr.frames.npy"
mkdir -p "$D/gdir.mp4"
gouts=yes
for a in "-o $D/glink.mp4" "--output frames -o $D/gfr" "-o $D/gdir.mp4" "--output video -o $D/gdir"; do
    $GEN --prompt "$P" $a 2>"$D/go.err"
    rc=$?
    [ $rc = 2 ] && grep -q "exists and is not a regular file" "$D/go.err" || { gouts="$a: exit $rc"; break; }
done
[ "$gouts" = yes ] && [ -L "$D/glink.mp4" ] && [ -L "$D/gfr.frames.npy" ] && [ "$(cat "$D/otarget")" = keep ] &&
    [ ! -e "$D/gfr" ] && [ ! -e "$D/glink.mp4.safetensors" ] &&
    ok "gen: a video or frames output that is a symlink or a folder is refused before sending (exit 2), nothing written" ||
    { bad "gen's outputs that are not regular files ($gouts)"; show "$D/go.err"; }
# a group's video: one MP4 is one sample (docs/PROTOCOL.md), so gen says
# so itself (exit 2) instead of sending what the broker refuses (exit 1)
$GEN --prompt "$P" --n 2 -o "$D/grp.mp4" 2>"$D/grpv.err"
[ $? = 2 ] && grep -q "a group (--n 2) asks for --output frames" "$D/grpv.err" && [ ! -e "$D/grp.mp4.safetensors" ] &&
    ok "gen --n 2 -o X.mp4 is refused (exit 2): a video is one sample, a group asks for frames" ||
    { bad "gen --n 2 with a video"; show "$D/grpv.err"; }
"$R" decode --vae "$REL/Wan2.1_VAE.pth" "$D/g.mp4.safetensors" -o "$D/dec.mp4" --quiet 2>"$D/dec.err" &&
    "$R" video probe "$D/dec.mp4" 2>/dev/null | grep -q "frames 5" &&
    ok "reelctl decode --vae Wan2.1_VAE.pth LATENT -o X.mp4" || { bad "decode to mp4"; show "$D/dec.err"; }
# decode's output by the same rule, before the decode: a symlink is not
# written through (its target kept), a missing folder is named (exit 2)
echo keep >"$D/dtarget"
ln -sf "$D/dtarget" "$D/dlink.mp4"
"$R" decode --vae "$REL/Wan2.1_VAE.pth" "$D/g.mp4.safetensors" -o "$D/dlink.mp4" --quiet 2>"$D/dlink.err"
rc1=$?
"$R" decode --vae "$REL/Wan2.1_VAE.pth" "$D/g.mp4.safetensors" -o "$D/nowhere/d.mp4" --quiet 2>"$D/dnf.err"
rc2=$?
[ $rc1 = 2 ] && grep -q "exists and is not a regular file" "$D/dlink.err" && [ "$(cat "$D/dtarget")" = keep ] &&
    [ $rc2 = 2 ] && grep -q -- "--out $D/nowhere/d.mp4: $D/nowhere is not a folder" "$D/dnf.err" &&
    ok "decode -o LINK.mp4 is refused, its target kept; -o MISSING/x.mp4 names the folder (exit 2 each)" ||
    { bad "decode's output: link exit $rc1, missing folder exit $rc2"; show "$D/dlink.err" "$D/dnf.err"; }
# FFmpeg is opened on first use (media/av_lazy.c), never at start: a
# binary that records it would load ~130 libraries in every process.
if ldd "$R" "$B/reel-worker" | grep -q "libav\|libswscale"; then
    bad "reelctl and reel-worker do not link FFmpeg"; ldd "$R" | grep "libav" | show
else ok "reelctl and reel-worker do not link FFmpeg (opened when a video is written or read)"; fi
# An FFmpeg that lacks a function is named, and no video is left behind.
mkdir -p "$D/fakeav"
echo 'int reel_fake_av(void) { return 0; }' >"$D/fakeav/f.c"
AVF=$(ldconfig -p | sed -n 's/^[[:space:]]*\(libavformat\.so\.[0-9]*\) .*/\1/p' | head -1)
if cc -shared -fPIC -o "$D/fakeav/$AVF" "$D/fakeav/f.c" 2>"$D/fakeav.err"; then
    LD_LIBRARY_PATH="$D/fakeav" "$R" decode --vae "$REL/Wan2.1_VAE.pth" "$D/g.mp4.safetensors" -o "$D/nodec.mp4" \
        --quiet >/dev/null 2>"$D/nodec.err"
    rc=$?
    [ "$rc" -ne 0 ] && [ ! -e "$D/nodec.mp4" ] && grep -q "$AVF has no avformat_" "$D/nodec.err" &&
        ok "a broken FFmpeg ($AVF without its functions): decode fails naming it, no video written" ||
        { bad "broken FFmpeg (rc $rc)"; show "$D/nodec.err"; }
else bad "cc builds a fake $AVF"; show "$D/fakeav.err"; fi
wait_sql "$DB" "select count(*) from requests where status='ok' and decode_seconds > 0 and encode_seconds > 0" 7 60 &&
    ok "the catalog records encode and decode seconds for each prompt request" ||
    { bad "catalog encode/decode seconds"; /usr/bin/sqlite3 "$DB" "select id, worker, encode_seconds, decode_seconds from requests" | show; }

"$R" report --html "$D/report.html" --catalog "$DB" >/dev/null 2>&1 &&
    grep -q "Where the workers' time went" "$D/report.html" && grep -q "decoding outputs" "$D/report.html" &&
    ok "the HTML report splits the workers' time into loops, encoding and decoding" || bad "report time split"

echo "== a GEN cancelled while its video decodes: the decode stops at its next latent frame"
# (before: the decode ran to its end, holding the VAE, and the next
# request's decode waited for it and counted the wait as its own). The
# client cancels at the decode's first frame (its progress count passes
# the one step); 6 latent frames of 256x256 take seconds here.
PYTHONPATH="$HERE/../clients/python" $PY - "$CE" >"$D/dcancel.out" 2>&1 <<'PYEOF'
import sys
import reel

class Stop(Exception):
    pass

def cb(step, steps):
    if step > 1:  # one step, then the decode's latent frames
        raise Stop()

with reel.Client(sys.argv[1], timeout=120) as c:
    try:
        c.gen("tiny", prompt="a cat", latent_shape=[4, 6, 32, 32], steps=1, cfg=1.0, output="video", progress=cb)
        print("the GEN ended before its decode's first frame was reported")
    except Stop:
        print("cancelled in the decode")
PYEOF
grep -q "^cancelled in the decode$" "$D/dcancel.out" &&
    wait_for "$D/wt.log" "failed: cancelled by its client while its output decoded \\(after [0-9]+ of 6 latent frames\\)" 60 &&
    ! grep -q "after 6 of 6 latent frames" "$D/wt.log" &&
    ok "wt stopped the decode: $(grep -o 'after [0-9]* of 6 latent frames' "$D/wt.log" | head -1)" ||
    { bad "a GEN cancelled in its decode"; show "$D/dcancel.out" "$D/wt.log"; }
$GEN --prompt "$P" --output frames --out "$D/fafter.safetensors" 2>"$D/fafter.err" && grep -q "worker wt," "$D/fafter.err" &&
    ok "the next prompt GEN with frames is served by wt" || { bad "the GEN after the cancelled decode"; show "$D/fafter.err"; }

echo "== without the worker that can, a prompt waits and fails no_worker saying why; the rest keeps serving"
stop_proc "$TW" || bad "the text worker stops on SIGTERM"
# the broker must know it is gone (else the GEN would wait for it: timeout, not no_worker)
wait_for "$D/broker.log" "worker wt lost" 60 || bad "the broker drops wt"
$GEN --prompt "$P" --deadline-ms 1500 --out "$D/n.safetensors" 2>"$D/n.err"
grep -q "no_worker" "$D/n.err" && grep -q "with a text encoder" "$D/n.err" &&
    ok "a prompt GEN with no text encoder in the cluster: no_worker naming the text encoder" || { bad "no_worker for prompts"; show "$D/n.err"; }
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors" >/dev/null 2>&1
$GEN --context "$D/ctx.safetensors" --uncond "$D/ctx.safetensors" --out "$D/c.safetensors" 2>"$D/c.err" &&
    grep -q "worker wp," "$D/c.err" && ok "a context GEN still runs on wp" || { bad "context GEN on wp"; show "$D/c.err"; }
$GEN --context "$D/ctx.safetensors" --uncond "$D/ctx.safetensors" --output frames --deadline-ms 1500 \
    --out "$D/v.safetensors" 2>"$D/v.err"
grep -q "with a VAE" "$D/v.err" && ok "frames from a cluster without a VAE: no_worker naming the VAE" || { bad "no_worker for frames"; show "$D/v.err"; }

echo "== the worker's own refusals"
"$B/reel-worker" --name bad --broker "$WE" --weights "$D/plain.safetensors" --t5 "$D/t5.safetensors" \
    --tokenizer "$D/spiece.model" >"$D/bad.log" 2>&1
[ $? = 2 ] && grep -q "needs a model with text_len" "$D/bad.log" &&
    ok "a text encoder for a model without text_len: the worker exits 2 saying so" || { bad "worker t5 without text_len"; show "$D/bad.log"; }
"$B/reel-worker" --name bad --broker "$WE" --weights "$D/dit.safetensors" --t5 "$D/t5.safetensors" >"$D/bad2.log" 2>&1
[ $? = 2 ] && grep -q -- "--t5 needs its tokenizer" "$D/bad2.log" && ok "--t5 without --tokenizer is a usage error" || { bad "t5 alone"; show "$D/bad2.log"; }
"$B/reel-worker" --name bad --broker "$WE" --weights "$D/dit.safetensors" --vae "$D/t5.safetensors" >"$D/bad3.log" 2>&1
[ $? = 2 ] && grep -qi "vae" "$D/bad3.log" && ok "a VAE file that is not one: exit 2, naming it" || { bad "bad vae"; show "$D/bad3.log"; }
"$B/reel-worker" --name bad --broker "$WE" --weights "$REL" --budget 64K >"$D/bad4.log" 2>&1
[ $? = 2 ] && grep -q "is used up by the text encoder and its cache, the VAE (" "$D/bad4.log" &&
    ! grep -q "LoRA base" "$D/bad4.log" &&
    ok "the encoders and the prompt cache count against --budget: a budget they use up is exit 2, naming what it holds" ||
    { bad "budget used up"; show "$D/bad4.log"; }
finish
