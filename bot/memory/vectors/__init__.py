"""The vector search both backends share: numpy over each visibility key's vectors."""
