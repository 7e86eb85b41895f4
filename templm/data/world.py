"""The embedded temporal world: a seeded generator of entities, time-scoped facts, news and TempLAMA queries.

Every verb of templm runs on this world by default, so it shows what the papers study: facts that change at
different rates per relation, years with several valid answers, names and words that only appear from some date on,
bursts of news about one event, and background topics whose mix drifts over the years. How much of the news depends
on its date is set by named mechanisms, each a `WorldConfig` field (docs/data.md's table of the world says where
each default comes from): most sentences are background that does not depend on the date (`background_share`), only a
few per cent name a year (`year_share`), new names (`emerging_share`) and new words (`new_words_per_month`) keep
appearing to the last month, the topic mix drifts (`topic_drift`), and every statement is drawn from many
paraphrases.

`generate_world(config, out_dir)` writes
  news.jsonl                 {"id","date","text"} per document, in date order
  templama/{train,val,test}.jsonl  TempLAMA release format, split by subject (20/10/70); as the paper's, only the
                             subjects whose object changes within the years
  calibration.jsonl          queries of relations with a known change class, with their candidate set
  world.json                 every entity (with its first date), every fact (with its interval), every coined word
  mentions.jsonl             per document: the facts it states, the character spans of the entities it names, and
                             each sentence's span with its source (a relation, "topic:<name>", "burst" or
                             "rising")
  stats.json                 counts by year, share of multi-answer queries, emerging names and words per year
Same config, same bytes. Everything is drawn from one `random.Random(seed)`.
"""

from __future__ import annotations

import calendar
import collections
import dataclasses
import datetime
import json
import os
import random
from typing import Dict, List, Optional, Sequence, Tuple

from templm import paths
from templm.data.records import MAX_DATE, MIN_DATE, Query
from templm.data.templama import (TEMPLATES, Fact, changing_facts, queries_from_facts, split_by_subject,
                                  write_queries)
from templm.errors import require_field_types
from templm.io import NamedWrites
from templm.outputs import build_output_folder, check_output_folder

# Part of the embedded world's cache name (templm.data.task_data.world_cache_dir): raised whenever the same config
# draws other text, so a cache of an older generator is never read as this one's.
WORLD_VERSION = 3


# WorldConfig's fields that are shares, from 0 to 1.
SHARES = ("emerging_share", "background_share", "year_share", "publication_year_share", "later_year_share",
          "new_word_persist_share", "new_word_sentence_share", "burst_sentence_share", "burst_background_share",
          "rising_share")
BURST_NAMES = ("coined", "places")  # WorldConfig.burst_names


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """The world's size and the rates of its mechanisms (docs/data.md, "The embedded temporal world", lists each
    default and where it comes from). `subjects_per_relation` sets every entity pool; `docs_per_month` the news
    volume."""

    seed: int = 0
    start_year: int = 2010
    end_year: int = 2020
    subjects_per_relation: int = 40
    docs_per_month: int = 60
    emerging_share: float = 0.25  # share of objects (and some subjects) that appear only after the first year
    min_sentences: int = 4  # sentences of one document, drawn uniformly from min to max
    max_sentences: int = 10
    background_share: float = 0.6  # sentences that state no fact and no event: the same at any date
    year_share: float = 0.039  # sentences that name a year
    publication_year_share: float = 0.54  # of those, the share naming the year the document is published in
    # Of the year phrases that name another year than the publication's, the share naming a later one (one or two
    # years on: what is scheduled or planned, as Dhingra et al. say articles "discuss events scheduled to happen in the
    # future"); the others name an earlier year. 0: none later.
    later_year_share: float = 0.0
    topic_drift: float = 1.0  # 0: the background topics keep their first-year mix; 1: they reach TOPICS' last mix
    new_words_per_month: float = 2.0  # words coined each month, used from their first date on
    new_word_persist_share: float = 0.25  # coined words that stay in use; the others are used for one month
    new_word_sentence_share: float = 0.02  # sentences that use a coined word
    bursts_per_year: int = 2  # named events that break each year and stay in the news for BURST_DAYS
    burst_sentence_share: float = 0.2  # of the sentences that are not background while an event is news, about it
    # Of the background sentences of a document while an event is in the news, the share about the event instead (on
    # top of the `burst_sentence_share` of the other sentences that are about it): how much of the news is short-lived.
    burst_background_share: float = 0.0
    # Names on the rise: of the background sentences, the share that name in passing an entity (a person, club or
    # company) that emerges within the next `rising_days` days, so that a name is seen rarely before it makes news
    # ("Mind the Gap"'s emerging words include those far less frequent in training than in the test period). 0: none.
    rising_share: float = 0.0
    rising_days: int = 1095
    # What a short-lived event is named: 'coined', a word never seen before it broke (as "Novichok"), or 'places', the
    # name of a city or country of the world, known before it (as a summit or a storm named after where it happens):
    # the event's words are then not new, only far more frequent while it is news ("Mind the Gap", section 3.4).
    burst_names: str = "coined"
    # Persons' given names: 0, each a word of its own; N, drawn from a stock of N given names shared by all persons
    # (as in real news, where a new person's given name is seldom a new word; the family name stays their own).
    given_names: int = 0
    # How much more often a fact is told while it is news (its first CHANGE_DAYS days) than later on: the weight of
    # such a fact among the valid facts a sentence states, the others' 1. Higher, more of the news is about what has
    # just changed and less about what has lasted.
    change_news_weight: float = 8.0

    def __post_init__(self):
        require_field_types(self, "templm.WorldConfig")  # a quoted number or an infinity from gin, named
        if self.end_year < self.start_year:
            raise ValueError(f"end_year {self.end_year} is before start_year {self.start_year}")
        if self.start_year < MIN_DATE.year or self.end_year > MAX_DATE.year:
            raise ValueError(f"years {self.start_year}-{self.end_year}: templm's readers accept dates from "
                             f"{MIN_DATE.year} to {MAX_DATE.year} only, so the world must lie within them")
        if self.subjects_per_relation < 4:
            raise ValueError("subjects_per_relation must be at least 4")
        if self.docs_per_month < 1:
            raise ValueError("docs_per_month must be at least 1")
        if not 1 <= self.min_sentences <= self.max_sentences:
            raise ValueError(f"min_sentences {self.min_sentences} and max_sentences {self.max_sentences}: expected "
                             f"1 <= min_sentences <= max_sentences")
        if self.rising_days < 1:
            raise ValueError(f"rising_days must be at least 1, got {self.rising_days}")
        if self.bursts_per_year < 0:
            raise ValueError(f"bursts_per_year must be at least 0, got {self.bursts_per_year}")
        if self.burst_names not in BURST_NAMES:
            raise ValueError(f"burst_names must be one of {', '.join(map(repr, BURST_NAMES))}, got {self.burst_names!r}")
        if not 1.0 <= self.change_news_weight <= 1000.0:
            raise ValueError(f"change_news_weight must be from 1 to 1000 (1: a fact is told as often when it is news "
                             f"as later), got {self.change_news_weight}")
        if self.given_names < 0:
            raise ValueError(f"given_names must be at least 0 (0: each person's given name a word of its own), got "
                             f"{self.given_names}")
        for name in SHARES:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a share from 0 to 1, got {value}")
        if not 0.0 <= self.topic_drift <= 2.0:
            raise ValueError(f"topic_drift must be from 0 to 2 (2 doubles TOPICS' drift), got {self.topic_drift}")
        if not 0.0 <= self.new_words_per_month <= 1000.0:
            raise ValueError(f"new_words_per_month must be from 0 to 1000, got {self.new_words_per_month}")


