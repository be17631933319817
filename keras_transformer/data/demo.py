"""An offline English-German demo corpus that the project generates itself.

Nothing can be downloaded on a fresh machine, so the first run needs data
that the package can make: templated sentences about numbers, dates, times,
quantities and prices, rendered in both languages with well-kept libraries
(`num2words` for number words, Babel's CLDR data for month and weekday names,
times and decimal formats). It is a real transduction task, not a copy task:

- number words change order: "twenty-one" -> "einundzwanzig";
- German word order: verb second after a fronted phrase ("Am 5. Mai 2021
  verkaufte sie ..."), verb-final in subordinate clauses ("..., dass das
  Konzert um 14:30 Uhr beginnt"), participles and separable prefixes at the
  end ("... gekauft", "... fährt ... ab");
- 12-hour times become 24-hour times ("2:30 PM" -> "14:30 Uhr"), dates and
  decimals change format ("May 5, 2021" -> "5. Mai 2021", "3.50" -> "3,50"),
  city names change ("Munich" -> "München");
- agreement: articles and possessives by gender, verb endings by person,
  dative plurals after "seit".

The corpus is written as `train.en train.de valid.en valid.de test.en test.de`
(the layout of Multi30k), which `load_parallel_text` reads.

Command line:

    python -m keras_transformer.data.demo --output-dir data/demo --seed 0
"""

import argparse
import datetime
import functools
import pathlib
import random
import sys

from babel.dates import format_date, format_time
from babel.numbers import format_decimal
from num2words import num2words

from keras_transformer.data.readers import write_parallel_text

SPLITS = ("train", "valid", "test")

# --- lexicon -------------------------------------------------------------------
# Countable nouns: English singular, plural; German gender, singular, plural.
NOUNS = (
    ("apple", "apples", "m", "Apfel", "Äpfel"),
    ("pear", "pears", "f", "Birne", "Birnen"),
    ("book", "books", "n", "Buch", "Bücher"),
    ("chair", "chairs", "m", "Stuhl", "Stühle"),
    ("table", "tables", "m", "Tisch", "Tische"),
    ("cup", "cups", "f", "Tasse", "Tassen"),
    ("ticket", "tickets", "f", "Fahrkarte", "Fahrkarten"),
    ("newspaper", "newspapers", "f", "Zeitung", "Zeitungen"),
    ("pencil", "pencils", "m", "Bleistift", "Bleistifte"),
    ("lemon", "lemons", "f", "Zitrone", "Zitronen"),
    ("egg", "eggs", "n", "Ei", "Eier"),
    ("flower", "flowers", "f", "Blume", "Blumen"),
    ("bread roll", "bread rolls", "n", "Brötchen", "Brötchen"),
    ("shirt", "shirts", "n", "Hemd", "Hemden"),
    ("lamp", "lamps", "f", "Lampe", "Lampen"),
    ("key", "keys", "m", "Schlüssel", "Schlüssel"),
    ("plate", "plates", "m", "Teller", "Teller"),
    ("glass", "glasses", "n", "Glas", "Gläser"),
    ("bicycle", "bicycles", "n", "Fahrrad", "Fahrräder"),
    ("computer", "computers", "m", "Computer", "Computer"),
    ("umbrella", "umbrellas", "m", "Regenschirm", "Regenschirme"),
    ("candle", "candles", "f", "Kerze", "Kerzen"),
    ("letter", "letters", "m", "Brief", "Briefe"),
    ("orange", "oranges", "f", "Orange", "Orangen"),
    ("tomato", "tomatoes", "f", "Tomate", "Tomaten"),
    ("potato", "potatoes", "f", "Kartoffel", "Kartoffeln"),
    ("banana", "bananas", "f", "Banane", "Bananen"),
    ("bag", "bags", "f", "Tasche", "Taschen"),
    ("shoe", "shoes", "m", "Schuh", "Schuhe"),
    ("bottle", "bottles", "f", "Flasche", "Flaschen"),
    ("towel", "towels", "n", "Handtuch", "Handtücher"),
    ("postcard", "postcards", "f", "Postkarte", "Postkarten"),
)
ARTICLE = {"m": "der", "f": "die", "n": "das"}

