"""The three regimes of Dhingra et al. in one table: how each gives a model the time, how its models are trained and
scored. The SeqIO registry (task and mixture names, the year prefix), inference, the future probes, the study driver
and its report all read it, so the prefix is written here only.

    uniform    one model for every year, the text as it is
    temporal   one model for every year, each input prefixed "year: YYYY " with its year (the document's date, the
               query's year)
    yearly     one model per year, trained on that year's text alone; a query is answered by the expert of its year
               (the closest year's for a year without one)
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

PREFIX_HEAD, PREFIX_TAIL = "year: ", " "  # the Temporal prefix is PREFIX_HEAD + year + PREFIX_TAIL


@dataclasses.dataclass(frozen=True)
class Regime:
    name: str
    label: str  # as tables and figures name it
    year_prefix: bool  # inputs are prefixed with their year
    per_year: bool  # one model per year, queries routed to a year's expert
    description: str

    def model_input(self, year: int, text: str) -> str:
        """`text` as this regime's models read it for `year` (training and evaluation data, inference)."""
        return year_prefix(year) + text if self.year_prefix else text

    def probe_input(self, year: int, text: str) -> str:
        """`text` asked about `year` by the future probes: the prefix where the regime has one, otherwise the year
        in words ("In 2019, ..."), the only way to ask a model without a prefix about a given year."""
        return self.model_input(year, text) if self.year_prefix else f"In {int(year)}, {text}"


def year_prefix(year: int) -> str:
    return f"{PREFIX_HEAD}{int(year)}{PREFIX_TAIL}"


REGIMES: Dict[str, Regime] = {r.name: r for r in (
    Regime("uniform", "Uniform", year_prefix=False, per_year=False,
           description="one model for every year, no time given"),
    Regime("yearly", "Yearly", year_prefix=False, per_year=True,
           description="one model per year, each query routed to its year's expert (the closest year's)"),
    Regime("temporal", "Temporal", year_prefix=True, per_year=False,
           description="one model for every year, inputs prefixed with their year"),
)}
# The regimes whose one model covers every year (their tasks: customnews_ssm_<name>, templama_<name>).
SHARED_MODEL: Tuple[str, ...] = tuple(name for name, r in REGIMES.items() if not r.per_year)
ORDER: Tuple[str, ...] = tuple(REGIMES)  # the order of tables and figures: Uniform, Yearly, Temporal


def regime(name: str) -> Regime:
    if name not in REGIMES:
        raise ValueError(f"regime must be one of {', '.join(REGIMES)}, got {name!r}")
    return REGIMES[name]


def label(name: str) -> str:
    """The table name of a regime (a name outside the table, e.g. a model's, capitalised)."""
    return REGIMES[name].label if name in REGIMES else name.capitalize()