@dataclasses.dataclass(frozen=True)
class Entity:
    id: str
    name: str
    type: str
    first_date: datetime.date


@dataclasses.dataclass(frozen=True)
class Word:
    """A coined word: used in the news from `first_date` to `last_date`."""

    word: str
    first_date: datetime.date
    last_date: datetime.date


@dataclasses.dataclass(frozen=True)
class RelationSpec:
    """How one relation behaves: who its subjects and objects are and how long a value lasts."""

    subject_type: str
    object_type: str
    mean_years: float  # mean tenure of one object
    static_share: float  # subjects that keep one object for the whole span
    overlap_share: float  # transitions where the new object starts before the old one ends


RELATIONS: Dict[str, RelationSpec] = {
    "P54": RelationSpec("athlete", "club", 1.8, 0.15, 0.05),
    "P39": RelationSpec("politician", "position", 3.0, 0.15, 0.1),
    "P108": RelationSpec("employee", "company", 3.0, 0.2, 0.05),
    "P102": RelationSpec("politician", "party", 7.0, 0.6, 0.0),
    "P286": RelationSpec("club", "coach", 2.2, 0.1, 0.0),
    "P69": RelationSpec("student", "university", 3.5, 0.3, 0.1),
    "P488": RelationSpec("company", "executive", 4.0, 0.3, 0.0),
    "P6": RelationSpec("place", "politician", 4.5, 0.2, 0.0),
    "P127": RelationSpec("company", "company", 6.0, 0.5, 0.0),
}

# Relations for calibration into the future, by how often their value changes.
CALIBRATION: Dict[str, Tuple[str, str, str, float]] = {
    # relation: (change class, subject type, candidate type, mean years)
    "host_city": ("frequent", "event", "city", 1.0),
    "based_in": ("rare", "company", "country", 8.0),
    "located_in": ("never", "landmark", "city", 0.0),
}
CALIBRATION_TEMPLATES = {
    "host_city": "The <subject> is hosted by _X_.",
    "based_in": "<subject> is based in _X_.",
    "located_in": "<subject> is located in _X_.",
}

