"""Tests of keras_transformer.data.demo: the offline English-German demo corpus."""

import datetime
import os
import re
import subprocess
import sys
import time

import pytest

from keras_transformer.data import load_parallel_text
from keras_transformer.data import demo

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Pairs of seed 0, checked by hand: German word order (verb second after a
# fronted date, verb-final subordinate clause, participle and separable prefix
# at the end), number words, 24-hour times, dates, decimal commas, agreement.
PINNED_SEED_0 = {
    0: ("In 2013, the hospital had 873 beds.",
        "Im Jahr 2013 hatte das Krankenhaus 873 Betten."),
    1: ("On January 23, 2006, Jonas sold sixty-four potatoes for 797.11 euros.",
        "Am 23. Januar 2006 verkaufte Jonas vierundsechzig Kartoffeln für 797,11 Euro."),
    2: ("Sarah was born on Wednesday, December 27, 1944.",
        "Sarah wurde am Mittwoch, dem 27. Dezember 1944, geboren."),
    3: ("Clara says that the course starts at 5:55 PM on Tuesday, February 13, 2035.",
        "Clara sagt, dass der Kurs am Dienstag, dem 13. Februar 2035, um 17:55 Uhr beginnt."),
    5: ("Can you call me at 1:30 PM on Thursday?",
        "Kannst du mich am Donnerstag um 13:30 Uhr anrufen?"),
    8: ("Clara bought forty-four keys for 16.95 euros on July 28, 1998.",
        "Clara hat am 28. Juli 1998 vierundvierzig Schlüssel für 16,95 Euro gekauft."),
    21: ("Sarah will arrive in Basel at 10:30 PM on December 4, 2025.",
         "Sarah kommt am 4. Dezember 2025 um 22:30 Uhr in Basel an."),
    34: ("The egg costs 1,389.98 euros.", "Das Ei kostet 1.389,98 Euro."),
    89: ("My parents will arrive in Warsaw at 9:40 AM on April 23, 2029.",
         "Meine Eltern kommen am 23. April 2029 um 9:40 Uhr in Warschau an."),
    144: ("The course was moved from Tuesday to Saturday.",
          "Der Kurs wurde von Dienstag auf Samstag verschoben."),
}

# Independent references, written by hand.
GERMAN_NUMBERS = {0: "null", 1: "eins", 16: "sechzehn", 17: "siebzehn", 21: "einundzwanzig",
                  30: "dreißig", 35: "fünfunddreißig", 70: "siebzig", 99: "neunundneunzig",
                  122: "einhundertzweiundzwanzig"}
MONTHS_DE = ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August",
             "September", "Oktober", "November", "Dezember"]
MONTHS_EN = ["January", "February", "March", "April", "May", "June", "July", "August",
             "September", "October", "November", "December"]
