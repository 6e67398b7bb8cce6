"""Drafters that read the target's own features: Medusa heads and an EAGLE-style layer.

A draft model starts from scratch at every position. The target has already computed a
rich summary of the context: its last hidden state f_t (the input of ``lm_head``, after
the final norm). These drafters build on it:

* :class:`MedusaDrafter` (Cai et al. 2024, "Medusa"): K small residual heads on the
  latest feature, head k guessing the token k positions further ahead. One matrix product
  per head, no recurrence: very cheap, but each head guesses blind to the heads before it.
* :class:`EagleDrafter` (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking
  Feature Uncertainty"): ONE decoder layer that predicts the *next feature* from the
  current feature and the next token, f̂_{t+1} = layer(fc([f_t ; embed(x_{t+1})])), and reads
  tokens off f̂ with the target's own ``lm_head``. It drafts autoregressively at the feature
  level, feeding its own f̂ back in.

Both reuse the target's frozen embedding and ``lm_head`` (shared, not copied), restricted
to the first ``draft_vocab_size`` ids like the embedded draft's reduced head: q = 0 on the
other ids, which ``speculative_generate`` zero-pads and which leaves decoding exact. Only
the new layers are trained and saved (``save(dir)`` / ``load(dir, target)``).

**How features arrive.** A drafter with an ``observe(features)`` method is shown, by
``speculative_generate``, the target's features ``[n, d]`` for exactly the positions the
target's KV cache keeps: the prompt minus its last token (prefill), then after every round
``[last] + accepted drafts``. So when ``propose`` is called with a context x_0 … x_{L−1}
(length L), the drafter has seen f_0 … f_{L−2}: the context's last token has not been
through the target yet (it is the target's own sample from the last round). Rejected
drafts never produce an observation, so the features seen are always real and final.

**Bound to one target.** The layers were trained on one target's features; on another model
they would read features they never saw (α ≈ 0, still exact but pointless), or of another width
(a raw shape error). So a drafter stores a cheap fingerprint of its target
(:func:`target_fingerprint`) with its weights, and ``load`` and ``check_target`` (which
``speculative_generate`` calls) refuse any other target, naming the fix.

``load_drafter(name, target)`` gives any drafter of the course by name.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import kv
from ..drafters import LookupThenDrafter, ModelDrafter, PromptLookupDrafter, draft_loop, no_drafts, to_device
from ..result import warn_caller
from ..sampling import sample
from .assets import asset_dir
from .embedded import random_target

__all__ = ["MedusaDrafter", "EagleDrafter", "load_drafter", "DRAFTER_NAMES", "TRAIN_COMMAND"]

DRAFTER_NAMES = ("draft", "medusa", "eagle", "prompt-lookup", "suffix")
TRAIN_COMMAND = "python scripts/train_feature_drafters.py"


# ---- which target a drafter belongs to -------------------------------------------------------------

FINGERPRINT_ROWS = 8  # rows of the embedding and of the head summed into the checksum: cheap, yet weight-dependent
FINGERPRINT_RTOL = 0.02  # float32 vs float16/bfloat16 copies of one model differ by < 0.5 %; two models by ~100 %


@torch.no_grad()
def target_fingerprint(target: nn.Module) -> dict:
    """A cheap identity of ``target``: its shape, plus the sums of a few rows of its input embedding
    and of its output head (``weights``, 2 × 8 floats), which tell two models of the same shape apart.

    Row sums rather than raw weights: they survive a change of dtype or device (to < 0.5 %),
    while the sums of another model's rows are unrelated numbers. Reads 16 rows: one small
    device→host copy, done once per drafter (at construction), never per round.
    """
    embedding, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    # to the host before float64: Apple's MPS has no float64 (.double() raises there)
    sums = [w[torch.linspace(0, w.shape[0] - 1, FINGERPRINT_ROWS).long()].cpu().double().sum(-1) for w in (embedding, head)]
    return {
        "model_type": target.config.model_type,
        "hidden_size": head.shape[1],
        "vocab_size": head.shape[0],  # rows of the head: the ids the drafter may propose
        "weights": [float(f"{x:.6g}") for x in torch.cat(sums).tolist()],
    }


def fingerprint_mismatch(trained_on: dict, target: dict) -> str | None:
    """How ``target``'s fingerprint differs from ``trained_on``'s (``None``: the same target).

    Only keys present in both are compared, so a config saved before a key existed still loads.
    """
    for key, label in (("model_type", "model type"), ("hidden_size", "hidden size"), ("vocab_size", "vocabulary size")):
        if key in trained_on and key in target and trained_on[key] != target[key]:
            return f"it was trained on a target with {label} {trained_on[key]}, this target has {target[key]}"
    if "weights" in trained_on and "weights" in target:
        expected, actual = torch.tensor(trained_on["weights"]), torch.tensor(target["weights"])
        if (actual - expected).norm() > FINGERPRINT_RTOL * expected.norm():
            return ("it was trained on another model of the same shape "
                    "(the checksum of the target's embedding and head rows differs)")
    return None


def wrong_target_error(drafter: str, mismatch: str, trained_on: dict) -> ValueError:
    """The error for a drafter given a target it was not trained on, naming the two ways out."""
    return ValueError(f"{drafter} does not fit this target: {mismatch}. Use it with the target it was trained on "
                      f"({trained_on.get('model_type')}, hidden size {trained_on.get('hidden_size')}). "
                      f"{TRAIN_COMMAND} trains drafters for the embedded target only; with another target, draft with "
                      "its own small draft model or PromptLookupDrafter().")


class FeatureDrafter:
    """What Medusa and EAGLE share: the target's reduced head, the feature count, save/load.

    Subclasses set ``kind`` (the name in the saved config), build their trainable layers as
    ``self.net`` (an ``nn.Module``: the only weights they own) and list the constructor
    arguments to save in ``init_args()``. The drafter itself is deliberately *not* an
    ``nn.Module``: ``speculative_generate`` treats a module as a draft LM.
    """

    kind = ""
    net: nn.Module

    def __init__(self, target: nn.Module, draft_vocab_size: int | None):
        rows = target.get_output_embeddings().weight.shape[0]
        self.target = target
        self.width = draft_vocab_size or rows  # V': the ids the draft can propose
        if not 1 <= self.width <= rows:
            raise ValueError(f"draft_vocab_size={draft_vocab_size}: choose 1..{rows} (the target's head has {rows} rows).")
        self.hidden_size = target.get_output_embeddings().weight.shape[1]
        self.trained_on = target_fingerprint(target)  # saved with the weights; load() checks it against its target
        self.reset()

    def check_target(self, target: nn.Module) -> None:
        """Raise ``ValueError`` unless ``target`` is the model this drafter was built (and trained) for.

        ``speculative_generate`` calls this before generating. The drafter's own target passes at
        once (``load`` already compared it with the saved fingerprint), and the drafter's layers
        follow it if it was cast or moved since; another object passes only if it is the same model
        (e.g. reloaded), judged by its fingerprint.
        """
        if target is self.target:
            # The drafter's layers follow its target: cast or moved after loading (``target.half()``), the target
            # would feed features in a dtype the layers do not take ("mat1 and mat2 must have the same dtype").
            weight = next(self.net.parameters())
            if (weight.device, weight.dtype) != (target.device, target.dtype):
                self.net.to(target.device, target.dtype)
            return
        mismatch = fingerprint_mismatch(self.trained_on, target_fingerprint(target))
        if mismatch is not None:
            raise wrong_target_error(f"this {self.kind} drafter", mismatch, self.trained_on)
        # The same model: the drafter keeps using its own copy's embedding and head, which must then
        # live where the features will come from.
        if (target.device, target.dtype) != (self.target.device, self.target.dtype):
            raise ValueError(f"this {self.kind} drafter was loaded onto a copy of this target on {self.target.device} in "
                             f"{self.target.dtype}, this one is on {target.device} in {target.dtype}: load it onto this "
                             f"target, with load_drafter({self.kind!r}, target) or {type(self).__name__}.load(path, target).")

    # ---- the target's frozen pieces -------------------------------------------------------------

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., V']`` from features ``[..., d]``: the target's ``lm_head``, first V' rows.
        Slicing the weight is a view, so the target's head is shared, never copied."""
        lm_head = self.target.get_output_embeddings()
        bias = None if lm_head.bias is None else lm_head.bias[: self.width]
        return F.linear(features, lm_head.weight[: self.width], bias)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's input embedding of ``tokens`` ``[...]`` → ``[..., d]``."""
        return self.target.get_input_embeddings()(tokens)

    # ---- the loop's side: observations ----------------------------------------------------------

    def reset(self) -> None:
        """Forget everything seen (``speculative_generate`` calls this before each generation)."""
        self.n_seen = 0  # target features observed so far = positions the target's cache keeps

    def observe(self, features: torch.Tensor) -> None:
        """Take the target's features ``[n, d]`` for the next n positions (kept by its cache)."""
        self.n_seen += features.shape[0]

    def check_context(self, context: torch.Tensor) -> None:
        """The drafter needs f_0 … f_{L−2} for a context of length L (a host-side check: no sync)."""
        if self.n_seen != len(context) - 1:
            raise ValueError(
                f"{type(self).__name__} has seen target features for {self.n_seen} positions but the context has "
                f"{len(context)} tokens: it needs exactly len(context) - 1 (every position but the last). Run it "
                "through speculative_generate, or call reset() and then observe(features of context[:-1]) first."
            )

    # ---- save / load: only the new layers ------------------------------------------------------

    def init_args(self) -> dict:
        return {"draft_vocab_size": self.width}

    def save(self, path, dtype: torch.dtype = torch.float16) -> None:
        """Write ``config.json`` and ``model.safetensors`` (the new layers only, in ``dtype``) to ``path``."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {name: w.detach().to("cpu", dtype).contiguous() for name, w in self.net.state_dict().items()}
        config = {
            "kind": self.kind,
            "args": self.init_args(),
            "target": self.trained_on,  # the fingerprint load() checks the target against
        }
        # Both files are written in full under temporary names first, then moved into place: an interrupted save
        # (training overwrites assets/) must not leave new weights beside an old config that loads without error.
        # The two moves are still two steps, so the config also names its weights by their SHA-256: load() refuses
        # a pair that does not belong together.
        weights, config_file = path / ".model.safetensors.tmp", path / ".config.json.tmp"
        save_file(state, weights)
        config["weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
        config_file.write_text(json.dumps(config, indent=2) + "\n")
        os.replace(weights, path / "model.safetensors")
        os.replace(config_file, path / "config.json")

    @classmethod
    def load(cls, path, target: nn.Module):
        """A drafter saved with ``save(path)``, on ``target`` (weights cast to the target's device and dtype)."""
        from safetensors.torch import load as load_safetensors

        path = Path(path)
        if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"no trained {cls.kind} drafter in {path} (needs config.json + model.safetensors). Train one with:  "
                f"{TRAIN_COMMAND}  (or pass path= to a directory written by drafter.save(dir))."
            )
        config = _read_config(path / "config.json")
        kind = config["kind"]
        if kind != cls.kind:
            raise ValueError(f"{path} holds a {kind!r} drafter, not a {cls.kind!r} one: "
                             f"load it with load_drafter({kind!r}, target, path).")
        # Compared before the drafter is built: another width would fail there (or in the weights) with an error
        # about an argument the caller never passed.
        fingerprint = target_fingerprint(target)
        mismatch = fingerprint_mismatch(config["target"], fingerprint)
        if mismatch is not None:
            shape_only = {key: value for key, value in config["target"].items() if key != "weights"}
            if not (random_target() and fingerprint_mismatch(shape_only, fingerprint) is None):
                raise wrong_target_error(f"the {kind} drafter in {path}", mismatch, config["target"])
            # A GPU check without the real target's weights (they cannot travel there) still runs this drafter's
            # code: the same shapes, noise for drafts, and an output that stays exactly the target's.
            warn_caller(f"the {kind} drafter in {path} was trained on another target, and loads anyway: "
                        "SPECDEC_EDU_RANDOM_TARGET=1 gave this target random weights, so its drafts are noise.")
        weights = (path / "model.safetensors").read_bytes()  # read once: hashed, then parsed
        saved_with = config.get("weights_sha256")  # drafters saved before it was written have none
        if saved_with is not None and hashlib.sha256(weights).hexdigest() != saved_with:
            raise ValueError(f"the weights in {path} are not the ones its config.json was saved with (a save stopped "
                             f"between its two files, or one was replaced): save the drafter again, or train it:  "
                             f"{TRAIN_COMMAND}")
        drafter = cls(target, **config["args"])
        state = load_safetensors(weights)
        drafter.net.load_state_dict({name: w.to(target.device, target.dtype) for name, w in state.items()})
        return drafter