# A sentence of the news is a clause from the tables below, then (with probability `year_share`) a phrase naming a
# year, then for statements of facts and events a tail, then a full stop. Clause slots: {s} subject, {o} object,
# {e} event, {c} a city, {k} a country, {w} a coined word, [name] a word drawn from WORDS. No clause names a date,
# and no two entity slots stand side by side (the name detector would read them as one name).
FACT_TEMPLATES: Dict[str, List[str]] = {
    "P54": ["{s} plays for {o}", "{s} scored twice for {o}", "{s}, who plays for {o}, was named man of the match",
            "{o} fielded {s} in the derby", "Supporters of {o} cheered {s} at training",
            "{o} midfielder {s} missed a penalty", "{s} captained {o} in the cup"],
    "P39": ["{s} holds the position of {o}", "{s}, the {o}, spoke to reporters", "As {o}, {s} signed a new decree",
            "{s} defended the budget in the role of {o}", "{s}, serving as {o}, opened a new school",
            "Critics of {s} questioned the work of the {o}"],
    "P108": ["{s} works for {o}", "{s}, an engineer at {o}, presented a new product",
             "{o} said its employee {s} would lead the project", "{s} of {o} gave a talk",
             "{s} spoke for {o} at the trade fair", "Colleagues at {o} praised {s}"],
    "P102": ["{s} is a member of the {o}", "{s} of the {o} addressed a rally", "The {o} praised its member {s}",
             "{s} campaigned for the {o} in the spring", "{s} voted with the {o} on the bill",
             "Leaders of the {o} backed {s}"],
    "P286": ["{o} is the head coach of {s}", "{s} coach {o} praised the squad", "Under head coach {o}, {s} won again",
             "{o}, who coaches {s}, named the team", "{o} blamed the referee after {s} lost",
             "Players of {s} thanked coach {o}"],
    "P69": ["{s} attended {o}", "{s} is a student at {o}", "{s}, enrolled at {o}, won a prize",
            "{o} welcomed its student {s} to a lecture", "{s} studies history at {o}", "Teachers at {o} praised {s}"],
    "P488": ["{o} is the chair of {s}", "{s} chair {o} presented the annual results",
             "{o}, who chairs {s}, met investors",
             "The board of {s}, led by {o}, approved the plan", "{o} told shareholders of {s} to expect growth",
             "Staff of {s} questioned chair {o}"],
    "P6": ["{o} is the head of the government of {s}", "{o}, head of the government of {s}, visited the capital",
           "The government of {s} under {o} passed a law", "{o} led the cabinet of {s}",
           "Voters in {s} judged the record of {o}", "{o} of {s} met foreign ministers"],
    "P127": ["{s} is owned by {o}", "{o}, the owner of {s}, reported strong sales",
             "{s}, a subsidiary of {o}, hired new staff",
             "Shares of {o} rose after {s} grew", "{o} invested more in {s}", "{s} reported to its owner {o}"],
    "host_city": ["The {s} is hosted by {o}", "The {s} opened in {o}", "Crowds gathered in {o} for the {s}",
                  "Hotels in {o} filled up for the {s}"],
    "based_in": ["{s} is based in {o}", "{s}, a firm based in {o}, expanded",
                 "From its offices in {o}, {s} announced a merger", "{s} paid taxes in {o}"],
    "located_in": ["{s} is located in {o}", "Visitors flocked to {s} in {o}", "{s} in {o} reopened after repairs",
                   "Tourists in {o} photographed {s}"],
}
# Reports of a change, in the 60 days after a fact began; their year phrase names the day it began.
CHANGE_TEMPLATES: Dict[str, List[str]] = {
    "P54": ["{s} signed for {o}", "{o} completed the transfer of {s}", "{s} joined {o} on a new contract"],
    "P39": ["{s} took office as {o}", "{s} was appointed {o}", "{s} was sworn in as {o}"],
    "P108": ["{s} joined {o}", "{o} hired {s}"],
    "P102": ["{s} joined the {o}", "{s} switched to the {o}"],
    "P286": ["{s} appointed {o} as head coach", "{o} took charge of {s}"],
    "P69": ["{s} enrolled at {o}", "{s} was admitted to {o}"],
    "P488": ["{s} named {o} as its new chair", "{o} was elected chair of {s}"],
    "P6": ["{o} became head of the government of {s}", "{o} was sworn in as head of the government of {s}"],
    "P127": ["{o} completed its purchase of {s}", "{o} bought {s}"],
    "host_city": ["{o} was chosen to host the {s}"],
    "based_in": ["{s} moved its base to {o}"],
}
BURST_TEMPLATES = [
    "The {e} dominated the headlines", "Officials in {c} discussed the {e}",
    "Analysts said the {e} would have lasting effects", "New details of the {e} emerged",
    "Protesters in {c} marched over the {e}", "The {e} prompted an inquiry in {k}",
]
# Passing mentions of a name before its entity emerges (`rising_share`): {r} the entity.
RISING_TEMPLATES = [
    "{r} was mentioned in a report from {c}", "A profile of {r} appeared in the weekend papers",
    "{r} attended a meeting in {c}", "Few in {c} had heard of {r}",
]
# Tails of statements (facts and events); the empty tail is drawn as often as the rest together.
TAILS = [", officials said", ", reports said", ", according to local media", ", a spokesperson confirmed",
         ", sources said", " this week", " on Monday", " on Saturday", ", it was reported", " once more"]

