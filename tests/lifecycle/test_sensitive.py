"""The rule-based screen of facts (bot/lifecycle/sensitive.py): secrets of anyone, sensitive
kinds about people other than the author. Pure functions."""
from __future__ import annotations

import pytest

from bot.lifecycle import sensitive
from bot.lifecycle.sensitive import names_someone_else, screen, secret, sensitive_kind


@pytest.mark.parametrize("text", [
    "Bob's password is hunter2.",
    "my password is hunter2",
    "The wifi password here is quokka123.",
    "Bob's password for the office wifi is Tr0ub4dor.",
    "Bob's Netflix password is sunshine.",
    "The password is now quokka123.",
    "Alice password: hunter2",
    "Bob's PIN 4821 opens the door.",
    "The PIN of his card is 4821.",
    "Bob uses hunter2 as his password.",
    "Bob's passcode is '0000'.",
    "Her API key is sk-abcdefghijklmnop1234.",
    "The bot token is MTAxNTg0MjI0NjU4MTc2ODEwMA.GaBcDe.abcdefghijklmnopqrstuvwxyz0123",
    "Bob's GitHub token ghp_abcdefghijklmnopqrstuvwxyz0123456789 expires soon.",
    "AWS key AKIAIOSFODNN7EXAMPLE is in the notes.",
    "The server is at https://admin:s3cret@db.example.com/muninn.",
    "Bob keeps the key aB3dE5fG7hJ9kL1mN3pQ5rS7 in a drawer.",
    "The session cookie is eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc",
    "-----BEGIN OPENSSH PRIVATE KEY----- is how his key starts.",
    "The recovery phrase is apple banana cherry.",
    "Bob's login is bob99.",
])
def test_secrets_are_found_whoever_they_belong_to(text):
    assert secret(text) and screen(text, "Bob") == "secret"


@pytest.mark.parametrize("text", [
    "Bob forgot his password.",
    "Bob's password is weak.",
    "Bob uses a password manager.",
    "The token limit of llama3 is 8192.",
    "The token bucket algorithm is elegant.",
    "An API key is a code that identifies a program.",
    "Bob lent Dave 50 euros.",
    "Alice lives in Oslo.",
    "Bob's phone number changed in 2019.",
    "The channel meets on 2024-05-12 at 8 pm.",
    "Discord ids such as 1456074443980800002 are snowflakes.",
    "Bob likes supercalifragilisticexpialidocious words.",
    "See https://example.com/some/really/long/path/to/a/page for the rules.",
])
def test_ordinary_facts_are_not_secrets(text):
    assert not secret(text)


@pytest.mark.parametrize("text, kind", [
    ("Dave has diabetes.", "health"),
    ("Dave was diagnosed with depression last year.", "health"),
    ("Dave takes medication for his heart.", "health"),
    ("Dave is pregnant.", "health"),
    ("Dave lives at 12 Quokka Street.", "home"),
    ("Dave lives in Oslo.", "home"),
    ("Dave's address is Storgata 5.", "home"),
    ("Dave moved to 4 rue de Rivoli.", "home"),
    ("Dave's email is dave@example.com.", "contact"),
    ("Dave's number is +47 912 34 567.", "contact"),
    ("Dave is on Instagram.", "contact"),
    ("Dave's bank account number ends in 42.", "credential"),
    ("Dave's credit card expires in May.", "credential"),
])
def test_sensitive_kinds(text, kind):
    assert sensitive_kind(text) == kind


@pytest.mark.parametrize("text", ["Dave likes green tea.", "Bob lent Dave 50 euros.", "Dave plays chess on Fridays.",
                                  "Dave works as a doctor."])
def test_ordinary_facts_are_no_sensitive_kind(text):
    assert sensitive_kind(text) is None


@pytest.mark.parametrize("text, people, other", [
    ("Dave has diabetes.", (), True),                        # a capitalised name, not the author's
    ("@Dave has diabetes.", (), True),                       # a name written with "@"
    ("Bob's sister has cancer.", (), True),                  # a relative
    ("Bob says his landlord is ill.", (), True),
    ("the new guy has diabetes", ("the new guy",), True),    # a participant or mentioned person, by name
    ("zoë 🌸 has asthma", ("Zoë 🌸",), True),
    ("Bob has diabetes.", ("Bob", "Dave"), False),           # the author alone
    ("@Bob has diabetes.", (), False),
    ("Bob's diabetes is under control.", (), False),
    ("Bob has Type 1 diabetes.", (), False),                 # a term, not a person
    ("Bob has HIV.", (), False),                             # capitals: an acronym
    ("Bob has Crohn's disease.", (), False),                 # named after someone, not about them
    ("Bob lives at 12 Quokka Street.", (), False),           # a street after a number
    ("Bob lives in New York.", (), False),                   # a place after "in"
    ("In March Bob had surgery.", (), False),                # a month
])
def test_who_a_fact_names(text, people, other):
    assert names_someone_else(text, "Bob", people) is other


@pytest.mark.parametrize("text, kind", [
    ("Dave lives at 12 Quokka Street.", "home"),
    ("@Dave has diabetes.", "health"),
    ("Bob's sister is pregnant.", "health"),
    ("Bob knows that Dave's phone number is 555-123-4567.", "contact"),
    ("Bob's friend Dave has a bank account in Jersey.", "credential"),
])
def test_sensitive_facts_about_someone_else_are_screened(text, kind):
    assert screen(text, "Bob", ["Dave"]) == kind


@pytest.mark.parametrize("text", [
    "Bob lives at 12 Quokka Street.",      # the author's own: theirs to tell
    "Bob has diabetes.",
    "Bob lent Dave 50 euros.",             # about someone else, but nothing sensitive
    "Alice's sister Jane is a doctor.",
])
def test_the_authors_own_and_harmless_facts_pass(text):
    author = "Alice" if text.startswith("Alice") else "Bob"
    assert screen(text, author, ["Dave", author]) is None


def test_the_words_after_a_credential_that_describe_it_are_not_values():
    assert {"weak", "required", "the", "not"} <= sensitive._NOT_A_VALUE
