"""The embedded temporal world: determinism, and news/queries consistent with the facts in world.json."""

import collections
import filecmp
import json
import os
import re

import pytest

from templm.data import JsonlReader, TemplamaReader
from templm.data.templama import TEMPLATES
from templm.data.world import CALIBRATION, RISING_TYPES, TOPICS, WorldConfig, generate_world, load_world

SMALL = WorldConfig(seed=7, start_year=2012, end_year=2016, subjects_per_relation=12, docs_per_month=8)


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("world") / "w")
    generate_world(WorldConfig(), out)  # the default size, as users get it
    return out


@pytest.fixture(scope="module")
def world(world_dir):
    return load_world(world_dir)


@pytest.fixture(scope="module")
def news(world_dir):
    docs = list(JsonlReader(os.path.join(world_dir, "news.jsonl")))
    with open(os.path.join(world_dir, "mentions.jsonl"), encoding="utf-8") as f:
        mentions = [json.loads(line) for line in f]
    return docs, mentions


@pytest.fixture(scope="module")
def queries(world_dir):
    return {split: list(TemplamaReader(os.path.join(world_dir, "templama", f"{split}.jsonl")))
            for split in ("train", "val", "test")}


def _all_files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_same_seed_same_bytes_and_other_seed_differs(tmp_path):
    a, b, c = (str(tmp_path / name) for name in "abc")
    generate_world(SMALL, a)
    generate_world(SMALL, b)
    generate_world(WorldConfig(**{**SMALL.__dict__, "seed": 8}), c)
    files = _all_files(a)
    assert files == [".templm.json", "calibration.jsonl", "mentions.jsonl", "news.jsonl", "stats.json",
                     "templama/test.jsonl", "templama/train.jsonl", "templama/val.jsonl", "world.json"]
    match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert mismatch == [] and errors == []
    assert not filecmp.cmp(os.path.join(a, "news.jsonl"), os.path.join(c, "news.jsonl"), shallow=False)
    assert not os.path.exists(a + ".partial")


def test_news_is_chronological_dated_to_the_day_and_sized(news):
    docs, mentions = news
    config = WorldConfig()
    assert len(docs) == 12 * (config.end_year - config.start_year + 1) * config.docs_per_month
    dates = [d.date for d in docs]
    assert dates == sorted(dates)
    assert len({d.day for d in dates}) > 20
    assert [m["id"] for m in mentions] == [d.id for d in docs]
    assert len({d.id for d in docs}) == len(docs)


def test_every_stated_fact_is_valid_on_the_document_date(news, world):
    docs, mentions = news
    facts, entities = world["facts"], world["entities"]
    stated = 0
    for doc, mention in zip(docs, mentions):
        for index in mention["facts"]:
            fact = facts[index]
            assert fact.valid_on(doc.date), (doc.id, fact)
            assert entities[fact.subject].name in doc.text and entities[fact.object].name in doc.text
            stated += 1
    assert stated > len(docs)


def test_entity_spans_name_entities_that_exist_on_the_date(news, world):
    docs, mentions = news
    entities = world["entities"]
    seen_emerging = set()
    for doc, mention in zip(docs, mentions):
        for start, end, eid in mention["entities"]:
            entity = entities[eid]
            assert doc.text[start:end] == entity.name
            assert entity.first_date <= doc.date, (doc.id, entity)
            if entity.first_date.year > 2010:
                seen_emerging.add(eid)
    assert len(seen_emerging) >= 40  # emerging names do show up in the news once they exist


def test_templama_answers_are_what_world_json_says(queries, world):
    facts, entities = world["facts"], world["entities"]
    by_key = collections.defaultdict(list)
    for fact in facts:
        by_key[(fact.subject, fact.relation)].append(fact)
    total = 0
    for split in queries.values():
        for q in split:
            valid = {f.object for f in by_key[(q.subject_id, q.relation)] if q.year in f.covers(2010, 2020)}
            assert {a.wikidata_id for a in q.answers} == valid, q.id
            assert {a.name for a in q.answers} == {entities[o].name for o in valid}
            assert entities[q.subject_id].name in q.query and "_X_" in q.query
            total += 1
    assert total > 1000