# Subjects: English, German, person. "you" is left out (du/ihr/Sie).
PRONOUNS = (
    ("I", "ich", "1sg"), ("he", "er", "3sg"), ("she", "sie", "3sg"),
    ("we", "wir", "1pl"), ("they", "sie", "3pl"),
)
NAMES = ("Anna", "Lukas", "Maria", "Jonas", "Sophie", "Felix", "Laura", "David",
         "Julia", "Paul", "Lena", "Max", "Emma", "Leon", "Clara", "Tim", "Sarah",
         "Tom", "Nina", "Ben")
NOUN_SUBJECTS = (
    ("my brother", "mein Bruder", "3sg"), ("my sister", "meine Schwester", "3sg"),
    ("my parents", "meine Eltern", "3pl"), ("our neighbours", "unsere Nachbarn", "3pl"),
    ("my grandmother", "meine Großmutter", "3sg"), ("my uncle", "mein Onkel", "3sg"),
)
SUBJECTS = PRONOUNS + tuple((n, n, "3sg") for n in NAMES) + NOUN_SUBJECTS

# German present (or given tense) forms by person.
VERBS = {
    "haben": ("habe", "hat", "haben"),
    "verkaufte": ("verkaufte", "verkaufte", "verkauften"),
    "brauchen": ("brauche", "braucht", "brauchen"),
    "sagen": ("sage", "sagt", "sagen"),
    "arbeiten": ("arbeite", "arbeitet", "arbeiten"),
    "wohnen": ("wohne", "wohnt", "wohnen"),
    "warten": ("warte", "wartet", "warten"),
    "lernen": ("lerne", "lernt", "lernen"),
    "kommen": ("komme", "kommt", "kommen"),
}
_PERSON_INDEX = {"1sg": 0, "3sg": 1, "1pl": 2, "3pl": 2}

CITIES = (
    ("Munich", "München"), ("Vienna", "Wien"), ("Cologne", "Köln"),
    ("Zurich", "Zürich"), ("Berlin", "Berlin"), ("Hamburg", "Hamburg"),
    ("Rome", "Rom"), ("Prague", "Prag"), ("Warsaw", "Warschau"),
    ("Brussels", "Brüssel"), ("Venice", "Venedig"), ("Milan", "Mailand"),
    ("Copenhagen", "Kopenhagen"), ("Paris", "Paris"), ("London", "London"),
    ("Geneva", "Genf"), ("Lisbon", "Lissabon"), ("Athens", "Athen"),
    ("Nuremberg", "Nürnberg"), ("Hanover", "Hannover"), ("Basel", "Basel"),
    ("Frankfurt", "Frankfurt"), ("Dresden", "Dresden"), ("Leipzig", "Leipzig"),
)
# Events: English, German with its nominative article.
EVENTS = (
    ("meeting", "die Besprechung"), ("concert", "das Konzert"), ("film", "der Film"),
    ("game", "das Spiel"), ("course", "der Kurs"), ("party", "die Feier"),
    ("conference", "die Konferenz"), ("exam", "die Prüfung"),
    ("lecture", "die Vorlesung"), ("guided tour", "die Führung"),
    ("performance", "die Vorstellung"), ("wedding", "die Hochzeit"),
)
SHOPS = (
    ("bakery", "die Bäckerei"), ("market", "der Markt"),
    ("supermarket", "der Supermarkt"), ("pharmacy", "die Apotheke"),
    ("post office", "die Post"), ("library", "die Bibliothek"),
    ("museum", "das Museum"), ("bank", "die Bank"), ("shop", "das Geschäft"),
)
# English vehicle, German subject, German verb before the time, particle at the end.
VEHICLES = (
    ("train", "Der Zug", "fährt", " ab"), ("bus", "Der Bus", "fährt", " ab"),
    ("ferry", "Die Fähre", "fährt", " ab"), ("plane", "Das Flugzeug", "startet", ""),
)
# Relatives: English noun, German noun, gender (for the possessive ending).
RELATIVES = (
    ("brother", "Bruder", "m"), ("sister", "Schwester", "f"), ("father", "Vater", "m"),
    ("mother", "Mutter", "f"), ("grandfather", "Großvater", "m"),
    ("grandmother", "Großmutter", "f"), ("uncle", "Onkel", "m"), ("aunt", "Tante", "f"),
    ("daughter", "Tochter", "f"), ("son", "Sohn", "m"), ("child", "Kind", "n"),
    ("dog", "Hund", "m"), ("cat", "Katze", "f"),
)
POSSESSIVES = (("my", "mein"), ("his", "sein"), ("her", "ihr"), ("our", "unser"),
               ("their", "ihr"))
