"""The New run form's description (app/form.py), checked without a browser.

Everything on the form comes from the config model: which fields, which widget, the bounds, the
help, the sections and which fields a workload kind shows. A field added to the model appears
with no UI edit, and its widget value goes back through the usual validation.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, ClassVar, Literal

import pytest
from pydantic import BaseModel, BeforeValidator, Discriminator, Field

from app.form import KIND_KEY, form_fields, form_sections, humanize, workload_kinds
from app.form_values import values_to_config, widget_values
from db.vocabulary.config import (
    SEED_MAX,
    WORKLOADS,
    GptCharWorkload,
    MlpDigitsWorkload,
    RunConfig,
    TrainConfig,
    kinds_reading,
    kinds_with_field,
)
from db.vocabulary.config.sweep import SweepConfig
from db.vocabulary.config.workload import _kind_and_own_fields
from tests.unit.app.form_specs import by_key

KINDS = tuple(kind for model in WORKLOADS for kind in typing.get_args(model.model_fields["kind"].annotation))


def leaf_fields(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every leaf field of ``model`` by dotted TOML key, walked independently of app/form.py; not
    those of ``[sweep]``, which the New sweep form draws (``own_form``)."""
    found: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("own_form"):
            continue
        ann = field.annotation
        sections = [t for t in (ann, *typing.get_args(ann)) if isinstance(t, type) and issubclass(t, BaseModel)]
        for section in sections:  # a section, or each model of a union (the [workload] kinds), in order
            found |= {k: v for k, v in leaf_fields(section, f"{prefix}{name}.").items() if k not in found}
        if not sections:
            found[f"{prefix}{field.alias or name}"] = field
    return found


def kinds_of(key: str, field: Any) -> tuple[str, ...]:
    """The workload kinds a field applies to: a workload field's, the kinds whose model declares
    it; another section's, the kinds whose model does not ignore it (default: every kind)."""
    section, _, name = key.rpartition(".")
    if section == "workload" and name != "kind":
        return tuple(kinds_with_field(name))
    kinds = kinds_reading(key)
    return KINDS if kinds is None else tuple(kinds)


# -- which fields -----------------------------------------------------------------------------


def test_the_kinds_are_the_models() -> None:
    assert workload_kinds() == KINDS == ("mlp-digits", "gpt-char", "script")


@pytest.mark.parametrize("kind", KINDS)
def test_every_config_field_appears_for_its_kind_and_no_other(kind: str) -> None:
    expected = [key for key, field in leaf_fields(RunConfig).items() if kind in kinds_of(key, field)]
    assert [spec.key for spec in form_fields(RunConfig, kind)] == expected


def test_without_a_kind_every_field_appears_once() -> None:
    keys = [spec.key for spec in form_fields(RunConfig)]
    assert keys == list(leaf_fields(RunConfig)) and len(keys) == len(set(keys)) > 40


def test_each_kind_shows_its_own_workload_fields() -> None:
    def shown(kind: str) -> set[str]:
        return {spec.key for spec in form_fields(RunConfig, kind)}

    gpt = {"workload.text", "workload.n_layer", "workload.n_head", "workload.n_embd", "workload.block_size",
           "train.activation_checkpointing", "parallel.strategy"}
    script = {"workload.script", "workload.args"}
    assert gpt <= shown("gpt-char") and not (shown("gpt-char") & ({"workload.hidden"} | script))
    assert "workload.hidden" in shown("mlp-digits") and not (shown("mlp-digits") & (gpt | script))
    assert script <= shown("script") and not (shown("script") & (gpt | {"workload.hidden"}))
    # What the old hand-written form lacked, for every kind (the training loop's for the built-in ones):
    for kind in KINDS:
        assert {"supervision.startup_timeout_s", "retry.backoff_max_s", "checkpoint.keep_last"} <= shown(kind)
        train = {"train.precision", "train.compile", "train.grad_accum", "train.weight_decay"}
        assert train <= shown(kind) if kind != "script" else not (shown(kind) & train)
    # A script has its own training loop: the form has no [train] for it (the config refuses it too).
    assert not any(key.startswith("train.") for key in shown("script"))


