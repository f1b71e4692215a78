"""The operator's console (`muninn web`): Muninn's memory in a browser, behind a login."""
