"""Our model ↔ Hugging Face transformers' Llama (``LlamaForCausalLM``): names and configs.

The architectures are the same (RMSNorm, SwiGLU, no biases, GQA, optional tied head), so
the conversion is a renaming of weights plus three things that need care:

- Pairing. transformers rotates dim i with dim i + D/2 (our ``half``). An ``interleaved``
  run (dim 2i with 2i+1) is exported by reordering the rows of each q and k head to
  [0, 2, 4, …, 1, 3, 5, …]: rotation then acts on the same pairs with the same angles, and
  q·k is unchanged because q and k are reordered alike. Import undoes the reordering.
- RoPE scaling maps to ``rope_parameters`` (linear, dynamic, yarn, llama3 keep their
  names). Static ``ntk`` has no rope_type in transformers; it is exactly plain RoPE with
  base θ·s^(d/(d−2)), so it is exported as ``default`` with that ``rope_theta``.
  transformers' dynamic NTK counts growth from ``max_position_embeddings``, which is
  therefore set to ``original_max_len`` for it. A forward over a whole sequence agrees,
  generation does not: transformers refits the frequencies to the current length at every
  step (keys already cached keep the old ones), ours fits them once to prompt +
  max_new_tokens (see model/positional/rope.py), so greedy outputs part early.
- What Llama cannot express is refused: linear attention; every encoding but RoPE (each
  row of model/encodings.py says why); partial rotary (Llama rotates every dim of a head)
  and p-RoPE (Llama rotates every frequency).

Pure functions on configs and tensors: no file I/O. Reading and writing transformers
directories is in training/hf_directory.py. Neither needs ``transformers``; only the
export check (``hf_directory.check_parity``) loads it.
"""

from __future__ import annotations

import math

import torch

from ropelab.model.config import ModelConfig, PosConfig, RopeConfig, RopeScalingConfig
from ropelab.common.errors import UserError
from ropelab.model.encodings import KINDS, LLAMA_KIND
from ropelab.model.layers import fuse_projections, split_projections
from ropelab.model.positional.rope_scaling import ntk_base

# config.json keys that fix the network's shape and numerics (compared on import).
ARCH_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings")


class HFConversionError(UserError):
    """A run or Hugging Face directory that cannot be converted; the message says why."""


# --------------------------------------------------------------------------- config mapping

def describe_types(cfg: ModelConfig) -> str:
    """Each layer type of a plan in a few words (its encoding and what differs)."""
    parts = []
    for name, layer in cfg.layers.types.items():
        bits = [KINDS[layer.pos.kind].label] + ([f"window {layer.window}"] if layer.window else []) + (
            ["sinks"] if layer.sinks else []) + ([layer.temperature.kind] if layer.temperature.kind != "none" else [])
        parts.append(f"{name} = {', '.join(bits)}")
    return "; ".join(parts)


def check_exportable(cfg: ModelConfig) -> None:
    """Raise HFConversionError unless transformers' Llama computes exactly what ``cfg`` does."""
    if cfg.attention != "softmax":
        raise HFConversionError(
            f"model.attention={cfg.attention} cannot be exported: transformers' Llama "
            "(LlamaForCausalLM) computes softmax attention, and linear attention replaces the "
            "softmax by a feature map φ(q)ᵀφ(k) with RoPE in the numerator only, which no Llama "
            "config can express. Only softmax-attention runs can be exported.")
    if not cfg.layers.uniform:
        raise HFConversionError(
            f"a layer plan (model.layers.pattern={cfg.layers.pattern!r}: {describe_types(cfg)}) cannot be exported: "
            "transformers' Llama (LlamaForCausalLM) gives every layer the same full attention, the same RoPE and "
            "no sinks or temperature. Only uniform RoPE runs can be exported.")
    kind = cfg.pos.kind
    if not KINDS[kind].exportable:
        raise HFConversionError(
            f"pos.kind={kind} cannot be exported: transformers' Llama (LlamaForCausalLM) only has "
            f"rotary position embeddings, and {KINDS[kind].not_llama}. Only {KINDS[LLAMA_KIND].name} runs "
            "can be exported.")
    if cfg.rotary_dim != cfg.head_dim:
        raise HFConversionError(
            f"partial rotary (pos.rope.rotary_fraction={cfg.pos.rope.rotary_fraction}: {cfg.rotary_dim} of "
            f"{cfg.head_dim} dims per head) cannot be exported: transformers' Llama rotates every dim "
            "of a head. Only runs with rotary_fraction 1 can be exported.")
    if cfg.kept_frequencies != cfg.rotary_dim // 2:
        raise HFConversionError(
            f"p-RoPE (pos.rope.frequency_fraction={cfg.pos.rope.frequency_fraction}: {cfg.kept_frequencies} of "
            f"{cfg.rotary_dim // 2} frequencies rotate) cannot be exported: transformers' Llama rotates every "
            "frequency. Only runs with frequency_fraction 1 can be exported.")
    s = cfg.pos.rope.scaling
    if s.type == "yarn" and s.factor != 1.0 and 0.0 in (s.beta_fast, s.beta_slow):
        raise HFConversionError("YaRN with beta_fast or beta_slow = 0 cannot be exported: transformers "
                                "reads 0 as 'unset' and uses 32/1 instead; choose non-zero betas")