def test_sections_are_the_sub_models_common_ones_open() -> None:
    sections = form_sections(RunConfig, "gpt-char")
    assert [s.name for s in sections] == ["", "workload", "launch", "train", "parallel", "checkpoint", "retry",
                                          "supervision", "slurm", "alerts"]
    assert {s.name for s in sections if s.common} == {"", "workload", "launch", "train", "parallel"}
    train = next(s for s in sections if s.name == "train")
    assert (train.title, train.help) == ("Train", TrainConfig.__doc__)
    # A section with no field for the kind is left out.
    assert "parallel" not in [s.name for s in form_sections(RunConfig, "mlp-digits")]


def test_a_section_with_a_form_of_its_own_is_drawn_from_its_model_under_its_key() -> None:
    """[sweep]: left out of New run's form, the New sweep form's from SweepConfig, each key under
    ``sweep.``, the optional [sweep.early_stop] marked so, the space (its own box) left out."""
    assert not [spec for spec in form_fields(RunConfig) if spec.key.startswith("sweep")]
    sections = form_sections(SweepConfig, prefix="sweep", title="Sweep")
    assert [(s.name, s.title, s.common, s.optional) for s in sections] == [
        ("sweep", "Sweep", True, False), ("sweep.early_stop", "Early stop", False, True),
        ("sweep.budget", "Budget", False, False)]
    specs = by_key(form_fields(SweepConfig, prefix="sweep"))
    assert "sweep.space" not in specs
    assert specs["sweep.searcher"].options == ("grid", "random", "tpe")
    assert (specs["sweep.early_stop.reduction"].min_value, specs["sweep.early_stop.reduction"].section) == (
        2, "sweep.early_stop")
    assert specs["sweep.budget.gpu_hours"].label == "GPU-hours"


# -- how each field is shown ------------------------------------------------------------------


def test_widgets_bounds_labels_and_help_come_from_the_model() -> None:
    fields = leaf_fields(RunConfig)
    defaults = RunConfig().as_dict()
    # Every kind's workload defaults (a config holds its own kind's only), the default kind's kind.
    defaults["workload"] = {k: v for model in reversed(WORKLOADS)
                            for k, v in model.model_construct().model_dump(mode="json").items()}
    specs = by_key(form_fields(RunConfig))
    for key, spec in specs.items():
        field = fields[key]
        section, _, name = key.rpartition(".")
        assert spec.label == (field.title or humanize(name)), key
        assert spec.help.startswith(" ".join(field.description.split())), key
        assert spec.default == (defaults[section][name] if section else defaults[name]), key
    assert (specs["train.max_steps"].widget, specs["train.max_steps"].min_value) == ("int", 1)
    assert specs["train.max_steps"].max_value is None  # 2**63 - 1: beyond a browser's exact numbers
    assert (specs["train.seed"].min_value, specs["train.seed"].max_value) == (0, SEED_MAX)
    assert (specs["workload.n_layer"].min_value, specs["workload.n_layer"].max_value) == (1, 96)
    assert (specs["workload.n_layer"].label, specs["workload.n_layer"].kinds) == ("Transformer blocks (n_layer)",
                                                                                  ("gpt-char",))
    lr = specs["train.lr"]
    assert (lr.widget, lr.label, lr.min_value, lr.default) == ("float", "Learning rate", None, 0.001)
    assert "Allowed: > 0." in lr.help and "Default: `0.001`." in lr.help  # gt on a float: the help says it
    assert specs["train.weight_decay"].min_value == 0.0 and isinstance(specs["train.weight_decay"].min_value, float)
    assert specs["launch.nproc_per_node"].label == "Ranks per node (nproc_per_node)"
    assert (specs["train.precision"].widget, specs["train.precision"].options) == ("choice", ("fp32", "bf16", "fp16"))
    assert specs[KIND_KEY].options == KINDS
    assert specs["train.compile"].widget == "bool"
    assert specs["checkpoint.async"].label == "Write in the background (async)"  # the TOML key, not async_save
    assert (specs["name"].widget, specs["name"].max_chars, specs["name"].optional) == ("text", 100, False)
    assert (specs["workload.script"].widget, specs["workload.script"].optional) == ("text", True)
    assert (specs["tags"].widget, specs["tags"].list_syntax) == ("list", "comma")
    assert (specs["workload.args"].widget, specs["workload.args"].list_syntax) == ("list", "shell")
    assert specs["supervision.grace_s"].label == "Grace (s)"


