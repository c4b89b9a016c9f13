"""Today's flags as a recipe: ``--filters``, ``--annotate``, ``--languages``,
``--url-blocklist``, ``--pii`` and the cleaning flags build the default recipe, in FineWeb's
order: block-list, extraction (web inputs), cleaner, language ID, the rule sets (annotated
ones first, then the filters), then ``--decontaminate`` (on the text the others leave, before
PII masking rewrites it), PII masking. With no web flag and no web input the recipe is
the cleaner alone, and its shards are byte-identical to those of the fixed pipeline before
recipes."""

from __future__ import annotations

import json
from typing import Any

from pipeline.cleaning import CleaningConfig
from pipeline.steps.cleaning import Clean
from pipeline.steps.recipe import Recipe, StepSpec, spec
from pipeline.web.steps import parse_filters


def parse_rule_sets(text: str, flag: str = "--filters") -> tuple[str, ...]:
    """``"gopher,c4"`` -> the rule sets named, in their running order."""
    return parse_filters(text, f"rule set in {flag}")


def shorthand_recipe(cleaning: CleaningConfig, *, web: bool, filters: tuple[str, ...] = (),
                     annotate: tuple[str, ...] = (),
                     filter_options: tuple[tuple[str, Any], ...] = (),
                     languages: tuple[str, ...] = (), min_lang_score: float = 0.65,
                     identify: bool = False, url_blocklist: str | None = None,
                     pii: bool = False, metadata: bool = False,
                     decontaminate: dict[str, Any] | None = None,
                     decontaminate_mode: str = "filter") -> Recipe:
    """The recipe the flags describe (see the module's docstring)."""
    both = sorted(set(filters) & set(annotate))
    if both:
        raise ValueError(f"--filters and --annotate both name {both[0]}: a rule set either "
                         "drops documents or measures them")
    steps: list[StepSpec] = []
    if url_blocklist:
        steps.append(spec("url_blocklist", path=url_blocklist))
    if web:
        steps.append(spec("extract"))
    steps.append(spec("clean", **Clean.from_config(cleaning)))
    if languages or identify:
        steps.append(spec("langid", languages=list(languages), min_score=min_lang_score))
    for mode, names in (("annotate", annotate), ("filter", filters)):
        for name in names:
            prefix = name + "."
            options = {k[len(prefix):]: v for k, v in filter_options if k.startswith(prefix)}
            steps.append(spec(name, name, mode, **_jsonable(options)))
    if decontaminate is not None:
        steps.append(spec("decontaminate", mode=decontaminate_mode, **decontaminate))
    if pii:
        steps.append(spec("pii"))
    return Recipe(tuple(steps), metadata=metadata)


def _jsonable(options: dict[str, Any]) -> dict[str, Any]:
    """Options as JSON values (tuples of pairs, as the rule sets' n-gram thresholds are
    typed, become lists; the step types them again)."""
    return json.loads(json.dumps(options))


def recipe_of(cleaning: CleaningConfig, web: Any = None) -> Recipe:
    """The recipe of a cleaning config and a :class:`pipeline.web.WebConfig` (or ``None``):
    what the fixed pipeline ran before recipes, for callers that still describe a run so."""
    if web is None:
        return shorthand_recipe(cleaning, web=False)
    return shorthand_recipe(cleaning, web=True, filters=web.filters,
                            filter_options=web.filter_options, languages=web.languages,
                            min_lang_score=web.min_lang_score, identify=web.identify,
                            url_blocklist=web.url_blocklist, pii=web.pii,
                            metadata=web.metadata)
