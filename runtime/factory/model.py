"""The Flash model: a small decoder-only transformer with sparse mixture-of-experts feed-forward blocks.

nanoGPT-style and in one file. Layout (module names and weight shapes are relied on
by the ONNX exporter, keep them):

    transformer.wte   Embedding(vocab, n_embd)          tied to lm_head
    transformer.wpe   Embedding(block_size, n_embd)     learned absolute positions
    transformer.h[i]  Block: x + attn(ln_1(x)); x + ffn(ln_2(x))
                      ffn = MoE on layers where i % moe_every == moe_every - 1, else MLP
    transformer.ln_f  LayerNorm(n_embd, bias=False)
    lm_head           Linear(n_embd, vocab, bias=False)

MoE experts are stored as two stacked parameters in the layout of onnxruntime's
``QMoE`` operator: ``w1`` (n_expert, expert_hidden, n_embd) and ``w2``
(n_expert, n_embd, expert_hidden), i.e. output rows with the input (K) dimension
last, which is also the dimension INT4 blocks run along.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from runtime.factory.quant import fake_quant_int4

KV = tuple[Tensor, Tensor]


@dataclass
class FlashConfig:
    """Hyper-parameters of a Flash model.

    The default (d=256, 4 layers, 4 heads, every feed-forward block an MoE of 16
    experts 256->256->256 with top-1 routing, vocab 2048, context 128) has about
    10.0M parameters of which about 2.2M (~21%) are active per token. Why this size:

    - The shipped INT4 file must stay under 8 MB. INT4 with float32 block-32 scales
      costs ~0.625 bytes per weight; 9.5M quantized weights are ~5.9 MB, leaving room
      for the 2048x256 embedding table (the exported default measured 7.5 MB).
    - Per-token compute must be small enough for a game client on one CPU thread:
      top-1 routing touches one 131k-parameter expert per layer, so a decoded token
      costs about as much as a dense ~2M-parameter model, while 16 experts give the
      capacity of a 10M one (the line book's archetypes/states/intents specialise well).
    - Lines are short (<~40 tokens) after a ~10-token control prompt, so a 128-token
      context is ample and keeps the learned position table tiny.
    - It trains to a useful loss on a 2-core CPU in under 30 minutes.

    ``qat`` turns on INT4 fake quantization (block ``quant_block``) of every weight
    exported as INT4; training switches it on for its final phase.
    """

    vocab_size: int = 2048
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    n_expert: int = 16
    expert_hidden: int = 256
    top_k: int = 1
    moe_every: int = 1
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 1e-3
    dropout: float = 0.0
    quant_block: int = 32
    qat: bool = False

    def __post_init__(self) -> None:
        def need(ok: bool, problem: str) -> None:
            if not ok:
                raise ValueError(f"FlashConfig: {problem}")

        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "n_expert",
                     "expert_hidden", "moe_every", "quant_block"):
            value = getattr(self, name)
            need(isinstance(value, int) and value > 0, f"{name} must be a positive int, got {value!r}")
        need(self.n_embd % self.n_head == 0,
             f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        need(self.top_k in (1, 2), f"top_k must be 1 or 2, got {self.top_k!r}")
        need(self.top_k <= self.n_expert,
             f"top_k ({self.top_k}) cannot exceed n_expert ({self.n_expert})")
        need(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout!r}")
        for name, width in (("n_embd", self.n_embd), ("expert_hidden", self.expert_hidden)):
            need(width % self.quant_block == 0,
                 f"{name} ({width}) must be a multiple of quant_block ({self.quant_block})")

    def is_moe_layer(self, i: int) -> bool:
        return i % self.moe_every == self.moe_every - 1


@dataclass
class FlashOutput:
    """What :meth:`Flash.forward` returns.

    logits [B, T, V]; loss (CE on the masked targets + aux_loss) or None without targets;
    present_kv: per layer (k, v), each [B, n_head, P + T, head_dim];
    router_probs: per MoE layer, float32 [B, T, n_expert];
    aux_loss: weighted load-balancing + router z-loss summed over MoE layers (0-dim);
    ce_loss: the cross-entropy part of ``loss`` alone, or None without targets.
    """

    logits: Tensor
    loss: Tensor | None
    present_kv: list[KV]
    router_probs: list[Tensor]
    aux_loss: Tensor
    ce_loss: Tensor | None = None


def _maybe_quant(w: Tensor, enabled: bool, block: int) -> Tensor:
    return fake_quant_int4(w, block) if enabled else w


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: FlashConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.dropout = cfg.dropout
        self.quant_block = cfg.quant_block
        self.qat = cfg.qat
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, past: KV | None = None, mask: Tensor | None = None) -> tuple[Tensor, KV]:
        """``mask``: bool [B or 1, 1, T, P + T], True = may attend; None = plain causal (P must be 0)."""
        B, T, C = x.shape
        hd = C // self.n_head
        qkv = F.linear(x, _maybe_quant(self.c_attn.weight, self.qat, self.quant_block))
        q, k, v = qkv.split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        dropout_p = self.dropout if self.training else 0.0
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = F.linear(y, _maybe_quant(self.c_proj.weight, self.qat, self.quant_block))
        return self.resid_dropout(y), (k, v)


class MLP(nn.Module):
    """Dense feed-forward block (used on non-MoE layers when moe_every > 1)."""

    def __init__(self, cfg: FlashConfig) -> None:
        super().__init__()
        self.quant_block = cfg.quant_block
        self.qat = cfg.qat
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        h = F.silu(F.linear(x, _maybe_quant(self.c_fc.weight, self.qat, self.quant_block)))
        y = F.linear(h, _maybe_quant(self.c_proj.weight, self.qat, self.quant_block))
        return self.dropout(y), None, None


class MoE(nn.Module):
    """Sparse mixture of experts with a float32 top-k router.

    probs = softmax(router(x)) in float32; each token goes to its top-k experts with
    weight = the raw top-1 prob, or the renormalised top-2 probs; only the selected
    experts are computed, on the tokens routed to them.

    Also returns the auxiliary loss (Switch-Transformer load balancing
    ``n_expert * sum_e f_e * P_e`` times ``aux_loss_coef`` plus the router z-loss
    ``mean(logsumexp(logits)^2)`` times ``z_loss_coef``) and the router probabilities.
    """

    def __init__(self, cfg: FlashConfig) -> None:
        super().__init__()
        self.n_expert = cfg.n_expert
        self.top_k = cfg.top_k
        self.aux_loss_coef = cfg.aux_loss_coef
        self.z_loss_coef = cfg.z_loss_coef
        self.quant_block = cfg.quant_block
        self.qat = cfg.qat
        self.router = nn.Linear(cfg.n_embd, cfg.n_expert, bias=False)
        self.w1 = nn.Parameter(torch.empty(cfg.n_expert, cfg.expert_hidden, cfg.n_embd))
        self.w2 = nn.Parameter(torch.empty(cfg.n_expert, cfg.n_embd, cfg.expert_hidden))
        self.dropout = nn.Dropout(cfg.dropout)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router logits and softmax probs [N, n_expert], in float32 whatever the autocast state."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = F.linear(x.float(), self.router.weight.float())
            probs = torch.softmax(logits, dim=-1)
        return logits, probs

    def expert_weights(self) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Per-expert (w1[e], w2[e]) views, fake-quantized when QAT is on.

        Unbinding once per forward keeps the backward pass to one stacked gradient per
        parameter, instead of a full-size zero gradient for every indexed expert.
        """
        w1 = _maybe_quant(self.w1, self.qat, self.quant_block)
        w2 = _maybe_quant(self.w2, self.qat, self.quant_block)
        return w1.unbind(0), w2.unbind(0)

    def expert_forward(
        self, e: int, x: Tensor, weights: tuple[tuple[Tensor, ...], tuple[Tensor, ...]] | None = None
    ) -> Tensor:
        """Expert ``e`` on the tokens routed to it: w2[e] @ silu(w1[e] @ x)."""
        w1, w2 = weights if weights is not None else self.expert_weights()
        return F.linear(F.silu(F.linear(x, w1[e])), w2[e])

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, C = x.shape
        flat = x.reshape(-1, C)
        logits, probs = self.route(flat)
        top_p, top_e = probs.topk(self.top_k, dim=-1)  # [N, k]
        if self.top_k > 1:
            top_p = top_p / top_p.sum(dim=-1, keepdim=True)

        # group the (token, slot) assignments by expert and run each selected expert once
        expert_of = top_e.reshape(-1)
        order = torch.argsort(expert_of, stable=True)
        token_of = order // self.top_k
        weight_of = top_p.reshape(-1)[order]
        counts = torch.bincount(expert_of, minlength=self.n_expert).tolist()
        weights = self.expert_weights()
        out = torch.zeros_like(flat)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            tokens = token_of[start:start + n]
            y = self.expert_forward(e, flat[tokens], weights)
            w = weight_of[start:start + n].unsqueeze(1)
            out.index_add_(0, tokens, (y.float() * w).to(out.dtype))
            start += n

        # Switch load balancing: fraction of assignments per expert times mean router prob
        frac = torch.bincount(expert_of, minlength=self.n_expert).float() / expert_of.numel()
        balance = self.n_expert * (frac * probs.mean(dim=0)).sum()
        z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
        aux = self.aux_loss_coef * balance + self.z_loss_coef * z_loss
        return self.dropout(out.view(B, T, C)), probs.view(B, T, self.n_expert), aux


class Block(nn.Module):
    def __init__(self, cfg: FlashConfig, layer: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.ffn: MoE | MLP = MoE(cfg) if cfg.is_moe_layer(layer) else MLP(cfg)

    def forward(
        self, x: Tensor, past: KV | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, KV, Tensor | None, Tensor | None]:
        a, present = self.attn(self.ln_1(x), past, mask)
        x = x + a
        f, probs, aux = self.ffn(self.ln_2(x))
        return x + f, present, probs, aux


class Flash(nn.Module):
    """The Flash line model. See the module docstring for the layout."""

    def __init__(self, config: FlashConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=False),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        resid_std = 0.02 / math.sqrt(2 * config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith(".w2"):
                nn.init.normal_(p, mean=0.0, std=resid_std)
            elif name.endswith(".w1"):
                nn.init.normal_(p, mean=0.0, std=0.02)
        self.set_qat(config.qat)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def set_qat(self, enabled: bool) -> None:
        """Switch INT4 fake quantization of the exported-as-INT4 weights on or off."""
        self.config.qat = bool(enabled)
        for m in self.modules():
            if isinstance(m, (CausalSelfAttention, MLP, MoE)):
                m.qat = self.config.qat

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        past_kv: list[KV] | None = None,
        loss_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> FlashOutput:
        """Run the model on ``idx`` [B, T] continuing after ``past_kv`` (P cached positions).

        Positions are P + arange(T) unless ``position_ids`` [B, T] gives them (e.g. for
        left-padded batches). ``attention_mask`` [B, P + T] (1 = real token, 0 = padding)
        hides padded keys: query t of row b attends key j iff j <= P + t and
        attention_mask[b, j] == 1, as in the exported ONNX graph; a query with no key left
        (a padding position) attends to every key so it stays finite, and its logits are
        meaningless. With ``targets`` [B, T] the loss is the mean cross-entropy over
        positions where ``loss_mask`` is true (default: where targets != -100) plus the
        MoE auxiliary loss.
        """
        cfg = self.config
        if idx.dim() != 2:
            raise ValueError(f"idx must be [batch, time], got shape {tuple(idx.shape)}")
        B, T = idx.shape
        if past_kv is not None and len(past_kv) != cfg.n_layer:
            raise ValueError(f"past_kv has {len(past_kv)} layers, model has {cfg.n_layer}")
        past_len = past_kv[0][0].shape[2] if past_kv else 0
        if position_ids is None:
            if past_len + T > cfg.block_size:
                raise ValueError(
                    f"sequence of {past_len} cached + {T} new tokens exceeds block_size {cfg.block_size}"
                )
            pos = torch.arange(past_len, past_len + T, device=idx.device)
        else:
            if position_ids.shape != idx.shape:
                raise ValueError(f"position_ids shape {tuple(position_ids.shape)} != idx shape {tuple(idx.shape)}")
            if int(position_ids.max()) >= cfg.block_size or int(position_ids.min()) < 0:
                raise ValueError(f"position_ids must lie in [0, {cfg.block_size}), block_size {cfg.block_size}")
            pos = position_ids
        mask = self._attention_mask(B, T, past_len, attention_mask, idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        present: list[KV] = []
        router_probs: list[Tensor] = []
        aux_loss = torch.zeros((), device=idx.device)
        for i, block in enumerate(self.transformer.h):
            x, kv, probs, aux = block(x, past_kv[i] if past_kv else None, mask)
            present.append(kv)
            if probs is not None:
                router_probs.append(probs)
                aux_loss = aux_loss + aux
        x = self.transformer.ln_f(x)
        logits = F.linear(x, _maybe_quant(self.lm_head.weight, cfg.qat, cfg.quant_block))

        loss = ce_loss = None
        if targets is not None:
            if targets.shape != idx.shape:
                raise ValueError(f"targets shape {tuple(targets.shape)} != idx shape {tuple(idx.shape)}")
            mask = (targets != -100) if loss_mask is None else loss_mask.bool()
            ce = F.cross_entropy(
                logits.float().view(-1, logits.size(-1)),
                targets.clamp(min=0).view(-1),
                reduction="none",
            )
            ce_loss = (ce * mask.view(-1)).sum() / mask.sum().clamp(min=1)
            loss = ce_loss + aux_loss
        return FlashOutput(logits, loss, present, router_probs, aux_loss, ce_loss)

    @staticmethod
    def _attention_mask(
        B: int, T: int, past_len: int, attention_mask: Tensor | None, device: torch.device
    ) -> Tensor | None:
        """Bool [B or 1, 1, T, P + T] attention mask, or None when plain causal attention does."""
        if attention_mask is None and past_len == 0:
            return None
        q_pos = torch.arange(T, device=device).unsqueeze(1) + past_len
        k_pos = torch.arange(past_len + T, device=device).unsqueeze(0)
        mask = (k_pos <= q_pos).view(1, 1, T, past_len + T)
        if attention_mask is not None:
            if attention_mask.shape != (B, past_len + T):
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} != (batch, past + new) = {(B, past_len + T)}"
                )
            mask = mask & attention_mask.bool().view(B, 1, 1, past_len + T)
            mask = mask | ~mask.any(dim=-1, keepdim=True)  # padding queries: attend anywhere, stay finite
        return mask

    def num_params(self) -> dict[str, int]:
        """Parameter counts: total (tied weights once), active_per_token, router, embedding, experts.

        ``active_per_token`` counts every parameter a token touches: all dense weights
        (embeddings and lm_head included) plus ``top_k`` experts per MoE layer.
        ``embedding`` is the token table (shared with lm_head) plus the position table.
        """
        cfg = self.config
        total = sum(p.numel() for p in self.parameters())
        router = experts = unused = 0
        for block in self.transformer.h:
            if isinstance(block.ffn, MoE):
                per_expert = block.ffn.w1[0].numel() + block.ffn.w2[0].numel()
                router += block.ffn.router.weight.numel()
                experts += per_expert * cfg.n_expert
                unused += per_expert * (cfg.n_expert - cfg.top_k)
        embedding = self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return {
            "total": total,
            "active_per_token": total - unused,
            "router": router,
            "embedding": embedding,
            "experts": experts,
        }

    def configure_optimizer(
        self, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95)
    ) -> torch.optim.AdamW:
        """AdamW with decay on matrices (and expert stacks), none on norms and the router."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (decay if p.dim() >= 2 and "router" not in name else no_decay).append(p)
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)