WEEKDAYS_DE = ["Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag"]
WEEKDAYS_EN = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The default demo corpus of seed 0, written once, and the seconds it took."""
    start = time.perf_counter()
    paths = demo.write_demo_corpus(tmp_path_factory.mktemp("demo"), seed=0)
    seconds = time.perf_counter() - start
    return paths, seconds


def test_pinned_pairs_of_seed_0():
    pairs = demo.generate_pairs(150, seed=0)
    for index, pair in PINNED_SEED_0.items():
        assert pairs[index] == pair, index


def test_deterministic_for_a_seed():
    assert demo.generate_pairs(500, seed=4) == demo.generate_pairs(500, seed=4)
    assert demo.generate_pairs(500, seed=4) != demo.generate_pairs(500, seed=5)
    # A longer run starts with the shorter one.
    assert demo.generate_pairs(800, seed=4)[:500] == demo.generate_pairs(500, seed=4)


def test_number_words_match_hand_written_german():
    for number, words in GERMAN_NUMBERS.items():
        assert demo.number_words(number, "de") == words
    assert demo.number_words(21, "en") == "twenty-one"


def test_default_corpus_is_large_distinct_and_disjoint(corpus):
    paths, seconds = corpus
    print(f"\ndemo corpus written in {seconds:.1f} s")
    assert seconds < 30  # a generous bound; the time is printed above
    splits = {split: load_parallel_text(*paths[split]) for split in demo.SPLITS}
    assert {split: len(pairs) for split, pairs in splits.items()} == {
        "train": 50_000, "valid": 1_000, "test": 1_000}
    assert all(pairs.dropped_lines == () for pairs in splits.values())
    for side in ("source", "target"):
        sentences = [set(getattr(pairs, side)) for pairs in splits.values()]
        assert sum(map(len, sentences)) == 52_000  # distinct within and across splits
    assert [p.name for p in paths["train"]] == ["train.en", "train.de"]


def test_test_and_valid_splits_do_not_depend_on_train_size(corpus, tmp_path):
    paths, _ = corpus
    small = demo.write_demo_corpus(tmp_path, seed=0, num_train=10, num_valid=1_000,
                                   num_test=1_000)
    for split in ("valid", "test"):
        for big, little in zip(paths[split], small[split]):
            assert big.read_bytes() == little.read_bytes()


def test_not_a_copy_task(corpus):
    paths, _ = corpus
    pairs = list(load_parallel_text(*paths["valid"]))
    assert all(en != de for en, de in pairs)
    # Most German sentences share at most a third of their words with the English.
    def overlap(en, de):
        en_words, de_words = set(en.split()), de.split()
        return sum(w in en_words for w in de_words) / len(de_words)
    assert sum(overlap(en, de) <= 1 / 3 for en, de in pairs) > 0.8 * len(pairs)
    number_pairs = [(en, de) for en, de in pairs if "twenty-one" in en]
    assert number_pairs and all("einundzwanzig" in de for _, de in number_pairs)


def test_dates_times_and_prices_are_consistent(corpus):
    """Every date, time and price in the German agrees with the English."""
    paths, _ = corpus
    pairs = list(load_parallel_text(*paths["train"]))[:5000]
    counts = {"date": 0, "weekday date": 0, "time": 0, "price": 0}
    for en, de in pairs:
        assert de[0].isupper() and de[-1] in ".?" and "  " not in de
        for match in re.finditer(r"(?:(\w+), dem )?(\d+)\. (\w+) (\d{4})", de):
            weekday_de, day, month, year = match.groups()
            date = datetime.date(int(year), MONTHS_DE.index(month) + 1, int(day))
            english = f"{MONTHS_EN[date.month - 1]} {date.day}, {date.year}"
            assert english in en, (en, de)
            counts["date"] += 1
            if weekday_de:
                assert weekday_de == WEEKDAYS_DE[date.weekday()]
                assert f"{WEEKDAYS_EN[date.weekday()]}, {english}" in en
                # The closing comma of the apposition "am Montag, dem 5. Mai 2021,".
                assert de[match.end()] == ","
                counts["weekday date"] += 1
        en_times = re.findall(r"(\d+):(\d\d) (AM|PM)", en)
        de_times = re.findall(r"(\d+):(\d\d) Uhr", de)
        assert len(en_times) == len(de_times)
        for (hour, minute, half), (hour_de, minute_de) in zip(en_times, de_times):
            assert minute == minute_de
            assert int(hour) % 12 + (12 if half == "PM" else 0) == int(hour_de)
            counts["time"] += 1
        en_prices = re.findall(r"([\d,]+\.\d\d) euros", en)
        de_prices = re.findall(r"([\d.]+,\d\d) Euro", de)
        assert [p.replace(",", "_").replace(".", ",").replace("_", ".")
                for p in en_prices] == de_prices
        counts["price"] += len(de_prices)
    assert min(counts.values()) > 100, counts


@pytest.mark.slow
def test_command_line(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.data.demo", "--output-dir",
         str(tmp_path / "cli"), "--seed", "3", "--num-train", "300", "--num-valid", "20",
         "--num-test", "20"],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: 300 pairs" in result.stdout
    expected = demo.write_demo_corpus(tmp_path / "api", seed=3, num_train=300,
                                      num_valid=20, num_test=20)
    for split in demo.SPLITS:
        for path in expected[split]:
            assert (tmp_path / "cli" / path.name).read_bytes() == path.read_bytes()
