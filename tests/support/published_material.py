"""A researcher's own material, written here in the published formats (not by templm's writers): WMT News Crawl's
document-level files (one per year, base64 text), a TempLAMA release ({train,val,test}.json with a mirror's alias
lists) and the paper's published TIME-STRATIFIED / CONTROL split files. Used by tests/experiments/
test_reproduce_own_data.py and tests/cloud/test_study.py."""

import base64
import datetime
import gzip
import hashlib
import json
import os

YEARS = (2015, 2016, 2017, 2018)
PLAYERS = ["Alan Smith", "Bruno Costa", "Carla Mendes", "Dario Rossi", "Elena Petrova", "Farid Haddad",
           "Greta Lindqvist", "Hugo Laurent", "Ines Duarte", "Jonas Weber", "Kenji Sato", "Lucia Moreno"]
CLUBS = [("Q900", "Red Lions"), ("Q901", "Blue Harbour"), ("Q902", "Green Valley"), ("Q903", "Northern Stars"),
         ("Q904", "Lakeside Rovers"), ("Q905", "Eastport Athletic")]
# A mirror's rows: `name` a list of aliases (the first with the mirror's asterisk) and `original_name` the release's.
ALIASES = {"Q900": ["Red Lions FC*", "Red Lions FC"], "Q903": ["The Stars*", "Northern Stars"]}
SUBJECTS = {"train": PLAYERS[:4], "val": PLAYERS[4:6], "test": PLAYERS[6:]}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def club_of(player, year):
    """Each player changes club every two years, the players staggered."""
    i = PLAYERS.index(player)
    return CLUBS[(i + (year - 2015 + i % 2) // 2) % len(CLUBS)]


def documents(rng):
    """(date, sentences) of six news documents a month, each about two players and their clubs that month."""
    docs = []
    for year in YEARS:
        for month in range(1, 13):
            for k in range(6):
                day = 1 + (5 * k + month) % 28
                a, b = rng.sample(PLAYERS, 2)
                ca, cb = club_of(a, year)[1], club_of(b, year)[1]
                when = f"{day} {MONTHS[month - 1]} {year}"
                sentences = [
                    rng.choice([f"On {when}, {a} scored {rng.randint(1, 3)} goals for {ca} against {cb}.",
                                f"{a} of {ca} was the best player on the pitch on {when}.",
                                f"Fans of {ca} cheered as {a} opened the scoring on {when}."]),
                    rng.choice([f"{b} answered for {cb} in the {rng.randint(50, 89)}th minute.",
                                f"{cb} relied on {b}, who ran {rng.randint(9, 13)} kilometres.",
                                f"The coach of {cb} praised {b} after the match."]),
                    rng.choice(["The crowd of {n} left happy.", "Tickets for the next game sold out in {n} minutes.",
                                "Rain fell for {n} minutes before kick-off."]).format(n=rng.randint(20, 900)),
                ]
                docs.append((datetime.date(year, month, day), sentences))
    return docs


def b64(text):
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def write_news_crawl(folder, docs):
    """news-docs.YYYY.en.filtered.gz, one file per year: date, base64 sentence-split text, base64 text; returns
    {(date, first sentence): the document id the published split files use (sha256 of the third field)}."""
    os.makedirs(folder, exist_ok=True)
    ids = []
    for year in YEARS:
        with gzip.open(os.path.join(folder, f"news-docs.{year}.en.filtered.gz"), "wt", encoding="utf-8") as f:
            for date, sentences in docs:
                if date.year == year:
                    unsplit = b64(" ".join(sentences))
                    f.write(f"{date:%Y%m%d}\t{b64(chr(10).join(sentences))}\t{unsplit}\n")
                    ids.append((date, hashlib.sha256(unsplit.encode("ascii")).hexdigest()))
    return ids


def write_templama_release(folder, repeat_test_row=False):
    """train.json, val.json, test.json as Google's release: one JSON object a line, answers as lists; the answers of
    two clubs as a mirror writes them (ALIASES, with `original_name`). `repeat_test_row`: test.json ends with a row
    repeating the id of its first with another answer (a mirror's row concatenated to the release's)."""
    os.makedirs(folder, exist_ok=True)
    counts = {}
    for stem, players in SUBJECTS.items():
        rows = []
        for player in players:
            pid = f"Q{100 + PLAYERS.index(player)}"
            held = [club_of(player, y) for y in YEARS]
            frequent = max(held, key=held.count)
            for year in YEARS:
                qid, name = club_of(player, year)
                answer = {"wikidata_id": qid, "name": name}
                if qid in ALIASES:
                    answer = {"wikidata_id": qid, "name": ALIASES[qid], "original_name": [name]}
                rows.append({"query": f"{player} plays for _X_.", "answer": [answer], "date": str(year),
                             "id": f"{pid}_P54_{year}", "relation": "P54",
                             "most_frequent_answer": {"wikidata_id": frequent[0], "name": frequent[1]},
                             "most_recent_answer": {"wikidata_id": held[-1][0], "name": held[-1][1]}})
        counts[stem] = len(rows)
        if stem == "test" and repeat_test_row:
            rows.append({**rows[0], "answer": [{"wikidata_id": "Q999", "name": "Somewhere Else"}]})
        with open(os.path.join(folder, f"{stem}.json"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return counts


def write_published_splits(folder, ids, rng):
    """The paper's release layout, split_2017-09-30/{time_stratified,control}_{train,validation}.gz and test.gz
    (YYYYMMDD<TAB>id lines), drawn here by the protocol: training up to the cut-off, validation from the three months
    after it, test three documents a month of 2018, CONTROL train as many of the latest other documents."""
    cutoff, test_first = datetime.date(2017, 9, 30), datetime.date(2018, 1, 1)
    ordered = sorted(ids)
    ts_train = [d for d in ordered if d[0] <= cutoff]
    ts_validation = [d for d in ordered if cutoff < d[0] < test_first][::2]
    test = []
    for month in range(1, 13):
        test += rng.sample([d for d in ordered if d[0].year == 2018 and d[0].month == month], 3)
    test.sort()
    rest = [d for d in ordered if d[0] >= test_first and d not in test]
    control_validation = rest[::4][:len(ts_validation)]
    others = [d for d in ordered if d not in test and d not in control_validation]
    control_train = others[-len(ts_train):]
    split = os.path.join(folder, "time_stratified_control", "split_2017-09-30")
    os.makedirs(split)
    for name, rows in (("time_stratified_train", ts_train), ("time_stratified_validation", ts_validation),
                       ("control_train", control_train), ("control_validation", control_validation),
                       ("test", test)):
        with gzip.open(os.path.join(split, f"{name}.gz"), "wt", encoding="utf-8") as f:
            f.writelines(f"{date:%Y%m%d}\t{doc_id}\n" for date, doc_id in rows)
    return split, {"ts_train": len(ts_train), "test": len(test)}