# Background topics: (share in the first year, share in the last, clauses, clauses with a coined word). The share
# moves linearly between the two, scaled by `topic_drift`.
TOPICS: Dict[str, Tuple[float, float, List[str], List[str]]] = {
    "economy": (0.30, 0.15, ["[firms] in {c} reported [trend] [measures]", "Markets in {c} closed [direction]",
                             "Inflation in {k} [moved] to [count] per cent",
                             "The central bank of {k} kept rates steady",
                             "Prices of [goods] [moved] in {c}", "[firms] in {k} cut [count] hundred jobs"],
                ["Investors in {c} piled into {w}", "Shops in {c} began selling {w}"]),
    "weather": (0.25, 0.15, ["Heavy [precipitation] fell over {c}", "A [spell] gripped {c} for [span]",
                             "Forecasters expect a [season_adjective] [season] in {k}",
                             "Strong winds [damaged] [structures] in {c}", "Flooding closed roads near {c}"],
                ["Scientists in {k} linked {w} to the storms"]),
    "sport": (0.20, 0.20, ["Fans in {c} celebrated a [late] winner", "The marathon in {c} drew a [field] field",
                           "The league announced a [new] schedule", "Tickets for the [fixture] in {c} sold out",
                           "A [crowd] crowd watched the [contest] in {c}"],
              ["Fans in {c} took up {w}"]),
    "technology": (0.10, 0.35, ["Startups in {c} raised [new] funding", "A new [device] went on sale in {c}",
                                "Researchers in {k} unveiled a [lighter] [component]",
                                "Online [activity] grew again in {c}", "Engineers in {c} tested a [lighter] [device]"],
                   ["Sales of {w} devices rose in {c}", "Users in {k} flocked to {w}"]),
    "health": (0.15, 0.15, ["Hospitals in {c} expanded their [wards]", "A [trial] began in {c}",
                            "Doctors urged people to [advice]", "Cases of [illness] [moved] in {k}",
                            "Nurses in {c} called for [demand]"],
               ["Doctors in {c} warned about {w}"]),
}
WORDS: Dict[str, List[str]] = {
    "firms": ["Exporters", "Retailers", "Builders", "Farmers", "Manufacturers", "Lenders", "Carmakers", "Airlines"],
    "trend": ["rising", "falling", "steady", "record", "weaker", "stronger"],
    "measures": ["orders", "sales", "profits", "costs", "exports", "margins"],
    "direction": ["higher", "lower", "flat", "mixed"],
    "moved": ["rose", "fell", "climbed", "eased", "edged up", "slipped"],
    "count": ["two", "three", "four", "five", "six", "seven", "eight", "nine"],
    "goods": ["bread", "fuel", "housing", "coffee", "steel", "cotton", "electricity"],
    "precipitation": ["rain", "snow", "hail", "sleet"],
    "spell": ["heatwave", "cold snap", "drought", "thick fog"],
    "span": ["a week", "three days", "the weekend", "ten days"],
    "season_adjective": ["mild", "wet", "dry", "harsh", "cold"],
    "season": ["winter", "summer", "spring", "autumn"],
    "damaged": ["damaged", "toppled", "flattened"],
    "structures": ["roofs", "trees", "fences", "power lines"],
    "late": ["late", "dramatic", "stoppage-time", "first-half"],
    "field": ["record", "strong", "thin", "young"],
    "new": ["new", "fresh", "revised", "larger"],
    "fixture": ["final", "semi-final", "derby", "opener"],
    "crowd": ["large", "small", "noisy", "record"],
    "contest": ["match", "race", "tournament", "game"],
    "device": ["phone", "tablet", "laptop", "camera", "watch", "drone"],
    "component": ["chip", "battery", "network", "sensor"],
    "lighter": ["cheaper", "lighter", "smaller", "faster"],
    "activity": ["shopping", "banking", "streaming", "gaming"],
    "wards": ["wards", "clinics", "emergency rooms", "staff"],
    "trial": ["vaccine trial", "drug trial", "screening programme"],
    "advice": ["exercise more", "sleep more", "eat less salt", "stop smoking"],
    "illness": ["flu", "measles", "asthma", "malaria"],
    "demand": ["higher pay", "more staff", "new equipment"],
}
RISING_TYPES = ("athlete", "politician", "employee", "student", "coach", "executive", "club", "company")
CHANGE_DAYS = 60  # a fact that began this many days ago or fewer is news: reported often, sometimes as a change
BURST_DAYS = 90  # an event is in the news for this many days after it broke

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_CODAS = ["", "", "n", "r", "l", "s", "k"]


