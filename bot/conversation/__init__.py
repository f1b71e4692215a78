"""The conversation layer: answering a message (history, recall, prompt, reply) for
the Discord cogs and `muninn chat`, and handing each exchange to fact extraction."""