def rope_parameters(cfg: ModelConfig, train_len: int) -> tuple[dict, int]:
    """(transformers ``rope_parameters``, ``max_position_embeddings``) for a RoPE config."""
    rope, s = cfg.pos.rope, cfg.pos.rope.scaling
    kind = s.type if s.factor != 1.0 or s.type == "dynamic" else "none"  # dynamic scales even at factor 1
    original = s.original_max_len or train_len
    extended = max(original, round(original * s.factor))  # the context the scaling is meant for
    if kind == "none":
        return {"rope_type": "default", "rope_theta": rope.theta}, train_len
    if kind == "ntk":
        return {"rope_type": "default", "rope_theta": ntk_base(rope.theta, s.factor, cfg.rotary_dim)}, extended
    params = {"rope_type": kind, "rope_theta": rope.theta, "factor": s.factor}
    if kind == "linear":
        return params, extended
    if kind == "dynamic":
        return params, original
    params["original_max_position_embeddings"] = original
    if kind == "yarn":
        params.update(beta_fast=s.beta_fast, beta_slow=s.beta_slow, truncate=s.truncate)
        if s.attention_factor is not None:
            params["attention_factor"] = float(s.attention_factor)
    else:  # llama3
        params.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor)
    return params, extended


def hf_config(cfg: ModelConfig, train_len: int, eot_id: int) -> dict:
    """config.json for ``LlamaForCausalLM``; readable by transformers 4.45+ and 5."""
    check_exportable(cfg)
    params, max_position_embeddings = rope_parameters(cfg, train_len)
    legacy = {k: v for k, v in params.items() if k != "rope_theta"} if params["rope_type"] != "default" else None
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
        "max_position_embeddings": max_position_embeddings, "initializer_range": min(cfg.init_std, 1.0),
        # Every document follows <|endoftext|> in training, so it also serves as BOS and pad.
        "bos_token_id": eot_id, "eos_token_id": eot_id, "pad_token_id": eot_id,
        "use_cache": True, "dtype": "float32", "torch_dtype": "float32",
        "rope_parameters": params,
        # transformers < 5 reads these two instead; 5 gives rope_scaling precedence, so it
        # must say the same thing (or null for plain RoPE).
        "rope_theta": params["rope_theta"], "rope_scaling": legacy,
    }


def hf_rope_settings(hf: dict) -> dict:
    """The RoPE settings of a config.json, in either the transformers 5 or the 4.x layout."""
    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})  # 5 prefers rope_scaling too
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.pop("type", "default"))
    return params


def model_config_from_hf(hf: dict, where: str) -> tuple[ModelConfig, int]:
    """(ModelConfig, training length) for a foreign Llama config.json; half pairing."""
    if hf.get("model_type") != "llama":
        raise HFConversionError(f"{where} has model_type={hf.get('model_type')!r}; only Llama checkpoints "
                                "(model_type llama, LlamaForCausalLM) can be imported")
    missing = [k for k in ARCH_KEYS[:5] if k not in hf]
    if missing:
        raise HFConversionError(f"{where} lacks {', '.join(missing)}; it is not a complete Llama config")
    llama_defaults = (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False))
    unsupported = [f"{k}={hf[k]!r}" for k, ok in llama_defaults if hf.get(k, ok) != ok]
    heads = hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, hf["hidden_size"] // heads):
        unsupported.append(f"head_dim={hf['head_dim']} (not hidden_size/num_attention_heads)")
    rope = hf_rope_settings(hf)
    if rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) not in (None, 1, 1.0):
        unsupported.append("partial_rotary_factor < 1")
    if rope["rope_type"] not in ("default", "linear", "dynamic", "yarn", "llama3"):
        unsupported.append(f"rope_type={rope['rope_type']!r}")
    if unsupported:
        raise HFConversionError(f"{where}: this Llama variant has no ropelab equivalent ({'; '.join(unsupported)})")
    max_pos = hf.get("max_position_embeddings", 2048)
    kind, factor = rope["rope_type"], rope.get("factor")
    original = rope.get("original_max_position_embeddings")
    if kind == "dynamic" or (kind in ("yarn", "llama3") and original is None):
        original = max_pos  # what transformers uses in these cases
    if kind == "yarn" and factor is None:  # transformers derives it the same way
        factor = max_pos / original
    scaling = RopeScalingConfig()
    if kind != "default":
        scaling = RopeScalingConfig(type=kind, factor=float(factor), original_max_len=original,
                                    **_yarn_or_llama3_fields(rope))
    kv = hf.get("num_key_value_heads") or heads
    cfg = ModelConfig(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
                      n_heads=heads, n_kv_heads=None if kv == heads else kv, ffn_hidden=hf["intermediate_size"],
                      norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                      init_std=hf.get("initializer_range", 0.02),
                      pos=PosConfig(kind=LLAMA_KIND, rope=RopeConfig(theta=float(rope["rope_theta"]), scaling=scaling)))
    return cfg, original or max_pos


