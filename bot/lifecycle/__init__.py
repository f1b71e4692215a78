"""The memory lifecycle: fact extraction after each exchange, the LLM's update decision, and periodic maintenance."""