# Institutions: English, German with article, English members, German members,
# the largest plausible number.
INSTITUTIONS = (
    ("the company", "das Unternehmen", "employees", "Mitarbeiter", 90_000),
    ("the school", "die Schule", "pupils", "Schüler", 2_000),
    ("the university", "die Universität", "students", "Studierende", 60_000),
    ("the club", "der Verein", "members", "Mitglieder", 5_000),
    ("the village", "das Dorf", "inhabitants", "Einwohner", 3_000),
    ("the city", "die Stadt", "inhabitants", "Einwohner", 900_000),
    ("the hospital", "das Krankenhaus", "beds", "Betten", 1_500),
)
# Containers for "There are ... in the ...": English, German fronted phrase.
PLACES = (
    ("box", "In der Kiste"), ("basket", "Im Korb"), ("kitchen", "In der Küche"),
    ("car", "Im Auto"), ("cupboard", "Im Schrank"), ("shop window", "Im Schaufenster"),
)
# Duration activities: English -ing phrase, German verb, German phrase after the
# duration, units allowed (English, German dative plural).
LONG_UNITS = (("years", "Jahren"), ("months", "Monaten"), ("weeks", "Wochen"))
SHORT_UNITS = (("minutes", "Minuten"), ("hours", "Stunden"))
# Measures: English noun, German subject, verbs, unit names.
MEASURES = (
    ("parcel", "Das Paket", "weighs", "wiegt", "kilograms", "Kilogramm"),
    ("suitcase", "Der Koffer", "weighs", "wiegt", "kilograms", "Kilogramm"),
    ("bag", "Die Tasche", "weighs", "wiegt", "kilograms", "Kilogramm"),
    ("tank", "Der Tank", "holds", "fasst", "litres", "Liter"),
    ("bucket", "Der Eimer", "holds", "fasst", "litres", "Liter"),
    ("pot", "Der Topf", "holds", "fasst", "litres", "Liter"),
)


# --- rendering helpers ---------------------------------------------------------

@functools.lru_cache(maxsize=None)
def number_words(number, lang):
    """Cardinal number in words: `number_words(21, "de") == "einundzwanzig"`."""
    return num2words(number, lang=lang)


def _capitalize(text):
    return text[:1].upper() + text[1:]


def _verb(infinitive, person):
    return VERBS[infinitive][_PERSON_INDEX[person]]


def _en_third(person, third, other):
    return third if person == "3sg" else other


def _count(rng):
    """A count for a plural noun: 2..199, never ending in "one" (hundertein...)."""
    while True:
        n = rng.randint(2, 199) if rng.random() < 0.3 else rng.randint(2, 99)
        if n % 100 != 1:
            return n


def _price(rng):
    cents = rng.choice((rng.randint(200, 2000), rng.randint(200, 200_000)))
    amount = cents / 100
    return (format_decimal(amount, "#,##0.00", locale="en"),
            format_decimal(amount, "#,##0.00", locale="de"))


def _measure(rng):
    value = rng.randint(20, 2000) / 10 if rng.random() < 0.6 else rng.randint(2, 500)
    return (format_decimal(value, "#,##0.#", locale="en"),
            format_decimal(value, "#,##0.#", locale="de"))


