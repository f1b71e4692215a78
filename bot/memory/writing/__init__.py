"""How memories are written and kept: the rules that tell facts apart, fact writes, and maintenance's SQL."""
