"""A toy Flow-GRPO loop against a Reel cluster.

Each iteration: a round of groups, G SDE rollouts (different seeds) of
each of --prompts prompts (or of each --prompt), sent in one gen_many call,
with their per-step log-probabilities; a reward from each rollout: with
--prompt, on its decoded frames (the workers encode the text and decode the
latent with their VAE: output="frames"; the toy reward is how red the video
is), else on its final latent (closeness to a fixed target); advantages normalised within each group; a toy policy
update (a small perturbation, signed by the advantage-weighted
log-probability: a stand-in for a real gradient step, which needs autograd)
of a LoRA adapter on the attention projections (rank --rank, alpha twice
it, as Flow-GRPO trains: PEFT's key names, B starting at zero), published
as an adapter on the workers' base version (they run with --lora: every
captured graph is kept): --base, the full version the workers hold; without
it, --weights is published whole first and is the base (STATUS does not say
whether the current version is an adapter, as it is after a LoRA run, so
"the current version" is no base to count on); with --full, of every weight, published whole
(written as safetensors with the Wan2.1 names); and the next group's
rollouts, which must report the new weight version on every step.

    python3 grpo_loop.py --broker tcp://127.0.0.1:5555 --weights W.safetensors \\
        --model small --iters 3 --group 4 [--prompts 2] [--full]

Exit status 0 when every rollout of every iteration ran on the version the
loop had just published.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import reel  # noqa: E402
from reel import safetensors  # noqa: E402


def rollout(c, a, contexts, seed, latent_shape):
    """A round: a group of SDE rollouts with log-probs of each --prompt
    (with decoded frames), else of each fixed context, all in one gen_many
    call (group i's seeds from seed + 100 i); a list of groups."""
    kw = dict(model=a.model, n=a.group, latent_shape=latent_shape, steps=a.steps, shift=3.0, sde=True, eta=0.7,
              return_log_probs=True, deadline_ms=590000)
    if a.prompt:
        reqs = [dict(kw, prompt=p, output="frames", seed=seed + 100 * i) for i, p in enumerate(a.prompt)]
    else:
        reqs = [dict(kw, context=ctx, seed=seed + 100 * i) for i, ctx in enumerate(contexts)]
    return c.gen_many(reqs)


def reward(r, target):
    """The toy reward: how red its frames are (uint8 [F, H, W, 3]), or how
    close its latent is to a target."""
    if r.frames is not None:
        f = r.frames.astype(np.float32) / 255.0
        return float(np.mean(f[..., 0] - 0.5 * (f[..., 1] + f[..., 2])))
    return -float(np.mean((r.latent - target) ** 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", default="tcp://127.0.0.1:5555")
    ap.add_argument("--weights", required=True, help="the weights the workers started from")
    ap.add_argument("--model", default="small")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--latent", default="4x8x8", help="FxHxW")
    ap.add_argument("--weights-dir", default=None, help="where synced weights are written (workers read it)")
    ap.add_argument("--upload", action="store_true",
                    help="publish by value: the bytes go through the broker (its --weights-dir), no shared files")
    ap.add_argument("--start-version", type=int, default=None, help="first version to publish (default: current+1)")
    ap.add_argument("--full", action="store_true", help="publish whole weights, not a LoRA adapter")
    ap.add_argument("--rank", type=int, default=8, help="the adapter's rank r (lora_alpha = 2r)")
    ap.add_argument("--base", type=int, default=None,
                    help="the full version the workers hold as their base, built from --weights (default: "
                         "publish --weights whole first, as the base)")
    ap.add_argument("--prompts", type=int, default=1, help="groups a round (random contexts)")
    ap.add_argument("--prompt", action="append", default=None,
                    help="a text prompt, a group each, may be repeated (workers with a text encoder and a VAE): "
                         "the reward is computed on frames")
    a = ap.parse_args()

    sd, meta = safetensors.load(a.weights)
    C = sd["patch_embedding.weight"].shape[1]
    T = sd["text_embedding.0.weight"].shape[1]
    F, H, W = (int(x) for x in a.latent.split("x"))
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((8, T)).astype(np.float32)
    more = np.random.default_rng(1)  # the other groups' contexts (rng's draws stay as they were)
    contexts = [prompt] + [more.standard_normal((8, T)).astype(np.float32) for _ in range(max(0, a.prompts - 1))]
    target = rng.standard_normal((C, F, H, W)).astype(np.float32)
    wdir = a.weights_dir or tempfile.mkdtemp(prefix="reel-grpo-")
    config = meta.get("config") or {k: meta[k] for k in ("dim", "heads", "layers", "ffn_dim", "in_channels",
                                                          "text_dim", "freq_dim")}

    # The adapter: PEFT's names and initialisation (A random, B zero), on
    # the q, k, v, o of both attentions of every block.
    layers = sorted({int(k.split(".")[1]) for k in sd if k.startswith("blocks.")})
    modules = [f"{a_}.{p}" for a_ in ("self_attn", "cross_attn") for p in ("q", "k", "v", "o")]
    lora = {}
    for n in layers:
        for m in modules:
            out_f, in_f = sd[f"blocks.{n}.{m}.weight"].shape
            key = f"base_model.model.blocks.{n}.{m}"
            lora[key + ".lora_A.weight"] = (rng.standard_normal((a.rank, in_f)) / np.sqrt(in_f)).astype(np.float32)
            lora[key + ".lora_B.weight"] = np.zeros((out_f, a.rank), np.float32)
    lora_config = {"r": a.rank, "lora_alpha": 2 * a.rank, "target_modules": ["q", "k", "v", "o"]}
    full_bytes = sum(w.size * 4 for w in sd.values())
    lora_bytes = sum(w.size * 4 for w in lora.values())

    ok = True
    with reel.Client(a.broker, timeout=600) as c:
        current = c.status().get("versions", {}).get("transformer", 1) or 1
        version = a.start_version or current + 1
        base = a.base
        if not a.full and base is None:
            # The current version may be an adapter (the last LoRA run's),
            # which no adapter can go on: the base is published here.
            res = c.sync(version, state_dict=sd, config=config, weights_dir=wdir, upload=a.upload)
            print(f"grpo: published v{version} (the base: {a.weights} whole): applied by {','.join(res.applied)}"
                  f"{'' if res.complete else '; lagging: ' + str(res.failed)}")
            base, version = version, version + 1
        if not a.full:
            print(f"grpo: LoRA rank {a.rank} on {len(layers) * len(modules)} Linears, {lora_bytes} bytes a sync "
                  f"({100.0 * lora_bytes / full_bytes:.1f}% of the {full_bytes} of the whole model), on base v{base}")
        groups = len(a.prompt) if a.prompt else len(contexts)
        print(f"grpo: model {a.model}, {groups} group(s) of {a.group} a round, {a.steps} SDE steps, latent "
              f"{C}x{a.latent}, publishing from v{version}"
              + (f", prompts {a.prompt!r}, reward on decoded frames" if a.prompt else ""))
        print(f"{'iter':>4} {'version':>7} {'reward mean':>11} {'reward std':>10} {'log p mean':>10} "
              f"{'replayed':>8} {'seconds':>7}")  # replayed: the group's batched steps served from its graphs
        for it in range(a.iters):
            t0 = time.monotonic()
            round_ = rollout(c, a, contexts, 1000 * it, (C, F, H, W))
            per_group = [np.array([reward(r, target) for r in g]) for g in round_]
            adv = np.concatenate([(g - g.mean()) / (g.std() + 1e-6) for g in per_group])  # GRPO: within each group
            rewards = np.concatenate(per_group)
            rollouts = [r for g in round_ for r in g]
            logp = np.array([float(r.log_probs.sum()) for r in rollouts])
            want = version - 1 if it else None
            for r in rollouts:
                if want is not None and set(r.versions) != {want}:
                    print(f"grpo: a rollout ran on versions {sorted(set(r.versions))}, expected v{want}")
                    ok = False
            # a group's samples each hold the group's stats (its batched steps): count them once a group
            replayed = sum(g[0].replayed for g in round_)
            print(f"{it:>4} {rollouts[0].version:>7} {rewards.mean():>11.4f} {rewards.std():>10.4f} "
                  f"{logp.mean() / a.steps:>10.4f} {replayed:>8} {time.monotonic() - t0:>7.2f}")
            # The toy update: nudge every weight along a fixed random direction,
            # signed and scaled by the advantage-weighted log-probability.
            sign = float(np.sign(np.dot(adv, logp - logp.mean())) or 1.0)
            if a.full:
                for name, w in sd.items():
                    sd[name] = (w + 1e-4 * sign * rng.standard_normal(w.shape)).astype(np.float32)
                res = c.sync(version, state_dict=sd, config=config, weights_dir=wdir, upload=a.upload)
                what = "whole weights"
            else:
                for name, w in lora.items():
                    lora[name] = (w + 1e-2 * sign * rng.standard_normal(w.shape)).astype(np.float32)
                res = c.sync_lora(version, base, lora=lora, lora_config=lora_config, weights_dir=wdir,
                                  upload=a.upload)
                what = f"adapter on base v{base}"
            print(f"grpo: published v{version} ({what}): applied by {','.join(res.applied)}"
                  f"{'' if res.complete else '; lagging: ' + str(res.failed)}")
            version += 1
        # One more group: every step must run on the last published version.
        last = rollout(c, a, contexts, 99, (C, F, H, W))
        seen = sorted({v for g in last for r in g for v in r.versions})
        print(f"grpo: the next rollouts ran on {', '.join(f'v{v}' for v in seen)}"
              f" (published last: v{version - 1})")
        ok = ok and seen == [version - 1]
    print("grpo: done" if ok else "grpo: FAILED: a rollout ran on another version than the one just published")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