def test_templama_asks_exactly_the_subjects_whose_object_changes_within_the_years(queries, world):
    # The paper's selection (section 2.1), read off world.json: a (subject, relation) with two or more objects in
    # 2010-2020 is asked about, one whose object holds all along (the world has many: static_share) is not.
    objects = collections.defaultdict(set)
    for fact in world["facts"]:
        if fact.relation in TEMPLATES and len(fact.covers(2010, 2020)):
            objects[(fact.subject, fact.relation)].add(fact.object)
    asked = {(q.subject_id, q.relation) for qs in queries.values() for q in qs}
    assert asked == {key for key, objs in objects.items() if len(objs) > 1}
    assert sum(len(objs) == 1 for objs in objects.values()) >= 20  # static subjects exist, in the news only


def test_splits_are_subject_disjoint_about_20_10_70(queries):
    subjects = {split: {q.subject_id for q in qs} for split, qs in queries.items()}
    assert not subjects["train"] & subjects["val"]
    assert not subjects["train"] & subjects["test"]
    assert not subjects["val"] & subjects["test"]
    n = sum(len(s) for s in subjects.values())
    assert abs(len(subjects["train"]) / n - 0.2) < 0.01
    assert abs(len(subjects["val"]) / n - 0.1) < 0.01


def test_multi_answer_queries_and_emerging_answers_exist(queries, world):
    entities = world["entities"]
    flat = [q for qs in queries.values() for q in qs]
    multi = sum(len(q.answers) > 1 for q in flat) / len(flat)
    assert 0.05 < multi < 0.5
    emerging_answers = {a.wikidata_id for q in flat for a in q.answers
                        if entities[a.wikidata_id].first_date.year > 2010}
    assert len(emerging_answers) >= 10
    # An emerging answer is never an answer before the year its entity appears.
    for q in flat:
        for a in q.answers:
            assert entities[a.wikidata_id].first_date.year <= q.year


def test_relations_change_at_their_own_rates(world):
    distinct = collections.defaultdict(list)
    per_subject = collections.defaultdict(set)
    for fact in world["facts"]:
        per_subject[(fact.relation, fact.subject)].add(fact.object)
    for (relation, _), objects in per_subject.items():
        distinct[relation].append(len(objects))
    mean = {r: sum(v) / len(v) for r, v in distinct.items()}
    assert mean["P54"] > 2 * mean["P102"]  # athletes move clubs far more often than politicians change party
    assert mean["P54"] > mean["P127"]
    assert min(distinct["P54"]) == 1  # some subjects keep one object for the whole span
    assert mean["located_in"] == 1.0