def _time(rng):
    """(English 12-hour, German 24-hour without "Uhr")."""
    t = datetime.time(rng.randint(0, 23), rng.choice((0, 5, 10, 15, 20, 30, 40, 45, 50, 55)))
    return format_time(t, "h:mm a", locale="en"), format_time(t, "H:mm", locale="de")


def _weekday(rng):
    day = datetime.date(2024, 1, 1) + datetime.timedelta(days=rng.randint(0, 6))
    return format_date(day, "EEEE", locale="en"), format_date(day, "EEEE", locale="de")


def _date(rng, first_year, last_year):
    """(English "May 5, 2021", German "5. Mai 2021" after "am"), maybe with weekday.

    German "am Mittwoch, dem 5. Mai 2021, ..." closes the apposition with a
    comma; every template continues the sentence after the date, so the
    German phrase ends with "," in that case.
    """
    start = datetime.date(first_year, 1, 1).toordinal()
    day = datetime.date.fromordinal(
        rng.randint(start, datetime.date(last_year, 12, 31).toordinal()))
    en = format_date(day, "MMMM d, y", locale="en")
    de = format_date(day, "d. MMMM y", locale="de")
    if rng.random() < 0.3:
        en = format_date(day, "EEEE", locale="en") + ", " + en
        de = format_date(day, "EEEE", locale="de") + ", dem " + de + ","
    return en, de


def _subject(rng):
    return rng.choice(SUBJECTS)


def _en_subject_initial(en):
    return en if en == "I" else _capitalize(en)


# --- templates: each takes a random.Random and returns (english, german) ------

def _bought(rng):
    en_s, de_s, person = _subject(rng)
    n = _count(rng)
    noun = rng.choice(NOUNS)
    price_en, price_de = _price(rng)
    date_en, date_de = _date(rng, 1990, 2024)
    en = (f"{_en_subject_initial(en_s)} bought {number_words(n, 'en')} {noun[1]} "
          f"for {price_en} euros on {date_en}.")
    de = (f"{_capitalize(de_s)} {_verb('haben', person)} am {date_de} "
          f"{number_words(n, 'de')} {noun[4]} für {price_de} Euro gekauft.")
    return en, de


def _sold(rng):
    en_s, de_s, person = _subject(rng)
    n = _count(rng)
    noun = rng.choice(NOUNS)
    price_en, price_de = _price(rng)
    date_en, date_de = _date(rng, 1990, 2024)
    en = (f"On {date_en}, {en_s} sold {number_words(n, 'en')} {noun[1]} "
          f"for {price_en} euros.")
    de = (f"Am {date_de} {_verb('verkaufte', person)} {de_s} "
          f"{number_words(n, 'de')} {noun[4]} für {price_de} Euro.")
    return en, de


def _departure(rng):
    vehicle, de_subject, de_verb, particle = rng.choice(VEHICLES)
    city_en, city_de = rng.choice(CITIES)
    time_en, time_de = _time(rng)
    day_en, day_de = _weekday(rng)
    verb_en = "takes off" if vehicle == "plane" else "leaves"
    en = f"The {vehicle} to {city_en} {verb_en} at {time_en} on {day_en}."
    de = f"{de_subject} nach {city_de} {de_verb} am {day_de} um {time_de} Uhr{particle}."
    return en, de


def _says_that(rng):
    en_s, de_s, person = _subject(rng)
    event_en, event_de = rng.choice(EVENTS)
    time_en, time_de = _time(rng)
    date_en, date_de = _date(rng, 2025, 2035)
    says = _en_third(person, "says", "say")
    en = (f"{_en_subject_initial(en_s)} {says} that the {event_en} starts at "
          f"{time_en} on {date_en}.")
    de = (f"{_capitalize(de_s)} {_verb('sagen', person)}, dass {event_de} "
          f"am {date_de} um {time_de} Uhr beginnt.")
    return en, de


