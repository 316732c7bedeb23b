"""The New run form, described from the run config model; no Streamlit here.

The page (app/views/new_run.py) loops over what :func:`form_sections` returns and draws one
widget per field, so a field added to :class:`~db.vocabulary.config.RunConfig` shows up on the form
with no UI edit. Everything comes from the model:

- sections: one per sub-model of RunConfig (its class docstring says what it holds), plus the
  top-level fields; a section marked ``json_schema_extra={"common": True}`` is shown open;
- widgets: from the annotation (int, float, bool, Literal or Enum, str, a tuple or list of str);
- bounds: from the Field constraints (ge, gt, le, lt, max_length);
- help: from the field docstrings (the same text as docs/CONFIG.md);
- labels: from the field's ``title``, else its key in words;
- kinds: a section that is a union of models chosen by their ``kind`` ([workload]: one model
  per workload kind) shows each model's fields for its kind only, and one ``kind`` choice over
  them all; a field of another section is shown only for the kinds whose workload class reads it
  (the union's ``ignores``, :func:`~db.vocabulary.config.kinds_reading`). A field takes its
  default for the kinds it is not shown for.

Widget values go back to a plain nested dict with :func:`~app.form_values.values_to_config`
(app/form_values.py); it converts text (lists, empty optional strings) but never coerces numbers,
so the usual validation (``orchestrator.submission.validate``) judges exactly what was entered.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from db.vocabulary.config import WORKLOADS, RunConfig, Workload, kinds_reading

WidgetKind = Literal["int", "float", "bool", "choice", "text", "list", "table"]

# The field whose value chooses the kind-specific fields; the page draws it before the others.
KIND_KEY = "workload.kind"
# Chosen outside the form like the kind: the [slurm] section is shown only for a Slurm run.
EXECUTOR_KEY = "launch.executor"
SLURM_SECTION = "slurm"

# A browser's numbers are doubles: integers beyond 2**53 - 1 are not exact there, and Streamlit
# refuses such bounds. Larger bounds (the 64-bit storage limit) are left to the validation.
JS_MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True)
class FieldSpec:
    """One field of the form, everything a widget needs.

    Attributes:
        key: The dotted TOML path (``"train.lr"``, ``"checkpoint.async"``); also the widget's key
            and the name that validation problems start with.
        section: The sub-model the field belongs to (``""`` for top-level fields).
        label: What the widget is labelled.
        widget: Which widget shows it.
        default: The model's default, as plain data (a list for a tuple).
        help: The field's docstring, its bounds and its default, as Markdown.
        options: The allowed values of a ``choice``.
        min_value: The inclusive lower bound a number widget can enforce, or None.
        max_value: The inclusive upper bound a number widget can enforce, or None.
        max_chars: The longest text allowed, or None.
        optional: Whether None is allowed (an empty text stands for it).
        list_syntax: How a list is written in its text box: ``comma`` separated or ``shell`` words.
        kinds: The workload kinds the field applies to; None for all.
    """

    key: str
    section: str
    label: str
    widget: WidgetKind
    default: Any
    help: str
    options: tuple[Any, ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    max_chars: int | None = None
    optional: bool = False
    list_syntax: Literal["comma", "shell"] = "comma"
    kinds: tuple[str, ...] | None = None

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))

    @property
    def step(self) -> float | None:
        """The +/- step of a number widget: 1 for integers, the order of magnitude of the
        default for floats (0.1 when the default is 0)."""
        if self.widget == "int":
            return 1
        if self.widget == "float":
            return 10.0 ** math.floor(math.log10(self.default)) if self.default > 0 else 0.1
        return None

    @property
    def number_format(self) -> str | None:
        """printf format of a float widget: %g shows 0.0003 and 300 as written (Streamlit's
        default, %0.2f, would show a learning rate as 0.00)."""
        return "%g" if self.widget == "float" else None

    @property
    def placeholder(self) -> str | None:
        """What an empty list box shows: the syntax it expects."""
        if self.widget == "table":
            return "one per line: NAME = value"
        if self.widget != "list":
            return None
        return "as in a shell: --epochs 5 --name 'a b'" if self.list_syntax == "shell" else "comma separated: a, b"

    def applies_to(self, kind: str | None) -> bool:
        """Whether the field is shown for workload ``kind`` (None: any kind)."""
        return kind is None or self.kinds is None or kind in self.kinds


@dataclass(frozen=True)
class SectionSpec:
    """One section of the form: a sub-model of the config, or the top-level fields.

    Attributes:
        name: The TOML table (``"train"``), ``""`` for the top-level fields.
        title: The section's heading.
        help: The sub-model's docstring.
        common: Whether the section is shown open (else folded in an expander).
        fields: Its fields, in declaration order.
        optional: Whether the section may be left out (``X | None``: ``[sweep.early_stop]``).
    """

    name: str
    title: str
    help: str
    common: bool
    fields: tuple[FieldSpec, ...]
    optional: bool = False


def humanize(key: str) -> str:
    """A key in words: ``max_steps`` -> ``Max steps``, ``grace_s`` -> ``Grace (s)``."""
    unit = ""
    if key.endswith("_s"):  # the config's suffix for seconds
        key, unit = key[:-2], " (s)"
    words = key.replace("_", " ").strip()
    return (words[:1].upper() + words[1:] + unit) if words else key


def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _models(field: FieldInfo) -> list[type[BaseModel]]:
    """The models a section field holds: its own type, or every member of a union of models
    (the [workload] kinds; None aside, for a section that may be left out); empty for a field
    that is no section."""
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = [m for m in typing.get_args(annotation) if m is not type(None)] if union else []
    if members and all(isinstance(m, type) and issubclass(m, BaseModel) for m in members):
        return list(members)
    return []


def _is_section(field: FieldInfo) -> bool:
    return bool(_models(field))


def _plain(value: Any) -> Any:
    """A default as the plain data a TOML file or ``RunConfig.as_dict()`` holds."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _widget_of(key: str, annotation: Any) -> tuple[WidgetKind, tuple[Any, ...], bool]:
    """The widget for an annotation, the choices of a ``choice`` and whether None is allowed.

    Raises:
        TypeError: naming the field, for a type the form has no widget for (a newcomer learns it
            from the form's tests, not from a user).
    """
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            optional = True
            annotation, origin = args[0], typing.get_origin(args[0])
    if origin is Literal:
        return "choice", tuple(typing.get_args(annotation)), optional
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "choice", tuple(member.value for member in annotation), optional
    if annotation is bool:  # before int: bool is an int to Python
        return "bool", (), optional
    if annotation is int:
        return "int", (), optional
    if annotation is float:
        return "float", (), optional
    if annotation is str:
        return "text", (), optional
    if origin in (tuple, list) and all(a in (str, Ellipsis) for a in typing.get_args(annotation)):
        return "list", (), optional
    if origin is dict and typing.get_args(annotation) == (str, str):
        return "table", (), optional
    raise TypeError(f"{key}: the New run form has no widget for a field of type {annotation!r}; "
                    "use int, float, bool, str, a Literal, an Enum or a tuple of str, or add a widget in app/form.py")