def _read_config(file: Path) -> dict:
    """``config.json`` as ``save`` writes it: an object with ``kind``, ``args`` and ``target``, else a clear error.

    A truncated or hand-edited file otherwise failed deep inside ``load`` with a bare ``JSONDecodeError`` or
    ``KeyError: 'target'`` that names neither the file nor the fix."""
    try:
        config = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        problem = f"is not JSON ({exc})"
    else:
        shape = {"kind": str, "args": dict, "target": dict}
        missing = [key for key, want in shape.items() if not isinstance(config, dict) or not isinstance(config.get(key), want)]
        if not missing:
            return config
        problem = "lacks " + ", ".join(f"{key!r} ({shape[key].__name__})" for key in missing)
    raise ValueError(f"{file} {problem}: it was not written by drafter.save(dir), or it was cut short or edited. "
                     f"Save the drafter again, or train it:  {TRAIN_COMMAND}")


# ---- Medusa -------------------------------------------------------------------------------------


class MedusaHeads(nn.Module):
    """K residual blocks: head k maps a feature h ``[..., d]`` to h + SiLU(W_k h + b_k).

    The target's ``lm_head`` then turns each into logits. W_k and b_k start at zero (as in
    Medusa), so an untrained head is the target's own head: training starts from there.
    """

    def __init__(self, hidden_size: int, n_heads: int):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(n_heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    def forward(self, features: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """``[..., d]`` → ``[..., n, d]``: the first ``n`` heads (all by default)."""
        return torch.stack([features + F.silu(block(features)) for block in self.blocks[:n]], -2)


class MedusaDrafter(FeatureDrafter):
    """Medusa: K heads on the latest target feature, all guessing at once (chain drafting).

    **Alignment** (the classic off-by-one): at ``propose`` time the context has L tokens and
    the latest feature is f_{L−2}. The target's own head on f_{L−2} predicts x_{L−1}, which
    is already known (it is the context's last token). So head k on f_{L−2} guesses the
    token k positions after that, x_{L−2+k+1}::

        position:      …   L−2       L−1        L          L+1         L+2
        context:       …  x_{L−2}   x_{L−1}  |  (drafts)
        feature:       …  f_{L−2}      —      (x_{L−1} has not been through the target yet)
        lm_head(f_{L−2}) ──────────> x_{L−1}   (known: not drafted)
        head 1 (f_{L−2}) ────────────────────> x_L
        head 2 (f_{L−2}) ───────────────────────────────> x_{L+1}
        head k (f_t) predicts x_{t+k+1}; in training, its target is the target's distribution at t+k.

    A round proposes min(γ, K) tokens, token k drawn from head k's q (with ``generator``
    when sampling; the argmax when greedy). Each head guesses without seeing the earlier
    drafts, so q_k is also the distribution of draft k *given* the earlier drafts: exact.

    Args:
        target: the HF causal LM being decoded (its ``lm_head`` is shared).
        n_heads: K, the most tokens a round can draft.
        draft_vocab_size: V', propose only ids < V' (default: the whole head).
    """

    kind = "medusa"

    def __init__(self, target: nn.Module, n_heads: int = 4, draft_vocab_size: int | None = None):
        if n_heads < 1:
            raise ValueError(f"n_heads={n_heads}: Medusa needs at least one head.")
        super().__init__(target, draft_vocab_size)
        self.n_heads = n_heads
        weight = target.get_output_embeddings().weight
        self.net = MedusaHeads(self.hidden_size, n_heads).to(weight.device, weight.dtype).eval()  # zero init: no RNG

    def init_args(self) -> dict:
        return {"n_heads": self.n_heads, **super().init_args()}

    def reset(self) -> None:
        super().reset()
        self.latest = None  # f_{L−2}: the only feature Medusa needs

    @torch.no_grad()
    def observe(self, features: torch.Tensor) -> None:
        super().observe(features)
        if len(features):
            self.latest = features[-1]

    @torch.no_grad()
    def propose(self, context, gamma, to_probs, generator=None):
        """Tokens ``[γ']`` and q ``[γ', V']``, γ' = min(γ, K): head k's guess for x_{L−1+k}."""
        self.check_context(context)
        if gamma < 1 or self.latest is None:  # a one-token prompt: no feature yet, the target goes alone
            return no_drafts(self.width, self.target.device)
        q = to_probs(self.head(self.net(self.latest, min(gamma, self.n_heads))))  # [γ', V']
        return sample(q, generator), q  # one independent draw per head's row


# ---- EAGLE --------------------------------------------------------------------------------------


def one_layer_config(config):
    """The target's config with one layer (for the draft layer).

    ``vocab_size = 1``: the layer stack's own embedding is never used (the drafter reads
    the target's), so it should not cost V × d parameters.
    """
    config = copy.deepcopy(config)
    config.num_hidden_layers, config.vocab_size, config.pad_token_id = 1, 1, None
    if getattr(config, "layer_types", None):  # hybrid models: the first layer's kind
        config.layer_types = config.layer_types[:1]
    return config


class EagleNet(nn.Module):
    """EAGLE's trainable part: ``fc([f_t ; e_{t+1}])`` → one decoder layer (+ final norm) → f̂_{t+1}.

    The layer stack is the target's own decoder class with one layer, so the causal mask,
    the rotary position embedding and the KV cache work exactly as in the target.
    """

    def __init__(self, target: nn.Module):
        super().__init__()
        d = target.config.hidden_size
        self.fc = nn.Linear(2 * d, d)
        self.decoder = type(target.get_decoder())(one_layer_config(target.config))
        self.decoder.embed_tokens = None  # never used: inputs come as embeddings (keeps it out of the saved weights)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, cache=None) -> torch.Tensor:
        """``features`` f_t and ``embeds`` embed(x_{t+1}), both ``[B, n, d]`` → f̂_{t+1} ``[B, n, d]``.

        With a ``cache`` (batch 1), positions continue after what it holds and it grows by n.
        """
        x = self.fc(torch.cat([features, embeds], -1))
        if cache is None:  # training: whole sequences, causal mask, no cache
            return self.decoder(inputs_embeds=x, use_cache=False).last_hidden_state
        return kv.forward_cached(self.decoder, None, cache, inputs_embeds=x).last_hidden_state  # input_ids=None: embeddings


class EagleDrafter(FeatureDrafter):
    """EAGLE: one decoder layer drafting at the feature level, with its own KV cache.

    **The pairing invariant:** the layer's input at position t is the pair (f_t, x_{t+1}),
    and its output is f̂_{t+1}, read by the target's head as q over x_{t+2}::

        real positions:  (f_0, x_1) … (f_{L−2}, x_{L−1})  → f̂_{L−1} → q_1 over x_L     → draft d_1
        draft step 2:    (f̂_{L−1}, d_1)                   → f̂_L     → q_2 over x_{L+1} → draft d_2
        draft step 3:    (f̂_L, d_2)                       → f̂_{L+1} → q_3 over x_{L+2} → draft d_3 …

    x_{t+1} is the token the target actually emitted after position t: it resolves the
    uncertainty of sampling that a feature alone cannot (EAGLE's key point). The first step
    uses the real feature f_{L−2}; later ones feed back the layer's own predicted f̂.

    **Cache bookkeeping (host-side, no sync).** The draft cache holds n_real positions fed
    with real features, then the γ − 1 draft steps of the last round. The next round only
    ever keeps real features: ``observe`` received exactly the positions the target kept,
    so ``propose`` crops the draft steps, feeds the (f_t, x_{t+1}) pairs for the features
    observed since, and drafts. Accepted drafts are thus re-fed with their real features
    (better than the drafted f̂), as in EAGLE. The per-token loop never reads the device.

    Args:
        target: the HF causal LM being decoded (its embedding and ``lm_head`` are shared).
        draft_vocab_size: V', propose only ids < V' (default: the whole head).
        seed: seeds the random initialisation (without touching the global RNG).
    """

    kind = "eagle"

    def __init__(self, target: nn.Module, draft_vocab_size: int | None = None, seed: int = 0):
        weight = target.get_output_embeddings().weight
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG: built on the CPU, whose
            torch.random.default_generator.manual_seed(seed)  # generator alone is saved and restored (torch.manual_seed
            self.net = EagleNet(target).to(weight.device, weight.dtype).eval()  # would also reseed every GPU's, for good)
        super().__init__(target, draft_vocab_size)  # calls reset(), which needs self.net

    def reset(self) -> None:
        super().reset()
        self.cache = kv.new_cache(self.net.decoder)
        self.n_real = 0  # draft-cache positions fed with real target features (all still valid)
        self.n_cached = 0  # draft-cache positions in all: n_real + the last round's draft steps
        self.unfed: list[torch.Tensor] = []  # features observed but not yet fed: f_{n_real} … f_{n_seen−1}
        self.next_feature = None  # f̂_{n_real}: the layer's output at the last real position

    @torch.no_grad()
    def observe(self, features: torch.Tensor) -> None:
        super().observe(features)
        self.unfed.append(features)

    def step(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Feed pairs (f_t, x_{t+1}): ``features`` ``[n, d]``, ``tokens`` ``[n]`` → f̂_{t+1} ``[n, d]``."""
        self.n_cached += len(tokens)
        return self.net(features[None], self.embed(tokens)[None], self.cache)[0]

    @torch.no_grad()
    def propose(self, context, gamma, to_probs, generator=None):
        """Draft ``gamma`` tokens after ``context`` ``[L]`` (host); tokens ``[γ]`` and q ``[γ, V']``."""
        self.check_context(context)
        if gamma < 1 or self.n_seen == 0:  # a one-token prompt: no feature yet, the target goes alone
            return no_drafts(self.width, self.target.device)
        # 1. Roll back: drop last round's draft steps; the real positions are final.
        kv.crop(self.cache, self.n_cached - self.n_real)
        self.n_cached = self.n_real
        # 2. Catch up: pairs (f_t, x_{t+1}) for t = n_real … L−2. The last output is f̂_{L−1}.
        if self.unfed:
            tokens = to_device(context[self.n_real + 1 :], self.target.device)  # x_{n_real+1} … x_{L−1}
            self.next_feature = self.step(torch.cat(self.unfed), tokens)[-1]
            self.n_real, self.unfed = self.n_seen, []
        # 3. Draft autoregressively at the feature level (all on the device): q_i = head(f̂), and
        #    feeding draft x_i pairs it with the f̂ it was read from, giving the next f̂.
        f_hat = self.next_feature

        def feed(token: torch.Tensor) -> torch.Tensor:
            nonlocal f_hat
            f_hat = self.step(f_hat[None], token[None])[0]
            return self.head(f_hat)

        return draft_loop(self.head(f_hat), gamma, to_probs, generator, feed)


# ---- by name ------------------------------------------------------------------------------------


def load_drafter(name: str, target: nn.Module, path=None):
    """A drafter for ``speculative_generate(target, drafter, …)`` by name.

    ``"draft"``: the embedded draft model (``assets/draft/``); ``"prompt-lookup"``: n-gram
    lookup, no weights; ``"medusa"`` / ``"eagle"``: trained feature drafters from ``path``
    (default ``assets/medusa/``, ``assets/eagle/``; written by ``scripts/train_feature_drafters.py``).
    ``"suffix"``: suffix decoding over the request and the target's earlier answers (``path``: the folder of
    ``answers_*.npz`` shards, default ``assets/feature_data``; :mod:`specdec_edu.suffix`).
    ``"prompt-lookup+eagle"`` (or ``+medusa``, ``+draft``): lookup where the context repeats itself,
    the named drafter elsewhere (:class:`~specdec_edu.drafters.LookupThenDrafter`).
    """
    if isinstance(name, str) and name.startswith("prompt-lookup+"):  # anything else unknown: the error below
        return LookupThenDrafter(load_drafter(name.removeprefix("prompt-lookup+"), target, path))
    if name == "prompt-lookup":
        return PromptLookupDrafter()
    if name == "suffix":
        from ..suffix import suffix_drafter_for  # lazy: suffix.py imports this package's drafters

        return suffix_drafter_for(target, path)
    if name == "draft":
        from .embedded import load_embedded_draft  # lazy: loads weights from assets/

        draft = load_embedded_draft(device=target.device)
        if target.config.vocab_size != draft.config.vocab_size:  # its ids would mean other words: α ≈ 0, in silence
            raise ValueError(f"the embedded draft speaks SmolLM2's tokenizer ({draft.config.vocab_size} ids), this "
                             f"target has {target.config.vocab_size}: use the draft of the target's own pair "
                             "(load_pair), or a model-free drafter ('prompt-lookup', 'suffix').")
        return ModelDrafter(draft)
    if name in ("medusa", "eagle"):
        cls = MedusaDrafter if name == "medusa" else EagleDrafter
        return cls.load(asset_dir(name) if path is None else path, target)
    raise ValueError(f"unknown drafter {name!r}: choose one of {', '.join(repr(n) for n in DRAFTER_NAMES)}, "
                     "or 'prompt-lookup+NAME' for lookup with NAME as the fallback (e.g. 'prompt-lookup+eagle').")
