"""gpt-char's building blocks (trainer/workloads/gpt_char.py): reproducible batches, the model's
shape, tied head and FLOPs, activation checkpointing's gradients, and the corpus split.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.workloads import gpt_char

# -- gpt-char building blocks -------------------------------------------------------------------


def test_batches_depend_only_on_seed_step_rank() -> None:
    data = torch.arange(1000)
    x1, y1 = gpt_char.get_batch(data, 16, 8, gpt_char.window_generator(0, "train", 5, 1))
    x2, y2 = gpt_char.get_batch(data, 16, 8, gpt_char.window_generator(0, "train", 5, 1))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(y1[:, :-1], x1[:, 1:])  # targets are the inputs shifted by one
    x3, _ = gpt_char.get_batch(data, 16, 8, gpt_char.window_generator(0, "train", 5, 0))
    assert not torch.equal(x1, x3)


def test_gpt_forward_shape_tied_head_and_flops() -> None:
    model = gpt_char.GPT(vocab_size=30, n_layer=2, n_head=2, n_embd=16, block_size=8)
    logits = model(torch.zeros(3, 8, dtype=torch.long))
    assert logits.shape == (3, 8, 30)
    assert model.lm_head.weight is model.wte.weight
    n = model.non_embedding_params()
    assert n == sum(p.numel() for p in model.blocks.parameters()) + sum(p.numel() for p in model.ln_f.parameters())
    assert gpt_char.flops_per_token(model, 2, 16, 8) == 6 * n + 12 * 2 * 16 * 8


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    torch.manual_seed(0)
    plain = gpt_char.GPT(vocab_size=20, n_layer=2, n_head=2, n_embd=16, block_size=8)
    ckpt = gpt_char.GPT(vocab_size=20, n_layer=2, n_head=2, n_embd=16, block_size=8, activation_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 20, (2, 8))
    for m in (plain, ckpt):
        m(idx).sum().backward()
    for (_, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_corpus_split_and_vocab(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("abcab" * 20)
    corpus = gpt_char.load_corpus(str(path))
    assert corpus.vocab == "abc"
    assert len(corpus.val) == 10 and len(corpus.train) == 90
    assert corpus.train[:5].tolist() == [0, 1, 2, 0, 1]