def _bounds(widget: WidgetKind, field: FieldInfo) -> tuple[float | None, float | None, list[str]]:
    """The inclusive bounds a number widget can enforce, and every constraint in words."""
    low: float | None = None
    high: float | None = None
    words: list[str] = []
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Ge):
            low = typing.cast(float, meta.ge)
            words.append(f"≥ {low}")
        elif isinstance(meta, annotated_types.Gt):
            # An integer above n is at least n + 1; a float above 0 has no inclusive bound a
            # widget could take, so the validation says it.
            above = typing.cast(float, meta.gt)
            low = above + 1 if widget == "int" else None
            words.append(f"> {above}")
        elif isinstance(meta, annotated_types.Le):
            high = typing.cast(float, meta.le)
            if abs(high) <= JS_MAX_SAFE_INTEGER:  # the 64-bit storage limit says nothing to a person
                words.append(f"≤ {high}")
        elif isinstance(meta, annotated_types.Lt):
            below = typing.cast(float, meta.lt)
            high = below - 1 if widget == "int" else None
            words.append(f"< {below}")
        elif isinstance(meta, annotated_types.MinLen):
            words.append(f"at least {meta.min_length} characters" if meta.min_length > 1 else "not empty")
        elif isinstance(meta, annotated_types.MaxLen):
            words.append(f"at most {meta.max_length} characters")
        elif getattr(meta, "pattern", None):
            words.append(f"matches `{meta.pattern}`")

    def usable(bound: float | None) -> float | None:
        if bound is None or abs(bound) > JS_MAX_SAFE_INTEGER:
            return None
        return float(bound) if widget == "float" else int(bound)  # Streamlit wants one number type

    if widget not in ("int", "float"):
        return None, None, words
    return usable(low), usable(high), words


def _max_length(field: FieldInfo) -> int | None:
    return next((m.max_length for m in field.metadata if isinstance(m, annotated_types.MaxLen)), None)


def _help(field: FieldInfo, constraints: list[str], default: Any) -> str:
    text = " ".join((field.description or "").split())  # the docstrings are wrapped at 100 columns
    facts = []
    if constraints:
        facts.append("Allowed: " + ", ".join(constraints) + ".")
    shown = "none" if default is None else "empty" if default == [] else f"`{json.dumps(default)}`"  # as in TOML
    facts.append(f"Default: {shown}.")
    return "\n\n".join(part for part in (text, " ".join(facts)) if part)


def field_spec(key: str, section: str, field: FieldInfo, workloads: Sequence[type[Workload]] = WORKLOADS
               ) -> FieldSpec:
    """The form's description of one config field.

    Args:
        key: The field's dotted TOML path.
        section: The sub-model it belongs to, ``""`` at the top level.
        field: The pydantic field.
        workloads: The workload kinds' classes, which say which of them read the field.

    Raises:
        TypeError: for a type the form has no widget for.
    """
    widget, options, optional = _widget_of(key, field.annotation)
    default = _plain(field.get_default(call_default_factory=True))
    low, high, constraints = _bounds(widget, field)
    extra = _extra(field)
    kinds = kinds_reading(key, workloads)
    return FieldSpec(
        key=key, section=section, label=field.title or humanize(key.rsplit(".", 1)[-1]), widget=widget,
        default=default, help=_help(field, constraints, default), options=options, min_value=low, max_value=high,
        max_chars=_max_length(field) if widget == "text" else None, optional=optional,
        list_syntax="shell" if extra.get("list_syntax") == "shell" else "comma",
        kinds=tuple(kinds) if kinds is not None else None,
    )