class _Names:
    """Pronounceable, unique names made of consonant-vowel syllables."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set = set()

    def word(self, syllables: Tuple[int, int] = (2, 3)) -> str:
        rng = self.rng
        while True:
            n = rng.randint(*syllables)
            w = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(n)) + rng.choice(_CODAS)
            w = w.capitalize()
            if w not in self.used:
                self.used.add(w)
                return w

    def unique(self, make) -> str:
        for _ in range(10_000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise ValueError("the world is too small to give every entity a unique name: raise subjects_per_relation")


def _date_in_year(rng: random.Random, year: int) -> datetime.date:
    return datetime.date(year, 1, 1) + datetime.timedelta(days=rng.randrange(365 if not calendar.isleap(year) else 366))


def format_date(d: datetime.date) -> str:
    return f"{d.day} {calendar.month_name[d.month]} {d.year}"


class _Builder:
    """Draws the world step by step from one generator; the public entry point is `generate_world`."""

    def __init__(self, config: WorldConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        self.names = _Names(self.rng)
        self.first = datetime.date(config.start_year, 1, 1)
        self.last = datetime.date(config.end_year, 12, 31)
        self.entities: List[Entity] = []
        self.by_type: Dict[str, List[Entity]] = collections.defaultdict(list)
        self.facts: List[Fact] = []

    # -- entities ------------------------------------------------------------------------------------------------
    def _add(self, type_: str, name: str, first_date: Optional[datetime.date] = None) -> Entity:
        entity = Entity(f"W{len(self.entities) + 1:05d}", name, type_, first_date or self.first)
        self.entities.append(entity)
        self.by_type[type_].append(entity)
        return entity

    def _emerging_date(self) -> Optional[datetime.date]:
        if self.rng.random() < self.config.emerging_share:
            first_year = min(self.config.start_year + 1, self.config.end_year)
            return _date_in_year(self.rng, self.rng.randint(first_year, self.config.end_year))
        return None

    def make_entities(self) -> None:
        n = self.config.subjects_per_relation
        w = self.names.word
        given = [w((2, 2)) for _ in range(self.config.given_names)]
        person = lambda: f"{self.rng.choice(given) if given else w((2, 2))} {w((2, 3))}"  # noqa: E731
        for _ in range(max(6, n // 2)):
            self._add("country", w((2, 3)).rstrip(_VOWELS) + self.rng.choice(["ia", "land", "stan", "ora"]))
        for _ in range(max(n, 12)):  # clubs and universities are named after cities
            self._add("city", w((2, 3)))
        cities = self.by_type["city"]
        for i in range(n):
            self._add("club", self.names.unique(lambda: f"{self.rng.choice(cities).name} "
                                                        f"{self.rng.choice(['United', 'Rovers', 'Athletic', 'City'])}"),
                      self._emerging_date() if i >= n // 2 else None)
        for i in range(2 * n):
            self._add("company", f"{w()} {self.rng.choice(['Systems', 'Holdings', 'Labs', 'Group', 'Motors'])}",
                      self._emerging_date() if i >= n else None)
        for _ in range(max(5, n // 6)):
            self._add("party", f"{w()} {self.rng.choice(['Party', 'Alliance', 'Union', 'Front'])}")
        for _ in range(max(6, n // 4)):
            self._add("university", self.names.unique(lambda: f"University of {self.rng.choice(cities).name}"))
        for _ in range(n):
            office = self.rng.choice(["Minister of Finance", "Minister of Health", "Minister of Defence",
                                      "Minister of Transport", "Mayor", "Governor"])
            places = self.by_type["country"] if office.startswith("Minister") else cities
            self._add("position", self.names.unique(lambda: f"{office} of {self.rng.choice(places).name}"))
        for type_, count in (("athlete", n), ("politician", 2 * n), ("employee", n), ("student", n),
                             ("coach", n), ("executive", n)):
            for _ in range(count):
                self._add(type_, person(), self._emerging_date())
        for _ in range(max(4, n // 2)):
            self._add("event", f"{w()} {self.rng.choice(['Games', 'Festival', 'Expo', 'Cup'])}")
        for _ in range(max(4, n // 2)):
            self._add("landmark", f"{w()} {self.rng.choice(['Tower', 'Bridge', 'Cathedral', 'Gate'])}")
        # Burst events: `bursts_per_year` a year, each named with a word that did not exist before it broke, or
        # after a place of the world (`burst_names`).
        places = self.by_type["city"] + self.by_type["country"]
        for year in range(self.config.start_year, self.config.end_year + 1):
            for _ in range(self.config.bursts_per_year):
                kind = self.rng.choice(["Summit", "Scandal", "Storm", "Strike"])
                name = (self.names.unique(lambda: f"{self.rng.choice(places).name} {kind}")
                        if self.config.burst_names == "places" else f"{w()} {kind}")
                self._add("burst", name, _date_in_year(self.rng, year))

    def _pool(self, type_: str) -> List[Entity]:
        if type_ == "place":
            return self.by_type["country"] + self.by_type["city"]
        return self.by_type[type_]

    # -- facts -----------------------------------------------------------------------------------------------------
    def _tenures(self, subject: Entity, spec_years: float, static_share: float, overlap_share: float,
                 objects: Sequence[Entity]) -> List[Fact]:
        """A chain of (object, start, end) for one subject over the span; None when it never changes."""
        rng = self.rng
        begin = max(subject.first_date, self.first)
        if rng.random() < static_share or spec_years <= 0:
            # Subjects that exist from the start held their one object since some time before the window.
            chain = [(begin if subject.first_date > self.first else
                      begin - datetime.timedelta(days=rng.randrange(1, 5 * 365)), self.last)]
        else:
            chain, start = [], begin
            # The first tenure began before the window for subjects that exist from the start.
            start_of_first = start if subject.first_date > self.first else \
                start - datetime.timedelta(days=rng.randrange(1, int(365 * spec_years) + 2))
            start = start_of_first
            while start <= self.last:
                length = max(120, int(rng.expovariate(1.0 / (365 * spec_years))))
                end = start + datetime.timedelta(days=length)
                chain.append((start, min(end, self.last)))
                start = end + datetime.timedelta(days=1)
        facts: List[Fact] = []
        previous: Optional[str] = None
        for start, end in chain:
            eligible = [o for o in objects if o.first_date <= max(start, self.first) and o.id != previous
                        and o.id != subject.id]
            if not eligible:
                eligible = [o for o in objects if o.first_date <= self.first and o.id != subject.id]
            obj = rng.choice(eligible)
            if previous is not None and rng.random() < overlap_share:
                # Tenures last at least 120 days, so the new one still starts after the previous one did.
                start = start - datetime.timedelta(days=rng.randint(30, 100))
            # A fact never starts before both of its entities exist.
            lower = max(subject.first_date, obj.first_date)
            if lower > self.first:
                start = max(start, lower)
            facts.append(Fact(subject.id, "", obj.id, start, end if end < self.last else None))
            previous = obj.id
        return facts

    def make_facts(self) -> None:
        n = self.config.subjects_per_relation
        for relation, spec in RELATIONS.items():
            subjects = list(self._pool(spec.subject_type))
            self.rng.shuffle(subjects)
            for subject in sorted(subjects[:n], key=lambda e: e.id):
                for fact in self._tenures(subject, spec.mean_years, spec.static_share, spec.overlap_share,
                                          self._pool(spec.object_type)):
                    self.facts.append(dataclasses.replace(fact, relation=relation))
        for relation, (_, subject_type, object_type, years) in CALIBRATION.items():
            for subject in self.by_type[subject_type][: max(4, n // 2)]:
                static = 1.0 if years <= 0 else 0.0
                for fact in self._tenures(subject, years, static, 0.0, self.by_type[object_type]):
                    self.facts.append(dataclasses.replace(fact, relation=relation))

    # -- coined words ------------------------------------------------------------------------------------------------
    def make_words(self) -> None:
        """`new_words_per_month` coined words a month (the fraction as a chance of one more), each used from a day
        of its month on: to the world's last day (`new_word_persist_share` of them) or for 30 days."""
        config, rng = self.config, self.rng
        whole, fraction = divmod(config.new_words_per_month, 1.0)
        self.words: List[Word] = []
        for year in range(config.start_year, config.end_year + 1):
            for month in range(1, 13):
                days = calendar.monthrange(year, month)[1]
                for _ in range(int(whole) + (rng.random() < fraction)):
                    first = datetime.date(year, month, rng.randint(1, days))
                    last = self.last if rng.random() < config.new_word_persist_share else \
                        min(self.last, first + datetime.timedelta(days=30))
                    word = self.names.word((2, 3)).lower() + rng.choice(["", "", "ism", "ing", "er"])
                    self.words.append(Word(word, first, last))

    # -- news ------------------------------------------------------------------------------------------------------
    def _end(self, fact: Fact) -> datetime.date:
        return fact.end or self.last

    def make_news(self):
        """Yields (Document json, mentions json) in date order."""
        rng = self.rng
        config = self.config
        entity = {e.id: e for e in self.entities}
        span = max(1, config.end_year - config.start_year)
        topics = list(TOPICS)
        facts = [(i, f) for i, f in enumerate(self.facts)]
        bursts = self.by_type["burst"]
        emerging = [e for e in self.entities if e.type in RISING_TYPES and e.first_date > self.first]
        counter = 0
        for year in range(config.start_year, config.end_year + 1):
            t = config.topic_drift * (year - config.start_year) / span
            topic_weights = [TOPICS[k][0] + (TOPICS[k][1] - TOPICS[k][0]) * t for k in topics]
            for month in range(1, 13):
                days = calendar.monthrange(year, month)[1]
                month_start = datetime.date(year, month, 1)
                month_end = datetime.date(year, month, days)
                active = [(i, f) for i, f in facts
                          if (f.start or self.first) <= month_end and month_start <= self._end(f)]
                places = {"c": [c for c in self.by_type["city"] if c.first_date <= month_start],
                          "k": [k for k in self.by_type["country"] if k.first_date <= month_start]}
                live_bursts = [b for b in bursts if b.first_date <= month_end
                               and (month_start - b.first_date).days <= BURST_DAYS]
                words = [w for w in self.words if w.first_date <= month_end and month_start <= w.last_date]
                rising = [e for e in emerging if month_start < e.first_date
                          and (e.first_date - month_end).days <= config.rising_days] if config.rising_share else []
                dates = sorted(datetime.date(year, month, rng.randint(1, days)) for _ in range(config.docs_per_month))
                for date in dates:
                    counter += 1
                    doc_id = f"world-{date.isoformat()}-{counter:06d}"
                    yield self._document(doc_id, date, active, places, live_bursts, words, topics, topic_weights,
                                         entity, rising)

    def _document(self, doc_id, date, active, places, live_bursts, words, topics, topic_weights, entity, rising):
        rng, config = self.rng, self.config
        valid = [(i, f) for i, f in active if f.valid_on(date)
                 and entity[f.subject].first_date <= date and entity[f.object].first_date <= date]
        # Facts that began in the last CHANGE_DAYS days are news: drawn far more often (a burst of coverage).
        weights = [config.change_news_weight if f.start is not None and 0 <= (date - f.start).days <= CHANGE_DAYS
                   else 1.0 for _, f in valid]
        live_bursts = [b for b in live_bursts if 0 <= (date - b.first_date).days <= BURST_DAYS]
        words = [w for w in words if w.first_date <= date <= w.last_date]
        word_weights = [3.0 if (date - w.first_date).days <= 30 else 1.0 for w in words]
        rising = [e for e in rising if 0 < (e.first_date - date).days <= config.rising_days]
        # Of the background sentences, this share uses a coined word, so that `new_word_sentence_share` of all do.
        coined = min(1.0, config.new_word_sentence_share / config.background_share) if config.background_share else 0.0
        parts: List[Tuple[str, Optional[str]]] = []  # (text, entity id or None), concatenated into the document
        sentences: List[Tuple[int, int, str]] = []  # [start part, end part) and source of each sentence
        stated: List[int] = []
        for _ in range(rng.randint(config.min_sentences, config.max_sentences)):
            if parts:
                parts.append((" ", None))
            begin = len(parts)
            background = rng.random() < config.background_share
            fact_index: Optional[int] = None
            # (the share is tested before drawing, so that a world without it draws the numbers it always drew)
            about_burst = bool(background and live_bursts and config.burst_background_share
                               and rng.random() < config.burst_background_share)
            if about_burst or (not background and live_bursts and rng.random() < config.burst_sentence_share):
                background = False
                source = "burst"
                slots = {"e": rng.choice(live_bursts).id}
                clause, shown = rng.choice(BURST_TEMPLATES), date
            elif not background and valid:
                i, fact = rng.choices(valid, weights)[0]
                source = fact.relation
                slots = {"s": fact.subject, "o": fact.object}
                is_new = fact.start is not None and 0 <= (date - fact.start).days <= CHANGE_DAYS
                if is_new and fact.relation in CHANGE_TEMPLATES and rng.random() < 0.5:
                    clause, shown = rng.choice(CHANGE_TEMPLATES[fact.relation]), fact.start
                else:
                    clause, shown = rng.choice(FACT_TEMPLATES[fact.relation]), date
                stated.append(i)
                fact_index = i
            elif rising and rng.random() < config.rising_share:  # (drawn only where names are rising)
                background = True
                source = "rising"
                slots = {"r": rng.choice(rising).id}
                clause, shown = rng.choice(RISING_TEMPLATES), date
            else:
                background = True
                topic = rng.choices(topics, topic_weights)[0]
                source = f"topic:{topic}"
                slots = {}
                if words and rng.random() < coined:
                    clause = rng.choice(TOPICS[topic][3])
                    slots["w"] = rng.choices(words, word_weights)[0].word
                else:
                    clause = rng.choice(TOPICS[topic][2])
                shown = date
            for key in "ck":
                if "{" + key + "}" in clause:
                    slots[key] = rng.choice(places[key]).id
            self._render(parts, clause, slots, entity)
            if rng.random() < config.year_share:
                parts.append((self._year_phrase(date, shown, fact_index, background), None))
            if not background and rng.random() < 0.5:
                parts.append((rng.choice(TAILS), None))
            parts.append((".", None))
            sentences.append((begin, len(parts), source))
        text, spans, offsets, offset = [], [], [], 0
        for piece, eid in parts:
            offsets.append(offset)
            if eid is not None:
                spans.append([offset, offset + len(piece), eid])
            text.append(piece)
            offset += len(piece)
        offsets.append(offset)
        doc = {"id": doc_id, "date": date.isoformat(), "text": "".join(text)}
        return doc, {"id": doc_id, "facts": stated, "entities": spans,
                     "sentences": [[offsets[b], offsets[e], source] for b, e, source in sentences]}

    def _year_phrase(self, date: datetime.date, shown: datetime.date, fact: Optional[int], background: bool) -> str:
        """A phrase naming a year: the day shown (the document's, or the day a reported change began) with
        probability `publication_year_share`, else a later year (`later_year_share` of them) or an earlier one (the
        year a fact began, when it began earlier)."""
        rng = self.rng
        if rng.random() < self.config.publication_year_share:
            if rng.random() < 0.5:
                return f" on {format_date(shown)}"
            return f" in {calendar.month_name[shown.month]} {shown.year}"
        # (the share is tested before drawing: a world without it draws the numbers it always drew)
        if self.config.later_year_share and rng.random() < self.config.later_year_share:
            return f" ahead of {date.year + rng.randint(1, 2)}"
        start = self.facts[fact].start if fact is not None else None
        year = start.year if start is not None and start.year < date.year else date.year - rng.randint(1, 8)
        return f" for the first time since {year}" if background else f" since {year}"

    def _render(self, parts, template: str, slots: Dict[str, str], entity) -> None:
        """Appends a clause, keeping each entity name as its own part so its span is known; [name] slots take a
        word of WORDS, {w} the coined word in `slots`."""
        rest = template
        while rest:
            brace = min((i for i in (rest.find("{"), rest.find("[")) if i >= 0), default=-1)
            if brace < 0:
                parts.append((rest, None))
                break
            close = rest.index("}" if rest[brace] == "{" else "]", brace)
            if brace:
                parts.append((rest[:brace], None))
            key = rest[brace + 1:close]
            if rest[brace] == "[":
                parts.append((self.rng.choice(WORDS[key]), None))
            elif key == "w":
                parts.append((slots["w"], None))
            else:
                parts.append((entity[slots[key]].name, slots[key]))
            rest = rest[close + 1:]