def _need_because(rng):
    en_s, de_s, person = _subject(rng)
    n = _count(rng)
    noun = rng.choice(NOUNS)
    shop_en, shop_de = rng.choice(SHOPS)
    time_en, time_de = _time(rng)
    opens = rng.random() < 0.5
    need = _en_third(person, "needs", "need")
    en = (f"{_en_subject_initial(en_s)} {need} {number_words(n, 'en')} {noun[1]} "
          f"because the {shop_en} {'opens' if opens else 'closes'} at {time_en}.")
    de = (f"{_capitalize(de_s)} {_verb('brauchen', person)} {number_words(n, 'de')} "
          f"{noun[4]}, weil {shop_de} um {time_de} Uhr "
          f"{'öffnet' if opens else 'schließt'}.")
    return en, de


def _costs(rng):
    noun = rng.choice(NOUNS)
    price_en, price_de = _price(rng)
    if rng.random() < 0.5:
        en = f"The {noun[0]} costs {price_en} euros."
        de = f"{_capitalize(ARTICLE[noun[2]])} {noun[3]} kostet {price_de} Euro."
    else:
        n = _count(rng)
        en = f"{_capitalize(number_words(n, 'en'))} {noun[1]} cost {price_en} euros."
        de = f"{_capitalize(number_words(n, 'de'))} {noun[4]} kosten {price_de} Euro."
    return en, de


def _born(rng):
    name = rng.choice(NAMES)
    date_en, date_de = _date(rng, 1920, 2024)
    return f"{name} was born on {date_en}.", f"{name} wurde am {date_de} geboren."


def _age(rng):
    poss_en, poss_de = rng.choice(POSSESSIVES)
    relative_en, relative_de, gender = rng.choice(RELATIVES)
    n = rng.randint(2, 19) if relative_en in ("dog", "cat") else rng.randint(2, 99)
    ending = "e" if gender == "f" else ""
    en = f"{_capitalize(poss_en)} {relative_en} is {number_words(n, 'en')} years old."
    de = (f"{_capitalize(poss_de)}{ending} {relative_de} ist "
          f"{number_words(n, 'de')} Jahre alt.")
    return en, de


def _since(rng):
    en_s, de_s, person = _subject(rng)
    kind = rng.randrange(4)
    if kind == 0:
        activity_en, verb, rest, units = "working here", "arbeiten", " hier", LONG_UNITS
    elif kind == 1:
        city_en, city_de = rng.choice(CITIES)
        activity_en, verb, rest, units = (f"living in {city_en}", "wohnen",
                                          f" in {city_de}", LONG_UNITS)
    elif kind == 2:
        activity_en, verb, rest, units = "learning German", "lernen", " Deutsch", LONG_UNITS
    else:
        activity_en, verb, rest, units = "waiting", "warten", "", SHORT_UNITS
    unit_en, unit_de = rng.choice(units)
    n = rng.randint(2, 59)
    has = _en_third(person, "has", "have")
    en = (f"{_en_subject_initial(en_s)} {has} been {activity_en} for "
          f"{number_words(n, 'en')} {unit_en}.")
    de = (f"{_capitalize(de_s)} {_verb(verb, person)} seit {number_words(n, 'de')} "
          f"{unit_de}{rest}.")
    return en, de


def _measurement(rng):
    if rng.random() < 0.4:
        (c1_en, c1_de), (c2_en, c2_de) = rng.sample(CITIES, 2)
        x_en, x_de = _measure(rng)
        return (f"The distance from {c1_en} to {c2_en} is {x_en} kilometres.",
                f"Die Entfernung von {c1_de} nach {c2_de} beträgt {x_de} Kilometer.")
    thing, de_subject, verb_en, verb_de, unit_en, unit_de = rng.choice(MEASURES)
    x_en, x_de = _measure(rng)
    return (f"The {thing} {verb_en} {x_en} {unit_en}.",
            f"{de_subject} {verb_de} {x_de} {unit_de}.")


