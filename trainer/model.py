"""A small GPT-style decoder-only transformer.

Kept deliberately plain (GPT-2 layout: learned positions, pre-LN blocks, GELU MLP, tied head)
so that parallelism can be applied from outside: the blocks live in ``GPT.layers`` (a
``ModuleList``), which is the unit FSDP2's ``fully_shard`` wraps per block later. Nothing in
here knows about distributed training, devices or dtypes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: Label value that contributes nothing to the loss (PyTorch's ``cross_entropy`` default).
IGNORE_INDEX = -100


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model. ``max_seq_len`` bounds the learned position table."""

    vocab_size: int
    max_seq_len: int = 128
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    bias: bool = True
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.vocab_size <= 0 or self.max_seq_len <= 0 or self.n_layers <= 0:
            raise ValueError(f"vocab_size, max_seq_len and n_layers must be > 0: {self}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention; the causal mask comes from SDPA's ``is_causal`` so the
    fused/flash kernels are used where the backend has them."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.proj.is_residual_projection = True  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        # (B, T, D) -> (B, H, T, Dh)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.fc = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.proj.is_residual_projection = True  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_mlp = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_attn(x)))
        return x + self.drop(self.mlp(self.ln_mlp(x)))


class GPT(nn.Module):
    """Decoder-only LM. ``forward(input_ids, labels)`` returns ``(logits, loss)``; the loss is
    ``None`` without labels. Labels are aligned with ``input_ids`` (``labels[:, t]`` is the
    target for position ``t``; the loader does the shift), ``IGNORE_INDEX`` masks a position."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # Tied: one (vocab, d_model) matrix both embeds and un-embeds; halves the largest
        # parameter of a small model.
        self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) everywhere, zero biases, and residual output projections
        scaled by 1/sqrt(2 * n_layers) so the residual stream's variance does not grow with
        depth. A method (not only __init__) so a meta-device model can be materialised later."""
        std = self.cfg.init_std
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                s = resid_std if getattr(module, "is_residual_projection", False) else std
                if module is not self.lm_head:  # tied: initialised as the embedding
                    nn.init.normal_(module.weight, mean=0.0, std=s)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        _, t = input_ids.shape
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} > max_seq_len {self.cfg.max_seq_len}")
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(pos))
        for block in self.layers:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if labels is not None:
            # Loss in float32 even under autocast: the log-softmax over a large vocab is where
            # bf16 loses the most.
            loss = F.cross_entropy(
                logits.float().view(-1, logits.size(-1)),
                labels.reshape(-1),
                ignore_index=IGNORE_INDEX,
            )
        return logits, loss

    def num_parameters(self, exclude_position_embeddings: bool = False) -> int:
        """Unique parameters (the tied matrix counted once). Position embeddings are a table
        lookup, not a matmul, so FLOP estimates leave them out."""
        n = sum(p.numel() for p in self.parameters())  # parameters() de-duplicates tied ones
        if exclude_position_embeddings:
            n -= self.pos_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), the PaLM-paper estimate used for MFU:
        ``6 * N`` for the matmuls against weights (N without position embeddings; the tied
        embedding counts because it is the LM-head matmul) plus ``12 * L * d_model * T`` for
        the attention scores and the weighted sum (QK^T and AV, forward and backward)."""
        t = self.cfg.max_seq_len if seq_len is None else seq_len
        n = self.num_parameters(exclude_position_embeddings=True)
        return 6.0 * n + 12.0 * self.cfg.n_layers * self.cfg.d_model * t