def test_humanize() -> None:
    assert humanize("max_steps") == "Max steps"
    assert humanize("hang_timeout_s") == "Hang timeout (s)"
    assert humanize("name") == "Name"


# -- a new field needs no UI edit --------------------------------------------------------------


class LongerTrain(TrainConfig):
    label_smoothing: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    """Share of the target probability spread over the other classes."""

    dropout_layers: int = Field(default=0, ge=0, le=12)
    """gpt-char: blocks with dropout."""


class LongerMlp(MlpDigitsWorkload):
    ignores: ClassVar[tuple[str, ...]] = (*MlpDigitsWorkload.ignores, "train.dropout_layers")  # no blocks


class LongerWorkload(GptCharWorkload):
    mode: Literal["fast", "careful"] = "fast"
    """How to train."""


class LongerRunConfig(RunConfig):
    """A RunConfig with fields the form has never heard of."""

    owner: str | None = None
    """Who started the run."""

    # As WorkloadConfig is built: the other kind's keys at their defaults dropped when read.
    workload: Annotated[LongerMlp | LongerWorkload, Discriminator("kind"), BeforeValidator(_kind_and_own_fields)] = (
        Field(default=LongerWorkload(), json_schema_extra={"common": True}))
    train: LongerTrain = Field(default=LongerTrain(), json_schema_extra={"common": True})


def test_a_field_added_to_the_model_appears_with_its_widget_bounds_and_help() -> None:
    specs = by_key(form_fields(LongerRunConfig, "gpt-char"))
    smoothing = specs["train.label_smoothing"]
    assert (smoothing.label, smoothing.widget, smoothing.min_value, smoothing.max_value, smoothing.default) == (
        "Label smoothing", "float", 0.0, 1.0, 0.0)
    assert smoothing.help.startswith("Share of the target probability spread over the other classes.")
    assert "Allowed: ≥ 0, ≤ 1." in smoothing.help
    assert (specs["train.dropout_layers"].widget, specs["train.dropout_layers"].max_value) == ("int", 12)
    assert specs["workload.mode"].options == ("fast", "careful")
    assert (specs["owner"].widget, specs["owner"].optional) == ("text", True)
    # The kind-specific one only for the kinds whose workload class reads it.
    assert "train.dropout_layers" not in by_key(form_fields(LongerRunConfig, "mlp-digits"))
    assert "train.label_smoothing" in by_key(form_fields(LongerRunConfig, "mlp-digits"))


def test_a_field_added_to_the_model_goes_through_values_to_config() -> None:
    values, notes = widget_values(LongerRunConfig().as_dict(), form_fields(LongerRunConfig, "gpt-char"))
    assert notes == []
    values |= {KIND_KEY: "gpt-char", "train.label_smoothing": 0.1, "workload.mode": "careful", "owner": " ann "}
    config = LongerRunConfig.model_validate(values_to_config(values, LongerRunConfig))
    assert isinstance(config.workload, LongerWorkload)
    assert (config.train.label_smoothing, config.workload.mode, config.owner) == (0.1, "careful", "ann")


def test_a_type_without_a_widget_names_the_field() -> None:
    class Odd(RunConfig):
        limits: dict[str, int] = Field(default_factory=dict)
        """Per-key limits."""

    with pytest.raises(TypeError, match=r"^limits: the New run form has no widget"):
        form_fields(Odd)