def _temperature(rng):
    day_en, day_de = _weekday(rng)
    degrees = rng.choice([d for d in range(-15, 39) if abs(d) != 1])  # not "ein(s) Grad"
    rise = rng.random() < 0.5
    words_en = number_words(abs(degrees), "en")
    words_de = number_words(abs(degrees), "de")
    if degrees < 0:
        words_en, words_de = "minus " + words_en, "minus " + words_de
    en = (f"On {day_en}, the temperature will {'rise' if rise else 'fall'} to "
          f"{words_en} degrees.")
    de = (f"Am {day_de} wird die Temperatur auf {words_de} Grad "
          f"{'steigen' if rise else 'sinken'}.")
    return en, de


def _question(rng):
    time_en, time_de = _time(rng)
    action_en, action_de = rng.choice((("call", "anrufen"), ("pick up", "abholen")))
    when = rng.randrange(3)
    if when == 0:
        when_en, when_de = "tomorrow", "morgen"
    elif when == 1:
        when_en, when_de = "today", "heute"
    else:
        day_en, day_de = _weekday(rng)
        when_en, when_de = f"on {day_en}", f"am {day_de}"
    if action_en == "call":
        en = f"Can you call me at {time_en} {when_en}?"
    else:
        en = f"Can you pick me up at {time_en} {when_en}?"
    return en, f"Kannst du mich {when_de} um {time_de} Uhr {action_de}?"


def _institution(rng):
    inst_en, inst_de, members_en, members_de, most = rng.choice(INSTITUTIONS)
    year = rng.randint(1900, 2024)
    n = rng.randint(12, most)
    n_en = format_decimal(n, "#,##0", locale="en")
    n_de = format_decimal(n, "#,##0", locale="de")
    return (f"In {year}, {inst_en} had {n_en} {members_en}.",
            f"Im Jahr {year} hatte {inst_de} {n_de} {members_de}.")


def _arithmetic(rng):
    op = rng.randrange(3)
    if op == 0:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        result, op_en, op_de = a + b, "plus", "plus"
    elif op == 1:
        a, b = rng.randint(0, 199), rng.randint(0, 99)
        a, b = max(a, b), min(a, b)
        result, op_en, op_de = a - b, "minus", "minus"
    else:
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        result, op_en, op_de = a * b, "times", "mal"
    en = (f"{_capitalize(number_words(a, 'en'))} {op_en} {number_words(b, 'en')} "
          f"is {number_words(result, 'en')}.")
    de = (f"{_capitalize(number_words(a, 'de'))} {op_de} {number_words(b, 'de')} "
          f"ist {number_words(result, 'de')}.")
    return en, de


def _moved(rng):
    event_en, event_de = rng.choice(EVENTS)
    (day1_en, day1_de), (day2_en, day2_de) = _weekday(rng), _weekday(rng)
    while day2_en == day1_en:
        day2_en, day2_de = _weekday(rng)
    return (f"The {event_en} was moved from {day1_en} to {day2_en}.",
            f"{_capitalize(event_de)} wurde von {day1_de} auf {day2_de} verschoben.")


def _arrive(rng):
    en_s, de_s, person = _subject(rng)
    city_en, city_de = rng.choice(CITIES)
    time_en, time_de = _time(rng)
    date_en, date_de = _date(rng, 2025, 2035)
    en = (f"{_en_subject_initial(en_s)} will arrive in {city_en} at {time_en} "
          f"on {date_en}.")
    de = (f"{_capitalize(de_s)} {_verb('kommen', person)} am {date_de} um "
          f"{time_de} Uhr in {city_de} an.")
    return en, de


def _there_are(rng):
    place_en, place_de = rng.choice(PLACES)
    noun = rng.choice(NOUNS)
    n = _count(rng)
    return (f"There are {number_words(n, 'en')} {noun[1]} in the {place_en}.",
            f"{place_de} sind {number_words(n, 'de')} {noun[4]}.")


