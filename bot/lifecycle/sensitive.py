"""What must never become a memory, whatever the model says: anyone's secrets, and sensitive
facts about people other than the one who said them.

Two checks over a fact's text, by rules only (word lists and patterns; no model):
- `secret(text)`: a password, passcode, PIN, token, API key or other credential with its
  value ("Alice's password is hunter2", "the PIN: 4821", "uses hunter2 as her password"), a
  known token format (GitHub, GitLab, Slack, AWS, Google, OpenAI/Anthropic-style `sk-`, Stripe,
  npm, JWT, Discord bot tokens, private key blocks, `Bearer ...`, a URL with a password in it),
  or a long random-looking string (letters and digits mixed, high entropy). Applies to
  everyone, the author included: "my password is hunter2" stores nothing.
- `sensitive_kind(text)`: health (illness, diagnosis, medication, pregnancy, therapy, ...),
  where someone lives (an address, a street, a postcode, "lives in/at"), contact details
  (phone numbers, e-mail addresses, messenger and social handles) and anything like a
  credential (passwords, account, card and ID numbers), without needing a value. Applied only
  when `names_someone_else(text, author, people)`: the fact names a participant or mentioned
  person other than the author, writes a name with "@", speaks of a relative or acquaintance
  ("Alice's sister", "his landlord"), or holds a capitalised name that is neither the author's
  nor plainly a place, a date or a term (after "in", "at", a number; a month, a weekday).
`screen` combines them and says which kind of rule dropped a fact; callers log counts only.

Limits, on purpose or not: rules see words, not meaning. They miss what they have no word for
(a rare illness, a paraphrase such as "is expecting", an address without a street word, a name
written in lower case, a pronoun standing for someone), and they drop some harmless facts (the
author's own fact that names a brand beside a health word, general knowledge about passwords
with a value-like word after "is", a long product code). Erring toward dropping is the safe
side: a fact that is not stored can be told again; one that is stored has already leaked.
Only English words are known.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterable

from bot.memory.writing import rules

# -- secrets (anyone's) ------------------------------------------------------------------------

_CREDENTIAL = (r"(?:pass(?:word|wd|code|phrase|key)s?|pwd|pins?(?:\s*(?:code|number))?|"
               r"(?:api|access|secret|private|license|licence|product|recovery|backup|encryption|ssh|gpg)[\s_-]?keys?|"
               r"client[\s_-]?secret|(?:access|auth|bearer|bot|session|refresh|discord|github|api|oauth|security|"
               r"personal[\s_-]access)?[\s_-]?tokens?|recovery[\s_-]?(?:codes?|phrase)|seed[\s_-]?phrase|"
               r"mnemonic|2fa[\s_-]?codes?|otp|one[\s_-]time[\s_-]code|security[\s_-]?(?:code|answer)|"
               r"login|credentials?|combination|wifi[\s_-]?key)")
# Words after "is" that say something about a credential rather than give it.
_NOT_A_VALUE = frozenset("""
a an the this that these those his her their its my your our one some any no not never always still also now
very too so really quite pretty just only even being been be is was required needed necessary optional mandatory
strong weak long short longer shorter stronger weaker wrong right correct incorrect invalid valid expired old new
missing lost forgotten changed reset stolen leaked compromised secure insecure safe unsafe easy hard simple complex
complicated same different stored saved written encrypted hashed shared private public secret important good bad
great terrible ok okay fine unknown known set used random generated managed protected case sensitive
in on at of for from with by about like to and or but if when because which who what how where why
""".split())
_COPULA = r"(?:\bis\b|\bwas\b|\bare\b|\bwere\b|\bequals\b|\bset\s+to\b|\bchanged\s+to\b|[:=]|->)"
_VALUE = r"[\"'`“‘]?([^\s\"'`”’,;]{3,})"
# "password is X", "PIN for her card: X", "password to the office wifi was X"
_QUALIFIER = (r"(?:\s+(?:for|of|to|on|at|in)(?:\s+[^\s.!?:=]+){1,4}?)?"
              r"(?:\s+(?:here|there|now|currently|still|today|nowadays))?")
_ADVERB = r"(?:(?:now|still|currently|always|just)\s+)?"
_CREDENTIAL_VALUE = re.compile(rf"(?i)\b{_CREDENTIAL}\b{_QUALIFIER}\s*{_COPULA}\s*{_ADVERB}{_VALUE}")
_CREDENTIAL_QUOTED = re.compile(rf"(?i)\b{_CREDENTIAL}\b\s*[\"'`“‘]([^\"'`”’\s]{{3,}})[\"'`”’]")
_CREDENTIAL_BARE = re.compile(rf"(?i)\b{_CREDENTIAL}\b\s+([^\s,;]{{3,}})")
_VALUE_AS_CREDENTIAL = re.compile(
    rf"(?i)\b(?:uses?|used|using|chose|picked|set|made|has)\s+{_VALUE}\s+as\s+(?:\w+\s+){{0,3}}?{_CREDENTIAL}\b")
def _either(*parts: str) -> re.Pattern[str]:
    """One pattern matching any of `parts` (each may carry its own scoped flags, "(?i:...)")."""
    return re.compile("|".join(f"(?:{part})" for part in parts))


TOKEN_FORMATS = _either(
    r"\bgh[pousr]_[A-Za-z0-9]{20,}", r"\bgithub_pat_[A-Za-z0-9_]{20,}", r"\bglpat-[A-Za-z0-9_-]{20,}",
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", r"\bAIza[0-9A-Za-z_-]{35}",
    r"\bsk-[A-Za-z0-9_-]{16,}", r"\b[rsp]k_(?:live|test)_[A-Za-z0-9]{10,}", r"\bnpm_[A-Za-z0-9]{30,}",
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",
    r"\b[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----", r"(?i:\bbearer\s+[A-Za-z0-9._~+/=-]{12,})",
    r"(?i:\b[a-z][a-z0-9+.-]*://[^\s/:@]+:[^\s/@]+@)",
)
_RANDOM_CANDIDATE = re.compile(r"[A-Za-z0-9_+/=~.-]{20,}")
RANDOM_MIN_CHARS = 20
RANDOM_MIN_BITS = 3.5   # Shannon entropy per character: words and repeated digits stay below it


def _a_value(word: str) -> bool:
    return rules.normalise(word) not in _NOT_A_VALUE and any(ch.isalnum() for ch in word)


def _looks_random(word: str) -> bool:
    """A long string of mixed letters and digits with little repetition: a key, not a word."""
    word = word.strip(".-_~")
    if len(word) < RANDOM_MIN_CHARS or not any(ch.isdigit() for ch in word) or not any(ch.isalpha() for ch in word):
        return False
    if "://" in word or word.count(".") > 2:
        return False  # a URL or a dotted name
    counts = Counter(word)
    bits = -sum(n / len(word) * math.log2(n / len(word)) for n in counts.values())
    return bits >= RANDOM_MIN_BITS


def secret(text: str) -> bool:
    """Whether the text gives away a password, token, key or other secret (anyone's)."""
    if TOKEN_FORMATS.search(text):
        return True
    for pattern in (_CREDENTIAL_VALUE, _CREDENTIAL_QUOTED, _VALUE_AS_CREDENTIAL):
        if any(_a_value(match.group(1)) for match in pattern.finditer(text)):
            return True
    for match in _CREDENTIAL_BARE.finditer(text):  # "PIN 4821", "password hunter2!": no "is"
        value = match.group(1).rstrip(".!?")
        if any(ch.isdigit() for ch in value) or (any(not ch.isalnum() for ch in value) and _a_value(value)
                                                   and not value.endswith("'s")):
            return True
    return any(_looks_random(word) for word in _RANDOM_CANDIDATE.findall(text))


# -- sensitive kinds (about someone else) ------------------------------------------------------

def _words(*alternatives: str) -> str:
    return r"(?i:\b(?:" + "|".join(alternatives) + r")\b)"


HEALTH = _either(_words(
    r"ill(?:ness(?:es)?)?", r"sick(?:ness)?", r"diseases?", r"disorders?", r"syndromes?", r"diagnos\w*",
    r"medica(?:tion|tions|ted|l)", r"medicines?", r"meds", r"prescri\w+", r"pills?", r"therap(?:y|ies|ist|ists)",
    r"psychiatr\w*", r"counsell?ing", r"diabet\w*", r"cancer\w*", r"tumou?rs?", r"leuka?emia", r"chemo\w*",
    r"radiotherapy", r"hiv", r"aids", r"hepatitis", r"std", r"covid(?:-19)?", r"flu", r"asthma\w*", r"epilep\w*",
    r"seizures?", r"migraines?", r"allerg\w*", r"depress(?:ed|ion)", r"anxiety", r"panic attacks?", r"adhd",
    r"autis\w*", r"asperger'?s?", r"bipolar", r"schizo\w*", r"ptsd", r"ocd", r"dementia", r"alzheimer'?s?",
    r"parkinson'?s?", r"strokes?", r"heart (?:attack|condition|disease|failure)", r"surger(?:y|ies)",
    r"operated on", r"hospitali[sz]\w*", r"hospitals?", r"clinic", r"pregnan\w*", r"miscarri\w*", r"abortions?",
    r"ivf", r"infertil\w*", r"disab\w*", r"wheelchair", r"deaf", r"addict\w*", r"rehab", r"alcoholi\w*",
    r"overdos\w*", r"suicid\w*", r"self[- ]harm\w*", r"anorexi\w*", r"bulimi\w*", r"eating disorder",
    r"insulin", r"dialysis", r"transplant", r"injur(?:y|ies|ed)", r"infect\w*", r"symptoms?", r"chronic",
    r"terminal(?:ly)?", r"mental health", r"health", r"vaccinat\w*", r"unvaccinated", r"crohn'?s?",
    r"sclerosis", r"arthritis", r"lupus", r"celiac|coeliac", r"hiv-positive"))
HOME = _either(
    _words(r"(?:lives?|living|lived|resid(?:es?|ing|ent|ence))\s+(?:at|in|on|near|by|with|next\s+to|across|"
           r"around|outside|above|below|behind|opposite)", r"address(?:es)?", r"post\s*code", r"zip\s*code",
           r"(?:house|home|flat|apartment|place|room)\s+(?:is|was)\s+(?:at|in|on|near)",
           r"mov(?:ed|es|ing)\s+(?:to|into|in\s+to)"),
    r"(?i:\b(?:apartment|apt|flat|unit|suite|p\.?\s?o\.?\s?box)\s*#?\d)",
    r"\b\d+[A-Za-z]?,?\s+(?:[A-Z][\w'’-]*\s+){1,4}(?:Street|St|Road|Rd|Avenue|Ave|Lane|Ln|Drive|Dr|Boulevard|Blvd|"
    r"Way|Court|Ct|Place|Pl|Terrace|Close|Crescent|Square|Sq|Highway|Hwy|Parkway|Row|Gardens|Grove|Hill|Mews|"
    r"Walk|Circle|Cir)\b",
    r"\b[A-ZÄÖÜÅÆØ][\w-]*(?:straße|strasse|gasse|weg|gatan|gata|gate|gaten|vej|veien|vegen|laan|straat|plein|"
    r"allee)\s+\d+",
    r"(?i:\b\d+[a-z]?,?\s+(?:rue|via|calle|avenida|avenue|boulevard|piazza|plaza|chemin)\s+\w+)",
    r"\b[A-Z]{1,2}\d[A-Z\d]?\s*\d[A-Z]{2}\b",                                       # a UK postcode
    r"-?\b\d{1,2}\.\d{3,},\s*-?\d{1,3}\.\d{3,}\b",                                  # coordinates
)
CONTACT = _either(
    r"[\w.+-]+@[\w-]+\.[\w.-]*[A-Za-z]",                                           # an e-mail address
    r"\+\d[\d\s().-]{6,}\d", r"\b\d{3}[\s.-]\d{3}[\s.-]\d{4}\b", r"\b\d(?:[\s.-]?\d){8,}\b",  # phone numbers
    _words(r"phones?", r"(?:mobile|cell)\s+(?:number|phone)", r"telephone", r"tel", r"landline", r"fax",
           r"e-?mails?", r"whatsapp", r"telegram", r"signal\s+number", r"skype", r"instagram", r"insta", r"twitter",
           r"snapchat", r"tiktok", r"facebook", r"linkedin", r"mastodon", r"bluesky", r"reddit",
           r"steam\s+(?:id|name)", r"discord\s+(?:tag|name|handle|username)", r"handle\s+is", r"user\s?names?",
           r"gamertag", r"contact\s+(?:details|info|information|number)", r"(?:be\s+)?reached\s+(?:at|on)",
           r"reach\s+(?:him|her|them)\s+(?:at|on)"),
)
CREDENTIAL_LIKE = _either(rf"(?i:\b{_CREDENTIAL}\b)", _words(
    r"account\s+(?:number|details|name)", r"bank\s+(?:account|details)", r"iban", r"routing\s+number",
    r"sort\s+code", r"credit\s+card", r"debit\s+card", r"card\s+number", r"cvv|cvc", r"social\s+security",
    r"ssn", r"passport\s+(?:number|no)", r"national\s+id", r"(?:driver'?s|driving)\s+licen[cs]e",
    r"tax\s+(?:id|number)", r"security\s+questions?", r"maiden\s+name"))
KINDS = (("health", HEALTH), ("home", HOME), ("contact", CONTACT), ("credential", CREDENTIAL_LIKE))


def sensitive_kind(text: str) -> str | None:
    """Which sensitive kind the text speaks of (health, home, contact, credential), or None."""
    for kind, pattern in KINDS:
        if pattern.search(text):
            return kind
    return None


# -- who a fact names ----------------------------------------------------------------------------

RELATIONS = (r"wife|husband|partner|spouse|boyfriend|girlfriend|fianc[ée]e?|ex|mother|father|mum|mom|mam|dad|"
             r"parents?|sons?|daughters?|child|children|kids?|bab(?:y|ies)|brothers?|sisters?|siblings?|twins?|"
             r"cousins?|aunts?|uncles?|nieces?|nephews?|grand(?:mother|father|ma|pa|parents?|son|daughter|child"
             r"|children|kids?)|in-laws?|friends?|best\s+friend|roommates?|flatmates?|housemates?|neighbou?rs?|"
             r"colleagues?|co-?workers?|boss|landlord|landlady|tenants?|classmates?|teammates?|doctor|therapist")
_RELATIVE = re.compile(rf"(?i)(?:'s|’s|\b(?:his|her|their|its)(?:\s+\w+)?)\s+(?:{RELATIONS})\b")
AT_NAME = re.compile(r"(?<![\w.+-])@([^\s@,;:!?()\[\]{}\"']+)")
_CAPITALISED = re.compile(r"[^\W\d_][\w'’-]*")
# Capitalised words that are not people: sentence starters, dates, and names of illnesses.
NOT_NAMES = frozenset("""
the a an this that these those there it its he she they his her their we our i my you your one some every each
all most many several both either neither no any other another such what which who whom whose when where why how
and or but if then so because since although though while after before until as also however
monday tuesday wednesday thursday friday saturday sunday january february march april may june july august
september october november december christmas easter muninn discord type stage level grade room chapter
crohn alzheimer parkinson asperger hodgkin huntington addison cushing graves tourette lyme down
""".split())
# Words after which a capitalised word is a place or a thing, not a person.
PLACE_WORDS = frozenset("in at on near from to into onto around across outside inside via towards toward through "
                        "of off above below behind beyond opposite within".split())


def _name_words(name: str) -> set[str]:
    return set(rules.normalise(name).split())


def _names(text: str, name: str) -> bool:
    key = rules.normalise(name)
    return bool(key) and f" {key} " in f" {rules.normalise(text)} "


def capitalised_names(text: str, author: str) -> list[str]:
    """Capitalised words of the text that may be someone's name: not the author's, not all
    capitals (HIV), not a starter or a date (NOT_NAMES), not right after a number or a place
    word ("in Oslo", "12 Quokka Street", and the words of the name that follow it)."""
    own = _name_words(author)
    found: list[str] = []
    place_end = -1   # where the last capitalised word taken for a place ended
    for match in _CAPITALISED.finditer(text):
        word = match.group(0)
        if not word[0].isupper():
            continue
        before = text[:match.start()].split()
        previous = before[-1].casefold().strip("\"'“”‘’(") if before else ""
        place = (previous in PLACE_WORDS or previous[-1:].isdigit()
                 or (place_end >= 0 and not text[place_end:match.start()].strip()))
        if place:
            place_end = match.end()
            continue
        key = rules.normalise(word.removesuffix("'s").removesuffix("’s"))
        if key and not word.isupper() and key not in own and key not in NOT_NAMES and key not in PLACE_WORDS:
            found.append(word)
    return found


def names_someone_else(text: str, author: str, people: Iterable[str] = ()) -> bool:
    """Whether the fact names a person other than its author: one of `people` (participants,
    mentioned people), a name written with "@", a relative or acquaintance, or a capitalised
    name (capitalised_names)."""
    own = rules.normalise(author)
    if any(_names(text, person) for person in people if rules.normalise(person) != own):
        return True
    if any(rules.normalise(name) != own for name in AT_NAME.findall(text)):
        return True
    return bool(_RELATIVE.search(text)) or bool(capitalised_names(text, author))


def screen(text: str, author: str, people: Iterable[str] = ()) -> str | None:
    """Why the fact must not be stored: "secret", or the sensitive kind it gives about someone
    other than `author` ("health", "home", "contact", "credential"); None when it may be."""
    if secret(text):
        return "secret"
    kind = sensitive_kind(text)
    if kind is not None and names_someone_else(text, author, people):
        return kind
    return None
