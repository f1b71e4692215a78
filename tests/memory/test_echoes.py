"""bot/memory/echoes.py: which of Muninn's replies repeat a person's words (forget-all empties them)."""
from __future__ import annotations

from bot.memory.echoes import TheirWords, words

HERS = ["Game night is every Friday at 8 pm, bring snacks!", "My cat Zorblax loves tuna.", "my PIN is 4711",
        "I think that it is going to be fine in the morning"]


def theirs(*others: str) -> TheirWords:
    found = TheirWords.of(HERS)
    for text in others:
        found.seen_elsewhere(text)
    return found


def test_words_are_casefolded_runs_of_letters_and_digits():
    assert words("Ｚorblax's ＰＩＮ: 4711!") == ["zorblax", "s", "pin", "4711"]


def test_a_run_of_three_of_her_words_with_two_uncommon_ones_is_hers():
    found = theirs("Game night sounds fun", "Friday works, pm me", "bring snacks please", "tuna")
    assert found.repeated_in("Reminder for Bob: GAME NIGHT IS on Friday.")   # "game night is"
    assert found.repeated_in("Alice said every Friday at 8 pm.")             # "friday at 8", "at 8 pm"
    assert not found.repeated_in("Is the night game on?")                    # her words, not in her order
    assert found.repeated_in("game... night; is")                            # punctuation between words does not matter


def test_a_run_of_common_words_is_nobodys():
    found = theirs("i think that it is going to be fine in the morning, fine, morning")
    assert not found.repeated_in("I think that it is going to be fine.")
    assert not found.repeated_in("See you in the morning.")


def test_a_rare_word_of_hers_is_hers_wherever_it_is():
    found = theirs("good night", "game night was fun", "i love tuna too", "friday is fine", "snacks!")
    assert found.repeated_in("Did you know someone has a cat called zorblax?")
    assert found.repeated_in("The code 4711 opens it.")  # a number of three or more characters, hers alone
    assert not found.repeated_in("Tuna is a fish.")       # someone else wrote it: not hers alone
    assert not found.repeated_in("Game night!")           # so did this one, and two words are no run


def test_short_and_common_words_are_never_rare():
    assert TheirWords.of(["My cat is 4 and I am ok"]).rare == set()  # "cat" is short, "4" too, the others common
    found = TheirWords.of(["Yes, it is so, and I am ok with that."])
    assert not found and not found.repeated_in("yes it is so and i am ok with that")  # nothing of it is hers alone


def test_a_word_is_rare_until_someone_else_writes_it():
    found = TheirWords.of(["Zorblax"])
    assert found.found_in("zorblax again") == (False, {"zorblax"})
    found.seen_elsewhere("Bob: is zorblax a cat?")
    assert not found.repeated_in("zorblax again")