def _ends(rng):
    event_en, event_de = rng.choice(EVENTS)
    time_en, time_de = _time(rng)
    return (f"The {event_en} ends at {time_en}.",
            f"{_capitalize(event_de)} endet um {time_de} Uhr.")


TEMPLATES = (_bought, _sold, _departure, _says_that, _need_because, _costs, _born,
             _age, _since, _measurement, _temperature, _question, _institution,
             _arithmetic, _moved, _arrive, _there_are, _ends)


# --- corpus ---------------------------------------------------------------------

def generate_pairs(num_pairs, *, seed=0):
    """Generates distinct English-German sentence pairs.

    Templates are drawn uniformly; a pair whose English or German side was
    already generated is skipped, so no sentence occurs twice on either side.

    Args:
        num_pairs: how many pairs.
        seed: the random seed; the same seed gives the same list.

    Returns:
        A list of `(english, german)` strings.

    Example:

    >>> generate_pairs(2, seed=0)[1]
    ('On January 23, 2006, Jonas sold sixty-four potatoes for 797.11 euros.',
     'Am 23. Januar 2006 verkaufte Jonas vierundsechzig Kartoffeln für 797,11 Euro.')
    """
    if not isinstance(num_pairs, int) or num_pairs < 0:
        raise ValueError(f"num_pairs must be a non-negative integer, received {num_pairs!r}")
    rng = random.Random(seed)
    pairs, seen_en, seen_de = [], set(), set()
    attempts = 0
    while len(pairs) < num_pairs:
        attempts += 1
        if attempts > 20 * num_pairs + 1000:
            raise RuntimeError(f"could not generate {num_pairs} distinct pairs")
        en, de = rng.choice(TEMPLATES)(rng)
        if en in seen_en or de in seen_de:
            continue
        seen_en.add(en)
        seen_de.add(de)
        pairs.append((en, de))
    return pairs


def write_demo_corpus(output_dir, *, seed=0, num_train=50_000, num_valid=1_000,
                      num_test=1_000):
    """Writes the demo corpus as `{train,valid,test}.{en,de}` in `output_dir`.

    The splits are disjoint (no English or German sentence in two splits).
    Test and validation pairs are generated first, so they do not change with
    `num_train`.

    Args:
        output_dir: the folder (created if needed).
        seed: the random seed; the same seed writes the same files.
        num_train: training pairs.
        num_valid: validation pairs.
        num_test: test pairs.

    Returns:
        A dict `{"train": (en_path, de_path), "valid": ..., "test": ...}` of
        `pathlib.Path`s.

    Example:

    >>> paths = write_demo_corpus("data/demo", seed=0)
    >>> pairs = load_parallel_text(*paths["train"])
    >>> len(pairs)
    50000
    """
    sizes = {"test": num_test, "valid": num_valid, "train": num_train}
    pairs = generate_pairs(sum(sizes.values()), seed=seed)
    output_dir = pathlib.Path(output_dir)
    paths, start = {}, 0
    for split, size in sizes.items():
        en_path, de_path = output_dir / f"{split}.en", output_dir / f"{split}.de"
        write_parallel_text(pairs[start:start + size], en_path, de_path)
        paths[split] = (en_path, de_path)
        start += size
    return {split: paths[split] for split in SPLITS}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.data.demo",
        description="Write the offline English-German demo corpus "
                    "(train/valid/test .en/.de files).",
    )
    parser.add_argument("--output-dir", required=True, help="folder to write to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-train", type=int, default=50_000)
    parser.add_argument("--num-valid", type=int, default=1_000)
    parser.add_argument("--num-test", type=int, default=1_000)
    args = parser.parse_args(argv)
    paths = write_demo_corpus(args.output_dir, seed=args.seed, num_train=args.num_train,
                              num_valid=args.num_valid, num_test=args.num_test)
    sizes = {"train": args.num_train, "valid": args.num_valid, "test": args.num_test}
    for split, (en_path, de_path) in paths.items():
        print(f"{split}: {sizes[split]} pairs -> {en_path}, {de_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
