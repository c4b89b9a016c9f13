"""The GPT model: shapes, causality, parameter accounting, tying, and that it can learn."""

from __future__ import annotations

import pytest
import torch

from trainer.model import GPT, IGNORE_INDEX, GPTConfig
from trainer.optim import build_optimizer, param_groups

V, T, L, D, H = 97, 16, 2, 32, 4


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=V, max_seq_len=T, n_layers=L, d_model=D, n_heads=H)).eval()


def test_output_shapes(model: GPT) -> None:
    ids = torch.randint(0, V, (3, T))
    logits, loss = model(ids)
    assert logits.shape == (3, T, V)
    assert loss is None
    logits, loss = model(ids[:, :5], ids[:, :5])  # shorter than max_seq_len is fine
    assert logits.shape == (3, 5, V)
    assert loss is not None and loss.shape == ()


def test_loss_at_init_is_near_uniform(model: GPT) -> None:
    ids = torch.randint(0, V, (8, T))
    _, loss = model(ids, torch.randint(0, V, (8, T)))
    assert loss is not None
    assert abs(loss.item() - torch.log(torch.tensor(float(V))).item()) < 0.3


def test_too_long_sequence_is_rejected(model: GPT) -> None:
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, T + 1, dtype=torch.long))


@pytest.mark.parametrize("k", [0, 5, T - 1])
def test_causal_future_tokens_do_not_change_earlier_logits(model: GPT, k: int) -> None:
    ids = torch.randint(0, V, (2, T))
    changed = ids.clone()
    changed[:, k] = (ids[:, k] + 1) % V
    with torch.no_grad():
        a, _ = model(ids)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :k], b[:, :k], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, k:], b[:, k:])  # the change is visible from k on


def test_parameter_count_matches_the_architecture(model: GPT) -> None:
    per_block = 12 * D * D + 13 * D  # qkv, proj, fc, proj (+ biases), two LayerNorms
    expected = V * D + T * D + L * per_block + 2 * D  # tied head adds nothing; final LN
    assert model.num_parameters() == expected
    assert model.num_parameters(exclude_position_embeddings=True) == expected - T * D


def test_flops_per_token_is_6n_plus_attention(model: GPT) -> None:
    n = model.num_parameters(exclude_position_embeddings=True)
    assert model.flops_per_token() == 6 * n + 12 * L * D * T
    assert model.flops_per_token(seq_len=8) == 6 * n + 12 * L * D * 8


def test_lm_head_is_tied_to_the_token_embedding(model: GPT) -> None:
    assert model.lm_head.weight is model.tok_emb.weight
    ids = torch.randint(0, V, (2, T))
    _, loss = model(ids, ids)
    assert loss is not None
    loss.backward()
    # One tensor, one gradient, fed from both the lookup and the output projection.
    assert model.tok_emb.weight.grad is not None
    assert sum(1 for _ in model.parameters()) == len({id(p) for p in model.parameters()})


def test_init_std(model: GPT) -> None:
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.layers[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)
    resid = 0.02 / (2 * L) ** 0.5
    assert model.layers[0].mlp.proj.weight.std().item() == pytest.approx(resid, rel=0.1)
    assert torch.count_nonzero(model.layers[0].attn.qkv.bias) == 0


def test_ignore_index_labels_do_not_count(model: GPT) -> None:
    ids = torch.randint(0, V, (2, T))
    labels = torch.randint(0, V, (2, T))
    masked = labels.clone()
    masked[:, T // 2:] = IGNORE_INDEX
    _, full = model(ids, labels)
    _, half = model(ids, masked)
    _, first_half = model(ids[:, : T // 2], labels[:, : T // 2])  # causal: same logits
    assert half is not None and first_half is not None and full is not None
    torch.testing.assert_close(half, first_half)
    assert half.item() != full.item()


def test_weight_decay_groups_skip_biases_and_norms(model: GPT) -> None:
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == model.num_parameters()


def test_a_few_optimizer_steps_reduce_the_loss_on_a_fixed_batch(model: GPT) -> None:
    torch.manual_seed(1)
    model.train()
    ids = torch.randint(0, V, (4, T))
    labels = torch.roll(ids, -1, dims=1)
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(20):
        _, loss = model(ids, labels)
        assert loss is not None
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_config_validates_heads() -> None:
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(vocab_size=10, d_model=30, n_heads=4)
