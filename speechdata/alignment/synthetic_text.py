"""The text of the ``small`` aligner's synthesized speech: word lists and pseudo-sentences.

Sentences are random words of one language, a number written as words (``num2words``) in 30 % of
them, drawn from a seeded generator, so any utterance of the training or held-out set is
reproducible from its seed and index. Every letter is in the small model's alphabet
(``speechdata.alignment.train_small.SMALL_ALPHABET``).
"""

from __future__ import annotations

import numpy as np

_ENGLISH = """
the a an and or but if then so because when while after before under over into out of on in at
by for with from about near far above below between through during without again once here there
where why how all any both each few more most other some such no not only own same than too very
can will just should now i you he she it we they me him her us them my your his its our their
this that these those am is are was were be been being have has had do does did say said go went
gone get got make made know knew think thought take took see saw come came want look use find
give tell work call try ask need feel become leave put mean keep let begin seem help talk turn
start show hear play run move like live believe hold bring happen write provide sit stand lose
pay meet include continue set learn change lead understand watch follow stop create speak read
allow add spend grow open walk win offer remember love consider appear buy wait serve die send
expect build stay fall cut reach kill remain time year people way day man thing woman life child
world school state family student group country problem hand part place case week company system
program question government number night point home water room mother area money story fact
month lot right study book eye job word business issue side kind head house service friend
father power hour game line end member law car city community name president team minute idea
kid body information back parent face others level office door health person art war history
party result morning reason research girl guy moment air teacher force education foot boy age
policy music market sense nation plan college interest death experience effect class control
field development role effort rate heart drug show leader light voice wife police mind price
report decision son view relationship town road arm difference value building action model
season society tax director position player record paper space ground form event official matter
center couple site project activity star table need court oil situation cost industry figure
street image phone data picture practice piece land product doctor wall patient worker news test
movie north love support technology step baby computer type attention film tree source
organization hair window evidence population truth song summer river garden kitchen winter good
new first last long great little own other old right big high different small large next early
young important few public bad same able late hard major better economic strong possible whole
free military true federal international full special easy clear recent certain personal open
red difficult available likely short single medical current wrong private past foreign fine
common poor natural significant similar hot dead central happy serious ready simple left
physical general environmental financial blue democratic dark various entire close legal
religious cold final main green nice huge popular traditional cultural quick brown lazy quiet
bright warm yellow sweet weather station message camera garden silver morning evening yesterday
tomorrow always never often sometimes quickly slowly together everyone nothing something
anything everything maybe perhaps coffee train apple orange bread butter cheese chicken sugar
salt window pencil letter bottle
"""
EN_WORDS = _ENGLISH.split()
"""Everyday English words (order matters: sentences index into it)."""
_GERMAN = """
der die das ein eine und oder aber wenn dann weil als nach vor unter über in an auf aus bei mit
von zu für ohne gegen durch um hier dort wo warum wie alle jeder mehr viel wenig nicht nur auch
sehr schon noch immer nie oft heute morgen gestern jetzt bald ich du er sie es wir ihr mein dein
sein unser euer dieser jener bin bist ist sind war waren sein haben hat hatte werden wird wurde
kann muss soll will darf mag machen sagen gehen kommen sehen wissen denken nehmen geben finden
bleiben liegen stehen lesen schreiben sprechen hören spielen arbeiten wohnen lernen kaufen essen
trinken schlafen fahren laufen helfen fragen antworten zeigen bringen tragen öffnen schließen
beginnen Zeit Jahr Tag Mann Frau Kind Welt Schule Familie Land Stadt Haus Straße Wasser Geld
Buch Auge Hand Kopf Tür Fenster Tisch Stuhl Auto Zug Bahnhof Arbeit Freund Vater Mutter Bruder
Schwester Woche Monat Stunde Minute Morgen Abend Nacht Sommer Winter Frühling Herbst Wetter
Sonne Regen Schnee Wind Baum Blume Garten Küche Zimmer Brot Käse Milch Kaffee Tee Apfel Zucker
Salz Musik Sprache Frage Antwort Wort Satz Bild Brief Nachricht Geschichte Anfang Ende Weg Reise
Katze Hund Vogel Fisch Pferd Berg Fluss Meer See Wald Feld Dorf Kirche Brücke Markt Laden Preis
Farbe gut neu erste letzte lang groß klein alt jung hoch schön schnell langsam warm kalt hell
dunkel rot blau grün gelb weiß schwarz laut leise früh spät leicht schwer richtig falsch froh
müde ruhig fröhlich wichtig einfach möglich sicher klar ganz halb voll leer süß sauer heiß
"""
DE_WORDS = _GERMAN.split()
"""Everyday German words (order matters: sentences index into it)."""

WORDS = {"en": EN_WORDS, "de": DE_WORDS}


def number_words(value: int, language: str) -> str:
    from num2words import num2words

    return num2words(value, lang=language).replace("-", " ").replace(",", " ")


def sentence(rng: np.random.Generator, language: str, min_words: int = 3, max_words: int = 12) -> str:
    """A deterministic pseudo-sentence: random words of ``language``, sometimes a number in words."""
    words = WORDS[language]
    count = int(rng.integers(min_words, max_words + 1))
    picked = [words[int(i)] for i in rng.integers(0, len(words), size=count)]
    if rng.random() < 0.3:
        picked.insert(int(rng.integers(0, count + 1)), number_words(int(rng.integers(0, 2100)), language))
    return " ".join(" ".join(picked).split())
