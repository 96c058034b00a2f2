"""Seeded English sentences from a small word list: inputs for the real sentence encoder
(``modelroll-encoder``) in ``make demo`` and ``make bench-encoder``."""

from __future__ import annotations

import random


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Words for the sentences, by part of speech, so that every clause reads as English.
DETERMINERS = _words("the a this every one our their some no each")
ADJECTIVES = _words(
    "small large quiet busy new old careful rapid simple local remote early late short long "
    "bright cold warm heavy light strange common public private final"
)
NOUNS = _words(
    "engineer river report server garden teacher market window question city train model "
    "request letter doctor village storm program bridge customer kitchen meeting forest "
    "library camera ticket budget"
)
VERBS = _words(
    "reads sends finds builds watches carries opens follows answers moves checks writes "
    "cleans leaves repairs describes measures visits"
)
PREPOSITIONS = _words("near after before under behind across during without beside")
LINKS = _words("and but because while although so")


def sentence(rng: random.Random, words: int) -> str:
    """An English sentence of exactly ``words`` words: clauses of determiner, noun, verb and
    object (some with adjectives and a prepositional phrase) joined by conjunctions, cut at
    ``words``."""
    out: list[str] = []
    while len(out) < words:
        if out:
            out[-1] += ","
            out.append(rng.choice(LINKS))
        for part in ("subject", "object"):
            out.append(rng.choice(DETERMINERS))
            if rng.random() < 0.5:
                out.append(rng.choice(ADJECTIVES))
            out.append(rng.choice(NOUNS))
            if part == "subject":
                out.append(rng.choice(VERBS))
        if rng.random() < 0.4:
            out += [rng.choice(PREPOSITIONS), rng.choice(DETERMINERS), rng.choice(NOUNS)]
    text = " ".join(out[:words]).rstrip(",")
    return text[0].upper() + text[1:] + "."


def sentences(count: int, min_words: int, max_words: int, seed: int) -> list[str]:
    """``count`` sentences, word counts uniform in [min_words, max_words], from ``seed``."""
    rng = random.Random(seed)
    return [sentence(rng, rng.randint(min_words, max_words)) for _ in range(count)]