def _yarn_or_llama3_fields(rope: dict) -> dict:
    kind, out = rope["rope_type"], {}
    if kind == "yarn":
        out = dict(beta_fast=float(rope.get("beta_fast") or 32), beta_slow=float(rope.get("beta_slow") or 1),
                   truncate=bool(rope.get("truncate", True)), attention_factor=rope.get("attention_factor"))
        mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
        if out["attention_factor"] is None and mscale and mscale_all and rope["factor"] > 1:
            # DeepSeek-style ratio of two log scalings; ours takes the resulting constant.
            log_s = 0.1 * math.log(rope["factor"])
            out["attention_factor"] = (mscale * log_s + 1.0) / (mscale_all * log_s + 1.0)
    elif kind == "llama3":
        out = dict(low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
                   high_freq_factor=float(rope.get("high_freq_factor", 4.0)))
    return out


# --------------------------------------------------------------------------- weights

def _names(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our key with separate projections (split_projections), transformers key) per tensor."""
    pairs = [("tok_emb.weight", "model.embed_tokens.weight"), ("norm.weight", "model.norm.weight")]
    ours_to_hf = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
                  "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
                  "attn.wo": "self_attn.o_proj", "mlp.w1": "mlp.gate_proj", "mlp.w3": "mlp.up_proj",
                  "mlp.w2": "mlp.down_proj"}  # SwiGLU: silu(w1 x) ⊙ w3 x = silu(gate) ⊙ up
    for i in range(cfg.n_layers):
        pairs += [(f"blocks.{i}.{a}.weight", f"model.layers.{i}.{b}.weight") for a, b in ours_to_hf.items()]
    if not cfg.tie_embeddings:
        pairs.append(("head.weight", "lm_head.weight"))
    return pairs


def _half_order(head_dim: int) -> torch.Tensor:
    """Row j of a half-paired head is row order[j] of the interleaved head."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def permute_rows(w: torch.Tensor, n_heads: int, head_dim: int, to_half: bool) -> torch.Tensor:
    """A q/k projection (n_heads·head_dim, d) reordered interleaved→half (or back)."""
    order = _half_order(head_dim)
    if not to_half:
        order = torch.argsort(order)
    return w.reshape(n_heads, head_dim, -1)[:, order].reshape(w.shape).contiguous()


def _reordered_heads(cfg: ModelConfig, our_key: str) -> int:
    """Heads of ``our_key`` if it is a q/k projection whose rows the pairing reorders, else 0."""
    if cfg.pos.rope.pairing != "interleaved":
        return 0
    return {"attn.wq.weight": cfg.n_heads, "attn.wk.weight": cfg.kv_heads}.get(our_key.split(".", 2)[-1], 0)


def to_hf_state(model) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names, q/k rows in half pairing (our fused
    q/k/v and gate/up weights split into Llama's separate projections)."""
    cfg, ours = model.cfg, split_projections(model.state_dict(), model.cfg)
    out = {}
    for our_key, hf_key in _names(cfg):
        w = ours[our_key].detach()
        if heads := _reordered_heads(cfg, our_key):
            w = permute_rows(w, heads, cfg.head_dim, to_half=True)
        out[hf_key] = w.clone().contiguous()  # no shared storage: safetensors refuses it
    return out


def from_hf_state(tensors: dict[str, torch.Tensor], cfg: ModelConfig, where: str) -> dict[str, torch.Tensor]:
    """A state_dict for ``Transformer(cfg)`` from transformers' tensors (inverse of to_hf_state)."""
    names = _names(cfg)
    expected = {hf for _, hf in names}
    ignorable = {"lm_head.weight"} if cfg.tie_embeddings else set()  # tied: transformers ignores it too
    missing = sorted(expected - set(tensors))
    unexpected = sorted(k for k in set(tensors) - expected - ignorable if not k.endswith("rotary_emb.inv_freq"))
    if missing or unexpected:
        raise HFConversionError(f"the weights in {where} do not fit its config.json: missing {missing[:4]}, "
                                f"unexpected {unexpected[:4]}")
    out = {}
    for our_key, hf_key in names:
        w = tensors[hf_key].to(torch.float32)
        if heads := _reordered_heads(cfg, our_key):
            w = permute_rows(w, heads, cfg.head_dim, to_half=False)
        out[our_key] = w
    if cfg.tie_embeddings:
        out["head.weight"] = out["tok_emb.weight"]
    return fuse_projections(out)
