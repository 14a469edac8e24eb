"""Tests for the plain-torch BERT, DLRM, ResNet and AlexNet models (tiny inputs, CPU)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from core.errors import UserError
from workloads.bert.model import BertConfig, BertPretraining, mlm_accuracy, pretraining_loss
from workloads.dlrm import model as dlrm
from workloads.dlrm.model import DLRM, DLRMConfig, interaction_features
from workloads.images.models import alexnet, build_image_model, resnet18, resnet50


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run these tiny models on one thread: with two threads on a busy 2-core machine, OpenMP
    workers wait on each other and a DLRM step takes 30x longer."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------- images


@pytest.mark.parametrize(
    ("build", "expected"),
    [(resnet18, 11_689_512), (resnet50, 25_557_032), (alexnet, 61_100_840)],
)
def test_image_parameter_counts_match_torchvision(build, expected: int) -> None:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        assert n_params(build()) == expected


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "alexnet"])
def test_image_models_classify_small_images(name: str) -> None:
    torch.manual_seed(0)
    model = build_image_model(name, num_classes=7).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


def test_resnet_width_scales_every_stage() -> None:
    model = resnet50(num_classes=5, width=16)
    assert model.conv1.out_channels == 16
    assert model.layer4[-1].conv3.out_channels == 16 * 8 * 4
    assert model.fc.in_features == 512
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 5)


def test_resnet_initialisation_is_torchvisions() -> None:
    torch.manual_seed(0)
    model = resnet18()
    # Kaiming normal, fan_out, ReLU gain: std = sqrt(2 / (out_channels * k * k)).
    w = model.conv1.weight
    assert w.std().item() == pytest.approx(math.sqrt(2 / (64 * 7 * 7)), rel=0.05)
    w = model.layer4[0].conv2.weight
    assert w.std().item() == pytest.approx(math.sqrt(2 / (512 * 3 * 3)), rel=0.05)
    assert torch.equal(model.layer2[0].bn1.weight, torch.ones(128))
    assert torch.equal(model.layer2[0].bn1.bias, torch.zeros(128))


def test_build_image_model_rejects_bad_requests() -> None:
    with pytest.raises(UserError, match="unknown image model 'vgg16'.*resnet18"):
        build_image_model("vgg16", 10)
    with pytest.raises(UserError, match="alexnet has fixed widths"):
        build_image_model("alexnet", 10, width=32)
    with pytest.raises(UserError, match="num_classes"):
        build_image_model("resnet18", 0)


# ----------------------------------------------------------------------------------------- BERT

SMALL = BertConfig(vocab_size=1000, dropout=0.0)


def bert_batch(config: BertConfig, batch: int = 4, seq: int = 32, predictions: int = 5):
    """A deterministic batch: the last 8 tokens of each row are padding."""
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, config.vocab_size, (batch, seq), generator=g)
    input_mask = torch.ones(batch, seq, dtype=torch.int64)
    input_mask[:, seq - 8 :] = 0
    input_ids[:, seq - 8 :] = 0
    segment_ids = torch.zeros(batch, seq, dtype=torch.int64)
    segment_ids[:, seq // 2 : seq - 8] = 1
    positions = torch.stack(
        [torch.randperm(seq - 8, generator=g)[:predictions] for _ in range(batch)]
    )
    masked_lm_ids = torch.randint(1, config.vocab_size, (batch, predictions), generator=g)
    weights = torch.ones(batch, predictions)
    weights[:, -1] = 0  # the last slot is padding in every row
    labels = torch.randint(0, 2, (batch,), generator=g)
    return input_ids, input_mask, segment_ids, positions, masked_lm_ids, weights, labels


def test_bert_config_validation_and_large_size() -> None:
    with pytest.raises(UserError, match="not divisible by heads 3"):
        BertConfig(hidden=128, heads=3)
    large = BertConfig.large()
    assert (large.hidden, large.layers, large.heads, large.intermediate) == (1024, 24, 16, 4096)
    with torch.device("meta"):
        total = n_params(BertPretraining(large))
    # Encoder + pooler 335,141,888 (the "335M" of BERT-large) plus MLM transform, LayerNorm,
    # decoder bias and NSP: 336,226,108 (the decoder weight is tied, so not counted twice).
    assert total == 336_226_108
    assert 335e6 <= total <= 340e6


def test_bert_shapes_and_loss() -> None:
    torch.manual_seed(0)
    model = BertPretraining(SMALL)
    ids, mask, seg, pos, mlm_ids, weights, labels = bert_batch(SMALL)
    mlm_logits, nsp_logits = model(ids, mask, seg, pos)
    assert mlm_logits.shape == (4, 5, 1000)
    assert nsp_logits.shape == (4, 2)
    loss = pretraining_loss(mlm_logits, nsp_logits, mlm_ids, weights, labels)
    assert torch.isfinite(loss)
    # A freshly initialised model is close to uniform: about log(V) + log(2).
    assert loss.item() == pytest.approx(math.log(1000) + math.log(2), rel=0.1)


def test_bert_loss_and_accuracy_formulas() -> None:
    vocab = 10
    mlm_logits = torch.zeros(1, 3, vocab)
    mlm_logits[0, 2, 0] = 100.0  # a slot with weight 0: must not count
    mlm_logits[0, 0, 4] = 5.0  # slot 0 predicts 4 (correct), slot 1 predicts 0 (wrong)
    ids = torch.tensor([[4, 7, 1]])
    weights = torch.tensor([[1.0, 1.0, 0.0]])
    nsp_logits = torch.zeros(1, 2)
    loss = pretraining_loss(mlm_logits, nsp_logits, ids, weights, torch.tensor([1]))
    ce0 = -F.log_softmax(mlm_logits[0, 0], dim=0)[4].item()
    expected = (ce0 + math.log(vocab)) / (2 + 1e-5) + math.log(2)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert mlm_accuracy(mlm_logits, ids, weights).item() == pytest.approx(0.5)


def test_bert_mlm_head_gathers_positions_and_ties_decoder() -> None:
    torch.manual_seed(0)
    model = BertPretraining(SMALL).eval()
    ids, mask, seg, _, mlm_ids, weights, labels = bert_batch(SMALL)
    with torch.no_grad():
        a, _ = model(ids, mask, seg, torch.tensor([[3, 9]] * 4))
        b, _ = model(ids, mask, seg, torch.tensor([[9, 0]] * 4))
    assert torch.allclose(a[:, 1], b[:, 0], atol=1e-5)  # position 9 in either slot
    assert not torch.allclose(a[:, 0], a[:, 1])
    # Tied decoder: the MLM loss reaches word-embedding rows of tokens absent from the input.
    model.train()
    mlm_logits, nsp_logits = model(ids, mask, seg, torch.tensor([[3, 9]] * 4))
    pretraining_loss(mlm_logits, nsp_logits, mlm_ids[:, :2], weights[:, :2], labels).backward()
    absent = sorted(set(range(1, SMALL.vocab_size)) - set(ids.flatten().tolist()))[0]
    assert model.embeddings.word.weight.grad[absent].abs().sum() > 0
    assert not any("decoder" in name for name, _ in model.named_parameters())


def test_bert_attention_mask_hides_padding() -> None:
    torch.manual_seed(0)
    model = BertPretraining(SMALL).eval()
    ids, mask, seg, pos, *_ = bert_batch(SMALL)
    changed = ids.clone()
    changed[:, -8:] = torch.randint(1, SMALL.vocab_size, (4, 8))
    with torch.no_grad():
        mlm_a, nsp_a = model(ids, mask, seg, pos)
        mlm_b, nsp_b = model(changed, mask, seg, pos)
        # Without the mask the same change must show, or this test could not fail.
        full = torch.ones_like(mask)
        mlm_c, _ = model(ids, full, seg, pos)
        mlm_d, _ = model(changed, full, seg, pos)
    assert torch.allclose(mlm_a, mlm_b, atol=1e-5)
    assert torch.allclose(nsp_a, nsp_b, atol=1e-5)
    assert (mlm_c - mlm_d).abs().max() > 1e-3


def test_bert_adam_overfits_one_batch() -> None:
    torch.manual_seed(0)
    model = BertPretraining(SMALL)
    ids, mask, seg, pos, mlm_ids, weights, labels = bert_batch(SMALL)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        optimiser.zero_grad()
        loss = pretraining_loss(*model(ids, mask, seg, pos), mlm_ids, weights, labels)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


# ----------------------------------------------------------------------------------------- DLRM

COUNTS = [3, 50, 20_000, 7, 100_000] + [11] * 21  # 26 features; two exceed max_ind_range


def dlrm_batch(counts: list[int], batch: int = 16):
    g = torch.Generator().manual_seed(2)
    dense = torch.rand(batch, 13, generator=g)
    sparse = torch.stack([torch.randint(0, c, (batch,), generator=g) for c in counts], dim=1)
    labels = torch.randint(0, 2, (batch,), generator=g).float()
    return dense, sparse, labels


def test_dlrm_config_validation_and_mlperf_sizes() -> None:
    with pytest.raises(UserError, match="bottom_mlp ends in 32 but embedding_dim is 16"):
        DLRMConfig(bottom_mlp=(64, 32))
    with pytest.raises(UserError, match="top_mlp ends in 2"):
        DLRMConfig(top_mlp=(64, 2))
    with pytest.raises(UserError, match="one\\s+positive count per categorical feature"):
        DLRM(DLRMConfig(), counts=[5, 0])
    mlperf = DLRMConfig.mlperf()
    assert mlperf.embedding_dim == 128 and mlperf.bottom_mlp == (512, 256, 128)
    assert mlperf.top_mlp == (1024, 1024, 512, 256, 1) and mlperf.max_ind_range == 40_000_000
    assert DLRMConfig(bottom_mlp=[8, 16]).bottom_mlp == (8, 16)  # lists from JSON become tuples


def test_dlrm_shapes_tables_and_interaction_width() -> None:
    torch.manual_seed(0)
    model = DLRM(DLRMConfig(), COUNTS)
    rows = [t.num_embeddings for t in model.embeddings]
    assert rows == [3, 50, 10_000, 7, 10_000] + [11] * 21
    assert interaction_features(16, 26) == 16 + 26 * 27 // 2 == model.interaction_width == 367
    assert model.top[0].in_features == 367
    dense, sparse, _ = dlrm_batch(COUNTS)
    assert model(dense, sparse).shape == (16,)
    uncapped = DLRM(DLRMConfig(max_ind_range=0), [3, 100_000])
    assert [t.num_embeddings for t in uncapped.embeddings] == [3, 100_000]


def test_dlrm_interaction_is_pairwise_dots_and_indices_wrap() -> None:
    torch.manual_seed(0)
    model = DLRM(DLRMConfig(), [5, 6, 7])
    bottom = torch.randn(2, 16)
    embedded = [torch.randn(2, 16) for _ in range(3)]
    vectors = [bottom, *embedded]
    expected = [bottom] + [
        (vectors[i] * vectors[j]).sum(1, keepdim=True) for i in range(4) for j in range(i)
    ]
    assert torch.allclose(model.interact(bottom, embedded), torch.cat(expected, 1), atol=1e-5)
    # A capped table reduces indices modulo its rows, as the reference's index % max_ind_range.
    capped = DLRM(DLRMConfig(max_ind_range=10), [100])
    dense = torch.rand(1, 13)
    assert torch.equal(capped(dense, torch.tensor([[13]])), capped(dense, torch.tensor([[3]])))


def test_dlrm_loss_and_accuracy_formulas() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0])
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0])
    expected = (
        -(
            math.log(torch.sigmoid(torch.tensor(2.0)).item())
            + math.log(torch.sigmoid(torch.tensor(-1.0)).item())
            + math.log(1 - torch.sigmoid(torch.tensor(0.5)).item())
            + math.log(1 - torch.sigmoid(torch.tensor(-3.0)).item())
        )
        / 4
    )
    assert dlrm.loss(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    assert dlrm.accuracy(logits, labels).item() == pytest.approx(0.5)


def test_dlrm_overfits_one_batch() -> None:
    torch.manual_seed(0)
    model = DLRM(DLRMConfig(), COUNTS)
    dense, sparse, labels = dlrm_batch(COUNTS)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        optimiser.zero_grad()
        loss = dlrm.loss(model(dense, sparse), labels)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]
    assert dlrm.accuracy(model(dense, sparse), labels).item() == 1.0