def test_calibration_classes_order_by_change_rate(world_dir, world):
    with open(os.path.join(world_dir, "calibration.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    answers = collections.defaultdict(set)
    classes = {}
    for row in rows:
        classes[row["relation"]] = row["change_class"]
        for a in row["answer"]:
            answers[(row["relation"], row["id"].rsplit("_", 1)[0])].add(a["name"])
        assert all(a["name"] in row["candidates"] for a in row["answer"])
    assert classes == {r: spec[0] for r, spec in CALIBRATION.items()}
    changes = collections.defaultdict(list)
    for (relation, _), names in answers.items():
        changes[classes[relation]].append(len(names))
    mean = {c: sum(v) / len(v) for c, v in changes.items()}
    assert mean["frequent"] > mean["rare"] > mean["never"] == 1.0


def test_bursts_are_concentrated(news, world):
    docs, mentions = news
    bursts = {eid for eid, e in world["entities"].items() if e.type == "burst"}
    within, total = 0, 0
    for doc, mention in zip(docs, mentions):
        for _, _, eid in mention["entities"]:
            if eid in bursts:
                total += 1
                within += (doc.date - world["entities"][eid].first_date).days <= 90
    assert total > 100 and within == total


# -- the mechanisms of the news, measured against their settings -------------------------------------------------
# Each share is checked to 4.5 binomial standard errors of the measured count (plus a small allowance where a
# mechanism cannot always act, e.g. a fact sentence drawn when no fact holds), so the checks hold for any seed.

ALTERED = WorldConfig(seed=11, start_year=2012, end_year=2017, subjects_per_relation=12, docs_per_month=30,
                      background_share=0.3, year_share=0.2, publication_year_share=0.25, topic_drift=0.0,
                      new_words_per_month=0.5, new_word_persist_share=1.0, new_word_sentence_share=0.05,
                      later_year_share=0.4)


@pytest.fixture(scope="module")
def altered_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("altered") / "w")
    generate_world(ALTERED, out)
    return out


def _sentences(world_dir):
    """(document date, sentence text, source) of every sentence, from mentions.jsonl's spans."""
    docs = list(JsonlReader(os.path.join(world_dir, "news.jsonl")))
    with open(os.path.join(world_dir, "mentions.jsonl"), encoding="utf-8") as f:
        mentions = [json.loads(line) for line in f]
    out = []
    for doc, mention in zip(docs, mentions):
        spans = mention["sentences"]
        assert " ".join(doc.text[start:end] for start, end, _ in spans) == doc.text
        out.extend((doc.date, doc.text[start:end], source) for start, end, source in spans)
    return out


def _close(count, n, p, allowance=0.0):
    se = (p * (1 - p) / n) ** 0.5
    return abs(count / n - p) <= 4.5 * se + allowance


@pytest.mark.parametrize("which", ["default", "altered"])
def test_background_and_year_mentions_have_their_configured_shares(which, world_dir, altered_dir):
    """Most sentences are background; a few per cent name a year (Dhingra et al.: 3.9 % of CustomNews sentences, 2.1
    % their publication year), the others an earlier year or a later one; the altered config moves every share."""
    world_dir, config = (world_dir, WorldConfig()) if which == "default" else (altered_dir, ALTERED)
    sentences = _sentences(world_dir)
    n = len(sentences)
    assert n > 10_000
    assert all(text.endswith(".") for _, text, _ in sentences)
    background = sum(source.startswith("topic:") for _, _, source in sentences)
    assert _close(background, n, config.background_share, allowance=0.01), background / n
    years = [re.findall(r"\b(?:19|20)\d\d\b", text) for _, text, _ in sentences]
    assert _close(sum(bool(y) for y in years), n, config.year_share), sum(map(bool, years)) / n
    # Change reports show the day the change began, which may fall in the year before: a small allowance.
    publication = sum(str(date.year) in y for (date, _, _), y in zip(sentences, years))
    assert _close(publication, n, config.year_share * config.publication_year_share, allowance=0.002)
    # Of the other years named, `later_year_share` are later than the document's (none in the default world).
    later = sum(any(int(year) > date.year for year in y) for (date, _, _), y in zip(sentences, years))
    assert _close(later, n, config.year_share * (1 - config.publication_year_share) * config.later_year_share)


@pytest.mark.parametrize("which", ["default", "altered"])
def test_coined_words_appear_at_their_rate_and_only_while_in_use(which, world_dir, altered_dir):
    world_dir, config = (world_dir, WorldConfig()) if which == "default" else (altered_dir, ALTERED)
    words = {w.word: w for w in load_world(world_dir)["words"]}
    months = 12 * (config.end_year - config.start_year + 1)
    whole, fraction = divmod(config.new_words_per_month, 1.0)  # the fraction is a monthly chance of one more
    assert _close(len(words) - whole * months, months, fraction) if fraction else len(words) == whole * months
    persistent = sum(w.last_date.year == config.end_year and (w.last_date - w.first_date).days > 31
                     for w in words.values())
    assert _close(persistent, len(words), config.new_word_persist_share, allowance=0.03)
    used_in = collections.defaultdict(set)
    with_word = 0
    sentences = _sentences(world_dir)
    for date, text, _ in sentences:
        found = [t for t in re.findall(r"[a-z]+", text) if t in words]
        with_word += bool(found)
        for t in found:
            assert words[t].first_date <= date <= words[t].last_date, (t, date)
            used_in[t].add((date.year, date.month))
    # The first month has no coined word yet in some documents: a small allowance.
    assert _close(with_word, len(sentences), config.new_word_sentence_share, allowance=0.005)
    if which == "default":
        # Mind the Gap (section 3.4): 14-35 % of the novel words reappear in at least four later months.
        reappear = sum(len(used_in[w] - {(words[w].first_date.year, words[w].first_date.month)}) >= 4 for w in words)
        assert 0.14 <= reappear / len(words) <= 0.35


def test_short_lived_news_has_its_events_a_year_and_its_share_of_the_sentences(tmp_path, world):
    """`bursts_per_year` named events break each year; while one is in the news, `burst_background_share` of the
    background sentences are about it, beside `burst_sentence_share` of the other sentences (so 0.6 x 0.5 + 0.4 x
    0.1 = 34 % of the sentences here; the default world: 0.4 x 0.2 = 8 %). The default world keeps its two events a
    year."""
    config = WorldConfig(seed=13, start_year=2014, end_year=2016, subjects_per_relation=6, docs_per_month=40,
                         bursts_per_year=6, burst_background_share=0.5, burst_sentence_share=0.1)
    out = str(tmp_path / "w")
    generate_world(config, out)
    bursty = load_world(out)
    for loaded, per_year in ((bursty, 6), (world, 2)):
        broke = collections.Counter(e.first_date.year for e in loaded["entities"].values() if e.type == "burst")
        assert set(broke.values()) == {per_year}
    starts = sorted(e.first_date for e in bursty["entities"].values() if e.type == "burst")
    live = [(source, date) for date, _, source in _sentences(out)
            if any(0 <= (date - start).days <= 90 for start in starts)]
    n = len(live)
    assert n > 5_000
    about = sum(source == "burst" for source, _ in live)
    expected = (config.background_share * config.burst_background_share
                + (1 - config.background_share) * config.burst_sentence_share)
    assert _close(about, n, expected, allowance=0.01), about / n
    background = sum(source.startswith("topic:") for source, _ in live)
    assert _close(background, n, config.background_share * (1 - config.burst_background_share), allowance=0.01)


def test_a_fact_is_told_change_news_weight_times_as_often_while_it_is_news(tmp_path):
    """A sentence states one of the facts valid on its date, one in its first 60 days (news) drawn
    `change_news_weight` times as often as one older. Two worlds of one seed, at the default weight (8) and at 32,
    hold the same facts; among their fact sentences the odds of one about a fact in its first 60 days go up about
    32 / 8 = 4 times (3.5 here: the odds are pooled over dates with more or fewer new facts), within 4.5 standard
    errors of the log odds ratio (about 3,600 statements a world). Were the weight not applied, the ratio would be 1."""
    import math

    odds = {}
    for weight in (8.0, 32.0):
        out = str(tmp_path / f"w{weight:g}")
        generate_world(WorldConfig(seed=5, start_year=2014, end_year=2016, subjects_per_relation=6,
                                   docs_per_month=40, change_news_weight=weight), out)
        facts = load_world(out)["facts"]
        with open(os.path.join(out, "mentions.jsonl"), encoding="utf-8") as f:
            mentions = [json.loads(line) for line in f]
        fresh = old = 0
        for doc, mention in zip(JsonlReader(os.path.join(out, "news.jsonl")), mentions):
            for i in mention["facts"]:
                start = facts[i].start
                if start is not None and 0 <= (doc.date - start).days <= 60:
                    fresh += 1
                else:
                    old += 1
        assert fresh + old > 3_500
        odds[weight] = (fresh / old, fresh, old)
    ratio = odds[32.0][0] / odds[8.0][0]
    spread = 4.5 * math.sqrt(sum(1 / odds[w][1] + 1 / odds[w][2] for w in odds))  # on the log odds ratio
    assert abs(math.log(ratio / 4.0)) <= spread, (ratio, odds)


def test_rising_names_are_in_the_news_rarely_before_their_entity_emerges(tmp_path, news, world):
    """`rising_share` of the background sentences name, in passing, a person, club or company whose first date is
    within the next `rising_days` days; so a name is seen before it makes news. The default world has none."""
    config = WorldConfig(seed=21, start_year=2014, end_year=2017, subjects_per_relation=8, docs_per_month=30,
                         rising_share=0.1, rising_days=400)
    out = str(tmp_path / "w")
    generate_world(config, out)
    rising_world = load_world(out)
    entities = rising_world["entities"]
    emerging = [e for e in entities.values() if e.type in RISING_TYPES and e.first_date.year > 2014]
    docs = list(JsonlReader(os.path.join(out, "news.jsonl")))
    with open(os.path.join(out, "mentions.jsonl"), encoding="utf-8") as f:
        mentions = [json.loads(line) for line in f]
    named_before = set()
    rising = background = 0
    for doc, mention in zip(docs, mentions):
        may_rise = any(0 < (e.first_date - doc.date).days <= config.rising_days for e in emerging)
        for start, end, source in mention["sentences"]:
            if source == "rising":
                names = [eid for a, _, eid in mention["entities"] if start <= a < end
                         and entities[eid].type in RISING_TYPES]  # (a city may be named beside it)
                assert len(names) == 1 and 0 < (entities[names[0]].first_date - doc.date).days <= config.rising_days
                named_before.add(names[0])
            if may_rise and (source == "rising" or source.startswith("topic:")):
                background += 1
                rising += source == "rising"
    assert background > 3_000 and _close(rising, background, config.rising_share), rising / background
    assert len(named_before) > 0.8 * len(emerging)  # nearly every emerging name is seen before it emerges
    assert not any(source == "rising" for mention in news[1] for _, _, source in mention["sentences"])


def test_events_named_after_places_and_given_names_from_a_stock_are_words_seen_before(tmp_path, world):
    """`burst_names='places'`: each event is named after a city or country of the world ("Kavo Summit"), a name in
    the news before the event breaks; `given_names=N`: persons share N given names while each keeps a
    family name of its own. The default world coins a new word for each event and each person's given name."""
    config = WorldConfig(seed=23, start_year=2014, end_year=2017, subjects_per_relation=8, docs_per_month=20,
                         burst_names="places", given_names=10)
    out = str(tmp_path / "w")
    generate_world(config, out)
    entities = load_world(out)["entities"].values()
    places = {e.name for e in entities if e.type in ("city", "country")}
    bursts = [e for e in entities if e.type == "burst"]
    assert len(bursts) == 2 * 4 and all(e.name.rsplit(" ", 1)[0] in places for e in bursts)
    persons = _person_names(entities)
    assert len({given for given, _ in persons}) == 10 and len({family for _, family in persons}) == len(persons)
    waiting = sorted((e for e in bursts if e.first_date.year > config.start_year), key=lambda e: e.first_date)
    assert len(waiting) == 6
    seen, known_before = set(), []
    for doc in JsonlReader(os.path.join(out, "news.jsonl")):  # in date order
        while waiting and waiting[0].first_date <= doc.date:  # the words seen before the event broke
            known_before.append(set(waiting.pop(0).name.rsplit(" ", 1)[0].split(" ")) <= seen)
        seen.update(re.findall(r"[A-Za-z]+", doc.text))
    assert known_before == [True] * 6
    default_places = {e.name for e in world["entities"].values() if e.type in ("city", "country")}
    default_bursts = [e.name.rsplit(" ", 1)[0] for e in world["entities"].values() if e.type == "burst"]
    assert default_bursts and not set(default_bursts) & default_places
    given = collections.Counter(given for given, _ in _person_names(world["entities"].values()))
    assert set(given.values()) == {1}


def _person_names(entities):
    """(given name, family name) of every person among `entities`."""
    return [e.name.split(" ") for e in entities if e.type in RISING_TYPES and e.type not in ("club", "company")]


def test_what_the_training_period_did_not_see_grows_with_distance(world_dir, world):
    """Cut off after 2016: the share of the later years' words never seen before grows year by year, and emerging
    names keep appearing in every year to the last."""
    seen, unseen = set(), {}
    for doc in JsonlReader(os.path.join(world_dir, "news.jsonl")):
        tokens = re.findall(r"[A-Za-z]+", doc.text)
        if doc.date.year <= 2016:
            seen.update(tokens)
        else:
            counts = unseen.setdefault(doc.date.year, [0, 0])
            counts[0] += sum(t not in seen for t in tokens)
            counts[1] += len(tokens)
    share = [unseen[year][0] / unseen[year][1] for year in (2017, 2018, 2019, 2020)]
    assert 0 < share[0] < share[-1] and share[-1] > 1.3 * share[0], share
    first_years = collections.Counter(e.first_date.year for e in world["entities"].values()
                                      if e.first_date.year > 2010 and e.type != "burst")
    assert set(first_years) == set(range(2011, 2021)), first_years


@pytest.mark.parametrize("which", ["default", "altered"])
def test_the_topic_mix_drifts_as_configured(which, world_dir, altered_dir):
    world_dir, config = (world_dir, WorldConfig()) if which == "default" else (altered_dir, ALTERED)
    by_year = collections.defaultdict(collections.Counter)
    for date, _, source in _sentences(world_dir):
        if source.startswith("topic:"):
            by_year[date.year][source[len("topic:"):]] += 1
    for year, t in ((config.start_year, 0.0), (config.end_year, config.topic_drift)):
        n = sum(by_year[year].values())
        for topic, (first, last, _, _) in TOPICS.items():
            assert _close(by_year[year][topic], n, first + (last - first) * t), (year, topic, by_year[year][topic] / n)


def test_statements_of_one_fact_are_drawn_from_many_paraphrases(news, world):
    """Two statements of the same fact (year phrases aside) are rarely the same sentence, so a document is not
    predictable from another about the same fact."""
    docs, mentions = news
    year_phrase = re.compile(r" (?:on \d{1,2} [A-Z][a-z]+ \d{4}|in [A-Z][a-z]+ \d{4}|since \d{4})")
    statements = collections.defaultdict(list)
    for doc, mention in zip(docs, mentions):
        facts = iter(mention["facts"])
        for start, end, source in mention["sentences"]:
            if not source.startswith("topic:") and source != "burst":
                statements[next(facts)].append(year_phrase.sub("", doc.text[start:end]))
    pairs = same = 0
    for texts in statements.values():
        pairs += len(texts) * (len(texts) - 1) // 2
        same += sum(k * (k - 1) // 2 for k in collections.Counter(texts).values())
    assert pairs > 10_000 and same / pairs < 0.08, same / pairs


def test_config_shares_out_of_range_are_refused():
    with pytest.raises(ValueError, match="year_share must be a share from 0 to 1"):
        WorldConfig(year_share=1.5)
    with pytest.raises(ValueError, match="min_sentences"):
        WorldConfig(min_sentences=5, max_sentences=3)
    with pytest.raises(ValueError, match="topic_drift"):
        WorldConfig(topic_drift=-1)
    with pytest.raises(ValueError, match="burst_background_share must be a share from 0 to 1"):
        WorldConfig(burst_background_share=2.0)
    with pytest.raises(ValueError, match="bursts_per_year must be at least 0"):
        WorldConfig(bursts_per_year=-1)


def test_stats_match_the_files(world_dir, news, queries):
    with open(os.path.join(world_dir, "stats.json"), encoding="utf-8") as f:
        stats = json.load(f)
    docs, _ = news
    assert stats["documents"] == len(docs)
    assert stats["templama_splits"] == {k: len(v) for k, v in queries.items()}
    by_year = collections.Counter(d.date.year for d in docs)
    assert {y: row["documents"] for y, row in stats["by_year"].items()} == {str(y): n for y, n in by_year.items()}
    flat = [q for qs in queries.values() for q in qs]
    assert stats["multi_answer_share"] == round(sum(len(q.answers) > 1 for q in flat) / len(flat), 4)


def test_entity_names_are_unique(world):
    names = [e.name for e in world["entities"].values()]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[A-Z][a-z]+( (of|[A-Z][a-z]+))*", n) for n in names), \
        [n for n in names if not re.fullmatch(r"[A-Z][a-z]+( (of|[A-Z][a-z]+))*", n)][:5]


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="end_year"):
        WorldConfig(start_year=2015, end_year=2010)
    with pytest.raises(ValueError, match="burst_names must be one of 'coined', 'places', got 'cities'"):
        WorldConfig(burst_names="cities")
    with pytest.raises(ValueError, match="given_names must be at least 0"):
        WorldConfig(given_names=-1)


@pytest.mark.parametrize("years", [(1850, 1852), (2099, 2101)])
def test_a_world_outside_the_readers_dates_is_refused(tmp_path, years):
    """A world its own readers reject (dates before 1900 or after 2100) used to be written."""
    with pytest.raises(ValueError, match=r"readers accept dates from 1900 to 2100 only"):
        WorldConfig(start_year=years[0], end_year=years[1])