def _calibration_queries(builder: _Builder, names: Dict[str, str]) -> Tuple[List[Query], Dict[str, dict]]:
    config = builder.config
    facts = [f for f in builder.facts if f.relation in CALIBRATION]
    queries = queries_from_facts(facts, names, config.start_year, config.end_year, CALIBRATION_TEMPLATES)
    extra = {}
    for q in queries:
        change_class, _, candidate_type, _ = CALIBRATION[q.relation]
        extra[q.id] = {"change_class": change_class,
                       "candidates": [e.name for e in builder.by_type[candidate_type]]}
    return queries, extra


def _stats(builder: _Builder, news_by_year, queries: List[Query], splits) -> dict:
    config = builder.config
    by_year = collections.defaultdict(lambda: {"documents": 0, "sentences": 0, "background_sentences": 0,
                                               "queries": 0, "multi_answer_queries": 0, "emerging_names": 0,
                                               "new_words": 0})
    for year, counts in news_by_year.items():
        by_year[year].update(counts)
    for word in builder.words:
        by_year[word.first_date.year]["new_words"] += 1
    for q in queries:
        by_year[q.year]["queries"] += 1
        by_year[q.year]["multi_answer_queries"] += len(q.answers) > 1
    emerging = [e for e in builder.entities if e.first_date > builder.first]
    for e in emerging:
        by_year[e.first_date.year]["emerging_names"] += 1
    multi = sum(len(q.answers) > 1 for q in queries)
    return {
        "config": dataclasses.asdict(config),
        "documents": sum(row["documents"] for row in news_by_year.values()),
        "entities": len(builder.entities),
        "emerging_entities": len(emerging),
        "new_words": len(builder.words),
        "facts": len(builder.facts),
        "templama_queries": len(queries),
        "templama_splits": {name: len(qs) for name, qs in splits.items()},
        "templama_subjects": {name: len({q.subject_id for q in qs}) for name, qs in splits.items()},
        "multi_answer_share": round(multi / max(1, len(queries)), 4),
        "by_year": {str(y): by_year[y] for y in range(config.start_year, config.end_year + 1)},
    }


