"""The Metrics section's sections (app/panels/sections.py): metric names grouped by their prefix,
the loss's and headline's sections first, then alphabetically; which sections start open; which
charts a section draws; and the Overview's curves from the person's pins."""

from __future__ import annotations

from app.panels.sections import (
    FIRST_CHARTS,
    MANY_CHARTS,
    OPEN_WHEN_MANY,
    UNPREFIXED,
    Section,
    drawn,
    drawn_keys,
    opened,
    overview_keys,
    section_of,
    sections,
)


def test_names_are_grouped_by_the_prefix_before_the_first_slash() -> None:
    assert section_of("train/loss") == "train"
    assert section_of("val/acc/top1") == "val"
    assert section_of("loss") == section_of("/odd") == UNPREFIXED


def test_headline_sections_come_first_then_alphabetically() -> None:
    keys = ["sys/gpu_util", "lr", "val/loss", "zeta/x", "train/loss", "alpha/grad", "epoch", "loss",
            "train/layer10", "train/layer2"]
    found = sections(keys)
    assert [s.id for s in found] == [UNPREFIXED, "train", "val", "alpha", "sys", "zeta"]
    assert found[0] == Section(UNPREFIXED, ("loss", "lr"))  # the Run page's order first; epoch is no chart
    assert found[1].keys == ("train/layer2", "train/layer10", "train/loss")  # layer2 before layer10
    assert found[0].label == "Charts · 2 charts" and found[-1].label == "zeta · 1 chart"


def test_a_run_without_a_loss_keeps_every_section_alphabetical() -> None:
    assert [s.id for s in sections(["b/x", "a/y", "c"])] == [UNPREFIXED, "a", "b"]


def test_every_section_opens_unless_the_run_has_many_charts() -> None:
    few = sections(["loss", "train/a", "val/b", "sys/c"])
    assert all(opened(few, {}).values())
    many = sections([f"group{g}/m{i}" for g in range(10) for i in range(MANY_CHARTS // 5)])
    default = opened(many, {})
    assert [s.id for s in many if default[s.id]] == [s.id for s in many[:OPEN_WHEN_MANY]]
    chosen = opened(many, {many[0].id: False, many[5].id: True})  # the person's choice wins
    assert not chosen[many[0].id] and chosen[many[5].id] and chosen[many[1].id]


def test_a_section_draws_its_first_charts_the_full_width_one_alone_or_nothing_while_closed() -> None:
    big = Section("train", tuple(f"train/m{i}" for i in range(FIRST_CHARTS + 5)))
    assert drawn(big, True, None, show_all=False) == big.keys[:FIRST_CHARTS]
    assert drawn(big, True, None, show_all=True) == big.keys
    assert drawn(big, True, "train/m3", show_all=False) == ("train/m3",)
    assert drawn(big, True, "val/other", show_all=False) == big.keys[:FIRST_CHARTS]  # another section's
    assert drawn(big, False, "train/m3", show_all=True) == ()


def test_200_metric_names_draw_and_fetch_a_few_charts() -> None:
    found = sections([f"block{b}/metric{i}" for b in range(10) for i in range(20)])
    keys = drawn_keys(found, opened(found, {}), None, shown_all=set())
    assert len(keys) == OPEN_WHEN_MANY * FIRST_CHARTS
    assert keys[:2] == ["block0/metric0", "block0/metric1"]


def test_the_overview_shows_the_pins_the_run_has_else_the_loss_and_headline() -> None:
    keys = ["loss", "eval_accuracy", "lr", "samples_per_s"]
    assert overview_keys(keys, None) == ["loss", "eval_accuracy"]
    assert overview_keys(keys, ("samples_per_s", "lr", "val/x")) == ["lr", "samples_per_s"]
    assert overview_keys(keys, ("val/x",)) == ["loss", "eval_accuracy"]  # none of the pins here: the defaults
    assert overview_keys(keys, ()) == []  # every curve unpinned: none, not the defaults back
    assert overview_keys(["b", "a", "c"], None) == ["b", "a"]  # a script naming neither: its first two
    assert overview_keys(["train/loss", "val/acc"], None) == ["train/loss"]