def _fields_of(model: type[BaseModel], section: str, workloads: Sequence[type[Workload]] = WORKLOADS
               ) -> list[FieldSpec]:
    prefix = f"{section}." if section else ""
    return [field_spec(f"{prefix}{field.alias or name}", section, field, workloads)
            for name, field in model.model_fields.items() if not _is_section(field) and not _own_form(field)]


def _own_form(field: FieldInfo) -> bool:
    """A section with a form of its own (``json_schema_extra={"own_form": True}``: ``[sweep]``,
    the New sweep form's), which the New run form leaves out."""
    return bool(_extra(field).get("own_form"))


def _kind_field(members: list[type[BaseModel]], default: Any) -> FieldInfo:
    """One ``kind`` choice over the members of a union: every member's kinds, the section's
    default kind, the first member's title and every member's description of its kind."""
    infos = [member.model_fields["kind"] for member in members]
    kinds = tuple(kind for info in infos for kind in typing.get_args(info.annotation))
    return FieldInfo(annotation=typing.cast(Any, Literal)[kinds], default=getattr(default, "kind", kinds[0]),
                     title=infos[0].title, description=" ".join(" ".join((i.description or "").split()) for i in infos))


def _fields_of_union(members: list[type[BaseModel]], section: str, default: Any) -> list[FieldSpec]:
    """The fields of a section that is one model per kind: the kind first, then each model's
    own fields, shown for its kind only (a field several models declare, for each of them)."""
    specs = {"kind": field_spec(f"{section}.kind", section, _kind_field(members, default))}
    for member in members:
        own = typing.get_args(member.model_fields["kind"].annotation)
        for spec in _fields_of(member, section):
            name = spec.key.rsplit(".", 1)[-1]
            if name == "kind":
                continue
            before = specs.get(name)
            specs[name] = dataclasses.replace(spec, kinds=(*(before.kinds or ()), *own) if before else own)
    return list(specs.values())


def _workloads(model: type[BaseModel]) -> list[type[Workload]]:
    """The workload kinds' classes of a run config model: the members of its [workload] union."""
    field = model.model_fields.get("workload")
    members = _models(field) if field is not None else []
    return [m for m in members if issubclass(m, Workload)] or list(WORKLOADS)


def _section_doc(members: list[type[BaseModel]]) -> str:
    """What a section holds: its model's docstring, or that of the class every member of a
    union derives from."""
    common = next(c for c in members[0].__mro__ if all(issubclass(m, c) for m in members))
    return " ".join((common.__doc__ or "").split())


def form_sections(model: type[BaseModel] = RunConfig, kind: str | None = None, prefix: str = "",
                  title: str = "Run") -> list[SectionSpec]:
    """The form for workload ``kind``: the top-level fields first, then one section per sub-model
    (not those with a form of their own).

    Args:
        model: The run config model (a RunConfig, or one built like it), or a section with a form
            of its own (``SweepConfig``, with ``prefix="sweep"``).
        kind: The workload kind; only its fields are listed (None: every field). A section
            left without fields is left out.
        prefix: The TOML table ``model`` is read from (``""``: the top level); it starts every key.
        title: The top-level fields' heading.

    Raises:
        TypeError: for a field type the form has no widget for.
    """
    workloads = _workloads(model)
    sections = [SectionSpec(name=prefix, title=title, help=(model.__doc__ or "").strip(), common=True,
                            fields=tuple(_fields_of(model, prefix, workloads)))]
    for name, field in model.model_fields.items():
        if (members := _models(field)) and not _own_form(field):
            key = f"{prefix}.{name}" if prefix else name
            fields = (_fields_of(members[0], key, workloads) if len(members) == 1
                      else _fields_of_union(members, key, field.get_default(call_default_factory=True)))
            sections.append(SectionSpec(
                name=key, title=field.title or humanize(name), help=_section_doc(members),
                common=bool(_extra(field).get("common")), fields=tuple(fields), optional=not field.is_required()
                and field.get_default(call_default_factory=True) is None,
            ))
    shown = [dataclasses.replace(s, fields=tuple(f for f in s.fields if f.applies_to(kind))) for s in sections]
    return [s for s in shown if s.fields]


def form_fields(model: type[BaseModel] = RunConfig, kind: str | None = None, prefix: str = "") -> list[FieldSpec]:
    """Every field of the form for workload ``kind`` (None: every field), section by section."""
    return [spec for section in form_sections(model, kind, prefix) for spec in section.fields]


def workload_kinds(model: type[BaseModel] = RunConfig) -> tuple[str, ...]:
    """The values ``workload.kind`` may take."""
    return next(spec.options for spec in form_fields(model) if spec.key == KIND_KEY)