def generate_world(config: WorldConfig, out_dir: str, overwrite: bool = False, lock: bool = True) -> dict:
    """Draws the world for `config` and writes it to `out_dir` (see the module docstring). Returns stats.json.

    `out_dir` is replaced only when it is absent, empty or a templm world, unless `overwrite`
    (templm.outputs.build_output_folder); `lock` = False when it is built inside a folder whose own lock is held."""
    check_output_folder(out_dir, "world", overwrite)  # before the work
    builder = _Builder(config)
    builder.make_entities()
    builder.make_facts()
    builder.make_words()
    names = {e.id: e.name for e in builder.entities}
    return build_output_folder(out_dir, "world", lambda tmp: _write_world(builder, names, tmp), overwrite, lock)


def _write_world(builder: _Builder, names: Dict[str, str], tmp: str) -> dict:
    config = builder.config
    os.makedirs(os.path.join(tmp, "templama"))
    news_by_year: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    with NamedWrites(os.path.join(tmp, "news.jsonl"), "w", encoding="utf-8") as news, \
            NamedWrites(os.path.join(tmp, "mentions.jsonl"), "w", encoding="utf-8") as mentions:
        for doc, mention in builder.make_news():
            news.write(json.dumps(doc, ensure_ascii=False) + "\n")
            mentions.write(json.dumps(mention, ensure_ascii=False) + "\n")
            counts = news_by_year[int(doc["date"][:4])]
            counts["documents"] += 1
            counts["sentences"] += len(mention["sentences"])
            counts["background_sentences"] += sum(s[2].startswith("topic:") for s in mention["sentences"])
    # TempLAMA asks about the subjects whose object changes within the years, as the paper's (and templm's Wikidata
    # builder's) selection does; the news states every fact, static ones included.
    templama_facts = changing_facts([f for f in builder.facts if f.relation in RELATIONS], config.start_year,
                                    config.end_year)
    queries = queries_from_facts(templama_facts, names, config.start_year, config.end_year, TEMPLATES)
    splits = split_by_subject(queries, config.seed)
    for split, split_queries in splits.items():
        write_queries(os.path.join(tmp, "templama", f"{split}.jsonl"), split_queries)
    calibration, extra = _calibration_queries(builder, names)
    write_queries(os.path.join(tmp, "calibration.jsonl"), calibration, extra)
    world = {
        "config": dataclasses.asdict(config),
        "entities": [{"id": e.id, "name": e.name, "type": e.type, "first_date": e.first_date.isoformat()}
                     for e in builder.entities],
        "facts": [{"id": i, "subject": f.subject, "relation": f.relation, "object": f.object,
                   "start": f.start.isoformat() if f.start else None, "end": f.end.isoformat() if f.end else None}
                  for i, f in enumerate(builder.facts)],
        "words": [{"word": w.word, "first_date": w.first_date.isoformat(), "last_date": w.last_date.isoformat()}
                  for w in builder.words],
    }
    with NamedWrites(os.path.join(tmp, "world.json"), "w", encoding="utf-8") as f:
        json.dump(world, f, ensure_ascii=False, indent=1)
    stats = _stats(builder, news_by_year, queries, splits)
    with NamedWrites(os.path.join(tmp, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1)
    return stats


def load_world(world_dir: str) -> dict:
    """world.json with dates parsed into datetime.date: entities by id, facts as templama.Fact, coined words."""
    path = paths.join(world_dir, "world.json")
    with paths.open(path, encoding="utf-8") as f:
        raw = json.load(f)
    parse = lambda s: None if s is None else datetime.date.fromisoformat(s)  # noqa: E731
    entities = {e["id"]: Entity(e["id"], e["name"], e["type"], parse(e["first_date"])) for e in raw["entities"]}
    facts = [Fact(f["subject"], f["relation"], f["object"], parse(f["start"]), parse(f["end"])) for f in raw["facts"]]
    words = [Word(w["word"], parse(w["first_date"]), parse(w["last_date"])) for w in raw.get("words", [])]
    return {"config": raw["config"], "entities": entities, "facts": facts, "words": words}
